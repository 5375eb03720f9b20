//! The readable (pretty) form: `module { func.func @k(...) attributes {...} { ... } ... }`, each
//! op in its dialect's custom syntax. Each line is read into the generic op record
//! ([`Generic`]) it stands for, as MLIR's custom parsers do: the types the syntax leaves implicit
//! (a binary op's one type for both operands and the result, `index` load indices, a
//! comparison's `i1` result) and the attributes it spells inline (a comparison's predicate
//! name, a reduction's `<kind>` and `[dims]`, a store's operand segments) made explicit.

use super::ops::{Block, Family, FuncText, Generic, ModuleText, family, predicate_number};
use super::text::{
    At, Attrs, close_of, numbered, parse_type, parse_types, split_top, strip_loc, symbol,
    value_name, value_names,
};
use crate::mosaic::types::MType;
use crate::types::DType;

struct Lines {
    lines: Vec<At>,
    pos: usize,
}

impl Lines {
    fn next(&mut self, what: &str) -> Result<At, String> {
        let at = self.lines.get(self.pos).cloned();
        self.pos += 1;
        at.ok_or_else(|| format!("the body ends inside {what}"))
    }
}

/// Reads the readable form's module.
pub(super) fn parse(body: &str) -> Result<ModuleText, String> {
    let mut p = Lines { lines: numbered(body), pos: 0 };
    let head = p.next("the module")?;
    if strip_loc(&head.text) != "module {" {
        return head.fail("the readable form starts with `module {`");
    }
    let mut funcs = Vec::new();
    loop {
        let at = p.next("the module")?;
        let l = strip_loc(&at.text);
        if l == "}" {
            break;
        }
        if !l.starts_with("func.func ") {
            return at.fail("a module holds `func.func`s only");
        }
        funcs.push(func(&mut p, at)?);
    }
    if let Some(at) = p.lines.get(p.pos) {
        return at.fail("text after the module");
    }
    Ok(ModuleText { funcs })
}

/// `func.func @name(%a: T, ...) [-> (T, ...)] [attributes {...}] {`, its body and `}`.
fn func(p: &mut Lines, at: At) -> Result<FuncText, String> {
    let l = strip_loc(&at.text).to_owned();
    let e = |what: String| at.error(what);
    let rest = l.strip_prefix("func.func ").unwrap_or(&l);
    let (name, rest) = symbol(rest).map_err(e)?;
    let rest = rest.trim_start();
    if !rest.starts_with('(') {
        return at.fail("no parameter list");
    }
    let close = close_of(rest, 0).map_err(e)?;
    let mut args = Vec::new();
    for param in split_top(&rest[1..close]).map_err(e)? {
        let (n, t) = param.split_once(':').ok_or_else(|| e(format!("bad parameter `{param}`")))?;
        args.push((value_name(n).map_err(e)?, parse_type(t).map_err(e)?));
    }
    let mut rest = rest[close + 1..].trim();
    let mut results = Vec::new();
    if let Some(r) = rest.strip_prefix("->") {
        let r = r.trim_start();
        if r.starts_with('(') {
            let c = close_of(r, 0).map_err(e)?;
            results = parse_types(&r[1..c]).map_err(e)?;
            rest = r[c + 1..].trim();
        } else {
            let end = r.find(' ').unwrap_or(r.len());
            results = vec![parse_type(&r[..end]).map_err(e)?];
            rest = r[end..].trim();
        }
    }
    let mut attrs = Attrs::default();
    if let Some(r) = rest.strip_prefix("attributes") {
        let r = r.trim_start();
        let c = close_of(r, 0).map_err(e)?;
        attrs = Attrs::parse(&r[..=c]).map_err(e)?;
        rest = r[c + 1..].trim();
    }
    if rest != "{" {
        return at.fail("a function header ends with `{`");
    }
    let (body, other) = block(p)?;
    if let Some(else_at) = other {
        return else_at.fail("an `else` closing a function");
    }
    Ok(FuncText { at, name, args, results, attrs, body })
}

/// Ops up to the `}` (or `} else {`, whose line is returned) that closes their block.
fn block(p: &mut Lines) -> Result<(Vec<Generic>, Option<At>), String> {
    let mut ops = Vec::new();
    loop {
        let at = p.next("a block")?;
        match strip_loc(&at.text) {
            "}" => return Ok((ops, None)),
            "} else {" => return Ok((ops, Some(at))),
            _ => ops.push(op(p, at)?),
        }
    }
}

fn generic(at: At, name: &str, operands: Vec<String>, operand_types: Vec<MType>) -> Generic {
    Generic {
        attrs_at: at.clone(),
        at,
        results: Vec::new(),
        name: name.to_owned(),
        operands,
        operand_types,
        result_types: Vec::new(),
        attrs: Attrs::default(),
        regions: Vec::new(),
    }
}

/// `%m[%i, %j]`: the memref and its indices.
fn access(s: &str) -> Result<(String, Vec<String>), String> {
    let (m, idx) = s.trim().split_once('[').ok_or_else(|| format!("no `[` in `{s}`"))?;
    let idx = idx.strip_suffix(']').ok_or_else(|| format!("no `]` ending `{s}`"))?;
    Ok((value_name(m)?, value_names(idx)?))
}

/// The text before an op's attribute dictionary, the dictionary (empty if none is printed),
/// and the text after it (from the ` : ` of the types on).
fn with_attrs(s: &str) -> Result<(&str, Attrs, &str), String> {
    let colon = s.find(" : ").ok_or("no ` : ` types")?;
    match s[..colon].find(" {") {
        None => Ok((&s[..colon], Attrs::default(), &s[colon..])),
        Some(i) => {
            let c = close_of(s, i + 1)?;
            Ok((&s[..i], Attrs::parse(&s[i + 1..=c])?, &s[c + 1..]))
        }
    }
}

/// The type list after ` : ` (`after` begins with it).
fn types_after(after: &str) -> Result<&str, String> {
    after.trim_start().strip_prefix(':').map(str::trim).ok_or_else(|| "no ` : ` types".to_owned())
}

fn op(p: &mut Lines, at: At) -> Result<Generic, String> {
    let l = strip_loc(&at.text).to_owned();
    let e = |what: String| at.error(what);
    if l == "return" {
        return Ok(generic(at, "func.return", Vec::new(), Vec::new()));
    }
    if let Some(r) = l.strip_prefix("return ") {
        let (vals, tys) = r.split_once(" : ").ok_or_else(|| e("no return types".into()))?;
        let (vals, tys) = (value_names(vals).map_err(e)?, parse_types(tys).map_err(e)?);
        return Ok(generic(at, "func.return", vals, tys));
    }
    if let Some(r) = l.strip_prefix("scf.if ") {
        let cond = r.strip_suffix(" {").ok_or_else(|| e("`scf.if` without its `{`".into()))?;
        let cond = value_name(cond).map_err(e)?;
        let (then, other) = block(p)?;
        let mut regions = vec![Block { args: Vec::new(), ops: then }];
        if other.is_some() {
            let (ops, again) = block(p)?;
            if let Some(a) = again {
                return a.fail("a second `else`");
            }
            regions.push(Block { args: Vec::new(), ops });
        }
        let mut g = generic(at, "scf.if", vec![cond], vec![MType::Scalar(DType::Bool)]);
        g.regions = regions;
        return Ok(g);
    }
    if let Some(r) = l.strip_prefix("scf.for ") {
        // `%iv = %lo to %hi step %step : i32 {`.
        let header = r.strip_suffix(" {").ok_or_else(|| e("`scf.for` without its `{`".into()))?;
        let (head, ty) = header.rsplit_once(" : ").ok_or_else(|| e("no loop type".into()))?;
        let ty = parse_type(ty).map_err(e)?;
        let (iv, range) = head.split_once(" = ").ok_or_else(|| e("no ` = `".into()))?;
        let (lo, rest) = range.split_once(" to ").ok_or_else(|| e("no ` to `".into()))?;
        let (hi, step) = rest.split_once(" step ").ok_or_else(|| e("no ` step `".into()))?;
        let operands = [lo, hi, step].map(value_name);
        let operands: Vec<String> = operands.into_iter().collect::<Result<_, _>>().map_err(e)?;
        let (ops, other) = block(p)?;
        if let Some(a) = other {
            return a.fail("an `else` closing an `scf.for`");
        }
        let args = vec![(value_name(iv).map_err(e)?, ty.clone())];
        let mut g = generic(at, "scf.for", operands, vec![ty; 3]);
        g.regions = vec![Block { args, ops }];
        return Ok(g);
    }
    if let Some(r) = l.strip_prefix("tpu.vector_store ") {
        // `%m[%i, %j], %v {strides = array<i32>} : M, V,`: the trailing comma is the (empty)
        // mask's type, which the op's syntax requires.
        let (head, mut attrs, after) = with_attrs(r).map_err(e)?;
        let (acc, value) =
            head.rsplit_once("], ").ok_or_else(|| e("a store is `%m[...], %v`".into()))?;
        let (memref, indices) = access(&format!("{acc}]")).map_err(e)?;
        let tys = types_after(after).map_err(e)?;
        let tys = tys
            .strip_suffix(',')
            .ok_or_else(|| e("`tpu.vector_store` without the `,` of its mask type".into()))?;
        let Ok([m, v]) = <[MType; 2]>::try_from(parse_types(tys).map_err(e)?) else {
            return at.fail("a store has a memref and a vector type");
        };
        let n = indices.len();
        attrs.insert("operandSegmentSizes", &format!("array<i32: 1, 1, {n}, 0>")).map_err(e)?;
        let operands = [value_name(value).map_err(e)?, memref].into_iter().chain(indices);
        let types = [v, m].into_iter().chain(std::iter::repeat_n(MType::Index, n));
        let mut g = generic(at, "tpu.vector_store", operands.collect(), types.collect());
        g.attrs = attrs;
        return Ok(g);
    }
    if let Some(r) = l.strip_prefix("memref.store ") {
        // `%v, %m[%i] : M`.
        let (head, ty) = r.rsplit_once(" : ").ok_or_else(|| e("no memref type".into()))?;
        let (value, acc) = head.split_once(", ").ok_or_else(|| e("no value".into()))?;
        let (memref, indices) = access(acc).map_err(e)?;
        let m = parse_type(ty).map_err(e)?;
        let element = MType::Scalar(m.dtype().unwrap_or(DType::I32));
        let n = indices.len();
        let operands = [value_name(value).map_err(e)?, memref].into_iter().chain(indices);
        let types = [element, m].into_iter().chain(std::iter::repeat_n(MType::Index, n));
        return Ok(generic(at, "memref.store", operands.collect(), types.collect()));
    }
    let (result, rhs) = l.split_once(" = ").ok_or_else(|| e("cannot read this line".into()))?;
    let result = value_name(result).map_err(e)?;
    let (name, rest) = rhs.split_once(' ').unwrap_or((rhs, ""));
    let family =
        family(name).ok_or_else(|| e(format!("the interpreter does not know `{name}`")))?;
    let mut attrs = Attrs::default();
    let (operands, operand_types, result_type) = match family {
        Family::Constant => {
            let (_, ty) = rest.rsplit_once(" : ").ok_or_else(|| e("no constant type".into()))?;
            attrs.insert("value", rest).map_err(e)?;
            (Vec::new(), Vec::new(), parse_type(ty).map_err(e)?)
        }
        Family::Binary(..) | Family::Unary(_) => {
            let (ops, ty) = rest.rsplit_once(" : ").ok_or_else(|| e("no type".into()))?;
            let (ops, ty) = (value_names(ops).map_err(e)?, parse_type(ty).map_err(e)?);
            let types = vec![ty.clone(); ops.len()];
            (ops, types, ty)
        }
        Family::Compare(float) => {
            let (ops, ty) = rest.rsplit_once(" : ").ok_or_else(|| e("no type".into()))?;
            let ty = parse_type(ty).map_err(e)?;
            let mut ops = split_top(ops).map_err(e)?.into_iter();
            let pred = ops.next().unwrap_or_default();
            let number = predicate_number(float, pred)
                .ok_or_else(|| e(format!("unknown predicate `{pred}`")))?;
            attrs.insert("predicate", &format!("{number} : i64")).map_err(e)?;
            let ops: Vec<String> = ops.map(value_name).collect::<Result<_, _>>().map_err(e)?;
            let types = vec![ty.clone(); ops.len()];
            (ops, types, ty.with_dtype(DType::Bool))
        }
        Family::Select => {
            let (ops, tys) = rest.split_once(" : ").ok_or_else(|| e("no types".into()))?;
            let tys = parse_types(tys).map_err(e)?;
            let (cond, ty) = match tys.as_slice() {
                [t] => (MType::Scalar(DType::Bool), t.clone()),
                [c, t] => (c.clone(), t.clone()),
                _ => return at.fail("a select has one or two types"),
            };
            (value_names(ops).map_err(e)?, vec![cond, ty.clone(), ty.clone()], ty)
        }
        Family::Cast => {
            let (x, tys) = rest.split_once(" : ").ok_or_else(|| e("no types".into()))?;
            let (from, to) = tys.split_once(" to ").ok_or_else(|| e("no ` to `".into()))?;
            let (from, to) = (parse_type(from).map_err(e)?, parse_type(to).map_err(e)?);
            (value_names(x).map_err(e)?, vec![from], to)
        }
        Family::Load => {
            let (acc, tys) = rest.split_once(" : ").ok_or_else(|| e("no types".into()))?;
            let (memref, indices) = access(acc).map_err(e)?;
            let Ok([m, v]) = <[MType; 2]>::try_from(parse_types(tys).map_err(e)?) else {
                return at.fail("a load has a memref and a vector type");
            };
            let types = std::iter::once(m).chain(std::iter::repeat_n(MType::Index, indices.len()));
            (std::iter::once(memref).chain(indices).collect(), types.collect(), v)
        }
        Family::ScalarLoad => {
            // `%m[%i] : M`.
            let (acc, ty) = rest.rsplit_once(" : ").ok_or_else(|| e("no memref type".into()))?;
            let (memref, indices) = access(acc).map_err(e)?;
            let m = parse_type(ty).map_err(e)?;
            let element = MType::Scalar(m.dtype().unwrap_or(DType::I32));
            let types = std::iter::once(m).chain(std::iter::repeat_n(MType::Index, indices.len()));
            (std::iter::once(memref).chain(indices).collect(), types.collect(), element)
        }
        Family::Reduce => {
            // `<add>, %x, %acc [1] : X to A`.
            let (head, tys) = rest.split_once(" : ").ok_or_else(|| e("no types".into()))?;
            if !head.starts_with('<') {
                return at.fail("a reduction starts with its `<kind>`");
            }
            let c = close_of(head, 0).map_err(e)?;
            attrs.insert("kind", &format!("#vector.kind{}", &head[..=c])).map_err(e)?;
            let ops = head[c + 1..].trim_start().strip_prefix(',').unwrap_or_default();
            let (ops, dims) = ops.split_once(" [").ok_or_else(|| e("no `[dims]`".into()))?;
            let dims = dims.strip_suffix(']').ok_or_else(|| e("no `]`".into()))?;
            let dims = if dims.trim().is_empty() {
                "array<i64>".to_owned()
            } else {
                format!("array<i64: {dims}>")
            };
            attrs.insert("reduction_dims", &dims).map_err(e)?;
            let (x, acc) = tys.split_once(" to ").ok_or_else(|| e("no ` to `".into()))?;
            let acc = parse_type(acc).map_err(e)?;
            let types = vec![parse_type(x).map_err(e)?, acc.clone()];
            (value_names(ops).map_err(e)?, types, acc)
        }
        Family::Iota => {
            // `{dimensions = array<i32: 1>} : T`.
            let spaced = format!(" {rest}");
            let (ops, a, after) = with_attrs(&spaced).map_err(e)?;
            if !ops.is_empty() {
                return at.fail("an iota has no operands");
            }
            attrs = a;
            (Vec::new(), Vec::new(), parse_type(types_after(after).map_err(e)?).map_err(e)?)
        }
        Family::AssumeMultiple => {
            // `%x, 8 : i32`.
            let (ops, ty) = rest.rsplit_once(" : ").ok_or_else(|| e("no type".into()))?;
            let (x, by) = ops.split_once(", ").ok_or_else(|| e("no multiple".into()))?;
            attrs.insert("multiple", &format!("{} : i32", by.trim())).map_err(e)?;
            let ty = parse_type(ty).map_err(e)?;
            (vec![value_name(x).map_err(e)?], vec![ty.clone()], ty)
        }
        Family::Matmul => {
            // `%a, %b, %c {attrs} : L, R, A -> T`.
            let (ops, a, after) = with_attrs(rest).map_err(e)?;
            attrs = a;
            let tys = types_after(after).map_err(e)?;
            let (ins, out) = tys.split_once(" -> ").ok_or_else(|| e("no ` -> `".into()))?;
            let types = parse_types(ins).map_err(e)?;
            (value_names(ops).map_err(e)?, types, parse_type(out).map_err(e)?)
        }
        Family::If
        | Family::For
        | Family::Yield
        | Family::Return
        | Family::Store
        | Family::ScalarStore => {
            return at.fail(format!("`{name}` gives no result"));
        }
    };
    let mut g = generic(at, name, operands, operand_types);
    g.results = vec![result];
    g.result_types = vec![result_type];
    g.attrs = attrs;
    Ok(g)
}
