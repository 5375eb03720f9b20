//! The shipped form: the `stable_mosaic` serialization in MLIR's generic syntax. One
//! `"builtin.module"() ({ ... }) {stable_mosaic.version = N : i64} : () -> ()` holds
//! `"stable_mosaic.func.func"` ops (their `sym_name` and `function_type` attributes, one block
//! whose arguments are the parameters); every other op is `[%r = ]"stable_mosaic.<dialect>.<op>"
//! (operands) [({ regions })] [{attributes}] : (types) -> results`, on one line but for its
//! regions.
//! Each op is read as it stands into the generic op record ([`Generic`]), its name demangled;
//! what an op means is decided once for both forms ([`super::ops::normalise`]).

use super::ops::{Block, FuncText, Generic, ModuleText};
use super::text::{
    At, Attrs, close_of, int_attr, numbered, parse_fn_type, parse_type, split_top, string_literal,
    strip_loc, value_name, value_names,
};

const PREFIX: &str = "stable_mosaic.";

/// The `stable_mosaic.version`s read: jaxlib serializes the printed op subset identically from
/// 15 (what `jax.export` stamps and the printer writes) to 18 (the newest jaxlib 0.12 writes);
/// what libtpu's upgrade rules make of other versions is not modelled.
const VERSIONS: std::ops::RangeInclusive<i64> = 15..=18;

struct Lines {
    lines: Vec<At>,
    pos: usize,
}

impl Lines {
    fn peek(&self) -> Option<&At> {
        self.lines.get(self.pos)
    }

    fn next(&mut self, what: &str) -> Result<At, String> {
        let at = self.lines.get(self.pos).cloned();
        self.pos += 1;
        at.ok_or_else(|| format!("the body ends inside {what}"))
    }
}

/// Reads the shipped form's module.
pub(super) fn parse(body: &str) -> Result<ModuleText, String> {
    let mut p = Lines { lines: numbered(body), pos: 0 };
    let mut top = op(&mut p)?;
    if let Some(at) = p.peek() {
        return at.fail("text after the module");
    }
    let at = top.at.clone();
    if top.name != "builtin.module" {
        return at.fail("the shipped form is one `\"builtin.module\"`");
    }
    if !top.operands.is_empty() || !top.results.is_empty() || top.regions.len() != 1 {
        return at.fail("a module has one region, and no operands or results");
    }
    let version = top.attrs.take("stable_mosaic.version").ok_or_else(|| {
        at.error("no `stable_mosaic.version` (libtpu: Missing or invalid version attribute)")
    })?;
    let version = int_attr(&version, "i64").map_err(|e| at.error(e))?;
    if !VERSIONS.contains(&version) {
        return at.fail(format!(
            "stable_mosaic.version {version}: the interpreter reads versions {} to {}",
            VERSIONS.start(),
            VERSIONS.end()
        ));
    }
    std::mem::take(&mut top.attrs).finish("builtin.module").map_err(|e| at.error(e))?;
    let region = top.regions.pop().unwrap_or_default();
    if !region.args.is_empty() {
        return at.fail("a module's block has no arguments");
    }
    let funcs = region.ops.into_iter().map(func).collect::<Result<_, _>>()?;
    Ok(ModuleText { funcs })
}

/// A `"stable_mosaic.func.func"` op as a function (named, in errors, by the line that closes
/// it: where its attributes and type are).
fn func(mut g: Generic) -> Result<FuncText, String> {
    let at = g.attrs_at.clone();
    let e = |what: String| at.error(what);
    if g.name != "func.func" {
        return at.fail(format!("a module holds `{PREFIX}func.func`s only, not `{}`", g.name));
    }
    if !g.operands.is_empty() || !g.results.is_empty() || g.regions.len() != 1 {
        return at.fail("a function has one region, and no operands or results");
    }
    let name = string_literal(&g.attrs.require("sym_name", "func.func").map_err(e)?).map_err(e)?;
    let function_type = g.attrs.require("function_type", "func.func").map_err(e)?;
    let (ins, results) = parse_fn_type(&function_type).map_err(e)?;
    let block = g.regions.pop().unwrap_or_default();
    let arg_types: Vec<_> = block.args.iter().map(|(_, t)| t.clone()).collect();
    if arg_types != ins {
        let list = |ts: &[crate::mosaic::types::MType]| {
            ts.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        };
        return at.fail(format!(
            "@{name}: its function_type takes ({}) but its block arguments are ({})",
            list(&ins),
            list(&arg_types)
        ));
    }
    terminated(&block.ops)?;
    Ok(FuncText { at, name, args: block.args, results, attrs: g.attrs, body: block.ops })
}

/// Generic syntax has no implicit terminators: the regions of `scf.if` and `scf.for` end with
/// their `scf.yield`, but for an empty else region.
fn terminated(ops: &[Generic]) -> Result<(), String> {
    for g in ops.iter().filter(|g| g.name == "scf.if" || g.name == "scf.for") {
        for (i, r) in g.regions.iter().enumerate() {
            let ends = r.ops.last().is_some_and(|o| o.name == "scf.yield");
            if !ends && (i == 0 || !r.ops.is_empty()) {
                return g
                    .at
                    .fail(format!("region {i} of `{PREFIX}{}` without its scf.yield", g.name));
            }
            terminated(&r.ops)?;
        }
    }
    Ok(())
}

/// A region's block: `^bb0(%a: T, ...):` if it has arguments, then ops up to the line that
/// closes the region (not taken).
fn block(p: &mut Lines) -> Result<Block, String> {
    let mut b = Block::default();
    if let Some(at) = p.peek().cloned()
        && let Some(label) = strip_loc(&at.text).strip_prefix('^')
    {
        let e = |what: String| at.error(what);
        let open = label.find('(').ok_or_else(|| e("a block label without arguments".into()))?;
        let close = close_of(label, open).map_err(e)?;
        if label[close + 1..].trim() != ":" {
            return at.fail("a block label ends with `):`");
        }
        for arg in split_top(&label[open + 1..close]).map_err(e)? {
            let (n, t) = arg.split_once(':').ok_or_else(|| e(format!("bad argument `{arg}`")))?;
            b.args.push((value_name(n).map_err(e)?, parse_type(t).map_err(e)?));
        }
        p.pos += 1;
    }
    loop {
        let at = p.peek().ok_or("the body ends inside a region")?;
        if strip_loc(&at.text).starts_with('}') {
            return Ok(b);
        }
        b.ops.push(op(p)?);
    }
}

/// One op, with its regions.
fn op(p: &mut Lines) -> Result<Generic, String> {
    let at = p.next("an op")?;
    let l = strip_loc(&at.text).to_owned();
    let e = |what: String| at.error(what);
    let (results, rest) = match l.split_once(" = ") {
        Some((r, rest)) if l.starts_with('%') => (value_names(r).map_err(e)?, rest),
        _ => (Vec::new(), l.as_str()),
    };
    let quoted = rest.strip_prefix('"').ok_or_else(|| e("not a generic op".into()))?;
    let end = quoted.find('"').ok_or_else(|| e("an unterminated op name".into()))?;
    let raw = &quoted[..end];
    let name = if raw == "builtin.module" {
        raw
    } else {
        raw.strip_prefix(PREFIX).ok_or_else(|| {
            e(format!(
                "`{raw}` is not in the stable_mosaic serialization (libtpu: Operation not in a \
                 serialized form)"
            ))
        })?
    };
    let rest = &quoted[end + 1..];
    if !rest.starts_with('(') {
        return at.fail("no operand list after the op name");
    }
    let c = close_of(rest, 0).map_err(e)?;
    let operands = value_names(&rest[1..c]).map_err(e)?;
    let mut tail = rest[c + 1..].trim().to_owned();
    let mut close_at = at.clone();
    let mut regions = Vec::new();
    if tail == "({" {
        loop {
            regions.push(block(p)?);
            let closer = p.next("a region")?;
            let c = strip_loc(&closer.text);
            if c == "}, {" {
                continue;
            }
            let Some(t) = c.strip_prefix("})") else {
                return closer.fail("a region ends with `}, {` or `})`");
            };
            tail = t.trim().to_owned();
            close_at = closer;
            break;
        }
    }
    let ce = |what: String| close_at.error(what);
    let mut t = tail.as_str();
    if t.starts_with("<{") {
        return close_at.fail("op properties (`<{...}>`) are not read");
    }
    let mut attrs = Attrs::default();
    if t.starts_with('{') {
        let c = close_of(t, 0).map_err(ce)?;
        attrs = Attrs::parse(&t[..=c]).map_err(ce)?;
        t = t[c + 1..].trim_start();
    }
    let sig = t.strip_prefix(':').ok_or_else(|| ce("no ` : ` function type".into()))?;
    let (operand_types, result_types) = parse_fn_type(sig).map_err(ce)?;
    Ok(Generic {
        at,
        attrs_at: close_at,
        results,
        name: name.to_owned(),
        operands,
        operand_types,
        result_types,
        attrs,
        regions,
    })
}
