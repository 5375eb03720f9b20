//! The typed, fallible kernel builder.
//!
//! A [`KernelBuilder`] owns one function under construction. Every op goes through
//! [`crate::ir::infer`], so a wrong dtype, an incompatible shape, a bad axis or a value from another
//! builder is a [`BuildError`] naming the kernel, the op and the types, never a panic.
//!
//! Two ways to call it:
//! - the builder's methods (`b.binary(..)`, `b.dot_general(..)`) return `Result` at once;
//! - the [`Tensor`] methods and operators (`x * w`, `x.exp()`, `x.sum(&[-1], true)`) read like
//!   array code: an error is recorded on the builder, the op returns a poisoned tensor that every
//!   later op passes through, and [`KernelBuilder::finish`] returns the first error.

use std::cell::RefCell;

use crate::error::{BuildError, OpError, op_err};
use crate::ir::{
    self, AttrValue, BinaryOp, ConvDims, ConvWindow, Direction, DotDims, Function, GatherDims,
    InferCx, Instr, Module, Op, Precision, Region, RegionId, ScatterDims, Signature, TextFunction,
    UnaryOp, ValueId, Visibility,
};
use crate::literal::{Literal, LiteralData};
use crate::types::{DType, Dim, Shape, TensorType};

const POISON: ValueId = ValueId(u32::MAX);
const BODY_SCOPE: u32 = 0;

/// One branch of [`KernelBuilder::case`]: builds the branch's ops and returns its results.
pub type Branch<'b, 'f> = Box<dyn FnOnce() -> Result<Vec<Tensor<'b>>, BuildError> + 'f>;

/// One function under construction. See the [module docs](self).
#[derive(Debug)]
pub struct KernelBuilder {
    kernel: String,
    state: RefCell<State>,
}

#[derive(Debug, Default)]
struct State {
    values: Vec<TensorType>,
    /// The scope each value was defined in.
    scope_of: Vec<u32>,
    regions: Vec<Region>,
    /// Scopes whose values are visible now (innermost last).
    open_scopes: Vec<u32>,
    /// Regions receiving instructions (innermost last).
    open_regions: Vec<RegionId>,
    next_scope: u32,
    params: Vec<TensorType>,
    param_attrs: Vec<Vec<(String, String)>>,
    callees: Vec<Function>,
    text_callees: Vec<TextFunction>,
    deferred: Option<BuildError>,
    finished: bool,
}

impl InferCx for State {
    fn ty(&self, v: ValueId) -> &TensorType {
        &self.values[v.0 as usize]
    }

    fn region_result_types(&self, r: RegionId) -> Vec<TensorType> {
        self.regions[r.0 as usize]
            .results
            .iter()
            .map(|v| self.values[v.0 as usize].clone())
            .collect()
    }

    fn callee(&self, name: &str) -> Option<Signature> {
        self.callees.iter().find(|f| f.name == name).map(Function::signature).or_else(|| {
            self.text_callees.iter().find(|f| f.name == name).map(|f| f.signature.clone())
        })
    }
}

/// A value of the kernel being built: a cheap handle (`Copy`) tied to its builder.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'b> {
    b: &'b KernelBuilder,
    id: ValueId,
}

impl KernelBuilder {
    /// A builder for kernel `kernel` whose function takes `params`.
    pub fn new(kernel: impl Into<String>, params: &[TensorType]) -> KernelBuilder {
        let state = State {
            values: params.to_vec(),
            scope_of: vec![BODY_SCOPE; params.len()],
            regions: vec![Region::default()],
            open_scopes: vec![BODY_SCOPE],
            open_regions: vec![RegionId(0)],
            next_scope: 1,
            params: params.to_vec(),
            param_attrs: vec![Vec::new(); params.len()],
            ..State::default()
        };
        KernelBuilder { kernel: kernel.into(), state: RefCell::new(state) }
    }

    /// The kernel's name, as errors show it.
    pub fn kernel_name(&self) -> &str {
        &self.kernel
    }

    /// The function's parameters.
    pub fn args(&self) -> Vec<Tensor<'_>> {
        let n = self.state.borrow().params.len();
        (0..n).map(|i| Tensor { b: self, id: ValueId(i as u32) }).collect()
    }

    /// Parameter `i`, or an error naming the parameter count.
    pub fn arg(&self, i: usize) -> Result<Tensor<'_>, BuildError> {
        if self.state.borrow().finished {
            return Err(self.err("func.func", op_err!(ForeignValue, "the builder has finished")));
        }
        let n = self.state.borrow().params.len();
        if i >= n {
            return Err(self.err("func.func", op_err!(Axis, "parameter {i} of {n}")));
        }
        Ok(Tensor { b: self, id: ValueId(i as u32) })
    }

    /// Adds an attribute to parameter `i` (e.g. `tf.aliasing_output` = `0 : i32` for donation).
    pub fn set_param_attr(&self, i: usize, name: &str, value: &str) -> Result<(), BuildError> {
        let mut st = self.state.borrow_mut();
        let n = st.params.len();
        let Some(attrs) = st.param_attrs.get_mut(i) else {
            return Err(self.err("func.func", op_err!(Axis, "parameter {i} of {n}")));
        };
        attrs.push((name.to_owned(), value.to_owned()));
        Ok(())
    }

    fn err(&self, op: &'static str, e: OpError) -> BuildError {
        e.in_kernel(&self.kernel, op)
    }

    fn tensor(&self, id: ValueId) -> Tensor<'_> {
        Tensor { b: self, id }
    }

    /// The first deferred error, if an operator or `Tensor` method failed.
    pub fn deferred_error(&self) -> Option<BuildError> {
        self.state.borrow().deferred.clone()
    }

    /// Checks that `t` belongs to this builder, is visible from the open region, and is not
    /// poisoned; returns its id.
    fn check(&self, op: &'static str, t: Tensor<'_>) -> Result<ValueId, BuildError> {
        if !std::ptr::eq(t.b, self) {
            return Err(self.err(
                op,
                op_err!(
                    ForeignValue,
                    "operand {} belongs to kernel `{}`, not this one",
                    t.b.ty_of(t.id),
                    t.b.kernel
                ),
            ));
        }
        let st = self.state.borrow();
        if st.finished {
            return Err(self.err(op, op_err!(ForeignValue, "the kernel's builder has finished")));
        }
        if t.id == POISON {
            return Err(st.deferred.clone().unwrap_or_else(|| {
                self.err(op, op_err!(ForeignValue, "operand comes from a failed op"))
            }));
        }
        let scope = st.scope_of[t.id.0 as usize];
        if !st.open_scopes.contains(&scope) {
            return Err(self.err(
                op,
                op_err!(
                    ForeignValue,
                    "operand {} was defined inside a region that is closed",
                    st.values[t.id.0 as usize]
                ),
            ));
        }
        Ok(t.id)
    }

    fn ty_of(&self, id: ValueId) -> TensorType {
        let st = self.state.borrow();
        match st.values.get(id.0 as usize) {
            Some(t) => t.clone(),
            // A poisoned value, or any value after `finish`: errors are already recorded.
            None => TensorType::scalar(DType::F32),
        }
    }

    fn new_value(st: &mut State, ty: TensorType) -> ValueId {
        let id = ValueId(st.values.len() as u32);
        st.values.push(ty);
        let scope = st.open_scopes.last().copied().unwrap_or(BODY_SCOPE);
        st.scope_of.push(scope);
        id
    }

    /// Type-checks `op` and appends it to the open region; returns its results.
    fn push(&self, op: Op) -> Result<Vec<ValueId>, BuildError> {
        let name = op.name();
        let mut st = self.state.borrow_mut();
        let types = ir::infer(&op, &*st).map_err(|e| self.err(name, e))?;
        let results: Vec<ValueId> =
            types.into_iter().map(|t| Self::new_value(&mut st, t)).collect();
        let region = st.open_regions.last().copied().unwrap_or(RegionId(0));
        st.regions[region.0 as usize].instrs.push(Instr { op, results: results.clone() });
        Ok(results)
    }

    fn push1(&self, op: Op) -> Result<Tensor<'_>, BuildError> {
        let r = self.push(op)?;
        Ok(self.tensor(r[0]))
    }

    // ----- elementwise -----

    /// An elementwise unary op (`exponential`, `rsqrt`, `chlo.erf`, ...).
    pub fn unary(&self, op: UnaryOp, x: Tensor<'_>) -> Result<Tensor<'_>, BuildError> {
        let x = self.check(op.name(), x)?;
        self.push1(Op::Unary(op, x))
    }

    /// An elementwise binary op; operands of different shapes broadcast as in NumPy
    /// (trailing dimensions aligned, size-1 dimensions stretched), element types must agree.
    pub fn binary(
        &self,
        op: BinaryOp,
        x: Tensor<'_>,
        y: Tensor<'_>,
    ) -> Result<Tensor<'_>, BuildError> {
        let (x, y) = self.broadcast_pair(op.name(), x, y)?;
        self.push1(Op::Binary(op, x, y))
    }

    /// `stablehlo.compare` with broadcasting; the result is `i1`.
    pub fn compare(
        &self,
        direction: Direction,
        x: Tensor<'_>,
        y: Tensor<'_>,
    ) -> Result<Tensor<'_>, BuildError> {
        let (lhs, rhs) = self.broadcast_pair("stablehlo.compare", x, y)?;
        self.push1(Op::Compare { direction, lhs, rhs })
    }

    /// `pred ? on_true : on_false`, elementwise (`pred` may be a scalar).
    pub fn select(
        &self,
        pred: Tensor<'_>,
        on_true: Tensor<'_>,
        on_false: Tensor<'_>,
    ) -> Result<Tensor<'_>, BuildError> {
        let op = "stablehlo.select";
        let (pred, on_true, on_false) =
            (self.check(op, pred)?, self.check(op, on_true)?, self.check(op, on_false)?);
        self.push1(Op::Select { pred, on_true, on_false })
    }

    /// Clamps `x` between `min` and `max` (each a scalar or of `x`'s type).
    pub fn clamp(
        &self,
        min: Tensor<'_>,
        x: Tensor<'_>,
        max: Tensor<'_>,
    ) -> Result<Tensor<'_>, BuildError> {
        let op = "stablehlo.clamp";
        let (min, operand, max) = (self.check(op, min)?, self.check(op, x)?, self.check(op, max)?);
        self.push1(Op::Clamp { min, operand, max })
    }

    /// Converts element type (rounding, or truncating toward zero for float to int).
    pub fn convert(&self, x: Tensor<'_>, to: DType) -> Result<Tensor<'_>, BuildError> {
        let operand = self.check("stablehlo.convert", x)?;
        self.push1(Op::Convert { operand, to })
    }

    /// Reinterprets the bits (a trailing dimension appears or disappears when widths differ).
    pub fn bitcast_convert(&self, x: Tensor<'_>, to: DType) -> Result<Tensor<'_>, BuildError> {
        let operand = self.check("stablehlo.bitcast_convert", x)?;
        self.push1(Op::BitcastConvert { operand, to })
    }

    // ----- constants and shapes -----

    /// A constant with explicit row-major elements (or one element, splatted).
    pub fn constant(&self, ty: TensorType, data: LiteralData) -> Result<Tensor<'_>, BuildError> {
        let lit = Literal::new(ty, data).map_err(|e| self.err("stablehlo.constant", e))?;
        self.push1(Op::Constant(lit))
    }

    /// A constant of type `ty` filled with `value`.
    pub fn splat(&self, ty: TensorType, value: f64) -> Result<Tensor<'_>, BuildError> {
        if !ty.shape.is_static() {
            return Err(self.err(
                "stablehlo.constant",
                op_err!(Shape, "constant of type {ty} needs a static shape"),
            ));
        }
        let lit = Literal::splat(ty, value).map_err(|e| self.err("stablehlo.constant", e))?;
        self.push1(Op::Constant(lit))
    }

    /// A scalar constant.
    pub fn scalar(&self, dtype: DType, value: f64) -> Result<Tensor<'_>, BuildError> {
        self.splat(TensorType::scalar(dtype), value)
    }

    /// `0, 1, 2, ...` along `dim` of `ty`.
    pub fn iota(&self, ty: TensorType, dim: i64) -> Result<Tensor<'_>, BuildError> {
        self.push1(Op::Iota { ty, dim })
    }

    /// Broadcasts `x` into `ty`, operand dimension `i` landing on result dimension `dims[i]`.
    pub fn broadcast_in_dim(
        &self,
        x: Tensor<'_>,
        ty: TensorType,
        dims: &[i64],
    ) -> Result<Tensor<'_>, BuildError> {
        let operand = self.check("stablehlo.broadcast_in_dim", x)?;
        self.push1(Op::BroadcastInDim { operand, ty, dims: dims.to_vec() })
    }

    /// NumPy-style broadcast of `x` to `shape` (no op when already that shape).
    pub fn broadcast_to(&self, x: Tensor<'_>, shape: &Shape) -> Result<Tensor<'_>, BuildError> {
        let id = self.check("stablehlo.broadcast_in_dim", x)?;
        let id = self.broadcast_id(id, shape)?;
        Ok(self.tensor(id))
    }

    fn broadcast_id(&self, id: ValueId, shape: &Shape) -> Result<ValueId, BuildError> {
        let t = self.ty_of(id);
        if t.shape == *shape {
            return Ok(id);
        }
        let (r, out) = (t.rank(), shape.rank());
        if r > out {
            return Err(self.err(
                "stablehlo.broadcast_in_dim",
                op_err!(Shape, "cannot broadcast {t} to rank {out}"),
            ));
        }
        let dims: Vec<i64> = (0..r).map(|i| (i + out - r) as i64).collect();
        let r =
            self.push(Op::BroadcastInDim { operand: id, ty: t.with_shape(shape.clone()), dims })?;
        Ok(r[0])
    }

    fn broadcast_pair(
        &self,
        op: &'static str,
        x: Tensor<'_>,
        y: Tensor<'_>,
    ) -> Result<(ValueId, ValueId), BuildError> {
        let (x, y) = (self.check(op, x)?, self.check(op, y)?);
        let (tx, ty) = (self.ty_of(x), self.ty_of(y));
        if tx.dtype != ty.dtype {
            return Err(self.err(op, op_err!(DType, "element types differ: {tx} vs {ty}")));
        }
        if tx.shape == ty.shape {
            return Ok((x, y));
        }
        let shape = broadcast_shapes(&tx.shape, &ty.shape)
            .ok_or_else(|| self.err(op, op_err!(Shape, "cannot broadcast {tx} with {ty}")))?;
        Ok((self.broadcast_id(x, &shape)?, self.broadcast_id(y, &shape)?))
    }

    /// Same elements, new shape.
    pub fn reshape(
        &self,
        x: Tensor<'_>,
        shape: impl Into<Shape>,
    ) -> Result<Tensor<'_>, BuildError> {
        let operand = self.check("stablehlo.reshape", x)?;
        self.push1(Op::Reshape { operand, shape: shape.into() })
    }

    /// Permutes dimensions: result dimension `i` is operand dimension `perm[i]`.
    pub fn transpose(&self, x: Tensor<'_>, perm: &[i64]) -> Result<Tensor<'_>, BuildError> {
        let operand = self.check("stablehlo.transpose", x)?;
        self.push1(Op::Transpose { operand, perm: perm.to_vec() })
    }

    /// Static slice `start..limit` by `strides` in every dimension.
    pub fn slice(
        &self,
        x: Tensor<'_>,
        start: &[i64],
        limit: &[i64],
        strides: &[i64],
    ) -> Result<Tensor<'_>, BuildError> {
        let operand = self.check("stablehlo.slice", x)?;
        let (start, limit, strides) = (start.to_vec(), limit.to_vec(), strides.to_vec());
        self.push1(Op::Slice { operand, start, limit, strides })
    }

    /// Slice of static `sizes` at runtime `starts` (integer scalars, clamped into range by XLA).
    pub fn dynamic_slice(
        &self,
        x: Tensor<'_>,
        starts: &[Tensor<'_>],
        sizes: &[i64],
    ) -> Result<Tensor<'_>, BuildError> {
        let op = "stablehlo.dynamic_slice";
        let operand = self.check(op, x)?;
        let starts = starts.iter().map(|s| self.check(op, *s)).collect::<Result<_, _>>()?;
        self.push1(Op::DynamicSlice { operand, starts, sizes: sizes.to_vec() })
    }

    /// `stablehlo.gather`: slices of `slice_sizes` of `x` at the index vectors in `indices`
    /// (integers; each start clamped into range, as StableHLO does), laid out as `dims` says.
    /// Checked as StableHLO's verifier does.
    pub fn gather(
        &self,
        x: Tensor<'_>,
        indices: Tensor<'_>,
        dims: GatherDims,
        slice_sizes: &[i64],
    ) -> Result<Tensor<'_>, BuildError> {
        let op = "stablehlo.gather";
        let operand = self.check(op, x)?;
        let indices = self.check(op, indices)?;
        self.push1(Op::Gather { operand, indices, dims, slice_sizes: slice_sizes.to_vec() })
    }

    /// `stablehlo.scatter`: `x` with each window of `updates` combined into it at its index
    /// vector in `indices` by `combine` (the current element and the update, scalars; returns
    /// the new element), laid out as `dims` says. A window outside `x` is skipped, as StableHLO
    /// does. Checked as StableHLO's verifier does.
    pub fn scatter<'b>(
        &'b self,
        x: Tensor<'b>,
        indices: Tensor<'b>,
        updates: Tensor<'b>,
        dims: ScatterDims,
        combine: impl FnOnce(Tensor<'b>, Tensor<'b>) -> Result<Tensor<'b>, BuildError>,
    ) -> Result<Tensor<'b>, BuildError> {
        let op = "stablehlo.scatter";
        let operand = self.check(op, x)?;
        let indices = self.check(op, indices)?;
        let updates = self.check(op, updates)?;
        let scalar = TensorType::scalar(self.ty_of(operand).dtype);
        let (_, args) = self.open_arg_scope(&[scalar.clone(), scalar]);
        let (cur, new) = (self.tensor(args[0]), self.tensor(args[1]));
        let body = self.region(op, || Ok(vec![combine(cur, new)?]));
        self.close_scope();
        let body = body?;
        self.push1(Op::Scatter { operand, indices, updates, dims, args, body })
    }

    /// `x` with `update` written at runtime `starts`.
    pub fn dynamic_update_slice(
        &self,
        x: Tensor<'_>,
        update: Tensor<'_>,
        starts: &[Tensor<'_>],
    ) -> Result<Tensor<'_>, BuildError> {
        let op = "stablehlo.dynamic_update_slice";
        let (operand, update) = (self.check(op, x)?, self.check(op, update)?);
        let starts = starts.iter().map(|s| self.check(op, *s)).collect::<Result<_, _>>()?;
        self.push1(Op::DynamicUpdateSlice { operand, update, starts })
    }

    /// Joins tensors along `dim`.
    pub fn concatenate(&self, xs: &[Tensor<'_>], dim: i64) -> Result<Tensor<'_>, BuildError> {
        let op = "stablehlo.concatenate";
        let operands = xs.iter().map(|x| self.check(op, *x)).collect::<Result<_, _>>()?;
        self.push1(Op::Concatenate { operands, dim })
    }

    /// Pads with the scalar `value`: `low`/`high` per edge (negative crops), `interior` between.
    pub fn pad(
        &self,
        x: Tensor<'_>,
        value: Tensor<'_>,
        low: &[i64],
        high: &[i64],
        interior: &[i64],
    ) -> Result<Tensor<'_>, BuildError> {
        let op = "stablehlo.pad";
        let (operand, value) = (self.check(op, x)?, self.check(op, value)?);
        let (low, high, interior) = (low.to_vec(), high.to_vec(), interior.to_vec());
        self.push1(Op::Pad { operand, value, low, high, interior })
    }

    // ----- regions -----

    fn open_arg_scope(&self, types: &[TensorType]) -> (u32, Vec<ValueId>) {
        let mut st = self.state.borrow_mut();
        let scope = st.next_scope;
        st.next_scope += 1;
        st.open_scopes.push(scope);
        let args = types.iter().map(|t| Self::new_value(&mut st, t.clone())).collect();
        (scope, args)
    }

    fn close_scope(&self) {
        self.state.borrow_mut().open_scopes.pop();
    }

    /// Builds one region with `body`, returning its id; scopes are restored on every path.
    fn region<'b>(
        &'b self,
        op: &'static str,
        body: impl FnOnce() -> Result<Vec<Tensor<'b>>, BuildError>,
    ) -> Result<RegionId, BuildError> {
        let region = {
            let mut st = self.state.borrow_mut();
            let region = RegionId(st.regions.len() as u32);
            st.regions.push(Region::default());
            let scope = st.next_scope;
            st.next_scope += 1;
            st.open_scopes.push(scope);
            st.open_regions.push(region);
            region
        };
        let results = body().and_then(|rs| rs.iter().map(|r| self.check(op, *r)).collect());
        let mut st = self.state.borrow_mut();
        st.open_scopes.pop();
        st.open_regions.pop();
        st.regions[region.0 as usize].results = results?;
        Ok(region)
    }

    /// `stablehlo.reduce` of `operands` over `dims`, starting from `inits`; `body` receives the
    /// accumulators then the new elements (scalars) and returns the new accumulators.
    pub fn reduce<'b>(
        &'b self,
        operands: &[Tensor<'b>],
        inits: &[Tensor<'b>],
        dims: &[i64],
        body: impl FnOnce(&[Tensor<'b>]) -> Result<Vec<Tensor<'b>>, BuildError>,
    ) -> Result<Vec<Tensor<'b>>, BuildError> {
        let op = "stablehlo.reduce";
        let operands: Vec<ValueId> =
            operands.iter().map(|x| self.check(op, *x)).collect::<Result<_, _>>()?;
        let inits: Vec<ValueId> =
            inits.iter().map(|x| self.check(op, *x)).collect::<Result<_, _>>()?;
        if operands.is_empty() || inits.len() != operands.len() {
            let e = op_err!(
                Region,
                "reduce needs N operands and N inits, got {} and {}",
                operands.len(),
                inits.len()
            );
            return Err(self.err(op, e));
        }
        let init_types: Vec<TensorType> = inits.iter().map(|v| self.ty_of(*v)).collect();
        let arg_types: Vec<TensorType> = init_types.iter().chain(&init_types).cloned().collect();
        let (_, args) = self.open_arg_scope(&arg_types);
        let arg_tensors: Vec<Tensor<'b>> = args.iter().map(|a| self.tensor(*a)).collect();
        let body = self.region(op, || body(&arg_tensors));
        self.close_scope();
        let body = body?;
        let results = self.push(Op::Reduce { operands, inits, dims: dims.to_vec(), args, body })?;
        Ok(results.into_iter().map(|r| self.tensor(r)).collect())
    }

    /// Reduces one operand with one binary op (`add` for sum, `maximum`, `minimum`) from `init`.
    pub fn reduce_with<'b>(
        &'b self,
        x: Tensor<'b>,
        op: BinaryOp,
        init: f64,
        dims: &[i64],
    ) -> Result<Tensor<'b>, BuildError> {
        let dtype = self.ty_of(self.check("stablehlo.reduce", x)?).dtype;
        let init = self.scalar(dtype, init)?;
        let r = self.reduce(&[x], &[init], dims, |a| Ok(vec![self.binary(op, a[0], a[1])?]))?;
        Ok(r[0])
    }

    /// `stablehlo.dot_general`: `out` picks the result element type (e.g. f32 from bf16 inputs).
    pub fn dot_general(
        &self,
        lhs: Tensor<'_>,
        rhs: Tensor<'_>,
        dims: DotDims,
        precision: Option<[Precision; 2]>,
        out: Option<DType>,
    ) -> Result<Tensor<'_>, BuildError> {
        let op = "stablehlo.dot_general";
        let (lhs, rhs) = (self.check(op, lhs)?, self.check(op, rhs)?);
        self.push1(Op::DotGeneral { lhs, rhs, dims, precision, out })
    }

    /// `stablehlo.convolution` of `input` with `kernel` (same element type; the result too).
    pub fn convolution(
        &self,
        input: Tensor<'_>,
        kernel: Tensor<'_>,
        dims: ConvDims,
        window: ConvWindow,
        feature_group_count: u64,
        batch_group_count: u64,
    ) -> Result<Tensor<'_>, BuildError> {
        let op = "stablehlo.convolution";
        let (lhs, rhs) = (self.check(op, input)?, self.check(op, kernel)?);
        self.push1(Op::Convolution {
            lhs,
            rhs,
            dims,
            window,
            feature_group_count,
            batch_group_count,
        })
    }

    /// `stablehlo.optimization_barrier`: `xs` unchanged, as values the compiler cannot see
    /// through. Each result is a separate name for its operand's value: XLA neither merges an
    /// expression of one result with the same expression of another (or of the operand) nor
    /// moves work across the barrier. A kernel gives each consumer of a value its own copy when
    /// one shared expression would cost a pass over memory (see `Tensor::copies`).
    pub fn optimization_barrier<'b>(
        &'b self,
        xs: &[Tensor<'b>],
    ) -> Result<Vec<Tensor<'b>>, BuildError> {
        let op = "stablehlo.optimization_barrier";
        let operands: Vec<ValueId> =
            xs.iter().map(|x| self.check(op, *x)).collect::<Result<_, _>>()?;
        let results = self.push(Op::OptimizationBarrier { operands })?;
        Ok(results.into_iter().map(|r| self.tensor(r)).collect())
    }

    /// `stablehlo.reverse`: `x` with the order of its elements along `dims` reversed.
    pub fn reverse(&self, x: Tensor<'_>, dims: &[i64]) -> Result<Tensor<'_>, BuildError> {
        let operand = self.check("stablehlo.reverse", x)?;
        self.push1(Op::Reverse { operand, dims: dims.to_vec() })
    }

    /// `stablehlo.sort` of `operands` (one shape) along `dim`, all permuted alike; `less`
    /// receives the two elements compared of each operand (`lhs_0, rhs_0, lhs_1, rhs_1, ...`,
    /// scalars) and returns an `i1` scalar, true when the lhs goes first. `stable` keeps the
    /// order of elements neither goes before.
    pub fn sort<'b>(
        &'b self,
        operands: &[Tensor<'b>],
        dim: i64,
        stable: bool,
        less: impl FnOnce(&[Tensor<'b>]) -> Result<Tensor<'b>, BuildError>,
    ) -> Result<Vec<Tensor<'b>>, BuildError> {
        let op = "stablehlo.sort";
        let operands: Vec<ValueId> =
            operands.iter().map(|x| self.check(op, *x)).collect::<Result<_, _>>()?;
        let arg_types: Vec<TensorType> = operands
            .iter()
            .flat_map(|v| {
                let s = TensorType::scalar(self.ty_of(*v).dtype);
                [s.clone(), s]
            })
            .collect();
        let (_, args) = self.open_arg_scope(&arg_types);
        let arg_tensors: Vec<Tensor<'b>> = args.iter().map(|a| self.tensor(*a)).collect();
        let comparator = self.region(op, || Ok(vec![less(&arg_tensors)?]));
        self.close_scope();
        let comparator = comparator?;
        let results = self.push(Op::Sort { operands, dim, stable, args, comparator })?;
        Ok(results.into_iter().map(|r| self.tensor(r)).collect())
    }

    /// `stablehlo.while`: carries `init` while `cond` (returning an `i1` scalar) holds, updating
    /// with `body`. Both closures receive the carried values.
    pub fn while_loop<'b>(
        &'b self,
        init: &[Tensor<'b>],
        cond: impl FnOnce(&[Tensor<'b>]) -> Result<Tensor<'b>, BuildError>,
        body: impl FnOnce(&[Tensor<'b>]) -> Result<Vec<Tensor<'b>>, BuildError>,
    ) -> Result<Vec<Tensor<'b>>, BuildError> {
        let op = "stablehlo.while";
        let operands: Vec<ValueId> =
            init.iter().map(|x| self.check(op, *x)).collect::<Result<_, _>>()?;
        let types: Vec<TensorType> = operands.iter().map(|v| self.ty_of(*v)).collect();
        let (_, args) = self.open_arg_scope(&types);
        let carried: Vec<Tensor<'b>> = args.iter().map(|a| self.tensor(*a)).collect();
        let regions = self
            .region(op, || Ok(vec![cond(&carried)?]))
            .and_then(|c| Ok((c, self.region(op, || body(&carried))?)));
        self.close_scope();
        let (cond, body) = regions?;
        let results = self.push(Op::While { operands, args, cond, body })?;
        Ok(results.into_iter().map(|r| self.tensor(r)).collect())
    }

    /// `stablehlo.case`: runs branch `index` (an `i32` scalar; out of range runs the last).
    pub fn case<'b, 'f>(
        &'b self,
        index: Tensor<'b>,
        branches: Vec<Branch<'b, 'f>>,
    ) -> Result<Vec<Tensor<'b>>, BuildError> {
        let index = self.check("stablehlo.case", index)?;
        let mut regions = Vec::with_capacity(branches.len());
        for branch in branches {
            regions.push(self.region("stablehlo.case", branch)?);
        }
        let results = self.push(Op::Case { index, branches: regions })?;
        Ok(results.into_iter().map(|r| self.tensor(r)).collect())
    }

    // ----- calls -----

    /// Adds `module`'s functions as private functions of this one (its `@main` named after the
    /// module) and returns the callee name. Re-adding an identical function is a no-op; a
    /// different function under a taken name is an error.
    fn add_callee_module(&self, op: &'static str, module: &Module) -> Result<String, BuildError> {
        let mut st = self.state.borrow_mut();
        for (i, f) in module.functions.iter().enumerate() {
            let mut f = f.clone();
            if i == 0 {
                f.name = module.name.clone();
            }
            f.visibility = Visibility::Private;
            f.param_attrs = vec![Vec::new(); f.params.len()];
            f.result_attrs = vec![Vec::new(); f.results.len()];
            match st.callees.iter().find(|g| g.name == f.name) {
                Some(g) if *g == f => {}
                Some(_) => {
                    return Err(self
                        .err(op, op_err!(Symbol, "two different functions named `@{}`", f.name)));
                }
                None => st.callees.push(f),
            }
        }
        for t in &module.text_functions {
            match st.text_callees.iter().find(|g| g.name == t.name) {
                Some(g) if g == t => {}
                Some(_) => {
                    return Err(self
                        .err(op, op_err!(Symbol, "two different functions named `@{}`", t.name)));
                }
                None => st.text_callees.push(t.clone()),
            }
        }
        if module.name == self.kernel {
            return Err(
                self.err(op, op_err!(Symbol, "kernel `{}` cannot call itself", module.name))
            );
        }
        Ok(module.name.clone())
    }

    /// Calls another kernel's module as a private function (`func.call`).
    pub fn call(
        &self,
        module: &Module,
        args: &[Tensor<'_>],
    ) -> Result<Vec<Tensor<'_>>, BuildError> {
        let op = "func.call";
        let args: Vec<ValueId> =
            args.iter().map(|x| self.check(op, *x)).collect::<Result<_, _>>()?;
        let callee = self.add_callee_module(op, module)?;
        let results = self.push(Op::Call { callee, args })?;
        Ok(results.into_iter().map(|r| self.tensor(r)).collect())
    }

    /// Calls a verbatim text function (an imported kernel) added with [`Self::add_text_function`].
    pub fn call_text(
        &self,
        name: &str,
        args: &[Tensor<'_>],
    ) -> Result<Vec<Tensor<'_>>, BuildError> {
        let op = "func.call";
        let args: Vec<ValueId> =
            args.iter().map(|x| self.check(op, *x)).collect::<Result<_, _>>()?;
        let results = self.push(Op::Call { callee: name.to_owned(), args })?;
        Ok(results.into_iter().map(|r| self.tensor(r)).collect())
    }

    /// Adds a verbatim private function (see [`crate::reader`] for producing one).
    pub fn add_text_function(&self, f: TextFunction) -> Result<(), BuildError> {
        let module = Module {
            name: String::new(),
            num_partitions: 1,
            num_replicas: 1,
            functions: Vec::new(),
            text_functions: vec![f],
        };
        self.add_callee_module("func.func", &module).map(|_| ())
    }

    /// A `stablehlo.composite` named `name` whose decomposition is `module` (a private function):
    /// XLA may match it by name, and otherwise inlines the decomposition.
    pub fn composite(
        &self,
        name: &str,
        attributes: &[(&str, AttrValue)],
        version: i32,
        module: &Module,
        args: &[Tensor<'_>],
    ) -> Result<Vec<Tensor<'_>>, BuildError> {
        let op = "stablehlo.composite";
        let args: Vec<ValueId> =
            args.iter().map(|x| self.check(op, *x)).collect::<Result<_, _>>()?;
        let decomposition = self.add_callee_module(op, module)?;
        let attributes = attributes.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        let results = self.push(Op::Composite {
            name: name.to_owned(),
            args,
            attributes,
            decomposition,
            version,
        })?;
        Ok(results.into_iter().map(|r| self.tensor(r)).collect())
    }

    // ----- finishing -----

    /// Ends construction: returns the verified module whose public `@main` returns `results`.
    /// Every later call on this builder is an error.
    pub fn finish(&self, results: &[Tensor<'_>]) -> Result<Module, BuildError> {
        let ids = match self.deferred_error() {
            Some(e) => Err(e),
            None => results.iter().map(|r| self.check("func.return", *r)).collect(),
        };
        let kernel = self.kernel.clone();
        let mut st = std::mem::take(&mut *self.state.borrow_mut());
        self.state.borrow_mut().finished = true;
        let ids: Vec<ValueId> = ids?;
        st.regions[0].results = ids.clone();
        let main = Function {
            name: "main".to_owned(),
            visibility: Visibility::Public,
            results: ids.iter().map(|v| st.values[v.0 as usize].clone()).collect(),
            result_attrs: vec![Vec::new(); ids.len()],
            params: st.params,
            param_attrs: st.param_attrs,
            values: st.values,
            regions: st.regions,
        };
        let mut functions = vec![main];
        functions.extend(st.callees);
        let module = Module {
            name: kernel.clone(),
            num_partitions: 1,
            num_replicas: 1,
            functions,
            text_functions: st.text_callees,
        };
        super::verify::verify_module(&module).map_err(|e| e.in_kernel(&kernel, "verify"))?;
        Ok(module)
    }

    fn defer<'b>(&'b self, r: Result<Tensor<'b>, BuildError>) -> Tensor<'b> {
        match r {
            Ok(t) => t,
            Err(e) => {
                let mut st = self.state.borrow_mut();
                if st.deferred.is_none() {
                    st.deferred = Some(e);
                }
                self.tensor(POISON)
            }
        }
    }
}

/// NumPy broadcasting of two shapes, or `None` if they are incompatible.
pub fn broadcast_shapes(a: &Shape, b: &Shape) -> Option<Shape> {
    let rank = a.rank().max(b.rank());
    let one = Dim::Static(1);
    let at = |s: &Shape, i: usize| -> Dim {
        let off = rank - s.rank();
        if i < off { one.clone() } else { s.0[i - off].clone() }
    };
    let mut dims = Vec::with_capacity(rank);
    for i in 0..rank {
        let (x, y) = (at(a, i), at(b, i));
        dims.push(if x == y || y == one {
            x
        } else if x == one {
            y
        } else {
            return None;
        });
    }
    Some(Shape(dims))
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $method:ident => $op:ident;)*) => {
        $(
            $(#[$doc])*
            pub fn $method(self) -> Tensor<'b> {
                self.b.defer(self.b.unary(UnaryOp::$op, self))
            }
        )*
    };
}

/// Array-style methods: errors are deferred to [`KernelBuilder::finish`] (see the module docs).
impl<'b> Tensor<'b> {
    /// The builder this value belongs to.
    pub fn builder(self) -> &'b KernelBuilder {
        self.b
    }

    pub fn ty(self) -> TensorType {
        self.b.ty_of(self.id)
    }

    pub fn dtype(self) -> DType {
        self.ty().dtype
    }

    pub fn shape(self) -> Shape {
        self.ty().shape
    }

    pub fn rank(self) -> usize {
        self.ty().rank()
    }

    /// Whether this value is the placeholder left by a failed array-style op.
    pub fn is_poisoned(self) -> bool {
        self.id == POISON
    }

    unary_methods! {
        abs => Abs;
        exp => Exp;
        log => Log;
        /// `log(1 + x)`, accurate near zero.
        log1p => LogPlusOne;
        tanh => Tanh;
        /// `1 / (1 + exp(-x))`.
        sigmoid => Logistic;
        sqrt => Sqrt;
        rsqrt => Rsqrt;
        sin => Sine;
        cos => Cosine;
        floor => Floor;
        ceil => Ceil;
        sign => Sign;
        /// The error function, as `chlo.erf`.
        erf => Erf;
    }

    fn bin(self, op: BinaryOp, rhs: Tensor<'b>) -> Tensor<'b> {
        self.b.defer(self.b.binary(op, self, rhs))
    }

    /// A scalar constant of this value's element type.
    pub fn scalar(self, value: f64) -> Tensor<'b> {
        self.b.defer(self.b.scalar(self.dtype(), value))
    }

    /// A constant of this value's type filled with `value`.
    pub fn full_like(self, value: f64) -> Tensor<'b> {
        self.b.defer(self.b.splat(self.ty(), value))
    }

    pub fn maximum(self, rhs: Tensor<'b>) -> Tensor<'b> {
        self.bin(BinaryOp::Maximum, rhs)
    }

    pub fn minimum(self, rhs: Tensor<'b>) -> Tensor<'b> {
        self.bin(BinaryOp::Minimum, rhs)
    }

    pub fn pow(self, rhs: Tensor<'b>) -> Tensor<'b> {
        self.bin(BinaryOp::Power, rhs)
    }

    /// Bitwise `self << rhs` (integers; shifts of the width or more give 0).
    pub fn shift_left(self, rhs: Tensor<'b>) -> Tensor<'b> {
        self.bin(BinaryOp::ShiftLeft, rhs)
    }

    /// Bitwise `self >> rhs`, filling with zeros (integers).
    pub fn shift_right_logical(self, rhs: Tensor<'b>) -> Tensor<'b> {
        self.bin(BinaryOp::ShiftRightLogical, rhs)
    }

    /// Bitwise xor (integers) or logical xor (bool).
    pub fn xor(self, rhs: Tensor<'b>) -> Tensor<'b> {
        self.bin(BinaryOp::Xor, rhs)
    }

    fn cmp(self, direction: Direction, rhs: Tensor<'b>) -> Tensor<'b> {
        self.b.defer(self.b.compare(direction, self, rhs))
    }

    pub fn eq(self, rhs: Tensor<'b>) -> Tensor<'b> {
        self.cmp(Direction::Eq, rhs)
    }

    pub fn ne(self, rhs: Tensor<'b>) -> Tensor<'b> {
        self.cmp(Direction::Ne, rhs)
    }

    pub fn lt(self, rhs: Tensor<'b>) -> Tensor<'b> {
        self.cmp(Direction::Lt, rhs)
    }

    pub fn le(self, rhs: Tensor<'b>) -> Tensor<'b> {
        self.cmp(Direction::Le, rhs)
    }

    pub fn gt(self, rhs: Tensor<'b>) -> Tensor<'b> {
        self.cmp(Direction::Gt, rhs)
    }

    pub fn ge(self, rhs: Tensor<'b>) -> Tensor<'b> {
        self.cmp(Direction::Ge, rhs)
    }

    /// `self ? on_true : on_false` for an `i1` predicate (broadcast to the branches' shape).
    pub fn select(self, on_true: Tensor<'b>, on_false: Tensor<'b>) -> Tensor<'b> {
        let b = self.b;
        let r = (|| {
            let (t, f) = b.broadcast_pair("stablehlo.select", on_true, on_false)?;
            let shape = b.ty_of(t).shape;
            let p = b.check("stablehlo.select", self)?;
            let p = if b.ty_of(p).rank() == 0 { p } else { b.broadcast_id(p, &shape)? };
            b.select(b.tensor(p), b.tensor(t), b.tensor(f))
        })();
        b.defer(r)
    }

    /// Clamps into `[lo, hi]`.
    pub fn clamp(self, lo: f64, hi: f64) -> Tensor<'b> {
        let (lo, hi) = (self.scalar(lo), self.scalar(hi));
        self.b.defer(self.b.clamp(lo, self, hi))
    }

    /// Converts to another element type.
    pub fn cast(self, dtype: DType) -> Tensor<'b> {
        if self.dtype() == dtype && !self.is_poisoned() {
            return self;
        }
        self.b.defer(self.b.convert(self, dtype))
    }

    pub fn reshape(self, shape: impl Into<Shape>) -> Tensor<'b> {
        self.b.defer(self.b.reshape(self, shape))
    }

    pub fn transpose(self, perm: &[i64]) -> Tensor<'b> {
        self.b.defer(self.b.transpose(self, perm))
    }

    pub fn broadcast_to(self, shape: &Shape) -> Tensor<'b> {
        self.b.defer(self.b.broadcast_to(self, shape))
    }

    fn reduce_axes(self, op: BinaryOp, init: f64, axes: &[i64], keepdim: bool) -> Tensor<'b> {
        let b = self.b;
        let r = (|| {
            let x = b.check("stablehlo.reduce", self)?;
            let ty = b.ty_of(x);
            let mut dims = axes
                .iter()
                .map(|&a| ir::normalize_axis(a, ty.rank()).map(|a| a as i64))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| b.err("stablehlo.reduce", e))?;
            dims.sort_unstable();
            let out = b.reduce_with(self, op, init, &dims)?;
            if !keepdim {
                return Ok(out);
            }
            let kept: Shape = ty
                .shape
                .0
                .iter()
                .enumerate()
                .map(|(i, d)| if dims.contains(&(i as i64)) { Dim::Static(1) } else { d.clone() })
                .collect();
            b.reshape(out, kept)
        })();
        b.defer(r)
    }

    /// Sum over `axes` (negative counts from the end); `keepdim` keeps them as size 1.
    pub fn sum(self, axes: &[i64], keepdim: bool) -> Tensor<'b> {
        self.reduce_axes(BinaryOp::Add, 0.0, axes, keepdim)
    }

    /// Largest element over `axes`.
    pub fn amax(self, axes: &[i64], keepdim: bool) -> Tensor<'b> {
        self.reduce_axes(BinaryOp::Maximum, f64::NEG_INFINITY, axes, keepdim)
    }

    /// Smallest element over `axes`.
    pub fn amin(self, axes: &[i64], keepdim: bool) -> Tensor<'b> {
        self.reduce_axes(BinaryOp::Minimum, f64::INFINITY, axes, keepdim)
    }

    /// Mean over `axes` (static sizes only).
    pub fn mean(self, axes: &[i64], keepdim: bool) -> Tensor<'b> {
        let ty = self.ty();
        let mut count = 1u64;
        for &a in axes {
            match ir::normalize_axis(a, ty.rank()).map(|a| ty.shape.0[a].as_static()) {
                Ok(Some(n)) => count *= n,
                Ok(None) => {
                    let e = op_err!(Shape, "mean over a symbolic dimension of {ty}");
                    return self.b.defer(Err(self.b.err("stablehlo.reduce", e)));
                }
                Err(e) => return self.b.defer(Err(self.b.err("stablehlo.reduce", e))),
            }
        }
        let s = self.sum(axes, keepdim);
        s * (1.0 / count as f64)
    }

    /// `N` copies of this value behind one `stablehlo.optimization_barrier`: the same value
    /// under `N` names that XLA does not merge back into one expression. XLA:CPU hands a
    /// reduction to a YNNPACK fusion only with operands no other operation uses; a broadcast or
    /// product shared between a reduction and another consumer is written out whole, a pass
    /// over memory each way. Giving each consumer its own copy of the small value (a row's
    /// mean, a weight vector) keeps every large expression single-use. Take all copies of a
    /// value in one call: two barriers over the same operand are one expression again.
    pub fn copies<const N: usize>(self) -> [Tensor<'b>; N] {
        let r = self.b.optimization_barrier(&[self; N]);
        match r {
            Ok(v) => std::array::from_fn(|i| v[i]),
            Err(e) => {
                let poisoned = self.b.defer(Err(e));
                [poisoned; N]
            }
        }
    }

    /// Matrix product over the last dimension of `self` and the first of `rhs`
    /// (`[.., M, K] x [K, N] -> [.., M, N]`), accumulating and returning in `out` if given.
    pub fn matmul_to(self, rhs: Tensor<'b>, out: Option<DType>) -> Tensor<'b> {
        let dims = DotDims::matmul(self.rank());
        self.b.defer(self.b.dot_general(self, rhs, dims, None, out))
    }

    /// Matrix product in this value's element type.
    pub fn matmul(self, rhs: Tensor<'b>) -> Tensor<'b> {
        self.matmul_to(rhs, None)
    }
}

macro_rules! binary_operators {
    ($($trait:ident $method:ident => $op:ident;)*) => {$(
        impl<'b> std::ops::$trait<Tensor<'b>> for Tensor<'b> {
            type Output = Tensor<'b>;
            fn $method(self, rhs: Tensor<'b>) -> Tensor<'b> {
                self.bin(BinaryOp::$op, rhs)
            }
        }
        impl<'b> std::ops::$trait<f64> for Tensor<'b> {
            type Output = Tensor<'b>;
            fn $method(self, rhs: f64) -> Tensor<'b> {
                let rhs = self.scalar(rhs);
                self.bin(BinaryOp::$op, rhs)
            }
        }
        impl<'b> std::ops::$trait<Tensor<'b>> for f64 {
            type Output = Tensor<'b>;
            fn $method(self, rhs: Tensor<'b>) -> Tensor<'b> {
                let lhs = rhs.scalar(self);
                lhs.bin(BinaryOp::$op, rhs)
            }
        }
    )*};
}

binary_operators! {
    Add add => Add;
    Sub sub => Subtract;
    Mul mul => Multiply;
    Div div => Divide;
}

/// `-x`.
impl<'b> std::ops::Neg for Tensor<'b> {
    type Output = Tensor<'b>;
    fn neg(self) -> Tensor<'b> {
        self.b.defer(self.b.unary(UnaryOp::Negate, self))
    }
}

/// Logical (bool) or bitwise (integer) not: `!x`.
impl<'b> std::ops::Not for Tensor<'b> {
    type Output = Tensor<'b>;
    fn not(self) -> Tensor<'b> {
        self.b.defer(self.b.unary(UnaryOp::Not, self))
    }
}
