//! The op record both forms are read into, and what it means.
//!
//! Each form's reader turns its lines into [`Generic`] ops: MLIR's generic view of an op (its
//! name without the `stable_mosaic.` prefix, operands and their types, result types, inherent
//! attributes, regions). The shipped form spells that out; the readable form's custom syntax is
//! turned into it (`arith.cmpi eq, %a, %b : i32` has `predicate = 0 : i64` and types
//! `(i32, i32) -> i1`). [`normalise`] then checks each op once for both forms, the way MLIR's
//! parser and verifiers would (every operand defined before its use with the type the line says,
//! each name defined once, operand and result types that fit the op, the attributes it needs and
//! no others), and decodes it into an [`Instr`] the executor runs.

use std::collections::BTreeMap;

use crate::types::DType;

use super::super::types::{MType, MemorySpace};
use super::text::{At, Attrs, bool_attr, constant, dense_array, enum_attr, int_list, list_attr};

/// An op as MLIR's generic syntax has it.
#[derive(Debug)]
pub(super) struct Generic {
    pub at: At,
    /// Where its attributes and types are printed: `at`, or the line closing its regions.
    pub attrs_at: At,
    pub results: Vec<String>,
    /// `dialect.op`, without the `stable_mosaic.` prefix.
    pub name: String,
    pub operands: Vec<String>,
    pub operand_types: Vec<MType>,
    pub result_types: Vec<MType>,
    pub attrs: Attrs,
    pub regions: Vec<Block>,
}

/// A region's single block (an empty region has no arguments and no ops).
#[derive(Debug, Default)]
pub(super) struct Block {
    pub args: Vec<(String, MType)>,
    pub ops: Vec<Generic>,
}

/// A `func.func` as read: the attributes are the function's own (`sym_name` and
/// `function_type` already read into `name`, `args` and `results`).
#[derive(Debug)]
pub(super) struct FuncText {
    pub at: At,
    pub name: String,
    pub args: Vec<(String, MType)>,
    pub results: Vec<MType>,
    pub attrs: Attrs,
    pub body: Vec<Generic>,
}

/// A Mosaic module as read: its functions.
#[derive(Debug)]
pub(super) struct ModuleText {
    pub funcs: Vec<FuncText>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    DivSI,
    Max,
    Min,
    Rem,
    Pow,
    Atan2,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Un {
    Neg,
    Exp,
    Log,
    Tanh,
    Rsqrt,
    Sqrt,
    Erf,
    Abs,
    Log1p,
    Sin,
    Cos,
    Floor,
    Ceil,
}

/// A comparison; `ordered` for `arith.cmpf`'s `o*` predicates (false when either side is NaN).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Pred {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Combiner {
    Add,
    Max,
}

/// Which syntax family an op is printed in (the readable form's custom syntax differs per
/// family; the generic form has one syntax for all).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Family {
    Constant,
    /// `%a, %b : T`, float (`f`) or integer.
    Binary(Bin, bool),
    /// `%x : T`.
    Unary(Un),
    /// `pred, %a, %b : T`, float or integer.
    Compare(bool),
    Select,
    /// `%x : A to B`.
    Cast,
    Load,
    Store,
    /// `memref.load %m[indices] : M`.
    ScalarLoad,
    /// `memref.store %v, %m[indices] : M`.
    ScalarStore,
    Reduce,
    Matmul,
    Iota,
    AssumeMultiple,
    If,
    For,
    Yield,
    Return,
}

const BINARY: [(&str, Bin, bool); 16] = [
    ("arith.addf", Bin::Add, true),
    ("arith.subf", Bin::Sub, true),
    ("arith.mulf", Bin::Mul, true),
    ("arith.divf", Bin::Div, true),
    ("arith.maximumf", Bin::Max, true),
    ("arith.minimumf", Bin::Min, true),
    ("arith.addi", Bin::Add, false),
    ("arith.subi", Bin::Sub, false),
    ("arith.muli", Bin::Mul, false),
    ("arith.divsi", Bin::DivSI, false),
    ("arith.maxsi", Bin::Max, false),
    ("arith.minsi", Bin::Min, false),
    ("arith.remf", Bin::Rem, true),
    ("arith.remsi", Bin::Rem, false),
    ("math.powf", Bin::Pow, true),
    ("math.atan2", Bin::Atan2, true),
];

const UNARY: [(&str, Un); 13] = [
    ("arith.negf", Un::Neg),
    ("math.exp", Un::Exp),
    ("math.log", Un::Log),
    ("math.tanh", Un::Tanh),
    ("math.rsqrt", Un::Rsqrt),
    ("math.sqrt", Un::Sqrt),
    ("math.erf", Un::Erf),
    ("math.absf", Un::Abs),
    ("math.log1p", Un::Log1p),
    ("math.sin", Un::Sin),
    ("math.cos", Un::Cos),
    ("math.floor", Un::Floor),
    ("math.ceil", Un::Ceil),
];

const CASTS: [&str; 6] = [
    "arith.extf",
    "arith.truncf",
    "arith.sitofp",
    "arith.index_cast",
    "vector.shape_cast",
    "vector.broadcast",
];

/// `arith.cmpi` predicates by number (`arith::CmpIPredicate`; the unsigned ones are not read).
const CMPI: [(&str, Pred); 6] = [
    ("eq", Pred::Eq),
    ("ne", Pred::Ne),
    ("slt", Pred::Lt),
    ("sle", Pred::Le),
    ("sgt", Pred::Gt),
    ("sge", Pred::Ge),
];

/// `arith.cmpf` predicates by number, from 1 (`arith::CmpFPredicate`: 0 is `false`; the
/// unordered ones are not read).
const CMPF: [(&str, Pred); 6] = [
    ("oeq", Pred::Eq),
    ("ogt", Pred::Gt),
    ("oge", Pred::Ge),
    ("olt", Pred::Lt),
    ("ole", Pred::Le),
    ("one", Pred::Ne),
];

/// The syntax family of op `name` (`dialect.op`), if the interpreter reads it.
pub(super) fn family(name: &str) -> Option<Family> {
    if let Some((_, b, f)) = BINARY.iter().find(|(n, ..)| *n == name) {
        return Some(Family::Binary(*b, *f));
    }
    if let Some((_, u)) = UNARY.iter().find(|(n, _)| *n == name) {
        return Some(Family::Unary(*u));
    }
    if CASTS.contains(&name) {
        return Some(Family::Cast);
    }
    Some(match name {
        "arith.constant" => Family::Constant,
        "arith.cmpi" => Family::Compare(false),
        "arith.cmpf" => Family::Compare(true),
        "arith.select" => Family::Select,
        "vector.load" => Family::Load,
        "tpu.vector_store" => Family::Store,
        "memref.load" => Family::ScalarLoad,
        "memref.store" => Family::ScalarStore,
        "vector.multi_reduction" => Family::Reduce,
        "tpu.matmul" => Family::Matmul,
        "tpu.iota" => Family::Iota,
        "tpu.assume_multiple" => Family::AssumeMultiple,
        "scf.if" => Family::If,
        "scf.for" => Family::For,
        "scf.yield" => Family::Yield,
        "func.return" => Family::Return,
        _ => return None,
    })
}

/// The number of a comparison predicate's name (`eq` → 0 for `arith.cmpi`, `oeq` → 1 for
/// `arith.cmpf`): how the generic form spells it.
pub(super) fn predicate_number(float: bool, name: &str) -> Option<i64> {
    if float {
        CMPF.iter().position(|(n, _)| *n == name).map(|i| i as i64 + 1)
    } else {
        CMPI.iter().position(|(n, _)| *n == name).map(|i| i as i64)
    }
}

fn predicate(float: bool, number: i64) -> Option<Pred> {
    let table: &[(&str, Pred)] = if float { &CMPF } else { &CMPI };
    let i = if float { number - 1 } else { number };
    usize::try_from(i).ok().and_then(|i| table.get(i)).map(|(_, p)| *p)
}

/// An op, decoded: what the executor runs.
#[derive(Debug)]
pub(super) enum Kind {
    Constant(f64),
    Binary(Bin),
    Unary(Un),
    Compare(Pred),
    Select,
    /// `arith.extf`, `arith.truncf`, `arith.sitofp`, `arith.index_cast`, `vector.shape_cast`:
    /// the same elements in the result type.
    Cast,
    Broadcast,
    /// `vector.load %memref[indices]`.
    Load,
    /// `tpu.vector_store %value, %memref[indices]`.
    Store,
    /// `memref.load %memref[indices]`: one element.
    ScalarLoad,
    /// `memref.store %value, %memref[indices]`: one element.
    ScalarStore,
    Reduce {
        combiner: Combiner,
        dims: Vec<usize>,
    },
    /// `acc + lhs · rhs` contracting lhs dim `lhs` with rhs dim `rhs` (the dims as Mosaic
    /// canonicalises them: see [`matmul_dims`]).
    Matmul {
        lhs: usize,
        rhs: usize,
    },
    /// Each element's index along dim `dim`.
    Iota {
        dim: usize,
    },
    /// The operand, promised to be a multiple of this.
    AssumeMultiple(i64),
    If {
        then: Vec<Instr>,
        other: Vec<Instr>,
    },
    /// `body` for `iv` from the first operand, by the third, below the second.
    For {
        iv: String,
        body: Vec<Instr>,
    },
    Yield,
    Return,
}

#[derive(Debug)]
pub(super) struct Instr {
    pub at: At,
    pub result: Option<(String, MType)>,
    pub operands: Vec<String>,
    pub kind: Kind,
}

/// A function, checked and decoded.
#[derive(Debug)]
pub(super) struct Func {
    pub at: At,
    pub name: String,
    pub args: Vec<(String, MType)>,
    pub results: Vec<MType>,
    pub attrs: Attrs,
    pub body: Vec<Instr>,
}

/// The values in scope: their types, and the order they were defined in (to close a region).
#[derive(Default)]
struct Scope {
    types: BTreeMap<String, MType>,
    order: Vec<String>,
}

impl Scope {
    fn define(&mut self, at: &At, name: &str, ty: &MType) -> Result<(), String> {
        if self.types.insert(name.to_owned(), ty.clone()).is_some() {
            return at.fail(format!("`{name}` is defined twice"));
        }
        self.order.push(name.to_owned());
        Ok(())
    }

    fn close(&mut self, mark: usize) {
        for name in self.order.drain(mark..) {
            self.types.remove(&name);
        }
    }
}

/// Checks and decodes `f`.
pub(super) fn normalise(f: FuncText) -> Result<Func, String> {
    let mut scope = Scope::default();
    for (name, ty) in &f.args {
        scope.define(&f.at, name, ty)?;
    }
    let body = block(f.body, &mut scope)?;
    match body.last() {
        Some(Instr { kind: Kind::Return, operands, at, .. }) => {
            let types: Vec<MType> =
                operands.iter().filter_map(|o| scope.types.get(o)).cloned().collect();
            if types != f.results {
                let list = |ts: &[MType]| {
                    ts.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
                };
                return at.fail(format!(
                    "@{} returns ({}) but its type says ({})",
                    f.name,
                    list(&types),
                    list(&f.results)
                ));
            }
        }
        _ => return f.at.fail(format!("@{} does not end with a `func.return`", f.name)),
    }
    Ok(Func { at: f.at, name: f.name, args: f.args, results: f.results, attrs: f.attrs, body })
}

fn block(ops: Vec<Generic>, scope: &mut Scope) -> Result<Vec<Instr>, String> {
    let n = ops.len();
    let mut out = Vec::with_capacity(n);
    for (i, mut g) in ops.into_iter().enumerate() {
        if g.operands.len() != g.operand_types.len() || g.results.len() != g.result_types.len() {
            return g.at.fail(format!(
                "{} operands and {} results, but {} operand and {} result types",
                g.operands.len(),
                g.results.len(),
                g.operand_types.len(),
                g.result_types.len()
            ));
        }
        for (name, ty) in g.operands.iter().zip(&g.operand_types) {
            match scope.types.get(name) {
                None => return g.at.fail(format!("`{name}` is not defined here")),
                Some(t) if t != ty => {
                    return g.at.fail(format!("`{name}` has type {t}, the line says {ty}"));
                }
                Some(_) => {}
            }
        }
        let kind = decode(&mut g, scope)?;
        if matches!(kind, Kind::Yield | Kind::Return) && i + 1 != n {
            return g.at.fail("a terminator before the end of its block");
        }
        let result = match (g.results.pop(), g.result_types.pop()) {
            (Some(name), Some(ty)) => {
                scope.define(&g.at, &name, &ty)?;
                Some((name, ty))
            }
            _ => None,
        };
        out.push(Instr { at: g.at, result, operands: g.operands, kind });
    }
    Ok(out)
}

/// A region's ops, its block's arguments (`args`: their types) defined inside it only.
fn region(
    b: Block,
    scope: &mut Scope,
    at: &At,
    op: &str,
    args: &[MType],
) -> Result<(Vec<String>, Vec<Instr>), String> {
    let types: Vec<&MType> = b.args.iter().map(|(_, t)| t).collect();
    if types.len() != args.len() || types.iter().zip(args).any(|(a, b)| *a != b) {
        return at.fail(format!("an `{op}` region whose block takes {types:?}, not {args:?}"));
    }
    let mark = scope.order.len();
    for (name, ty) in &b.args {
        scope.define(at, name, ty)?;
    }
    let body = block(b.ops, scope)?;
    scope.close(mark);
    if body.iter().any(|i| matches!(i.kind, Kind::Return)) {
        return at.fail(format!("a `func.return` inside an `{op}`"));
    }
    Ok((b.args.into_iter().map(|(n, _)| n).collect(), body))
}

fn same_shape(a: &MType, b: &MType) -> bool {
    a.is_vector() == b.is_vector() && a.shape() == b.shape()
}

fn in_space(t: &MType, space: MemorySpace) -> bool {
    matches!(t, MType::MemRef { space: s, .. } if *s == space)
}

/// `indices` are one `index` per dim of `memref`.
fn indexes(memref: &MType, indices: &[MType]) -> bool {
    indices.len() == memref.shape().len() && indices.iter().all(|t| *t == MType::Index)
}

fn float(t: &MType) -> bool {
    t.dtype().is_some_and(DType::is_float)
}

fn integer(t: &MType) -> bool {
    t.dtype().is_none_or(DType::is_integer)
}

/// An optional flags attribute that must say `none` (other flags change the numbers).
fn flags(g: &mut Generic, key: &str, none: &str) -> Result<(), String> {
    match g.attrs.take(key) {
        Some(v) if v != none => g.at.fail(format!("`{key} = {v}`: only `{none}` is read")),
        _ => Ok(()),
    }
}

fn decode(g: &mut Generic, scope: &mut Scope) -> Result<Kind, String> {
    let at = g.at.clone();
    let name = g.name.clone();
    let family =
        family(&name).ok_or_else(|| at.error(format!("the interpreter does not know `{name}`")))?;
    let arity = |g: &Generic, operands: usize, results: usize| {
        if g.operands.len() == operands && g.results.len() == results {
            Ok(())
        } else {
            at.fail(format!(
                "`{name}` takes {operands} operands and gives {results} results, not {} and {}",
                g.operands.len(),
                g.results.len()
            ))
        }
    };
    let fail = |what: String| -> Result<Kind, String> { at.fail(format!("`{name}`: {what}")) };
    let kind = match family {
        Family::Constant => {
            arity(g, 0, 1)?;
            let v = g.attrs.require("value", &name).map_err(|e| at.error(e))?;
            let (x, ty) = constant(&v).map_err(|e| at.error(e))?;
            if ty != g.result_types[0] {
                return fail(format!("a {ty} value for a {} result", g.result_types[0]));
            }
            Kind::Constant(x)
        }
        Family::Binary(op, is_float) => {
            arity(g, 2, 1)?;
            let t = &g.operand_types[0];
            if g.operand_types[1] != *t || g.result_types[0] != *t {
                return fail("operands and result of different types".into());
            }
            if t.is_memref() || (if is_float { !float(t) } else { !integer(t) }) {
                return fail(format!("not an op on {t}"));
            }
            if is_float {
                flags(g, "fastmath", "#arith.fastmath<none>")?;
            } else if matches!(op, Bin::Add | Bin::Sub | Bin::Mul) {
                flags(g, "overflowFlags", "#arith.overflow<none>")?;
            }
            Kind::Binary(op)
        }
        Family::Unary(op) => {
            arity(g, 1, 1)?;
            let t = &g.operand_types[0];
            if g.result_types[0] != *t || t.is_memref() || !float(t) {
                return fail(format!("not an op from {t} to {}", g.result_types[0]));
            }
            flags(g, "fastmath", "#arith.fastmath<none>")?;
            Kind::Unary(op)
        }
        Family::Compare(is_float) => {
            arity(g, 2, 1)?;
            let (t, r) = (&g.operand_types[0], &g.result_types[0]);
            let bad_type = if is_float { !float(t) } else { !integer(t) };
            if g.operand_types[1] != *t
                || t.is_memref()
                || bad_type
                || r.dtype() != Some(DType::Bool)
                || !same_shape(t, r)
            {
                return fail(format!("not a comparison of {t} giving {r}"));
            }
            let p = g.attrs.require("predicate", &name).map_err(|e| at.error(e))?;
            let number = super::text::int_attr(&p, "i64").map_err(|e| at.error(e))?;
            if is_float {
                flags(g, "fastmath", "#arith.fastmath<none>")?;
            }
            Kind::Compare(
                predicate(is_float, number)
                    .ok_or_else(|| at.error(format!("predicate {number} is not read")))?,
            )
        }
        Family::Select => {
            arity(g, 3, 1)?;
            let [c, a, b] = [&g.operand_types[0], &g.operand_types[1], &g.operand_types[2]];
            let cond_ok = c.dtype() == Some(DType::Bool)
                && (matches!(c, MType::Scalar(_)) || same_shape(c, a));
            if !cond_ok || a != b || g.result_types[0] != *a || a.is_memref() {
                return fail(format!("not a select of {c}, {a}, {b}"));
            }
            Kind::Select
        }
        Family::Cast => {
            arity(g, 1, 1)?;
            let (from, to) = (&g.operand_types[0].clone(), &g.result_types[0].clone());
            let bits = |t: &MType| t.dtype().map_or(64, DType::bits);
            let ok = match name.as_str() {
                "arith.sitofp" => {
                    let int = from.dtype().is_some_and(DType::is_integer);
                    int && float(to) && same_shape(from, to) && !from.is_memref()
                }
                "arith.extf" | "arith.truncf" => {
                    let wider = if name == "arith.extf" {
                        bits(to) > bits(from)
                    } else {
                        bits(to) < bits(from)
                    };
                    flags(g, "fastmath", "#arith.fastmath<none>")?;
                    float(from) && float(to) && wider && same_shape(from, to)
                }
                "arith.index_cast" => {
                    let index = |t: &MType| t.dtype().is_none();
                    let i32s = |t: &MType| t.dtype() == Some(DType::I32);
                    ((index(from) && i32s(to)) || (i32s(from) && index(to)))
                        && same_shape(from, to)
                        && !from.is_memref()
                }
                "vector.shape_cast" => {
                    from.is_vector()
                        && to.is_vector()
                        && from.dtype() == to.dtype()
                        && from.shape().iter().product::<u64>() == to.shape().iter().product()
                }
                _ => {
                    // vector.broadcast: a scalar, or a vector whose dims (aligned at the end)
                    // are 1 or the result's.
                    let lead = to.shape().len().checked_sub(from.shape().len());
                    to.is_vector()
                        && !from.is_memref()
                        && from.dtype() == to.dtype()
                        && lead.is_some_and(|lead| {
                            from.shape()
                                .iter()
                                .zip(&to.shape()[lead..])
                                .all(|(f, t)| *f == 1 || f == t)
                        })
                }
            };
            if !ok {
                return fail(format!("not a cast from {from} to {to}"));
            }
            if name == "vector.broadcast" { Kind::Broadcast } else { Kind::Cast }
        }
        Family::Load => {
            if g.results.len() != 1 || g.operands.is_empty() {
                return fail("a load takes a memref and its indices".into());
            }
            let (m, v) = (&g.operand_types[0], &g.result_types[0]);
            if !in_space(m, MemorySpace::Vmem)
                || !v.is_vector()
                || m.dtype() != v.dtype()
                || m.shape().len() != v.shape().len()
                || g.operand_types.len() != 1 + m.shape().len()
                || g.operand_types[1..].iter().any(|t| *t != MType::Index)
            {
                return fail(format!("not a load of {v} from {m} at index indices"));
            }
            Kind::Load
        }
        Family::Store => {
            if !g.results.is_empty() || g.operands.len() < 2 {
                return fail("a store takes a value, a memref and its indices".into());
            }
            let (v, m) = (&g.operand_types[0], &g.operand_types[1]);
            let rank = m.shape().len();
            if !in_space(m, MemorySpace::Vmem)
                || !v.is_vector()
                || m.dtype() != v.dtype()
                || rank != v.shape().len()
                || g.operand_types.len() != 2 + rank
                || g.operand_types[2..].iter().any(|t| *t != MType::Index)
            {
                return fail(format!("not a store of {v} into {m} at index indices"));
            }
            let segments =
                g.attrs.require("operandSegmentSizes", &name).map_err(|e| at.error(e))?;
            let segments = dense_array(&segments, "i32").map_err(|e| at.error(e))?;
            if segments != [1, 1, rank as i64, 0] {
                return fail(format!(
                    "operandSegmentSizes {segments:?} for a value, a memref and {rank} indices"
                ));
            }
            let strides = g.attrs.require("strides", &name).map_err(|e| at.error(e))?;
            if !dense_array(&strides, "i32").map_err(|e| at.error(e))?.is_empty() {
                return fail(format!("strides {strides} are not read"));
            }
            if let Some(add) = g.attrs.take("add")
                && bool_attr(&add).map_err(|e| at.error(e))?
            {
                return fail("`add = true` is not read".into());
            }
            Kind::Store
        }
        Family::ScalarLoad => {
            if g.results.len() != 1 || g.operands.is_empty() {
                return fail("a load takes a memref and its indices".into());
            }
            let (m, r) = (&g.operand_types[0], &g.result_types[0]);
            let element = m.dtype().map(MType::Scalar);
            if !in_space(m, MemorySpace::Smem)
                || element.as_ref() != Some(r)
                || !indexes(m, &g.operand_types[1..])
            {
                return fail(format!("not a load of one {r} from SMEM {m} at index indices"));
            }
            Kind::ScalarLoad
        }
        Family::ScalarStore => {
            if !g.results.is_empty() || g.operands.len() < 2 {
                return fail("a store takes a value, a memref and its indices".into());
            }
            let (v, m) = (&g.operand_types[0], &g.operand_types[1]);
            let element = m.dtype().map(MType::Scalar);
            if !in_space(m, MemorySpace::Smem)
                || element.as_ref() != Some(v)
                || !indexes(m, &g.operand_types[2..])
            {
                return fail(format!("not a store of one {v} into SMEM {m} at index indices"));
            }
            Kind::ScalarStore
        }
        Family::Reduce => {
            arity(g, 2, 1)?;
            let (x, acc, r) = (&g.operand_types[0], &g.operand_types[1], &g.result_types[0]);
            let kind = g.attrs.require("kind", &name).map_err(|e| at.error(e))?;
            let combiner = match enum_attr(&kind, "#vector.kind").map_err(|e| at.error(e))? {
                "add" => Combiner::Add,
                "maximumf" if float(x) => Combiner::Max,
                "maxsi" if integer(x) => Combiner::Max,
                other => return fail(format!("combiner `{other}` is not read for {x}")),
            };
            let dims = g.attrs.require("reduction_dims", &name).map_err(|e| at.error(e))?;
            let dims = dense_array(&dims, "i64").map_err(|e| at.error(e))?;
            let rank = x.shape().len() as i64;
            if !dims.windows(2).all(|w| w[0] < w[1]) || dims.iter().any(|d| *d < 0 || *d >= rank) {
                return fail(format!("reduction dims {dims:?} of a rank-{rank} vector"));
            }
            let kept: Vec<u64> =
                (0..rank).filter(|d| !dims.contains(d)).map(|d| x.shape()[d as usize]).collect();
            let want = if kept.is_empty() {
                x.dtype().map(MType::Scalar)
            } else {
                x.dtype().map(|d| MType::vector(d, &kept))
            };
            if !x.is_vector() || want.as_ref() != Some(acc) || r != acc {
                return fail(format!("a reduction of {x} over {dims:?} into {acc}"));
            }
            Kind::Reduce { combiner, dims: dims.into_iter().map(|d| d as usize).collect() }
        }
        Family::Matmul => {
            arity(g, 3, 1)?;
            let (lhs, rhs) = matmul_dims(g).map_err(|e| at.error(format!("`{name}`: {e}")))?;
            Kind::Matmul { lhs, rhs }
        }
        Family::Iota => {
            arity(g, 0, 1)?;
            let t = &g.result_types[0];
            let dims = g.attrs.require("dimensions", &name).map_err(|e| at.error(e))?;
            let dims = dense_array(&dims, "i32").map_err(|e| at.error(e))?;
            let rank = t.shape().len();
            let [dim] = dims[..] else {
                return fail(format!("dimensions {dims:?}: one dim is read"));
            };
            let dim = usize::try_from(dim).ok().filter(|d| *d < rank);
            match dim {
                Some(dim) if t.is_vector() && t.dtype() == Some(DType::I32) => Kind::Iota { dim },
                _ => return fail(format!("an iota along {dims:?} of {t}")),
            }
        }
        Family::AssumeMultiple => {
            arity(g, 1, 1)?;
            let t = &g.operand_types[0];
            if *t != MType::Scalar(DType::I32) || g.result_types[0] != *t {
                return fail(format!("a multiple-of hint on {t}"));
            }
            let by = g.attrs.require("multiple", &name).map_err(|e| at.error(e))?;
            let by = super::text::int_attr(&by, "i32").map_err(|e| at.error(e))?;
            if by <= 0 {
                return fail(format!("a multiple of {by}"));
            }
            Kind::AssumeMultiple(by)
        }
        Family::If => {
            arity(g, 1, 0)?;
            if g.operand_types[0] != MType::Scalar(DType::Bool) {
                return fail(format!("a condition of type {}", g.operand_types[0]));
            }
            if g.regions.is_empty() || g.regions.len() > 2 {
                return fail(format!("{} regions", g.regions.len()));
            }
            let mut regions = std::mem::take(&mut g.regions).into_iter();
            let (_, then) = region(regions.next().unwrap_or_default(), scope, &at, &name, &[])?;
            let (_, other) = region(regions.next().unwrap_or_default(), scope, &at, &name, &[])?;
            Kind::If { then, other }
        }
        Family::For => {
            arity(g, 3, 0)?;
            let t = g.operand_types[0].clone();
            if t != MType::Scalar(DType::I32) || g.operand_types.iter().any(|o| *o != t) {
                return fail(format!("bounds and step of types {:?}", g.operand_types));
            }
            if g.regions.len() != 1 {
                return fail(format!("{} regions", g.regions.len()));
            }
            let body = std::mem::take(&mut g.regions).pop().unwrap_or_default();
            let (mut ivs, body) = region(body, scope, &at, &name, &[t])?;
            Kind::For { iv: ivs.pop().unwrap_or_default(), body }
        }
        Family::Yield => {
            arity(g, 0, 0)?;
            Kind::Yield
        }
        Family::Return => {
            if !g.results.is_empty() {
                return fail("a return with results".into());
            }
            Kind::Return
        }
    };
    if !matches!(family, Family::If | Family::For) && !g.regions.is_empty() {
        return at.fail(format!("`{name}` with regions"));
    }
    std::mem::take(&mut g.attrs).finish(&name).map_err(|e| at.error(e))?;
    Ok(kind)
}

/// The contracting dims of a 2-D `tpu.matmul`, as Mosaic canonicalises the op
/// (`canonicalize_matmul` in jaxlib's `canonicalize_mosaic.cc`, and `MatmulOp::verify`):
/// - `dimension_numbers` `<lhs contracting, rhs contracting, lhs non-contracting,
///   rhs non-contracting, output (operand, dim) pairs, lhs batch, rhs batch>`: each operand's
///   dims appear once, the output order is `[0, lhs non-contracting, 1, rhs non-contracting]`,
///   the contracting sizes agree; absent, they are the default `<[1], [0], [0], [1], ...>`.
///   Batch dims are not read.
/// - `transpose_lhs = true` is refused (the verifier: "Lhs transpose not supported via this
///   API"); `transpose_rhs = true` makes the rhs contract along its dim 1 whatever the dimension
///   numbers say (canonicalisation sets the flag when the rhs contracting dim is not 0, and
///   keeps a set flag otherwise).
/// - `transpose_lhs_hint` is required and changes nothing; the accumulator is 32-bit, of the
///   result's type.
fn matmul_dims(g: &mut Generic) -> Result<(usize, usize), String> {
    let [l, r, acc] = [&g.operand_types[0], &g.operand_types[1], &g.operand_types[2]];
    let res = &g.result_types[0];
    let rank2 = |t: &MType| t.is_vector() && t.shape().len() == 2;
    if !rank2(l) || !rank2(r) || !rank2(acc) || acc != res {
        return Err(format!("not a 2-d product of {l} and {r} into {acc} giving {res}"));
    }
    if l.dtype() != r.dtype() || acc.dtype().map(DType::bits) != Some(32) {
        return Err(format!("operands {l} and {r} into {acc}"));
    }
    let hint = g.attrs.require("transpose_lhs_hint", "tpu.matmul")?;
    bool_attr(&hint)?;
    if g.attrs.take("transpose_lhs").map(|v| bool_attr(&v)).transpose()? == Some(true) {
        return Err("`transpose_lhs = true` (Mosaic refuses it: use the dimension numbers)".into());
    }
    let transpose_rhs =
        g.attrs.take("transpose_rhs").map(|v| bool_attr(&v)).transpose()?.unwrap_or(false);
    let (lc, rc) = match g.attrs.take("dimension_numbers") {
        None => (1, 0),
        Some(v) => {
            let inner = enum_attr(&v, "#tpu.dot_dimension_numbers")?;
            let fields: Vec<Vec<i64>> = split_fields(inner)?;
            let [lc, rc, lnc, rnc, out, lb, rb] = fields.as_slice() else {
                return Err(format!("{} dimension-number fields, not 7", fields.len()));
            };
            if !lb.is_empty() || !rb.is_empty() {
                return Err("batch dims are not read".into());
            }
            let ([lc], [rc]) = (lc.as_slice(), rc.as_slice()) else {
                return Err("one contracting dim per operand".into());
            };
            for (what, c, nc) in [("lhs", *lc, lnc), ("rhs", *rc, rnc)] {
                let mut dims: Vec<i64> = std::iter::once(c).chain(nc.iter().copied()).collect();
                dims.sort_unstable();
                if dims != [0, 1] {
                    return Err(format!(
                        "the {what} dims are contracting {c} and non-contracting {nc:?}: each of \
                         0 and 1 once"
                    ));
                }
            }
            if *out != [0, lnc[0], 1, rnc[0]] {
                return Err(format!(
                    "output dim order {out:?}, not [0, lhs non-contracting, 1, rhs non-contracting]"
                ));
            }
            (*lc as usize, *rc as usize)
        }
    };
    if l.shape()[lc] != r.shape()[rc] {
        return Err(format!("contracting dim {lc} of {l} and dim {rc} of {r} differ"));
    }
    let rc = if transpose_rhs { 1 } else { rc };
    let (m, k, n) = (l.shape()[1 - lc], l.shape()[lc], r.shape()[1 - rc]);
    if r.shape()[rc] != k || acc.shape() != [m, n] {
        return Err(format!(
            "{l} · {r} contracting lhs dim {lc} and rhs dim {rc}{} does not give {acc}",
            if transpose_rhs { " (transpose_rhs)" } else { "" }
        ));
    }
    Ok((lc, rc))
}

/// `[1], [0], [0], [1], [0, 0, 1, 1], [], []`: the lists.
fn split_fields(inner: &str) -> Result<Vec<Vec<i64>>, String> {
    super::text::split_top(inner)?
        .into_iter()
        .map(|f| {
            list_attr(f)?;
            int_list(f)
        })
        .collect()
}
