//! The CPU twin of a tiled kernel: the same kernel description lowered to StableHLO with
//! Pallas interpret-mode semantics, through the StableHLO builder (so it is verified and printed
//! like every other module).
//!
//! - Outputs start as NaN (floats) or the type's minimum (integers), scratch buffers likewise,
//!   as interpret mode's "uninitialised" values; an output aliased to an input starts as the
//!   input's contents.
//! - One `stablehlo.while` runs over the grid points in row-major order (last axis fastest),
//!   carrying a step counter, the output arrays and the scratch buffers; the grid indices are
//!   `(t / stride) % bound`.
//! - Each window's block is a `dynamic_slice` at `index_map(grid) * block` (inputs from the
//!   function's arguments, outputs from the carried arrays); after the body each output block
//!   is written back with `dynamic_update_slice`. Scratch is carried across steps, never reset.
//! - Scalar-prefetch tables are `@main`'s first arguments, read in place: an index map entry
//!   `table[axis]` is a one-element `dynamic_slice` of the table at the grid index (a table
//!   value out of range is clamped, as in interpret mode; on a TPU it is the caller's bug).
//! - The body's ops become the elementwise, reduce, broadcast, reshape and `dot_general` ops of
//!   StableHLO; a `when` becomes a `stablehlo.case` whose branches give the blocks and scratch
//!   the region writes (unchanged, or as the region leaves them).

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::Module;
use crate::builder::{Branch, KernelBuilder, Tensor};
use crate::error::{BuildError, ErrorKind};
use crate::ir::{self as hlo, Direction, DotDims, RegionId, ValueId};
use crate::types::{DType, TensorType};

use super::ir::{BinaryOp, Compare, IndexExpr, Kernel, Op, Reduce, Scalar, UnaryOp};
use super::types::MType;

/// Lowers `kernel` to its CPU twin: a StableHLO module whose `@main` takes the input arrays
/// and returns the output arrays.
pub fn cpu_twin(kernel: &Kernel) -> Result<Module, BuildError> {
    let inputs = kernel.operands();
    let outputs: Vec<TensorType> = kernel.outputs().iter().map(|w| w.array.clone()).collect();
    cpu_twin_for(kernel, &inputs, &outputs)
}

/// [`cpu_twin`] for a caller whose arrays have other shapes of the same size than the
/// kernel's windows see: `@main` takes `inputs` (the scalar-prefetch tables, then the inputs)
/// and returns `outputs`, reshaped (row-major)
/// to and from the windows' arrays, as [`custom_call_module_for`] does around the custom call.
///
/// [`custom_call_module_for`]: super::wrap::custom_call_module_for
pub fn cpu_twin_for(
    kernel: &Kernel,
    inputs: &[TensorType],
    outputs: &[TensorType],
) -> Result<Module, BuildError> {
    let b = KernelBuilder::new(&kernel.name, inputs);
    let mut args = b.args();
    let tables = args.drain(..kernel.prefetch.len().min(args.len())).collect::<Vec<_>>();
    for (a, w) in args.iter_mut().zip(kernel.inputs()) {
        *a = adapt(*a, &w.array);
    }
    let mut init = vec![b.scalar(DType::I32, 0.0)?];
    for (o, w) in kernel.outputs().iter().enumerate() {
        // An aliased output starts as its input's contents; any other as "uninitialised".
        match kernel.aliases.iter().find(|(_, out)| *out == o) {
            Some((i, _)) => init.push(args[*i]),
            None => init.push(b.splat(w.array.clone(), uninitialised(w.array.dtype))?),
        }
    }
    for s in &kernel.scratch {
        init.push(b.splat(tensor_type(s), uninitialised(s.dtype().unwrap_or(DType::F32)))?);
    }
    let steps: u64 = kernel.grid.iter().product();
    let n_out = kernel.outputs().len();
    let result = b.while_loop(
        &init,
        |carried| {
            let bound = b.scalar(DType::I32, steps as f64)?;
            b.compare(Direction::Lt, carried[0], bound)
        },
        |carried| step(kernel, &b, &tables, &args, carried),
    )?;
    let mut results = result[1..=n_out].to_vec();
    for (r, caller) in results.iter_mut().zip(outputs) {
        *r = adapt(*r, caller);
    }
    b.finish(&results)
}

/// `x` as type `to` (the same element count): converted where the element types differ (the
/// 64-bit integers Mosaic lacks, [`super::window_dtype`]), reshaped where the shapes do, as the
/// custom call's wrapper does.
fn adapt<'b>(x: Tensor<'b>, to: &TensorType) -> Tensor<'b> {
    let x = if x.dtype() != to.dtype { x.cast(to.dtype) } else { x };
    if x.ty() != *to { x.reshape(to.shape.clone()) } else { x }
}

fn uninitialised(dtype: DType) -> f64 {
    if dtype.is_float() {
        f64::NAN
    } else {
        match dtype {
            DType::I8 => f64::from(i8::MIN),
            DType::I16 => f64::from(i16::MIN),
            DType::I32 => f64::from(i32::MIN),
            DType::I64 => i64::MIN as f64,
            _ => 0.0,
        }
    }
}

/// The tensor type a Mosaic value becomes (scalars and `index` are rank-0 tensors).
fn tensor_type(t: &MType) -> TensorType {
    match t {
        MType::Index => TensorType::scalar(DType::I32),
        MType::Scalar(d) => TensorType::scalar(*d),
        MType::Vector { shape, dtype } | MType::MemRef { shape, dtype, .. } => {
            TensorType::new(*dtype, shape.as_slice())
        }
    }
}

struct Step<'k, 'b> {
    kernel: &'k Kernel,
    b: &'b KernelBuilder,
    /// The tensor of each Mosaic value defined so far.
    values: RefCell<BTreeMap<u32, Tensor<'b>>>,
    /// The current contents of each memref (window block or scratch buffer).
    memrefs: RefCell<BTreeMap<u32, Tensor<'b>>>,
}

fn step<'b>(
    kernel: &Kernel,
    b: &'b KernelBuilder,
    tables: &[Tensor<'b>],
    args: &[Tensor<'b>],
    carried: &[Tensor<'b>],
) -> Result<Vec<Tensor<'b>>, BuildError> {
    let t = carried[0];
    let n_out = kernel.outputs().len();
    let (outputs, scratch) = carried[1..].split_at(n_out);
    let st = Step {
        kernel,
        b,
        values: RefCell::new(BTreeMap::new()),
        memrefs: RefCell::new(BTreeMap::new()),
    };
    // Grid indices, row-major: the last axis fastest.
    let mut grid = Vec::with_capacity(kernel.grid.len());
    for (axis, bound) in kernel.grid.iter().enumerate() {
        let stride: u64 = kernel.grid[axis + 1..].iter().product();
        let stride = b.scalar(DType::I32, stride as f64)?;
        let bound = b.scalar(DType::I32, *bound as f64)?;
        let q = b.binary(hlo::BinaryOp::Divide, t, stride)?;
        let g = b.binary(hlo::BinaryOp::Remainder, q, bound)?;
        st.values.borrow_mut().insert(axis as u32, g);
        grid.push(g);
    }
    // Each window's block at this step.
    let mut starts = Vec::with_capacity(kernel.windows.len());
    for (i, w) in kernel.windows.iter().enumerate() {
        let mut s = Vec::with_capacity(w.block.len());
        for (e, block) in w.index_map.iter().zip(&w.block) {
            let index = match e {
                IndexExpr::Grid(axis) => grid[*axis],
                IndexExpr::Const(c) => b.scalar(DType::I32, *c as f64)?,
                IndexExpr::GridDiv { axis, by, modulo } => {
                    let by = b.scalar(DType::I32, *by as f64)?;
                    let q = b.binary(hlo::BinaryOp::Divide, grid[*axis], by)?;
                    match modulo {
                        None => q,
                        Some(m) => {
                            let m = b.scalar(DType::I32, *m as f64)?;
                            b.binary(hlo::BinaryOp::Remainder, q, m)?
                        }
                    }
                }
                // The table's element at the grid index, as interpret mode reads it.
                IndexExpr::Prefetch { table, axis } => {
                    let one = b.dynamic_slice(tables[*table], &[grid[*axis]], &[1])?;
                    b.reshape(one, &[] as &[u64])?
                }
            };
            let block = b.scalar(DType::I32, *block as f64)?;
            s.push(b.binary(hlo::BinaryOp::Multiply, index, block)?);
        }
        let array = if i < kernel.num_inputs { args[i] } else { outputs[i - kernel.num_inputs] };
        let sizes: Vec<i64> = w.block.iter().map(|d| *d as i64).collect();
        let block = b.dynamic_slice(array, &s, &sizes)?;
        st.memrefs.borrow_mut().insert(kernel.window_value(i).0, block);
        starts.push(s);
    }
    for (p, table) in tables.iter().enumerate() {
        st.memrefs.borrow_mut().insert(kernel.prefetch_value(p).0, *table);
    }
    for (j, s) in scratch.iter().enumerate() {
        st.memrefs.borrow_mut().insert(kernel.scratch_value(j).0, *s);
    }
    st.region(RegionId(0))?;
    // Write the output blocks back; carry the scratch.
    let mut next = vec![b.binary(hlo::BinaryOp::Add, t, b.scalar(DType::I32, 1.0)?)?];
    for (o, out) in outputs.iter().enumerate() {
        let i = kernel.num_inputs + o;
        let block = st.memrefs.borrow()[&kernel.window_value(i).0];
        next.push(b.dynamic_update_slice(*out, block, &starts[i])?);
    }
    for j in 0..scratch.len() {
        next.push(st.memrefs.borrow()[&kernel.scratch_value(j).0]);
    }
    Ok(next)
}

/// The memrefs a region (and the regions nested in it) stores to, in order.
fn stored(kernel: &Kernel, r: RegionId, out: &mut Vec<u32>) {
    for instr in &kernel.region(r).instrs {
        match &instr.op {
            Op::Store { memref, .. } | Op::ScalarStore { memref, .. }
                if !out.contains(&memref.0) =>
            {
                out.push(memref.0)
            }
            Op::If { then, .. } => stored(kernel, *then, out),
            Op::For { body, .. } => stored(kernel, *body, out),
            _ => {}
        }
    }
}

impl<'b> Step<'_, 'b> {
    fn err(&self, op: &'static str, message: String) -> BuildError {
        BuildError { kernel: self.kernel.name.clone(), op, kind: ErrorKind::Verify, message }
    }

    fn lookup(
        &self,
        map: &RefCell<BTreeMap<u32, Tensor<'b>>>,
        v: ValueId,
        what: &str,
    ) -> Result<Tensor<'b>, BuildError> {
        map.borrow()
            .get(&v.0)
            .copied()
            .ok_or_else(|| self.err("twin", format!("value %{} {what}", v.0)))
    }

    fn value(&self, v: ValueId) -> Result<Tensor<'b>, BuildError> {
        self.lookup(&self.values, v, "has no tensor")
    }

    fn memref(&self, v: ValueId) -> Result<Tensor<'b>, BuildError> {
        self.lookup(&self.memrefs, v, "is not a memref")
    }

    fn region(&self, r: RegionId) -> Result<(), BuildError> {
        let (k, b) = (self.kernel, self.b);
        for instr in &k.region(r).instrs {
            let result = match &instr.op {
                Op::Constant { value, ty } => {
                    let v = match value {
                        Scalar::Float(f) => *f,
                        Scalar::Int(i) => *i as f64,
                    };
                    Some(b.splat(tensor_type(ty), v)?)
                }
                Op::Binary(op, x, y) => {
                    let op = match op {
                        BinaryOp::Add => hlo::BinaryOp::Add,
                        BinaryOp::Sub => hlo::BinaryOp::Subtract,
                        BinaryOp::Mul => hlo::BinaryOp::Multiply,
                        BinaryOp::Div => hlo::BinaryOp::Divide,
                        BinaryOp::Max => hlo::BinaryOp::Maximum,
                        BinaryOp::Min => hlo::BinaryOp::Minimum,
                        BinaryOp::Rem => hlo::BinaryOp::Remainder,
                        BinaryOp::Pow => hlo::BinaryOp::Power,
                        BinaryOp::Atan2 => hlo::BinaryOp::Atan2,
                    };
                    Some(b.binary(op, self.value(*x)?, self.value(*y)?)?)
                }
                Op::Unary(op, x) => {
                    let op = match op {
                        UnaryOp::Neg => hlo::UnaryOp::Negate,
                        UnaryOp::Exp => hlo::UnaryOp::Exp,
                        UnaryOp::Log => hlo::UnaryOp::Log,
                        UnaryOp::Tanh => hlo::UnaryOp::Tanh,
                        UnaryOp::Rsqrt => hlo::UnaryOp::Rsqrt,
                        UnaryOp::Sqrt => hlo::UnaryOp::Sqrt,
                        UnaryOp::Erf => hlo::UnaryOp::Erf,
                        UnaryOp::Abs => hlo::UnaryOp::Abs,
                        UnaryOp::Log1p => hlo::UnaryOp::LogPlusOne,
                        UnaryOp::Sin => hlo::UnaryOp::Sine,
                        UnaryOp::Cos => hlo::UnaryOp::Cosine,
                        UnaryOp::Floor => hlo::UnaryOp::Floor,
                        UnaryOp::Ceil => hlo::UnaryOp::Ceil,
                    };
                    Some(b.unary(op, self.value(*x)?)?)
                }
                Op::Compare(c, x, y) => {
                    let d = match c {
                        Compare::Eq => Direction::Eq,
                        Compare::Ne => Direction::Ne,
                        Compare::Lt => Direction::Lt,
                        Compare::Le => Direction::Le,
                        Compare::Gt => Direction::Gt,
                        Compare::Ge => Direction::Ge,
                    };
                    Some(b.compare(d, self.value(*x)?, self.value(*y)?)?)
                }
                Op::Select(c, x, y) => {
                    Some(b.select(self.value(*c)?, self.value(*x)?, self.value(*y)?)?)
                }
                Op::Convert { x, to } => Some(b.convert(self.value(*x)?, *to)?),
                Op::IndexCast(x) => Some(self.value(*x)?),
                Op::Broadcast { x, shape } => {
                    let x_ty = k.ty(*x);
                    let lead = (shape.len() - x_ty.shape().len()) as i64;
                    let dims: Vec<i64> = (0..x_ty.shape().len() as i64).map(|d| d + lead).collect();
                    let to = TensorType::new(x_ty.dtype().unwrap_or(DType::F32), shape.as_slice());
                    Some(b.broadcast_in_dim(self.value(*x)?, to, &dims)?)
                }
                Op::ShapeCast { x, shape } => Some(b.reshape(self.value(*x)?, shape.as_slice())?),
                Op::Load { memref, indices, shape } => {
                    let whole = self.memref(*memref)?;
                    if shape.as_slice() == k.ty(*memref).shape() {
                        Some(whole)
                    } else {
                        let starts: Vec<Tensor<'b>> =
                            indices.iter().map(|i| self.value(*i)).collect::<Result<_, _>>()?;
                        let sizes: Vec<i64> = shape.iter().map(|d| *d as i64).collect();
                        Some(b.dynamic_slice(whole, &starts, &sizes)?)
                    }
                }
                Op::Store { memref, indices, value } => {
                    let v = self.value(*value)?;
                    let v = if k.ty(*value).shape() == k.ty(*memref).shape() {
                        v
                    } else {
                        let starts: Vec<Tensor<'b>> =
                            indices.iter().map(|i| self.value(*i)).collect::<Result<_, _>>()?;
                        b.dynamic_update_slice(self.memref(*memref)?, v, &starts)?
                    };
                    self.memrefs.borrow_mut().insert(memref.0, v);
                    None
                }
                Op::ScalarLoad { memref, indices } => {
                    let starts: Vec<Tensor<'b>> =
                        indices.iter().map(|i| self.value(*i)).collect::<Result<_, _>>()?;
                    let ones = vec![1i64; indices.len()];
                    let one = b.dynamic_slice(self.memref(*memref)?, &starts, &ones)?;
                    Some(b.reshape(one, &[] as &[u64])?)
                }
                Op::ScalarStore { memref, indices, value } => {
                    let starts: Vec<Tensor<'b>> =
                        indices.iter().map(|i| self.value(*i)).collect::<Result<_, _>>()?;
                    let ones = vec![1u64; indices.len()];
                    let v = b.reshape(self.value(*value)?, ones.as_slice())?;
                    let updated = b.dynamic_update_slice(self.memref(*memref)?, v, &starts)?;
                    self.memrefs.borrow_mut().insert(memref.0, updated);
                    None
                }
                Op::Iota { dim, shape } => {
                    Some(b.iota(TensorType::new(DType::I32, shape.as_slice()), *dim as i64)?)
                }
                Op::AssumeMultiple { x, .. } => Some(self.value(*x)?),
                Op::For { lo, hi, step, iv, body } => {
                    self.for_loop(*lo, *hi, *step, *iv, *body)?;
                    None
                }
                Op::MultiReduce { kind, x, acc, dims } => {
                    let (op, init) = match kind {
                        Reduce::Sum => (hlo::BinaryOp::Add, 0.0),
                        Reduce::Max => (hlo::BinaryOp::Maximum, f64::NEG_INFINITY),
                    };
                    let dims: Vec<i64> = dims.iter().map(|d| *d as i64).collect();
                    let r = b.reduce_with(self.value(*x)?, op, init, &dims)?;
                    Some(b.binary(op, r, self.value(*acc)?)?)
                }
                Op::Matmul { lhs, rhs, acc, transpose_lhs, transpose_rhs } => {
                    let dims = DotDims {
                        lhs_batch: vec![],
                        rhs_batch: vec![],
                        lhs_contracting: vec![if *transpose_lhs { 0 } else { 1 }],
                        rhs_contracting: vec![if *transpose_rhs { 1 } else { 0 }],
                    };
                    let p = b.dot_general(
                        self.value(*lhs)?,
                        self.value(*rhs)?,
                        dims,
                        None,
                        Some(DType::F32),
                    )?;
                    Some(b.binary(hlo::BinaryOp::Add, p, self.value(*acc)?)?)
                }
                Op::If { cond, then } => {
                    self.when(*cond, *then)?;
                    None
                }
            };
            if let (Some(t), [v]) = (result, instr.results.as_slice()) {
                self.values.borrow_mut().insert(v.0, t);
            }
        }
        Ok(())
    }

    /// `scf.for` as a `stablehlo.while` carrying the induction variable and the memrefs the
    /// body writes.
    fn for_loop(
        &self,
        lo: ValueId,
        hi: ValueId,
        step: ValueId,
        iv: ValueId,
        body: RegionId,
    ) -> Result<(), BuildError> {
        let b = self.b;
        let mut written = Vec::new();
        stored(self.kernel, body, &mut written);
        if written.is_empty() {
            return Ok(()); // a body that writes nothing has no effect
        }
        let (hi, step) = (self.value(hi)?, self.value(step)?);
        let mut init = vec![self.value(lo)?];
        for v in &written {
            init.push(self.memref(ValueId(*v))?);
        }
        let after = b.while_loop(
            &init,
            |carried| b.compare(Direction::Lt, carried[0], hi),
            |carried| {
                self.values.borrow_mut().insert(iv.0, carried[0]);
                for (v, t) in written.iter().zip(&carried[1..]) {
                    self.memrefs.borrow_mut().insert(*v, *t);
                }
                self.region(body)?;
                let mut next = vec![b.binary(hlo::BinaryOp::Add, carried[0], step)?];
                for v in &written {
                    next.push(self.memref(ValueId(*v))?);
                }
                Ok(next)
            },
        )?;
        let mut memrefs = self.memrefs.borrow_mut();
        for (v, t) in written.iter().zip(&after[1..]) {
            memrefs.insert(*v, *t);
        }
        Ok(())
    }

    /// `scf.if` as a `stablehlo.case` over the memrefs the region writes.
    fn when(&self, cond: ValueId, then: RegionId) -> Result<(), BuildError> {
        let b = self.b;
        let mut written = Vec::new();
        stored(self.kernel, then, &mut written);
        if written.is_empty() {
            return Ok(()); // a region that writes nothing has no effect
        }
        let index = b.convert(self.value(cond)?, DType::I32)?;
        let before: Vec<Tensor<'b>> =
            written.iter().map(|v| self.memref(ValueId(*v))).collect::<Result<_, _>>()?;
        let keep = before.clone();
        let written_for_branch = written.clone();
        let branches: Vec<Branch<'b, '_>> = vec![
            Box::new(move || Ok(keep)),
            Box::new(move || {
                self.region(then)?;
                written_for_branch.iter().map(|v| self.memref(ValueId(*v))).collect()
            }),
        ];
        let after = b.case(index, branches)?;
        let mut memrefs = self.memrefs.borrow_mut();
        for (v, t) in written.iter().zip(after) {
            memrefs.insert(*v, t);
        }
        Ok(())
    }
}
