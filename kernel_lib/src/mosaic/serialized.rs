//! The shipped form of a Mosaic kernel: the versioned `stable_mosaic` serialization, printed as
//! generic MLIR text.
//!
//! Every op but the module is renamed `stable_mosaic.<dialect>.<op>` and printed in generic
//! syntax, its inherent attributes spelled out (`fastmath`, `operandSegmentSizes`, the matmul's
//! transpose flags, `scf.yield` terminators, `func.func`'s `sym_name` and `function_type`); the
//! module carries `stable_mosaic.version`. libtpu reads it with `serialization_format: 1`,
//! demangles it and upgrades it from that version, so a kernel keeps compiling with a newer
//! libtpu, where the pretty form must parse with whichever dialect libtpu has.

use std::fmt::Write as _;

use crate::ir::{RegionId, ValueId};
use crate::text::Names;
use crate::types::DType;

use super::ir::{Compare, IndexExpr, InferCx, Kernel, Op, Reduce, op_name};
use super::printer::{
    constant, dimension_semantics, dot_dimension_numbers, list, transform_params, window_params,
};
use super::types::MType;

/// The serialization version the shipped form is written at (libtpu 0.0.52 reads 0 to 20;
/// `jax.export` stamps 15).
pub const VERSION: u32 = 15;

const FASTMATH: &str = "fastmath = #arith.fastmath<none>";

struct Printer<'a> {
    k: &'a Kernel,
    out: String,
    names: Names,
    /// ` loc(...)` of the op being printed.
    loc: String,
}

impl InferCx for Printer<'_> {
    fn ty(&self, v: ValueId) -> &MType {
        self.k.ty(v)
    }
}

/// `arith.cmpi` / `arith.cmpf` predicate numbers.
fn predicate(c: Compare, float: bool) -> u32 {
    match (c, float) {
        (Compare::Eq, false) => 0,
        (Compare::Ne, false) => 1,
        (Compare::Lt, false) => 2,
        (Compare::Le, false) => 3,
        (Compare::Gt, false) => 4,
        (Compare::Ge, false) => 5,
        (Compare::Eq, true) => 1,
        (Compare::Gt, true) => 2,
        (Compare::Ge, true) => 3,
        (Compare::Lt, true) => 4,
        (Compare::Le, true) => 5,
        (Compare::Ne, true) => 6,
    }
}

impl Printer<'_> {
    /// `"stable_mosaic.<op>"(operands) {attrs} : (types) -> results`.
    fn generic(
        &mut self,
        pad: &str,
        op: &str,
        operands: &[ValueId],
        attrs: &[String],
        results: &[ValueId],
    ) {
        let k = self.k;
        let lhs = self.names.bind(results);
        let attrs =
            if attrs.is_empty() { String::new() } else { format!(" {{{}}}", attrs.join(", ")) };
        let in_types = list(operands.iter().map(|v| k.ty(*v)));
        let out_types = match results {
            [one] => k.ty(*one).to_string(),
            many => format!("({})", list(many.iter().map(|v| k.ty(*v)))),
        };
        let _ = writeln!(
            self.out,
            "{pad}{lhs}\"stable_mosaic.{op}\"({}){attrs} : ({in_types}) -> {out_types}{}",
            self.names.list(operands),
            self.loc
        );
    }

    fn region(&mut self, r: RegionId, depth: usize) {
        let k = self.k;
        for (i, instr) in k.region(r).instrs.iter().enumerate() {
            self.loc =
                k.region(r).locs.get(i).map(|l| format!(" {}", l.mlir())).unwrap_or_default();
            let pad = "  ".repeat(depth);
            let name = op_name(&instr.op, self);
            let float = |v: &ValueId| k.ty(*v).dtype().is_some_and(DType::is_float);
            match &instr.op {
                Op::Constant { value, ty } => {
                    let attr = format!("value = {} : {ty}", constant(*value, ty));
                    self.generic(&pad, name, &[], &[attr], &instr.results);
                }
                Op::Binary(_, a, b) => {
                    // Integer ops with overflow flags: add, sub and mul (not div, rem, max, min).
                    let attrs = if float(a) {
                        vec![FASTMATH.to_owned()]
                    } else if matches!(name, "arith.addi" | "arith.subi" | "arith.muli") {
                        vec!["overflowFlags = #arith.overflow<none>".to_owned()]
                    } else {
                        vec![]
                    };
                    self.generic(&pad, name, &[*a, *b], &attrs, &instr.results);
                }
                Op::Unary(_, x) => {
                    self.generic(&pad, name, &[*x], &[FASTMATH.to_owned()], &instr.results)
                }
                Op::Compare(c, a, b) => {
                    let mut attrs = vec![format!("predicate = {} : i64", predicate(*c, float(a)))];
                    if float(a) {
                        attrs.insert(0, FASTMATH.to_owned());
                    }
                    self.generic(&pad, name, &[*a, *b], &attrs, &instr.results);
                }
                Op::Select(c, a, b) => self.generic(&pad, name, &[*c, *a, *b], &[], &instr.results),
                Op::Convert { x, .. }
                | Op::IndexCast(x)
                | Op::Broadcast { x, .. }
                | Op::ShapeCast { x, .. } => {
                    self.generic(&pad, name, &[*x], &[], &instr.results);
                }
                Op::ScalarLoad { memref, indices } => {
                    let operands: Vec<ValueId> =
                        std::iter::once(*memref).chain(indices.iter().copied()).collect();
                    self.generic(&pad, name, &operands, &[], &instr.results);
                }
                Op::ScalarStore { memref, indices, value } => {
                    let operands: Vec<ValueId> =
                        [*value, *memref].into_iter().chain(indices.iter().copied()).collect();
                    self.generic(&pad, name, &operands, &[], &instr.results);
                }
                Op::Iota { dim, .. } => {
                    let attr = format!("dimensions = array<i32: {dim}>");
                    self.generic(&pad, name, &[], &[attr], &instr.results);
                }
                Op::AssumeMultiple { x, by } => {
                    let attr = format!("multiple = {by} : i32");
                    self.generic(&pad, name, &[*x], &[attr], &instr.results);
                }
                Op::For { lo, hi, step, iv, body } => {
                    // The body's block argument is the induction variable.
                    let (lo, hi, step) = (
                        self.names.name(*lo).to_owned(),
                        self.names.name(*hi).to_owned(),
                        self.names.name(*step).to_owned(),
                    );
                    self.names.fresh(*iv);
                    let iv = self.names.name(*iv).to_owned();
                    let _ = writeln!(
                        self.out,
                        "{pad}\"stable_mosaic.scf.for\"({lo}, {hi}, {step}) ({{\n{pad}^bb0({iv}: i32):"
                    );
                    self.region(*body, depth + 1);
                    let _ = writeln!(self.out, "{pad}  \"stable_mosaic.scf.yield\"() : () -> ()");
                    let loc = k
                        .region(r)
                        .locs
                        .get(i)
                        .map(|l| format!(" {}", l.mlir()))
                        .unwrap_or_default();
                    let _ = writeln!(self.out, "{pad}}}) : (i32, i32, i32) -> (){loc}");
                }
                Op::Load { memref, indices, .. } => {
                    let operands: Vec<ValueId> =
                        std::iter::once(*memref).chain(indices.iter().copied()).collect();
                    self.generic(&pad, name, &operands, &[], &instr.results);
                }
                Op::Store { memref, indices, value } => {
                    let operands: Vec<ValueId> =
                        [*value, *memref].into_iter().chain(indices.iter().copied()).collect();
                    let attrs = [
                        "add = false".to_owned(),
                        format!("operandSegmentSizes = array<i32: 1, 1, {}, 0>", indices.len()),
                        "strides = array<i32>".to_owned(),
                    ];
                    self.generic(&pad, name, &operands, &attrs, &instr.results);
                }
                Op::MultiReduce { kind, x, acc, dims } => {
                    let combiner = match (kind, float(x)) {
                        (Reduce::Sum, _) => "add",
                        (Reduce::Max, true) => "maximumf",
                        (Reduce::Max, false) => "maxsi",
                    };
                    let attrs = [
                        format!("kind = #vector.kind<{combiner}>"),
                        format!("reduction_dims = array<i64: {}>", list(dims)),
                    ];
                    self.generic(&pad, name, &[*x, *acc], &attrs, &instr.results);
                }
                Op::Matmul { lhs, rhs, acc, transpose_lhs, transpose_rhs } => {
                    let dims = dot_dimension_numbers(*transpose_lhs, *transpose_rhs);
                    let attrs = [
                        format!("dimension_numbers = #tpu.dot_dimension_numbers{dims}"),
                        "transpose_lhs = false".to_owned(),
                        "transpose_lhs_hint = false".to_owned(),
                        "transpose_rhs = false".to_owned(),
                    ];
                    self.generic(&pad, name, &[*lhs, *rhs, *acc], &attrs, &instr.results);
                }
                Op::If { cond, then } => {
                    let c = self.names.name(*cond).to_owned();
                    let _ = writeln!(self.out, "{pad}\"stable_mosaic.scf.if\"({c}) ({{");
                    self.region(*then, depth + 1);
                    let _ = writeln!(self.out, "{pad}  \"stable_mosaic.scf.yield\"() : () -> ()");
                    let loc = k
                        .region(r)
                        .locs
                        .get(i)
                        .map(|l| format!(" {}", l.mlir()))
                        .unwrap_or_default();
                    let _ = writeln!(self.out, "{pad}}}, {{\n{pad}}}) : (i1) -> (){loc}");
                }
            }
        }
    }
}

/// The kernel's Mosaic module in the shipped `stable_mosaic` serialized form (generic syntax,
/// version [`VERSION`]).
pub fn print_kernel_serialized(k: &Kernel) -> String {
    let mut p = Printer {
        k,
        out: String::with_capacity(8192),
        names: Names::new(k.values.len(), k.num_args()),
        loc: String::new(),
    };
    let arg_types = list(k.values[..k.num_args()].iter());
    let (windows, semantics) = (window_params(k), dimension_semantics(k));
    let _ = writeln!(p.out, "\"builtin.module\"() ({{");
    let _ = writeln!(p.out, "  \"stable_mosaic.func.func\"() ({{");
    let block_args = list((0..k.num_args()).map(|i| format!("%arg{i}: {}", k.values[i])));
    let _ = writeln!(p.out, "  ^bb0({block_args}):");
    p.region(RegionId(0), 2);
    let _ = writeln!(p.out, "    \"stable_mosaic.func.return\"() : () -> ()");
    let _ = writeln!(
        p.out,
        "  }}) {{dimension_semantics = [{semantics}], function_type = ({arg_types}) -> (), iteration_bounds = array<i64: {}>, scalar_prefetch = {} : i64, scratch_operands = {} : i64, sym_name = \"{}\", tpu.core_type = #tpu.core_type<tc>, window_params = [{windows}]}} : () -> ()",
        list(&k.grid),
        k.prefetch.len(),
        k.scratch.len(),
        crate::ir::escape(&k.name)
    );
    let params = transform_params(k);
    let param_types = list(params.iter().map(|(_, t)| t));
    let param_args = list(params.iter().map(|(n, t)| format!("{n}: {t}")));
    for (i, w) in k.windows.iter().enumerate() {
        let _ = writeln!(p.out, "  \"stable_mosaic.func.func\"() ({{");
        let _ = writeln!(p.out, "  ^bb0({param_args}):");
        let mut results = Vec::with_capacity(w.index_map.len());
        for (c, e) in w.index_map.iter().enumerate() {
            match e {
                IndexExpr::Grid(axis) => results.push(format!("%arg{axis}")),
                IndexExpr::Const(v) => {
                    let _ = writeln!(
                        p.out,
                        "    %c{c} = \"stable_mosaic.arith.constant\"() {{value = {v} : i32}} : () -> i32"
                    );
                    results.push(format!("%c{c}"));
                }
                IndexExpr::GridDiv { axis, by, modulo } => {
                    let _ = writeln!(
                        p.out,
                        "    %c{c} = \"stable_mosaic.arith.constant\"() {{value = {by} : i32}} : () -> i32"
                    );
                    let _ = writeln!(
                        p.out,
                        "    %q{c} = \"stable_mosaic.arith.divsi\"(%arg{axis}, %c{c}) : (i32, i32) -> i32"
                    );
                    match modulo {
                        None => results.push(format!("%q{c}")),
                        Some(m) => {
                            let _ = writeln!(
                                p.out,
                                "    %m{c} = \"stable_mosaic.arith.constant\"() {{value = {m} : i32}} : () -> i32"
                            );
                            let _ = writeln!(
                                p.out,
                                "    %r{c} = \"stable_mosaic.arith.remsi\"(%q{c}, %m{c}) : (i32, i32) -> i32"
                            );
                            results.push(format!("%r{c}"));
                        }
                    }
                }
                IndexExpr::Prefetch { table, axis } => {
                    let t = k.grid.len() + table;
                    let _ = writeln!(
                        p.out,
                        "    %i{c} = \"stable_mosaic.arith.index_cast\"(%arg{axis}) : (i32) -> index"
                    );
                    let _ = writeln!(
                        p.out,
                        "    %p{c} = \"stable_mosaic.memref.load\"(%arg{t}, %i{c}) : ({}, index) -> i32",
                        k.values[t]
                    );
                    results.push(format!("%p{c}"));
                }
            }
        }
        let result_types = list(w.index_map.iter().map(|_| "i32"));
        let _ = writeln!(
            p.out,
            "    \"stable_mosaic.func.return\"({}) : ({result_types}) -> ()",
            list(&results)
        );
        let _ = writeln!(
            p.out,
            "  }}) {{function_type = ({param_types}) -> ({result_types}), sym_name = \"transform_{i}\"}} : () -> ()"
        );
    }
    let _ = writeln!(p.out, "}}) {{stable_mosaic.version = {VERSION} : i64}} : () -> ()");
    p.out
}
