//! The Mosaic printer (the pretty form libtpu parses directly, for snapshots and for the body of
//! the custom call), byte-for-byte deterministic: positional names (`%argN` for the kernel's
//! arguments, `%N` for op results in print order), attributes in a fixed order, two spaces of
//! indent per nesting level.

use std::fmt::Write as _;

use crate::ir::{RegionId, ValueId};
use crate::literal::{format_float, round_float};
use crate::text::{Names, symbol};
use crate::types::DType;

use super::ir::{IndexExpr, InferCx, Kernel, Op, Reduce, Scalar, op_name};
use super::types::MType;

struct Printer<'a> {
    k: &'a Kernel,
    out: String,
    names: Names,
}

impl InferCx for Printer<'_> {
    fn ty(&self, v: ValueId) -> &MType {
        self.k.ty(v)
    }
}

pub(super) fn list<T: ToString>(items: impl IntoIterator<Item = T>) -> String {
    items.into_iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}

pub(super) fn constant(value: Scalar, ty: &MType) -> String {
    let dtype = ty.dtype();
    let text = match value {
        Scalar::Float(f) => {
            let d = dtype.unwrap_or(DType::F32);
            format_float(round_float(f, d).unwrap_or(f), d)
        }
        Scalar::Int(i) if dtype == Some(DType::Bool) => {
            (if i != 0 { "true" } else { "false" }).to_owned()
        }
        Scalar::Int(i) => i.to_string(),
    };
    if ty.is_vector() { format!("dense<{text}>") } else { text }
}

impl Printer<'_> {
    fn name(&self, v: ValueId) -> &str {
        self.names.name(v)
    }

    fn names(&self, vs: &[ValueId]) -> String {
        self.names.list(vs)
    }

    fn bind(&mut self, results: &[ValueId]) -> String {
        self.names.bind(results)
    }

    fn region(&mut self, r: RegionId, depth: usize) {
        let k = self.k;
        for (i, instr) in k.region(r).instrs.iter().enumerate() {
            let loc = k.region(r).locs.get(i).map(|l| format!(" {}", l.mlir())).unwrap_or_default();
            let pad = "  ".repeat(depth);
            let lhs = self.bind(&instr.results);
            let ty = |v: &ValueId| k.ty(*v).to_string();
            let line = match &instr.op {
                Op::Constant { value, ty } => {
                    format!("arith.constant {} : {ty}", constant(*value, ty))
                }
                Op::Binary(_, a, b) => {
                    format!(
                        "{} {}, {} : {}",
                        op_name(&instr.op, self),
                        self.name(*a),
                        self.name(*b),
                        ty(a)
                    )
                }
                Op::Unary(_, x) => {
                    format!("{} {} : {}", op_name(&instr.op, self), self.name(*x), ty(x))
                }
                Op::Compare(c, a, b) => {
                    let dtype = k.ty(*a).dtype().unwrap_or(DType::I32);
                    format!(
                        "{} {}, {}, {} : {}",
                        op_name(&instr.op, self),
                        c.predicate(dtype),
                        self.name(*a),
                        self.name(*b),
                        ty(a)
                    )
                }
                Op::Select(c, a, b) => {
                    let cond =
                        if k.ty(*c).is_vector() { format!("{}, ", ty(c)) } else { String::new() };
                    format!(
                        "arith.select {}, {}, {} : {cond}{}",
                        self.name(*c),
                        self.name(*a),
                        self.name(*b),
                        ty(a)
                    )
                }
                Op::Convert { x, .. } => format!(
                    "{} {} : {} to {}",
                    op_name(&instr.op, self),
                    self.name(*x),
                    ty(x),
                    k.ty(instr.results[0])
                ),
                Op::IndexCast(x) => format!("arith.index_cast {} : i32 to index", self.name(*x)),
                Op::Broadcast { x, .. } | Op::ShapeCast { x, .. } => format!(
                    "{} {} : {} to {}",
                    op_name(&instr.op, self),
                    self.name(*x),
                    ty(x),
                    k.ty(instr.results[0])
                ),
                Op::Load { memref, indices, .. } => format!(
                    "vector.load {}[{}] : {}, {}",
                    self.name(*memref),
                    self.names(indices),
                    ty(memref),
                    k.ty(instr.results[0])
                ),
                Op::Store { memref, indices, value } => format!(
                    // The trailing comma is the (empty) mask's type: required.
                    "tpu.vector_store {}[{}], {} {{strides = array<i32>}} : {}, {},",
                    self.name(*memref),
                    self.names(indices),
                    self.name(*value),
                    ty(memref),
                    ty(value)
                ),
                Op::MultiReduce { kind, x, acc, dims } => {
                    let float = k.ty(*x).dtype().is_some_and(DType::is_float);
                    let combiner = match (kind, float) {
                        (Reduce::Sum, _) => "add",
                        (Reduce::Max, true) => "maximumf",
                        (Reduce::Max, false) => "maxsi",
                    };
                    format!(
                        "vector.multi_reduction <{combiner}>, {}, {} [{}] : {} to {}",
                        self.name(*x),
                        self.name(*acc),
                        list(dims),
                        ty(x),
                        ty(acc)
                    )
                }
                Op::Matmul { lhs, rhs, acc, transpose_lhs, transpose_rhs } => {
                    let dims = dot_dimension_numbers(*transpose_lhs, *transpose_rhs);
                    format!(
                        "tpu.matmul {}, {}, {} {{dimension_numbers = #tpu.dot_dimension_numbers{dims}, transpose_lhs_hint = false}} : {}, {}, {} -> {}",
                        self.name(*lhs),
                        self.name(*rhs),
                        self.name(*acc),
                        ty(lhs),
                        ty(rhs),
                        ty(acc),
                        k.ty(instr.results[0])
                    )
                }
                Op::ScalarLoad { memref, indices } => format!(
                    "memref.load {}[{}] : {}",
                    self.name(*memref),
                    self.names(indices),
                    ty(memref)
                ),
                Op::ScalarStore { memref, indices, value } => format!(
                    "memref.store {}, {}[{}] : {}",
                    self.name(*value),
                    self.name(*memref),
                    self.names(indices),
                    ty(memref)
                ),
                Op::Iota { dim, .. } => format!(
                    "tpu.iota {{dimensions = array<i32: {dim}>}} : {}",
                    k.ty(instr.results[0])
                ),
                Op::AssumeMultiple { x, by } => {
                    format!("tpu.assume_multiple {}, {by} : i32", self.name(*x))
                }
                Op::If { cond, then } => {
                    let cond = self.name(*cond).to_owned();
                    let _ = writeln!(self.out, "{pad}scf.if {cond} {{");
                    self.region(*then, depth + 1);
                    let _ = writeln!(self.out, "{pad}}}{loc}");
                    continue;
                }
                Op::For { lo, hi, step, iv, body } => {
                    self.names.fresh(*iv);
                    let header = format!(
                        "{pad}scf.for {} = {} to {} step {} : i32 {{",
                        self.name(*iv),
                        self.name(*lo),
                        self.name(*hi),
                        self.name(*step)
                    );
                    let _ = writeln!(self.out, "{header}");
                    self.region(*body, depth + 1);
                    let _ = writeln!(self.out, "{pad}}}{loc}");
                    continue;
                }
            };
            let _ = writeln!(self.out, "{pad}{lhs}{line}{loc}");
        }
    }
}

/// A 2-d matmul's `#tpu.dot_dimension_numbers` body: `<lhs contracting, rhs contracting, lhs
/// non-contracting, rhs non-contracting, output dims as (operand, dim), lhs batch, rhs batch>`.
/// A transposed lhs contracts its dim 0, a transposed rhs its dim 1.
pub(super) fn dot_dimension_numbers(transpose_lhs: bool, transpose_rhs: bool) -> String {
    let lc = if transpose_lhs { 0 } else { 1 };
    let rc = if transpose_rhs { 1 } else { 0 };
    let (ln, rn) = (1 - lc, 1 - rc);
    format!("<[{lc}], [{rc}], [{ln}], [{rn}], [0, {ln}, 1, {rn}], [], []>")
}

/// The entries of the kernel's `window_params` attribute, one per window.
pub(super) fn window_params(k: &Kernel) -> String {
    list(k.windows.iter().enumerate().map(|(i, w)| {
        format!(
            "{{transform_indices = @transform_{i}, window_bounds = array<i64: {}>}}",
            list(&w.block)
        )
    }))
}

/// The parameters of every transform function: the grid indices, then the scalar-prefetch
/// tables (named as the kernel function names them).
pub(super) fn transform_params(k: &Kernel) -> Vec<(String, &MType)> {
    (0..k.grid.len() + k.prefetch.len()).map(|i| (format!("%arg{i}"), &k.values[i])).collect()
}

/// The entries of the kernel's `dimension_semantics` attribute, one per grid axis.
pub(super) fn dimension_semantics(k: &Kernel) -> String {
    list(k.semantics.iter().map(|s| format!("#tpu.dimension_semantics<{}>", s.mlir())))
}

/// The kernel's Mosaic module in the pretty form: the kernel function, then one transform
/// function per window.
pub fn print_kernel(k: &Kernel) -> String {
    let names = Names::new(k.values.len(), k.num_args());
    let mut p = Printer { k, out: String::with_capacity(4096), names };
    let args = list((0..k.num_args()).map(|i| format!("%arg{i}: {}", k.values[i])));
    let (windows, semantics) = (window_params(k), dimension_semantics(k));
    let _ = writeln!(p.out, "module {{");
    let _ = writeln!(
        p.out,
        "  func.func {}({args}) attributes {{dimension_semantics = [{semantics}], iteration_bounds = array<i64: {}>, scalar_prefetch = {} : i64, scratch_operands = {} : i64, tpu.core_type = #tpu.core_type<tc>, window_params = [{windows}]}} {{",
        symbol(&k.name),
        list(&k.grid),
        k.prefetch.len(),
        k.scratch.len()
    );
    p.region(RegionId(0), 2);
    let _ = writeln!(p.out, "    return");
    let _ = writeln!(p.out, "  }}");
    let transform_args = list(transform_params(k).iter().map(|(n, t)| format!("{n}: {t}")));
    for (i, w) in k.windows.iter().enumerate() {
        let _ = writeln!(
            p.out,
            "  func.func @transform_{i}({transform_args}) -> ({}) {{",
            list(w.index_map.iter().map(|_| "i32"))
        );
        let mut results = Vec::with_capacity(w.index_map.len());
        let mut consts = 0;
        for (d, e) in w.index_map.iter().enumerate() {
            match e {
                IndexExpr::Grid(axis) => results.push(format!("%arg{axis}")),
                IndexExpr::Const(c) => {
                    let _ = writeln!(p.out, "    %c{consts}_i32 = arith.constant {c} : i32");
                    results.push(format!("%c{consts}_i32"));
                    consts += 1;
                }
                IndexExpr::GridDiv { axis, by, modulo } => {
                    let _ = writeln!(p.out, "    %c{consts}_i32 = arith.constant {by} : i32");
                    let _ =
                        writeln!(p.out, "    %q{d} = arith.divsi %arg{axis}, %c{consts}_i32 : i32");
                    consts += 1;
                    match modulo {
                        None => results.push(format!("%q{d}")),
                        Some(m) => {
                            let _ =
                                writeln!(p.out, "    %c{consts}_i32 = arith.constant {m} : i32");
                            let _ = writeln!(
                                p.out,
                                "    %r{d} = arith.remsi %q{d}, %c{consts}_i32 : i32"
                            );
                            consts += 1;
                            results.push(format!("%r{d}"));
                        }
                    }
                }
                IndexExpr::Prefetch { table, axis } => {
                    let t = k.grid.len() + table;
                    let _ =
                        writeln!(p.out, "    %i{d} = arith.index_cast %arg{axis} : i32 to index");
                    let _ =
                        writeln!(p.out, "    %p{d} = memref.load %arg{t}[%i{d}] : {}", k.values[t]);
                    results.push(format!("%p{d}"));
                }
            }
        }
        let _ = writeln!(
            p.out,
            "    return {} : {}",
            list(&results),
            list(w.index_map.iter().map(|_| "i32"))
        );
        let _ = writeln!(p.out, "  }}");
    }
    p.out.push_str("}\n");
    p.out
}
