//! The Mosaic kernel IR: a grid, one window per input and output (block shape and index map),
//! scratch buffers, and a body of ops over block references and vectors, in regions.
//!
//! It shares the StableHLO IR's machinery: values are [`ValueId`]s into the kernel's arena of
//! types, nested bodies are [`RegionId`]s, and [`infer`] is the one table of type rules that
//! the builder and the verifier both use.

use crate::error::{OpError, op_err};
use crate::ir::{RegionId, ValueId};
use crate::types::{DType, TensorType};

use super::types::MType;

/// How a grid axis may be run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Semantics {
    /// Steps are independent: the compiler may run them in any order, or in parallel.
    Parallel,
    /// Steps run in order (a reduction axis whose scratch accumulates across steps).
    Arbitrary,
}

impl Semantics {
    pub fn mlir(self) -> &'static str {
        match self {
            Semantics::Parallel => "parallel",
            Semantics::Arbitrary => "arbitrary",
        }
    }
}

/// One dimension of an index map: the block index along one array dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IndexExpr {
    /// The index of grid axis `n` (`program_id(n)`).
    Grid(usize),
    /// A fixed block index.
    Const(i64),
    /// Element `program_id(axis)` of scalar-prefetch table `table` (`ids[i]` in an index map
    /// that takes the prefetched refs): a block index chosen by data the kernel is given,
    /// read from SMEM before the step's blocks are fetched.
    Prefetch { table: usize, axis: usize },
    /// `program_id(axis) / by` (floor; `by` > 0): several grid steps share a block, as the
    /// query heads of one key/value head in grouped-query attention (`h // group`); with a
    /// `modulo` (> 0), `(program_id(axis) / by) % modulo`: the block cycles, as a mask shared by
    /// the batch reads head `g % H` of a `B * H` axis.
    GridDiv { axis: usize, by: u64, modulo: Option<u64> },
}

/// A window: the block of an input or output a grid step sees, and where it is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    /// The whole array (the custom call's operand or result).
    pub array: TensorType,
    /// The block shape (the memref the body reads or writes).
    pub block: Vec<u64>,
    /// Block index per array dimension, from the grid indices. The element offset of dimension
    /// `d` is `index_map[d] * block[d]`.
    pub index_map: Vec<IndexExpr>,
}

/// Binary arithmetic on scalars or vectors of one type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    /// The remainder with the dividend's sign (C's `fmod`; `arith.remsi` on integers).
    Rem,
    /// Floats only.
    Pow,
    /// `atan2(self, rhs)`; f32 only (libtpu refuses bf16).
    Atan2,
}

impl BinaryOp {
    /// The `arith` op for operands of `dtype`.
    pub fn mlir(self, dtype: DType) -> &'static str {
        let float = dtype.is_float();
        match (self, float) {
            (BinaryOp::Add, true) => "arith.addf",
            (BinaryOp::Sub, true) => "arith.subf",
            (BinaryOp::Mul, true) => "arith.mulf",
            (BinaryOp::Div, true) => "arith.divf",
            (BinaryOp::Max, true) => "arith.maximumf",
            (BinaryOp::Min, true) => "arith.minimumf",
            (BinaryOp::Rem, true) => "arith.remf",
            (BinaryOp::Pow, _) => "math.powf",
            (BinaryOp::Atan2, _) => "math.atan2",
            (BinaryOp::Add, false) => "arith.addi",
            (BinaryOp::Sub, false) => "arith.subi",
            (BinaryOp::Mul, false) => "arith.muli",
            (BinaryOp::Div, false) => "arith.divsi",
            (BinaryOp::Max, false) => "arith.maxsi",
            (BinaryOp::Min, false) => "arith.minsi",
            (BinaryOp::Rem, false) => "arith.remsi",
        }
    }
}

/// Elementwise float math.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
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

impl UnaryOp {
    pub fn mlir(self) -> &'static str {
        match self {
            UnaryOp::Neg => "arith.negf",
            UnaryOp::Exp => "math.exp",
            UnaryOp::Log => "math.log",
            UnaryOp::Tanh => "math.tanh",
            UnaryOp::Rsqrt => "math.rsqrt",
            UnaryOp::Sqrt => "math.sqrt",
            UnaryOp::Erf => "math.erf",
            UnaryOp::Abs => "math.absf",
            UnaryOp::Log1p => "math.log1p",
            UnaryOp::Sin => "math.sin",
            UnaryOp::Cos => "math.cos",
            UnaryOp::Floor => "math.floor",
            UnaryOp::Ceil => "math.ceil",
        }
    }
}

/// A comparison (`arith.cmpi` / `arith.cmpf` predicate).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compare {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Compare {
    /// The predicate for operands of `dtype`: signed for integers, ordered for floats.
    pub fn predicate(self, dtype: DType) -> &'static str {
        match (self, dtype.is_float()) {
            (Compare::Eq, false) => "eq",
            (Compare::Ne, false) => "ne",
            (Compare::Lt, false) => "slt",
            (Compare::Le, false) => "sle",
            (Compare::Gt, false) => "sgt",
            (Compare::Ge, false) => "sge",
            (Compare::Eq, true) => "oeq",
            (Compare::Ne, true) => "one",
            (Compare::Lt, true) => "olt",
            (Compare::Le, true) => "ole",
            (Compare::Gt, true) => "ogt",
            (Compare::Ge, true) => "oge",
        }
    }
}

/// A reduction combiner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reduce {
    Sum,
    Max,
}

/// A constant's value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Float(f64),
    Int(i64),
}

/// One operation. Operands are values defined before it, in its region or an enclosing one.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A scalar, `index` or splat vector constant of type `ty`.
    Constant {
        value: Scalar,
        ty: MType,
    },
    Binary(BinaryOp, ValueId, ValueId),
    Unary(UnaryOp, ValueId),
    /// `i1` scalar or vector.
    Compare(Compare, ValueId, ValueId),
    /// `cond ? a : b`, elementwise for a vector condition.
    Select(ValueId, ValueId, ValueId),
    /// A float cast to another float type (`arith.extf` / `arith.truncf`), or a signed
    /// integer to a float (`arith.sitofp`).
    Convert {
        x: ValueId,
        to: DType,
    },
    /// An `i32` vector whose elements count along dim `dim` (`tpu.iota`).
    Iota {
        dim: usize,
        shape: Vec<u64>,
    },
    /// The same `i32` scalar, promised to be a multiple of `by` (`tpu.assume_multiple`): the
    /// hint that lets a dynamic offset into a block keep its tiling.
    AssumeMultiple {
        x: ValueId,
        by: u64,
    },
    /// An `i32` scalar as an `index`.
    IndexCast(ValueId),
    /// A vector to a larger shape (`vector.broadcast`): leading dims added, size-1 dims
    /// stretched.
    Broadcast {
        x: ValueId,
        shape: Vec<u64>,
    },
    /// The same elements in another shape (`vector.shape_cast`).
    ShapeCast {
        x: ValueId,
        shape: Vec<u64>,
    },
    /// A `shape` window of a memref (the whole block, or a sub-slice) at indices of type
    /// `index` (one per dim, its first element).
    Load {
        memref: ValueId,
        indices: Vec<ValueId>,
        shape: Vec<u64>,
    },
    /// Writes a vector into a memref at indices (its shape: the whole block or a sub-slice).
    Store {
        memref: ValueId,
        indices: Vec<ValueId>,
        value: ValueId,
    },
    /// Reduces a vector over `dims` into `acc`'s type (the remaining dims).
    MultiReduce {
        kind: Reduce,
        x: ValueId,
        acc: ValueId,
        dims: Vec<usize>,
    },
    /// `acc + lhs · rhs` on the MXU, either operand transposed (`lhsᵀ · rhs`, `lhs · rhsᵀ`);
    /// 2-D operands, f32 accumulator.
    Matmul {
        lhs: ValueId,
        rhs: ValueId,
        acc: ValueId,
        transpose_lhs: bool,
        transpose_rhs: bool,
    },
    /// Runs `then` when the `i1` scalar is true.
    If {
        cond: ValueId,
        then: RegionId,
    },
    /// One element of an SMEM memref, at `index` indices (`memref.load`).
    ScalarLoad {
        memref: ValueId,
        indices: Vec<ValueId>,
    },
    /// Writes a scalar into an SMEM memref (`memref.store`).
    ScalarStore {
        memref: ValueId,
        indices: Vec<ValueId>,
        value: ValueId,
    },
    /// Runs `body` for `iv` in `lo, lo + step, ..` below `hi` (`i32` scalars; `scf.for`
    /// without loop-carried values: the body communicates through memrefs). `iv` is defined
    /// inside `body` only.
    For {
        lo: ValueId,
        hi: ValueId,
        step: ValueId,
        iv: ValueId,
        body: RegionId,
    },
}

/// One op with the values it defines (the StableHLO IR's record over Mosaic ops).
pub type Instr = crate::ir::Instr<Op>;

/// Where in the kernel author's Rust source an op was built (the builder call's caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    pub file: &'static str,
    pub line: u32,
    pub column: u32,
}

impl Loc {
    /// The location of a Rust caller.
    pub fn of(caller: &'static std::panic::Location<'static>) -> Loc {
        Loc { file: caller.file(), line: caller.line(), column: caller.column() }
    }

    /// `loc("file":line:column)`, the MLIR location the printers attach to the op.
    pub fn mlir(&self) -> String {
        format!("loc(\"{}\":{}:{})", crate::ir::escape(self.file), self.line, self.column)
    }
}

/// A straight-line list of instructions, each with the source location it was built at.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Region {
    pub instrs: Vec<Instr>,
    /// One per instruction.
    pub locs: Vec<Loc>,
}

/// A Mosaic kernel: the grid and its windows, the scratch buffers and the body.
///
/// Values `0..grid.len()` are the grid indices (`i32`), then one SMEM memref per scalar-prefetch
/// table, then one memref per window (inputs, then outputs; block-shaped, in VMEM), then one
/// per scratch buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub grid: Vec<u64>,
    pub semantics: Vec<Semantics>,
    /// The scalar-prefetch tables (1-d `i32` arrays): the custom call's first operands, whole
    /// in SMEM, read by index maps and the body.
    pub prefetch: Vec<TensorType>,
    /// Inputs, then outputs.
    pub windows: Vec<Window>,
    pub num_inputs: usize,
    /// Scratch memrefs.
    pub scratch: Vec<MType>,
    /// `(input, output)` pairs whose arrays are one buffer (`input_output_aliases`): the output
    /// starts as the input's contents, so blocks the grid does not write keep them.
    pub aliases: Vec<(usize, usize)>,
    /// The scoped VMEM the kernel may use (`vmem_limit_bytes`), in place of the target's
    /// default; `None` keeps the default.
    pub vmem_limit_bytes: Option<u64>,
    /// The type of every value, indexed by [`ValueId`].
    pub values: Vec<MType>,
    /// Region 0 is the body.
    pub regions: Vec<Region>,
}

impl Kernel {
    pub fn ty(&self, v: ValueId) -> &MType {
        &self.values[v.0 as usize]
    }

    pub fn region(&self, r: RegionId) -> &Region {
        &self.regions[r.0 as usize]
    }

    /// How many values are the kernel's arguments (grid indices, prefetch tables, windows,
    /// scratch).
    pub fn num_args(&self) -> usize {
        self.grid.len() + self.prefetch.len() + self.windows.len() + self.scratch.len()
    }

    /// The custom call's operand arrays: the prefetch tables, then the input windows' arrays.
    pub fn operands(&self) -> Vec<TensorType> {
        self.prefetch.iter().chain(self.inputs().iter().map(|w| &w.array)).cloned().collect()
    }

    pub fn inputs(&self) -> &[Window] {
        &self.windows[..self.num_inputs]
    }

    pub fn outputs(&self) -> &[Window] {
        &self.windows[self.num_inputs..]
    }

    /// The memref value of window `i`.
    pub fn window_value(&self, i: usize) -> ValueId {
        ValueId((self.grid.len() + self.prefetch.len() + i) as u32)
    }

    /// The SMEM memref value of prefetch table `p`.
    pub fn prefetch_value(&self, p: usize) -> ValueId {
        ValueId((self.grid.len() + p) as u32)
    }

    /// The memref value of scratch buffer `j`.
    pub fn scratch_value(&self, j: usize) -> ValueId {
        ValueId((self.grid.len() + self.prefetch.len() + self.windows.len() + j) as u32)
    }

    /// Per scalar-prefetch table, the values its index maps can take inside their arrays: the
    /// fewest blocks along any dim a table picks (`None` for a table no index map reads).
    pub fn prefetch_bounds(&self) -> Vec<Option<u64>> {
        let mut bounds = vec![None; self.prefetch.len()];
        for w in &self.windows {
            let dims = w.array.shape.static_dims().unwrap_or_default();
            for ((e, b), a) in w.index_map.iter().zip(&w.block).zip(&dims) {
                if let IndexExpr::Prefetch { table, .. } = e
                    && let Some(slot) = bounds.get_mut(*table)
                {
                    let n = a / b.max(&1);
                    *slot = Some(slot.map_or(n, |m: u64| m.min(n)));
                }
            }
        }
        bounds
    }

    /// Whether window `i`'s index map reads a prefetch table (its blocks depend on data).
    pub fn data_dependent(&self, i: usize) -> bool {
        self.windows[i].index_map.iter().any(|e| matches!(e, IndexExpr::Prefetch { .. }))
    }
}

/// What [`infer`] needs to know about operands.
pub trait InferCx {
    fn ty(&self, v: ValueId) -> &MType;
}

fn same(a: &MType, b: &MType) -> Result<(), OpError> {
    if a != b {
        return Err(op_err!(DType, "operand types differ: {a} vs {b}"));
    }
    Ok(())
}

fn vector_or_scalar(t: &MType) -> Result<DType, OpError> {
    match t {
        MType::Vector { dtype, .. } | MType::Scalar(dtype) => Ok(*dtype),
        other => Err(op_err!(DType, "takes a vector or a scalar, not {other}")),
    }
}

fn memref_indices(memref: &MType, indices: &[ValueId], cx: &dyn InferCx) -> Result<(), OpError> {
    let MType::MemRef { shape, .. } = memref else {
        return Err(op_err!(DType, "takes a memref, not {memref}"));
    };
    if indices.len() != shape.len() {
        return Err(op_err!(
            Shape,
            "{} indices for {memref}, which has rank {}",
            indices.len(),
            shape.len()
        ));
    }
    for i in indices {
        if *cx.ty(*i) != MType::Index {
            return Err(op_err!(DType, "an index is {}, not index", cx.ty(*i)));
        }
    }
    Ok(())
}

/// The result types of `op`, or why its operands are wrong.
pub fn infer(op: &Op, cx: &dyn InferCx) -> Result<Vec<MType>, OpError> {
    Ok(match op {
        Op::Constant { value, ty } => {
            let dtype = match ty {
                MType::Index => None,
                MType::Scalar(d) | MType::Vector { dtype: d, .. } => Some(*d),
                other => return Err(op_err!(DType, "no constant of type {other}")),
            };
            match (value, dtype) {
                (Scalar::Float(_), Some(d)) if d.is_float() => {}
                (Scalar::Int(_), None) => {}
                (Scalar::Int(_), Some(d)) if !d.is_float() => {}
                _ => return Err(op_err!(DType, "{value:?} is not a {ty} value")),
            }
            vec![ty.clone()]
        }
        Op::Binary(op, x, y) => {
            let (tx, ty) = (cx.ty(*x), cx.ty(*y));
            let dtype = vector_or_scalar(tx)?;
            same(tx, ty)?;
            if dtype == DType::Bool {
                return Err(op_err!(DType, "not defined on i1"));
            }
            if matches!(op, BinaryOp::Pow | BinaryOp::Atan2) && !dtype.is_float() {
                return Err(op_err!(DType, "takes floats, not {tx}"));
            }
            // Measured: libtpu's Mosaic has no bf16 `math.atan2` or `arith.remf`.
            if matches!(op, BinaryOp::Atan2 | BinaryOp::Rem) && dtype == DType::BF16 {
                return Err(op_err!(
                    DType,
                    "has no bf16 form on a TPU: compute it in f32 (`.cast(DType::F32)`), not {tx}"
                ));
            }
            vec![tx.clone()]
        }
        Op::Unary(_, x) => {
            let t = cx.ty(*x);
            let dtype = vector_or_scalar(t)?;
            if !dtype.is_float() {
                return Err(op_err!(DType, "takes floats, not {t}"));
            }
            vec![t.clone()]
        }
        Op::Compare(_, x, y) => {
            let (tx, ty) = (cx.ty(*x), cx.ty(*y));
            vector_or_scalar(tx)?;
            same(tx, ty)?;
            vec![tx.with_dtype(DType::Bool)]
        }
        Op::Select(c, a, b) => {
            let (tc, ta, tb) = (cx.ty(*c), cx.ty(*a), cx.ty(*b));
            same(ta, tb)?;
            let cond_ok = match tc {
                MType::Scalar(DType::Bool) => true,
                MType::Vector { dtype: DType::Bool, shape } => shape == ta.shape(),
                _ => false,
            };
            if !cond_ok {
                return Err(op_err!(DType, "condition {tc} does not select {ta}"));
            }
            vec![ta.clone()]
        }
        Op::Convert { x, to } => {
            let t = cx.ty(*x);
            let from = vector_or_scalar(t)?;
            let int = matches!(from, DType::I8 | DType::I16 | DType::I32);
            if !to.is_float() || !(from.is_float() || int) {
                return Err(op_err!(
                    DType,
                    "float or signed integer to float only, not {t} to {to}"
                ));
            }
            vec![t.with_dtype(*to)]
        }
        Op::Iota { dim, shape } => {
            if shape.is_empty() || *dim >= shape.len() {
                return Err(op_err!(Axis, "dim {dim} of an iota of shape {shape:?}"));
            }
            vec![MType::vector(DType::I32, shape)]
        }
        Op::AssumeMultiple { x, by } => {
            let t = cx.ty(*x);
            if *t != MType::Scalar(DType::I32) || *by == 0 {
                return Err(op_err!(
                    DType,
                    "takes an i32 scalar and a positive multiple, not {t} and {by}"
                ));
            }
            vec![t.clone()]
        }
        Op::IndexCast(x) => {
            let t = cx.ty(*x);
            if *t != MType::Scalar(DType::I32) {
                return Err(op_err!(DType, "takes an i32 scalar, not {t}"));
            }
            vec![MType::Index]
        }
        Op::Broadcast { x, shape } => {
            let t = cx.ty(*x);
            let dtype = vector_or_scalar(t)?;
            let from = t.shape();
            if from.len() > shape.len() {
                return Err(op_err!(Shape, "{t} has more dims than {shape:?}"));
            }
            let lead = shape.len() - from.len();
            for (d, (a, b)) in from.iter().zip(&shape[lead..]).enumerate() {
                if a != b && *a != 1 {
                    return Err(op_err!(
                        Shape,
                        "dim {d} of {t} is {a}, which broadcasts to 1 or itself, not {b}"
                    ));
                }
            }
            vec![MType::vector(dtype, shape)]
        }
        Op::ShapeCast { x, shape } => {
            let t = cx.ty(*x);
            let MType::Vector { shape: from, dtype } = t else {
                return Err(op_err!(DType, "takes a vector, not {t}"));
            };
            if from.iter().product::<u64>() != shape.iter().product::<u64>() {
                return Err(op_err!(Shape, "{t} has another element count than {shape:?}"));
            }
            vec![MType::vector(*dtype, shape)]
        }
        Op::ScalarLoad { memref, indices } => {
            let t = cx.ty(*memref);
            memref_indices(t, indices, cx)?;
            in_smem(t)?;
            vec![MType::Scalar(t.dtype().unwrap_or(DType::I32))]
        }
        Op::ScalarStore { memref, indices, value } => {
            let t = cx.ty(*memref);
            memref_indices(t, indices, cx)?;
            in_smem(t)?;
            let v = cx.ty(*value);
            if *v != MType::Scalar(t.dtype().unwrap_or(DType::I32)) {
                return Err(op_err!(DType, "stores {v} into {t}: one element of its type"));
            }
            vec![]
        }
        Op::Load { memref, indices, shape } => {
            let t = cx.ty(*memref);
            memref_indices(t, indices, cx)?;
            in_vmem(t)?;
            window_within(t, shape)?;
            vec![MType::vector(t.dtype().unwrap_or(DType::F32), shape)]
        }
        Op::Store { memref, indices, value } => {
            let t = cx.ty(*memref);
            memref_indices(t, indices, cx)?;
            in_vmem(t)?;
            let v = cx.ty(*value);
            let MType::Vector { shape, dtype } = v else {
                return Err(op_err!(DType, "stores {v}, not a vector, into {t}"));
            };
            if Some(*dtype) != t.dtype() {
                return Err(op_err!(DType, "stores {v} into {t}: another element type"));
            }
            window_within(t, shape)?;
            vec![]
        }
        Op::MultiReduce { x, acc, dims, .. } => {
            let (t, ta) = (cx.ty(*x), cx.ty(*acc));
            let MType::Vector { shape, dtype } = t else {
                return Err(op_err!(DType, "takes a vector, not {t}"));
            };
            let mut sorted = dims.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if dims.is_empty()
                || sorted.len() != dims.len()
                || sorted.iter().any(|d| *d >= shape.len())
            {
                return Err(op_err!(Axis, "dims {dims:?} for {t}"));
            }
            let kept: Vec<u64> = shape
                .iter()
                .enumerate()
                .filter(|(i, _)| !dims.contains(i))
                .map(|(_, d)| *d)
                .collect();
            let want =
                if kept.is_empty() { MType::Scalar(*dtype) } else { MType::vector(*dtype, &kept) };
            if *ta != want {
                return Err(op_err!(Shape, "the accumulator is {ta}, the result {want}"));
            }
            vec![want]
        }
        Op::Matmul { lhs, rhs, acc, transpose_lhs, transpose_rhs } => {
            let (tl, tr, ta) = (cx.ty(*lhs), cx.ty(*rhs), cx.ty(*acc));
            let (MType::Vector { shape: l, dtype: dl }, MType::Vector { shape: r, dtype: dr }) =
                (tl, tr)
            else {
                return Err(op_err!(DType, "takes vectors, not {tl} and {tr}"));
            };
            if l.len() != 2 || r.len() != 2 {
                return Err(op_err!(Shape, "takes 2-d operands, not {tl} and {tr}"));
            }
            if dl != dr {
                return Err(op_err!(DType, "operand types differ: {tl} vs {tr}"));
            }
            let (m, k_l) = if *transpose_lhs { (l[1], l[0]) } else { (l[0], l[1]) };
            let (k_r, n) = if *transpose_rhs { (r[1], r[0]) } else { (r[0], r[1]) };
            if k_l != k_r {
                return Err(op_err!(
                    DimensionNumbers,
                    "contracting dims differ: {tl}{} has {k_l}, {tr}{} has {k_r}",
                    if *transpose_lhs { " (transposed)" } else { "" },
                    if *transpose_rhs { " (transposed)" } else { "" }
                ));
            }
            let want = MType::vector(DType::F32, &[m, n]);
            if *ta != want {
                return Err(op_err!(DType, "the accumulator is {ta}, the product {want}"));
            }
            vec![want]
        }
        Op::If { cond, .. } => {
            let t = cx.ty(*cond);
            if *t != MType::Scalar(DType::Bool) {
                return Err(op_err!(DType, "the condition is {t}, not i1"));
            }
            vec![]
        }
        Op::For { lo, hi, step, iv, .. } => {
            for (what, v) in [
                ("lower bound", lo),
                ("upper bound", hi),
                ("step", step),
                ("induction variable", iv),
            ] {
                let t = cx.ty(*v);
                if *t != MType::Scalar(DType::I32) {
                    return Err(op_err!(DType, "the {what} is {t}, not i32"));
                }
            }
            vec![]
        }
    })
}

/// Vector loads and stores reach VMEM only.
fn in_vmem(t: &MType) -> Result<(), OpError> {
    if t.space() != Some(super::types::MemorySpace::Vmem) {
        return Err(op_err!(
            DType,
            "a vector load or store needs a VMEM memref, not {t} (read SMEM one element at a time)"
        ));
    }
    Ok(())
}

/// Scalar loads and stores reach SMEM only, 32-bit elements.
fn in_smem(t: &MType) -> Result<(), OpError> {
    let ok = t.space() == Some(super::types::MemorySpace::Smem)
        && matches!(t.dtype(), Some(DType::I32 | DType::F32));
    if !ok {
        return Err(op_err!(
            DType,
            "a scalar load or store needs an i32 or f32 SMEM memref, not {t}"
        ));
    }
    Ok(())
}

/// A load's or store's window fits its memref: the same rank, each dim at most the memref's.
fn window_within(memref: &MType, shape: &[u64]) -> Result<(), OpError> {
    let dims = memref.shape();
    if shape.len() != dims.len() || shape.iter().zip(dims).any(|(s, d)| *s == 0 || s > d) {
        return Err(op_err!(Shape, "a window of {shape:?} does not fit {memref}"));
    }
    Ok(())
}

/// The name an op is reported under.
pub fn op_name(op: &Op, cx: &dyn InferCx) -> &'static str {
    match op {
        Op::Constant { .. } => "arith.constant",
        Op::Binary(b, x, _) => b.mlir(cx.ty(*x).dtype().unwrap_or(DType::F32)),
        Op::Unary(u, _) => u.mlir(),
        Op::Compare(_, x, _) => {
            if cx.ty(*x).dtype().is_some_and(DType::is_float) {
                "arith.cmpf"
            } else {
                "arith.cmpi"
            }
        }
        Op::Select(..) => "arith.select",
        Op::Convert { x, to } => {
            let from = cx.ty(*x).dtype().unwrap_or(DType::F32);
            if !from.is_float() {
                "arith.sitofp"
            } else if to.bits() >= from.bits() {
                "arith.extf"
            } else {
                "arith.truncf"
            }
        }
        Op::Iota { .. } => "tpu.iota",
        Op::AssumeMultiple { .. } => "tpu.assume_multiple",
        Op::For { .. } => "scf.for",
        Op::ScalarLoad { .. } => "memref.load",
        Op::ScalarStore { .. } => "memref.store",
        Op::IndexCast(_) => "arith.index_cast",
        Op::Broadcast { .. } => "vector.broadcast",
        Op::ShapeCast { .. } => "vector.shape_cast",
        Op::Load { .. } => "vector.load",
        Op::Store { .. } => "tpu.vector_store",
        Op::MultiReduce { .. } => "vector.multi_reduction",
        Op::Matmul { .. } => "tpu.matmul",
        Op::If { .. } => "scf.if",
    }
}
