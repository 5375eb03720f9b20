//! The one StableHLO printer: the pretty syntax jax emits, byte-for-byte deterministic.
//!
//! Names are positional: parameters `%argN`, every other value `%N` in print order (multi-result
//! ops `%N:k`, used as `%N#i`). Attributes print in a fixed order; no hash map is iterated.
//! Two spaces of indent per nesting level.

use std::fmt::Write as _;

use crate::ir::{Function, Instr, Module, Op, RegionId, ValueId, Visibility, escape};
use crate::text::Names;
use crate::types::{DType, DTypeClass, TensorType};

/// Prints a verified module.
pub fn print_module(module: &Module) -> String {
    let mut out = String::with_capacity(4096);
    let _ = writeln!(
        out,
        "module {} attributes {{mhlo.num_partitions = {} : i32, mhlo.num_replicas = {} : i32}} {{",
        symbol(&module.name),
        module.num_partitions,
        module.num_replicas
    );
    for f in &module.functions {
        FnPrinter::new(f, &mut out).print();
    }
    for t in &module.text_functions {
        for line in t.text.trim_end().lines() {
            if line.trim().is_empty() {
                out.push('\n');
            } else {
                let _ = writeln!(out, "  {line}");
            }
        }
    }
    out.push_str("}\n");
    out
}

pub(crate) use crate::text::symbol;

struct FnPrinter<'a> {
    f: &'a Function,
    out: &'a mut String,
    /// Printed name of each value.
    names: Names,
}

fn types(ts: &[&TensorType]) -> String {
    let parts: Vec<String> = ts.iter().map(ToString::to_string).collect();
    parts.join(", ")
}

fn ints(v: &[i64]) -> String {
    let parts: Vec<String> = v.iter().map(ToString::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// The body of a `#stablehlo.gather<...>` or `#stablehlo.scatter<...>` attribute: each
/// non-empty list of dims by name, then `index_vector_dim`.
fn index_dims(lists: [(&str, &Vec<i64>); 5], index_vector_dim: i64) -> String {
    let mut parts: Vec<String> = lists
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(name, v)| format!("{name} = {}", ints(v)))
        .collect();
    parts.push(format!("index_vector_dim = {index_vector_dim}"));
    parts.join(", ")
}

impl<'a> FnPrinter<'a> {
    fn new(f: &'a Function, out: &'a mut String) -> FnPrinter<'a> {
        FnPrinter { f, out, names: Names::new(f.values.len(), f.params.len()) }
    }

    fn name(&self, v: ValueId) -> &str {
        self.names.name(v)
    }

    fn names(&self, vs: &[ValueId]) -> String {
        self.names.list(vs)
    }

    fn ty(&self, v: ValueId) -> &'a TensorType {
        self.f.ty(v)
    }

    fn tys(&self, vs: &[ValueId]) -> Vec<&'a TensorType> {
        vs.iter().map(|v| self.ty(*v)).collect()
    }

    /// `(a, b) -> c` or `(a, b) -> (c, d)`.
    fn functional(&self, operands: &[ValueId], results: &[ValueId]) -> String {
        format!("({}) -> {}", types(&self.tys(operands)), self.result_types(results))
    }

    fn result_types(&self, results: &[ValueId]) -> String {
        if results.len() == 1 {
            self.ty(results[0]).to_string()
        } else {
            format!("({})", types(&self.tys(results)))
        }
    }

    fn fresh(&mut self, v: ValueId) {
        self.names.fresh(v);
    }

    /// Names an op's results; returns the left-hand side (`%3 = ` or `%3:2 = `).
    fn bind(&mut self, results: &[ValueId]) -> String {
        self.names.bind(results)
    }

    fn print(mut self) {
        let f = self.f;
        let vis = match f.visibility {
            Visibility::Public => "public",
            Visibility::Private => "private",
        };
        let mut params = Vec::with_capacity(f.params.len());
        for (i, (p, attrs)) in f.params.iter().zip(&f.param_attrs).enumerate() {
            let mut s = format!("%arg{i}: {p}");
            if !attrs.is_empty() {
                let parts: Vec<String> = attrs.iter().map(|(k, v)| format!("{k} = {v}")).collect();
                let _ = write!(s, " {{{}}}", parts.join(", "));
            }
            params.push(s);
        }
        let results = if f.result_attrs.iter().any(|a| !a.is_empty()) {
            let parts: Vec<String> = f
                .results
                .iter()
                .enumerate()
                .map(|(i, r)| match f.result_attrs.get(i).filter(|a| !a.is_empty()) {
                    Some(attrs) => {
                        let kv: Vec<String> =
                            attrs.iter().map(|(k, v)| format!("{k} = {v}")).collect();
                        format!("{r} {{{}}}", kv.join(", "))
                    }
                    None => r.to_string(),
                })
                .collect();
            format!(" -> ({})", parts.join(", "))
        } else {
            match f.results.as_slice() {
                [] => String::new(),
                [one] => format!(" -> {one}"),
                many => {
                    let refs: Vec<&TensorType> = many.iter().collect();
                    format!(" -> ({})", types(&refs))
                }
            }
        };
        let _ = writeln!(
            self.out,
            "  func.func {vis} {}({}){results} {{",
            symbol(&f.name),
            params.join(", ")
        );
        self.region_body(RegionId(0), 2, "return");
        self.out.push_str("  }\n");
    }

    fn indent(&mut self, level: usize) {
        for _ in 0..level {
            self.out.push_str("  ");
        }
    }

    /// Prints a region's instructions and its terminator at `level`.
    fn region_body(&mut self, r: RegionId, level: usize, terminator: &str) {
        let region = self.f.region(r);
        for instr in &region.instrs {
            self.instr(instr, level);
        }
        self.indent(level);
        if region.results.is_empty() {
            let _ = writeln!(self.out, "{terminator}");
        } else {
            let names = self.names(&region.results);
            let tys = types(&self.tys(&region.results));
            let _ = writeln!(self.out, "{terminator} {names} : {tys}");
        }
    }

    fn instr(&mut self, instr: &Instr, level: usize) {
        let res = &instr.results;
        self.indent(level);
        // Everything except the ops with regions prints on one line.
        let line = match &instr.op {
            Op::Unary(u, x) => {
                let lhs = self.bind(res);
                let sep = if u.name().starts_with("chlo.") {
                    format!("{} -> {}", self.ty(*x), self.ty(res[0]))
                } else {
                    self.ty(*x).to_string()
                };
                format!("{lhs}{} {} : {sep}", u.name(), self.name(*x))
            }
            Op::Binary(b, x, y) => {
                let lhs = self.bind(res);
                format!("{lhs}{} {}, {} : {}", b.name(), self.name(*x), self.name(*y), self.ty(*x))
            }
            Op::Compare { direction, lhs: a, rhs: b } => {
                let kind = compare_type(self.ty(*a).dtype);
                let ft = self.functional(&[*a, *b], res);
                let lhs = self.bind(res);
                format!(
                    "{lhs}stablehlo.compare  {}, {}, {},  {kind} : {ft}",
                    direction.name(),
                    self.name(*a),
                    self.name(*b)
                )
            }
            Op::Select { pred, on_true, on_false } => {
                let lhs = self.bind(res);
                format!(
                    "{lhs}stablehlo.select {}, {}, {} : {}, {}",
                    self.name(*pred),
                    self.name(*on_true),
                    self.name(*on_false),
                    self.ty(*pred),
                    self.ty(*on_true)
                )
            }
            Op::Clamp { min, operand, max } => {
                let all_same =
                    self.ty(*min) == self.ty(*operand) && self.ty(*max) == self.ty(*operand);
                let tys = if all_same {
                    self.ty(*operand).to_string()
                } else {
                    self.functional(&[*min, *operand, *max], res)
                };
                let lhs = self.bind(res);
                format!(
                    "{lhs}stablehlo.clamp {}, {}, {} : {tys}",
                    self.name(*min),
                    self.name(*operand),
                    self.name(*max)
                )
            }
            Op::Convert { operand, .. }
            | Op::BitcastConvert { operand, .. }
            | Op::Reshape { operand, .. } => {
                let ft = self.functional(&[*operand], res);
                let lhs = self.bind(res);
                format!("{lhs}{} {} : {ft}", instr.op.name(), self.name(*operand))
            }
            Op::Constant(lit) => {
                let lhs = self.bind(res);
                let mut s = format!("{lhs}stablehlo.constant ");
                lit.write_dense(&mut s);
                let _ = write!(s, " : {}", lit.ty());
                s
            }
            Op::Iota { ty, dim } => {
                let lhs = self.bind(res);
                format!("{lhs}stablehlo.iota dim = {dim} : {ty}")
            }
            Op::BroadcastInDim { operand, dims, .. } => {
                let ft = self.functional(&[*operand], res);
                let lhs = self.bind(res);
                format!(
                    "{lhs}stablehlo.broadcast_in_dim {}, dims = {} : {ft}",
                    self.name(*operand),
                    ints(dims)
                )
            }
            Op::Transpose { operand, perm } => {
                let ft = self.functional(&[*operand], res);
                let lhs = self.bind(res);
                format!(
                    "{lhs}stablehlo.transpose {}, dims = {} : {ft}",
                    self.name(*operand),
                    ints(perm)
                )
            }
            Op::Slice { operand, start, limit, strides } => {
                let ranges: Vec<String> = (0..start.len())
                    .map(|i| {
                        if strides[i] == 1 {
                            format!("{}:{}", start[i], limit[i])
                        } else {
                            format!("{}:{}:{}", start[i], limit[i], strides[i])
                        }
                    })
                    .collect();
                let ft = self.functional(&[*operand], res);
                let lhs = self.bind(res);
                format!(
                    "{lhs}stablehlo.slice {} [{}] : {ft}",
                    self.name(*operand),
                    ranges.join(", ")
                )
            }
            Op::DynamicSlice { operand, starts, sizes } => {
                let ops: Vec<ValueId> =
                    std::iter::once(*operand).chain(starts.iter().copied()).collect();
                let ft = self.functional(&ops, res);
                let lhs = self.bind(res);
                format!(
                    "{lhs}stablehlo.dynamic_slice {}, sizes = {} : {ft}",
                    self.names(&ops),
                    ints(sizes)
                )
            }
            Op::Gather { operand, indices, dims, slice_sizes } => {
                let ft = self.functional(&[*operand, *indices], res);
                let lhs = self.bind(res);
                let numbers = index_dims(
                    [
                        ("offset_dims", &dims.offset_dims),
                        ("collapsed_slice_dims", &dims.collapsed_slice_dims),
                        ("operand_batching_dims", &dims.operand_batching_dims),
                        ("start_indices_batching_dims", &dims.start_indices_batching_dims),
                        ("start_index_map", &dims.start_index_map),
                    ],
                    dims.index_vector_dim,
                );
                let sizes: Vec<String> = slice_sizes.iter().map(ToString::to_string).collect();
                format!(
                    "{lhs}\"stablehlo.gather\"({}, {}) {{dimension_numbers = \
                     #stablehlo.gather<{}>, slice_sizes = array<i64: {}>, indices_are_sorted = \
                     false}} : {ft}",
                    self.name(*operand),
                    self.name(*indices),
                    numbers,
                    sizes.join(", ")
                )
            }
            Op::DynamicUpdateSlice { .. } | Op::Pad { .. } | Op::Concatenate { .. } => {
                let ops = instr.op.operands();
                let ft = self.functional(&ops, res);
                let lhs = self.bind(res);
                let extra = match &instr.op {
                    Op::Pad { low, high, interior, .. } => format!(
                        ", low = {}, high = {}, interior = {}",
                        ints(low),
                        ints(high),
                        ints(interior)
                    ),
                    Op::Concatenate { dim, .. } => format!(", dim = {dim}"),
                    _ => String::new(),
                };
                format!("{lhs}{} {}{extra} : {ft}", instr.op.name(), self.names(&ops))
            }
            Op::DotGeneral { lhs: a, rhs: b, dims, precision, .. } => {
                let ft = self.functional(&[*a, *b], res);
                let lhs = self.bind(res);
                let mut s =
                    format!("{lhs}stablehlo.dot_general {}, {}", self.name(*a), self.name(*b));
                if !dims.lhs_batch.is_empty() {
                    let _ = write!(
                        s,
                        ", batching_dims = {} x {}",
                        ints(&dims.lhs_batch),
                        ints(&dims.rhs_batch)
                    );
                }
                let _ = write!(
                    s,
                    ", contracting_dims = {} x {}",
                    ints(&dims.lhs_contracting),
                    ints(&dims.rhs_contracting)
                );
                if let Some([p, q]) = precision {
                    let _ = write!(s, ", precision = [{}, {}]", p.name(), q.name());
                }
                let _ = write!(s, " : {ft}");
                s
            }
            Op::Convolution {
                lhs: a,
                rhs: b,
                dims,
                window,
                feature_group_count,
                batch_group_count,
            } => {
                let ft = self.functional(&[*a, *b], res);
                let lhs = self.bind(res);
                let pad: Vec<String> =
                    window.padding.iter().map(|(lo, hi)| format!("[{lo}, {hi}]")).collect();
                format!(
                    "{lhs}stablehlo.convolution({}, {}) dim_numbers = {}, window = {{stride = {}, \
                     pad = [{}], lhs_dilate = {}, rhs_dilate = {}}} {{batch_group_count = \
                     {batch_group_count} : i64, feature_group_count = {feature_group_count} : i64}} \
                     : {ft}",
                    self.name(*a),
                    self.name(*b),
                    conv_dims(dims),
                    ints(&window.strides),
                    pad.join(", "),
                    ints(&window.lhs_dilation),
                    ints(&window.rhs_dilation),
                )
            }
            Op::Reverse { operand, dims } => {
                let lhs = self.bind(res);
                format!(
                    "{lhs}stablehlo.reverse {}, dims = {} : {}",
                    self.name(*operand),
                    ints(dims),
                    self.ty(*operand)
                )
            }
            Op::OptimizationBarrier { operands } => {
                let lhs = self.bind(res);
                let tys = types(&self.tys(operands));
                format!("{lhs}stablehlo.optimization_barrier {} : {tys}", self.names(operands))
            }
            Op::Call { callee, args } => {
                let ft = self.functional(args, res);
                let lhs = self.bind(res);
                format!("{lhs}call {}({}) : {ft}", crate::printer::symbol(callee), self.names(args))
            }
            Op::Composite { name, args, attributes, decomposition, version } => {
                let ft = self.functional(args, res);
                let lhs = self.bind(res);
                let mut attrs: Vec<String> = Vec::new();
                if !attributes.is_empty() {
                    let mut sorted: Vec<&(String, crate::ir::AttrValue)> =
                        attributes.iter().collect();
                    sorted.sort_by(|a, b| a.0.cmp(&b.0));
                    let parts: Vec<String> =
                        sorted.iter().map(|(k, v)| format!("{k} = {v}")).collect();
                    attrs.push(format!("composite_attributes = {{{}}}", parts.join(", ")));
                }
                attrs.push(format!("decomposition = {}", symbol(decomposition)));
                if *version != 0 {
                    attrs.push(format!("version = {version} : i32"));
                }
                format!(
                    "{lhs}stablehlo.composite \"{}\" {} {{{}}} : {ft}",
                    escape(name),
                    self.names(args),
                    attrs.join(", ")
                )
            }
            Op::Reduce { operands, inits, dims, args, body } => {
                self.reduce(instr, operands, inits, dims, args, *body, level);
                return;
            }
            Op::While { operands, args, cond, body } => {
                let lhs = self.bind(res);
                for a in args {
                    self.fresh(*a);
                }
                let pairs: Vec<String> = args
                    .iter()
                    .zip(operands)
                    .map(|(a, o)| format!("{} = {}", self.name(*a), self.name(*o)))
                    .collect();
                let tys = types(&self.tys(operands));
                let _ = writeln!(self.out, "{lhs}stablehlo.while({}) : {tys}", pairs.join(", "));
                self.indent(level);
                self.out.push_str("cond {\n");
                self.region_body(*cond, level + 1, "stablehlo.return");
                self.indent(level);
                self.out.push_str("} do {\n");
                self.region_body(*body, level + 1, "stablehlo.return");
                self.indent(level);
                self.out.push_str("}\n");
                return;
            }
            Op::Sort { operands, dim, stable, args, comparator } => {
                let ft = self.functional(operands, res);
                let names = self.names(operands);
                let lhs = self.bind(res);
                let _ = writeln!(self.out, "{lhs}\"stablehlo.sort\"({names}) ({{");
                for a in args {
                    self.fresh(*a);
                }
                let params: Vec<String> =
                    args.iter().map(|a| format!("{}: {}", self.name(*a), self.ty(*a))).collect();
                self.indent(level);
                let _ = writeln!(self.out, "^bb0({}):", params.join(", "));
                self.region_body(*comparator, level + 1, "stablehlo.return");
                self.indent(level);
                let _ = writeln!(
                    self.out,
                    "}}) {{dimension = {dim} : i64, is_stable = {stable}}} : {ft}"
                );
                return;
            }
            Op::Scatter { operand, indices, updates, dims, args, body } => {
                let ops = [*operand, *indices, *updates];
                let ft = self.functional(&ops, res);
                let names = self.names(&ops);
                let lhs = self.bind(res);
                let _ = writeln!(self.out, "{lhs}\"stablehlo.scatter\"({names}) ({{");
                for a in args {
                    self.fresh(*a);
                }
                let params: Vec<String> =
                    args.iter().map(|a| format!("{}: {}", self.name(*a), self.ty(*a))).collect();
                self.indent(level);
                let _ = writeln!(self.out, "^bb0({}):", params.join(", "));
                self.region_body(*body, level + 1, "stablehlo.return");
                let numbers = index_dims(
                    [
                        ("update_window_dims", &dims.update_window_dims),
                        ("inserted_window_dims", &dims.inserted_window_dims),
                        ("input_batching_dims", &dims.input_batching_dims),
                        ("scatter_indices_batching_dims", &dims.scatter_indices_batching_dims),
                        ("scatter_dims_to_operand_dims", &dims.scatter_dims_to_operand_dims),
                    ],
                    dims.index_vector_dim,
                );
                self.indent(level);
                let _ = writeln!(
                    self.out,
                    "}}) {{indices_are_sorted = false, scatter_dimension_numbers = \
                     #stablehlo.scatter<{}>, unique_indices = false}} : {ft}",
                    numbers
                );
                return;
            }
            Op::Case { index, branches } => {
                let ft = self.functional(&[*index], res);
                let idx = self.name(*index).to_owned();
                let lhs = self.bind(res);
                let _ = writeln!(self.out, "{lhs}\"stablehlo.case\"({idx}) ({{");
                for (i, b) in branches.iter().enumerate() {
                    if i > 0 {
                        self.indent(level);
                        self.out.push_str("}, {\n");
                    }
                    self.region_body(*b, level + 1, "stablehlo.return");
                }
                self.indent(level);
                let _ = writeln!(self.out, "}}) : {ft}");
                return;
            }
        };
        self.out.push_str(&line);
        self.out.push('\n');
    }

    #[allow(clippy::too_many_arguments, reason = "the destructured fields of one reduce op")]
    fn reduce(
        &mut self,
        instr: &Instr,
        operands: &[ValueId],
        inits: &[ValueId],
        dims: &[i64],
        args: &[ValueId],
        body: RegionId,
        level: usize,
    ) {
        let res = &instr.results;
        let all: Vec<ValueId> = operands.iter().chain(inits).copied().collect();
        let ft = self.functional(&all, res);
        let pairs: Vec<String> = operands
            .iter()
            .zip(inits)
            .map(|(o, i)| format!("({} init: {})", self.name(*o), self.name(*i)))
            .collect();
        let region = self.f.region(body);
        // The compact form: one binary op over the two block arguments, in order, returned as is.
        if let ([one], [a, b], [r]) = (region.instrs.as_slice(), args, region.results.as_slice())
            && let Op::Binary(op, x, y) = &one.op
            && (x, y) == (a, b)
            && one.results.as_slice() == [*r]
        {
            let lhs = self.bind(res);
            let _ = writeln!(
                self.out,
                "{lhs}stablehlo.reduce{} applies {} across dimensions = {} : {ft}",
                pairs.join(", "),
                op.name(),
                ints(dims)
            );
            return;
        }
        let lhs = self.bind(res);
        let _ = writeln!(
            self.out,
            "{lhs}stablehlo.reduce{} across dimensions = {} : {ft}",
            pairs.join(", "),
            ints(dims)
        );
        for a in args {
            self.fresh(*a);
        }
        let n = operands.len();
        let groups: Vec<String> = (0..n)
            .map(|i| {
                let (x, y) = (args[i], args[i + n]);
                format!("({}: {}, {}: {})", self.name(x), self.ty(x), self.name(y), self.ty(y))
            })
            .collect();
        self.indent(level);
        let _ = writeln!(self.out, "reducer{} {{", groups.join(" "));
        self.region_body(body, level + 1, "stablehlo.return");
        self.indent(level);
        self.out.push_str("}\n");
    }
}

/// The `compare_type` a comparison of `dtype` values prints.
pub fn compare_type(dtype: DType) -> &'static str {
    match dtype.class() {
        DTypeClass::Float => "FLOAT",
        DTypeClass::SignedInt => "SIGNED",
        DTypeClass::UnsignedInt | DTypeClass::Bool => "UNSIGNED",
    }
}

/// Convolution dimension numbers in StableHLO's short form: one label per dim of the input,
/// kernel and output (`b`/`f`, `i`/`o`, spatial positions by index), `[b, f, 0, 1]x[o, i, 0,
/// 1]->[b, f, 0, 1]` for PyTorch's layout.
fn conv_dims(d: &crate::ir::ConvDims) -> String {
    fn labels(first: (i64, &str), second: (i64, &str), spatial: &[i64]) -> String {
        let mut out = vec![String::new(); spatial.len() + 2];
        out[first.0 as usize] = first.1.to_string();
        out[second.0 as usize] = second.1.to_string();
        for (i, &s) in spatial.iter().enumerate() {
            out[s as usize] = i.to_string();
        }
        format!("[{}]", out.join(", "))
    }
    format!(
        "{}x{}->{}",
        labels((d.input_batch, "b"), (d.input_feature, "f"), &d.input_spatial),
        labels((d.kernel_output_feature, "o"), (d.kernel_input_feature, "i"), &d.kernel_spatial),
        labels((d.output_batch, "b"), (d.output_feature, "f"), &d.output_spatial),
    )
}
