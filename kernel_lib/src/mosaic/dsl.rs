//! The language a tiled kernel's body is written in: block references and vector values with
//! operators, over one [`Tiled`] kernel being built.
//!
//! A `#[tpu_kernel(tiled(...))]` body receives a `&Tiled` (optional, first) and one [`Block`]
//! per input, output and scratch buffer; it reads blocks into [`Vector`]s, computes, and writes
//! blocks back:
//!
//! ```
//! use tpu_kernels::mosaic::dsl::{Block, Tiled};
//! use tpu_kernels::DType;
//!
//! // `o = silu(x) * y` on one block, computed in f32.
//! fn body(x: Block, y: Block, o: Block) {
//!     let xf = x.load().cast(DType::F32);
//!     let s = xf * (-xf).exp().add_scalar(1.0).recip();
//!     o.store((s * y.load().cast(DType::F32)).cast(o.dtype()));
//! }
//! # let _ = body;
//! ```
//!
//! What a body can do, with the Pallas spelling it stands for:
//!
//! | here | Pallas / JAX |
//! |---|---|
//! | `x.load()`, `o.store(v)` | `x_ref[...]`, `o_ref[...] = v` |
//! | `x.load_at(&[ds(i, 8), all()])`, `o.store_at(&[ds(i, 8), all()], v)` | `x_ref[pl.ds(i, 8), :]`, `o_ref[pl.ds(i, 8), :] = v` |
//! | `(i * 8).multiple_of(8)` | `pl.multiple_of(i * 8, 8)` |
//! | `s.get(&[0])`, `s.set(&[0], v)` on SMEM scratch | `s_ref[0]`, `s_ref[0] = v` |
//! | `prefetch(ids)`, index map `\|i\| (ids[i], 0)`, `ids.get(&[i])` | `num_scalar_prefetch=1`, `lambda i, ids: (ids[i], 0)`, `ids_ref[i]` |
//! | `aliases(o = x)` | `input_output_aliases={1: 0}` |
//! | `vmem_limit = 48 * 1024 * 1024` | `pltpu.CompilerParams(vmem_limit_bytes=...)` |
//! | `k.program_id(a)`, `k.num_programs(a)` | `pl.program_id(a)`, `pl.num_programs(a)` |
//! | `k.when(c, \|\| ...)` | `@pl.when(c)` |
//! | `k.fori(0, n, \|i\| ...)` | `jax.lax.fori_loop(0, n, ...)` (no carry: state lives in refs) |
//! | `a.matmul(b)`, `a.matmul_t(b)`, `a.t_matmul(b)` | `jnp.dot(a, b, preferred_element_type=f32)`, `a @ b.T`, `a.T @ b` |
//! | `x.sum(-1)`, `x.amax(-1)` (dims kept) | `x.sum(-1, keepdims=True)`, `x.max(...)` |
//! | `k.iota(&[8, 128], 1)` | `jax.lax.broadcasted_iota(jnp.int32, (8, 128), 1)` |
//! | `x.cast(DType::F32)` | `x.astype(jnp.float32)` (float to float, int to float) |
//! | `c.select(a, b)`, `x.lt(y)`, `x.maximum(0.0)` | `jnp.where(c, a, b)`, `x < y`, `jnp.maximum(x, 0.0)` |
//! | `exp`, `log`, `log1p`, `tanh`, `sqrt`, `rsqrt`, `erf`, `abs`, `sin`, `cos`, `floor`, `ceil`, `sign`, `sigmoid`, `recip` | `jnp.exp`, ... |
//! | `a % b`, `a.pow(b)`, `a.atan2(b)`, `a.maximum(b)`, `a.minimum(b)` | `a % b` (truncated, the dividend's sign: `jnp.fmod`, `lax.rem`), `a ** b`, `jnp.arctan2(a, b)`, ... |
//!
//! Operators and methods do not return `Result`: the first error (a dtype or shape mismatch, a
//! block stored with the wrong type) is recorded with the Rust line that made it, every later
//! op is skipped, and [`Tiled::finish`] returns it. Each op records its caller's file and line,
//! which the printed Mosaic carries as `loc(...)`.
//!
//! Binary operators take two vectors of one element type whose shapes are equal or broadcast
//! (same rank, each dim equal or 1, as `x * rms` with `rms` of shape `[rows, 1]`), or a vector
//! and a number (`x * 0.5`, `k - 1`), which becomes a constant of the vector's type.

use std::cell::RefCell;
use std::panic::Location;

use crate::error::{BuildError, ErrorKind};
use crate::types::{DType, TensorType};

use super::builder::{MValue, TiledBuilder};
use super::ir::{BinaryOp, Compare, IndexExpr, Kernel, Loc, Reduce, Scalar, Semantics, UnaryOp};
use super::types::MType;

/// A tiled kernel being built: the grid, its windows and scratch, and the body's ops.
#[derive(Debug)]
pub struct Tiled {
    b: RefCell<TiledBuilder>,
    /// The first error of the body, with where it was made.
    error: RefCell<Option<BuildError>>,
}

/// A block of an input or output window, or a scratch buffer: a memref the body loads and
/// stores whole.
#[derive(Clone, Copy, Debug)]
pub struct Block<'k> {
    t: &'k Tiled,
    v: MValue,
}

/// A vector (or scalar) value of the body. `None` inside once an earlier op failed.
#[derive(Clone, Copy, Debug)]
pub struct Vector<'k> {
    t: &'k Tiled,
    v: Option<MValue>,
}

impl Tiled {
    /// A kernel `name` over `grid`, one [`Semantics`] per axis.
    pub fn new(name: &str, grid: &[u64], semantics: &[Semantics]) -> Result<Tiled, BuildError> {
        Ok(Tiled {
            b: RefCell::new(TiledBuilder::new(name, grid, semantics)?),
            error: RefCell::new(None),
        })
    }

    /// A scalar-prefetch table (a 1-d `i32` array, whole in SMEM, before the inputs): index
    /// maps pick blocks by it ([`IndexExpr::Prefetch`]), and the body reads it with
    /// [`Block::get`] (`num_scalar_prefetch` in Pallas).
    pub fn prefetch(&self, array: TensorType) -> Result<Block<'_>, BuildError> {
        let v = self.b.borrow_mut().prefetch(array)?;
        Ok(Block { t: self, v })
    }

    /// The scoped VMEM the kernel may use (`vmem_limit_bytes` in Pallas's compiler params),
    /// in place of each target's default.
    pub fn vmem_limit(&self, bytes: u64) -> Result<(), BuildError> {
        self.b.borrow_mut().vmem_limit(bytes)
    }

    /// An input window: the array, its block and the block index per dim.
    pub fn input(
        &self,
        array: TensorType,
        block: &[u64],
        index_map: &[IndexExpr],
    ) -> Result<Block<'_>, BuildError> {
        let v = self.b.borrow_mut().input(array, block, index_map)?;
        Ok(Block { t: self, v })
    }

    /// An output window.
    pub fn output(
        &self,
        array: TensorType,
        block: &[u64],
        index_map: &[IndexExpr],
    ) -> Result<Block<'_>, BuildError> {
        let v = self.b.borrow_mut().output(array, block, index_map)?;
        Ok(Block { t: self, v })
    }

    /// Makes output `output` the same buffer as input `input` (counted among the inputs and
    /// the outputs): `input_output_aliases = {input: output}`.
    pub fn alias(&self, input: usize, output: usize) -> Result<(), BuildError> {
        self.b.borrow_mut().alias(input, output)
    }

    /// A scratch buffer, kept across grid steps (VMEM or SMEM).
    pub fn scratch(&self, ty: MType) -> Result<Block<'_>, BuildError> {
        let v = self.b.borrow_mut().scratch(ty)?;
        Ok(Block { t: self, v })
    }

    /// Verifies the kernel and checks its tiling and coverage; the body's first error, if any,
    /// comes first.
    pub fn finish(self) -> Result<Kernel, BuildError> {
        if let Some(e) = self.error.into_inner() {
            return Err(e);
        }
        self.b.into_inner().finish()
    }

    /// The grid: the number of steps of each axis (what [`Tiled::num_programs`] gives as a
    /// value, here as numbers the body can compute with while it is built).
    pub fn grid(&self) -> Vec<u64> {
        self.b.borrow().grid().to_vec()
    }

    /// The kernel's name.
    pub fn name(&self) -> String {
        self.b.borrow().name().to_owned()
    }

    /// Whether an op of the body has failed (later ops are skipped).
    pub fn failed(&self) -> bool {
        self.error.borrow().is_some()
    }

    /// Records `e` (the first one wins), with the Rust line of the op that made it.
    fn record(&self, mut e: BuildError, at: &'static Location<'static>) {
        let mut slot = self.error.borrow_mut();
        if slot.is_none() {
            e.message = format!("{} (at {}:{})", e.message, at.file(), at.line());
            *slot = Some(e);
        }
    }

    /// Fails the kernel with `message` (for a case the body does not take).
    #[track_caller]
    pub fn fail(&self, kind: ErrorKind, message: impl Into<String>) {
        let e = BuildError { kernel: self.name(), op: "body", kind, message: message.into() };
        self.record(e, Location::caller());
    }

    /// Runs `f` on the builder unless an op already failed; records its error.
    #[track_caller]
    fn with<T>(&self, f: impl FnOnce(&mut TiledBuilder) -> Result<T, BuildError>) -> Option<T> {
        if self.failed() {
            return None;
        }
        let at = Location::caller();
        let result = {
            let mut b = self.b.borrow_mut();
            b.set_location(Some(Loc::of(at)));
            let result = f(&mut b);
            b.set_location(None);
            result
        };
        match result {
            Ok(v) => Some(v),
            Err(e) => {
                self.record(e, at);
                None
            }
        }
    }

    #[track_caller]
    fn vector(
        &self,
        f: impl FnOnce(&mut TiledBuilder) -> Result<MValue, BuildError>,
    ) -> Vector<'_> {
        Vector { t: self, v: self.with(f) }
    }

    fn ty(&self, v: MValue) -> MType {
        self.b.borrow().ty(v).clone()
    }

    /// The index of grid axis `axis` at this step (an `i32` scalar), `pl.program_id(axis)`.
    #[track_caller]
    pub fn program_id(&self, axis: usize) -> Vector<'_> {
        self.vector(|b| b.program_id(axis))
    }

    /// The number of steps of grid axis `axis` (an `i32` constant), `pl.num_programs(axis)`.
    #[track_caller]
    pub fn num_programs(&self, axis: usize) -> Vector<'_> {
        self.vector(|b| b.num_programs(axis))
    }

    /// A vector of `shape` with every element `value`.
    #[track_caller]
    pub fn full(&self, dtype: DType, shape: &[u64], value: f64) -> Vector<'_> {
        self.vector(|b| b.splat(dtype, shape, value))
    }

    /// A vector of zeros.
    #[track_caller]
    pub fn zeros(&self, dtype: DType, shape: &[u64]) -> Vector<'_> {
        self.full(dtype, shape, 0.0)
    }

    /// An `i32` vector of `shape` counting along `dim`: `jax.lax.broadcasted_iota`.
    #[track_caller]
    pub fn iota(&self, shape: &[u64], dim: usize) -> Vector<'_> {
        self.vector(|b| b.iota(shape, dim))
    }

    /// An `i32` scalar constant.
    #[track_caller]
    pub fn index(&self, value: i64) -> Vector<'_> {
        self.vector(|b| b.constant(Scalar::Int(value), MType::Scalar(DType::I32)))
    }

    /// Runs `body` for `i` in `lo..hi` (an `scf.for`; `i` is an `i32` scalar): a loop whose
    /// body reads and writes blocks and scratch, `jax.lax.fori_loop` without a carry.
    #[track_caller]
    pub fn fori(&self, lo: i64, hi: i64, body: impl FnOnce(Vector<'_>)) {
        let (l, h, s) = (self.index(lo), self.index(hi), self.index(1));
        let (Some(l), Some(h), Some(s)) = (l.v, h.v, s.v) else { return };
        let Some(iv) = self.with(|b| b.begin_for(l, h, s)) else { return };
        body(Vector { t: self, v: Some(iv) });
        self.b.borrow_mut().end_for();
    }

    /// Runs the ops `body` adds only when `cond` (an `i1` scalar) holds: `@pl.when(cond)`.
    #[track_caller]
    pub fn when(&self, cond: Vector<'_>, body: impl FnOnce()) {
        let Some(c) = cond.v else { return };
        if self.with(|b| b.begin_when(c)).is_none() {
            return;
        }
        body();
        self.b.borrow_mut().end_when();
    }

    /// `acc + lhs · rhs` (`rhs` transposed when asked) on the MXU, accumulated in f32.
    #[track_caller]
    pub fn matmul<'k>(
        &'k self,
        lhs: Vector<'k>,
        rhs: Vector<'k>,
        acc: Vector<'k>,
        transpose_rhs: bool,
    ) -> Vector<'k> {
        self.matmul_transposed(lhs, rhs, acc, false, transpose_rhs)
    }

    /// `acc + op(lhs) · op(rhs)` on the MXU, accumulated in f32, `op` transposing the operands
    /// asked.
    #[track_caller]
    pub fn matmul_transposed<'k>(
        &'k self,
        lhs: Vector<'k>,
        rhs: Vector<'k>,
        acc: Vector<'k>,
        transpose_lhs: bool,
        transpose_rhs: bool,
    ) -> Vector<'k> {
        match (lhs.v, rhs.v, acc.v) {
            (Some(l), Some(r), Some(a)) => {
                self.vector(|b| b.matmul_transposed(l, r, a, transpose_lhs, transpose_rhs))
            }
            _ => Vector { t: self, v: None },
        }
    }
}

impl<'k> Block<'k> {
    /// The block's type (a memref).
    pub fn ty(&self) -> MType {
        self.t.ty(self.v)
    }

    /// The block shape.
    pub fn shape(&self) -> Vec<u64> {
        self.ty().shape().to_vec()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.ty().dtype().unwrap_or(DType::F32)
    }

    /// The whole block as a vector: `ref[...]`.
    #[track_caller]
    pub fn load(self) -> Vector<'k> {
        self.t.vector(|b| b.load(self.v))
    }

    /// Writes `value` (the block's shape and element type) to the whole block:
    /// `ref[...] = value`.
    #[track_caller]
    pub fn store(self, value: Vector<'k>) {
        if let Some(v) = value.v {
            self.t.with(|b| b.store(self.v, v));
        }
    }

    /// The starts and sizes of a sub-slice, one [`Slice`] per dim.
    #[track_caller]
    fn window(&self, slices: &[Slice<'k>]) -> Option<(Vec<MValue>, Vec<u64>)> {
        let full = self.shape();
        if slices.len() != full.len() {
            let e = BuildError {
                kernel: self.t.name(),
                op: "vector.load",
                kind: ErrorKind::Shape,
                message: format!(
                    "{} slices for a block of rank {} ({:?})",
                    slices.len(),
                    full.len(),
                    full
                ),
            };
            self.t.record(e, Location::caller());
            return None;
        }
        let mut starts = Vec::with_capacity(slices.len());
        let mut sizes = Vec::with_capacity(slices.len());
        for (s, d) in slices.iter().zip(&full) {
            let (start, size) = match s {
                Slice::All => (self.t.index(0).v?, *d),
                Slice::At { start: Start::Const(c), size } => (self.t.index(*c).v?, *size),
                Slice::At { start: Start::Dyn(v), size } => (v.v?, *size),
            };
            starts.push(start);
            sizes.push(size);
        }
        Some((starts, sizes))
    }

    /// A sub-slice of the block as a vector: `ref[pl.ds(start, size), :]` is
    /// `r.load_at(&[ds(start, size), all()])`.
    #[track_caller]
    pub fn load_at(self, slices: &[Slice<'k>]) -> Vector<'k> {
        let Some((starts, sizes)) = self.window(slices) else {
            return Vector { t: self.t, v: None };
        };
        self.t.vector(|b| b.load_at(self.v, &starts, &sizes))
    }

    /// Writes `value` into a sub-slice of the block (its sizes are `value`'s shape; an
    /// [`all()`] dim is the whole block dim).
    #[track_caller]
    pub fn store_at(self, slices: &[Slice<'k>], value: Vector<'k>) {
        let (Some((starts, _)), Some(v)) = (self.window(slices), value.v) else { return };
        self.t.with(|b| b.store_at(self.v, &starts, v));
    }
}

impl<'k> Block<'k> {
    fn starts<S: Into<Start<'k>> + Copy>(&self, at: &[S]) -> Option<Vec<MValue>> {
        at.iter()
            .map(|s| match (*s).into() {
                Start::Const(c) => self.t.index(c).v,
                Start::Dyn(v) => v.v,
            })
            .collect()
    }

    /// One element of an SMEM scratch buffer: `ref[i]` on an SMEM ref.
    #[track_caller]
    pub fn get<S: Into<Start<'k>> + Copy>(self, at: &[S]) -> Vector<'k> {
        let Some(starts) = self.starts(at) else { return Vector { t: self.t, v: None } };
        self.t.vector(|b| b.scalar_load(self.v, &starts))
    }

    /// Writes one element of an SMEM scratch buffer: `ref[i] = value`.
    #[track_caller]
    pub fn set<S: Into<Start<'k>> + Copy>(self, at: &[S], value: Vector<'k>) {
        let (Some(starts), Some(v)) = (self.starts(at), value.v) else { return };
        self.t.with(|b| b.scalar_store(self.v, &starts, v));
    }
}

/// Where a sub-slice starts along one dim: a number or an `i32` scalar of the body.
#[derive(Clone, Copy, Debug)]
pub enum Start<'k> {
    Const(i64),
    Dyn(Vector<'k>),
}

impl From<i64> for Start<'_> {
    fn from(v: i64) -> Self {
        Start::Const(v)
    }
}

impl<'k> From<Vector<'k>> for Start<'k> {
    fn from(v: Vector<'k>) -> Self {
        Start::Dyn(v)
    }
}

/// One dim of a sub-slice: the whole dim, or `size` elements from a start.
#[derive(Clone, Copy, Debug)]
pub enum Slice<'k> {
    All,
    At { start: Start<'k>, size: u64 },
}

/// `size` elements from `start`: `pl.ds(start, size)`. A dynamic start into a block's last
/// two dims keeps the tiling only at a multiple of it: say so with [`Vector::multiple_of`].
pub fn ds<'k>(start: impl Into<Start<'k>>, size: u64) -> Slice<'k> {
    Slice::At { start: start.into(), size }
}

/// The whole dim: `:` in `ref[pl.ds(i, 8), :]`.
pub fn all<'k>() -> Slice<'k> {
    Slice::All
}

/// What a binary operator takes on its right: a vector, or a number made a constant of the
/// left operand's type.
pub trait Operand<'k> {
    /// The operand as a value of `like`'s kernel (a number becomes a splat of `like`'s type).
    #[track_caller]
    fn value(self, like: &Vector<'k>) -> Option<MValue>;
}

impl<'k> Operand<'k> for Vector<'k> {
    fn value(self, _: &Vector<'k>) -> Option<MValue> {
        self.v
    }
}

impl<'k> Operand<'k> for f64 {
    #[track_caller]
    fn value(self, like: &Vector<'k>) -> Option<MValue> {
        like.constant_like(self)
    }
}

impl<'k> Operand<'k> for i64 {
    #[track_caller]
    fn value(self, like: &Vector<'k>) -> Option<MValue> {
        like.constant_like(self as f64)
    }
}

/// One method per elementwise float function: `self.name()` is `UnaryOp::Op` on `self`.
macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident,)*) => {
        $(
            $(#[$doc])*
            #[track_caller]
            pub fn $name(self) -> Vector<'k> {
                self.unary(UnaryOp::$op)
            }
        )*
    };
}

impl<'k> Vector<'k> {
    /// The value's type (`None` once an earlier op failed).
    pub fn ty(&self) -> Option<MType> {
        self.v.map(|v| self.t.ty(v))
    }

    /// The shape (empty for scalars, and once an earlier op failed).
    pub fn shape(&self) -> Vec<u64> {
        self.ty().map(|t| t.shape().to_vec()).unwrap_or_default()
    }

    /// The element type (f32 once an earlier op failed).
    pub fn dtype(&self) -> DType {
        self.ty().and_then(|t| t.dtype()).unwrap_or(DType::F32)
    }

    fn same(&self, v: Option<MValue>) -> Vector<'k> {
        Vector { t: self.t, v }
    }

    #[track_caller]
    fn constant_like(&self, value: f64) -> Option<MValue> {
        let ty = self.ty()?;
        let dtype = ty.dtype().unwrap_or(DType::F32);
        let scalar =
            if dtype.is_float() { Scalar::Float(value) } else { Scalar::Int(value as i64) };
        let ty = match ty {
            MType::MemRef { shape, dtype, .. } => MType::Vector { shape, dtype },
            other => other,
        };
        self.t.with(|b| b.constant(scalar, ty))
    }

    /// Broadcasts `a` and `b` to their common shape (same rank, size-1 dims stretched).
    #[track_caller]
    fn broadcast_pair(&self, a: MValue, b: MValue) -> Option<(MValue, MValue)> {
        let (ta, tb) = (self.t.ty(a), self.t.ty(b));
        let (sa, sb) = (ta.shape().to_vec(), tb.shape().to_vec());
        if sa == sb || sa.len() != sb.len() {
            return Some((a, b));
        }
        let mut shape = Vec::with_capacity(sa.len());
        for (x, y) in sa.iter().zip(&sb) {
            match (x, y) {
                _ if x == y => shape.push(*x),
                (1, _) => shape.push(*y),
                (_, 1) => shape.push(*x),
                // Left to the op, which names both types.
                _ => return Some((a, b)),
            }
        }
        let a = if sa == shape { a } else { self.t.with(|k| k.broadcast(a, &shape))? };
        let b = if sb == shape { b } else { self.t.with(|k| k.broadcast(b, &shape))? };
        Some((a, b))
    }

    #[track_caller]
    fn binary(self, op: BinaryOp, rhs: impl Operand<'k>) -> Vector<'k> {
        let (Some(a), Some(b)) = (self.v, rhs.value(&self)) else { return self.same(None) };
        let Some((a, b)) = self.broadcast_pair(a, b) else { return self.same(None) };
        self.same(self.t.with(|k| k.binary(op, a, b)))
    }

    #[track_caller]
    fn unary(self, op: UnaryOp) -> Vector<'k> {
        let Some(x) = self.v else { return self };
        self.same(self.t.with(|k| k.unary(op, x)))
    }

    #[track_caller]
    fn compare(self, c: Compare, rhs: impl Operand<'k>) -> Vector<'k> {
        let (Some(a), Some(b)) = (self.v, rhs.value(&self)) else { return self.same(None) };
        let Some((a, b)) = self.broadcast_pair(a, b) else { return self.same(None) };
        self.same(self.t.with(|k| k.compare(c, a, b)))
    }

    /// `self + x` for a number `x` (also `self + x` with the `+` operator).
    #[track_caller]
    pub fn add_scalar(self, x: f64) -> Vector<'k> {
        self.binary(BinaryOp::Add, x)
    }

    /// The elementwise maximum.
    #[track_caller]
    pub fn maximum(self, rhs: impl Operand<'k>) -> Vector<'k> {
        self.binary(BinaryOp::Max, rhs)
    }

    /// The elementwise minimum.
    #[track_caller]
    pub fn minimum(self, rhs: impl Operand<'k>) -> Vector<'k> {
        self.binary(BinaryOp::Min, rhs)
    }

    unary_methods! {
        /// `e^self`.
        exp => Exp,
        /// The natural logarithm.
        log => Log,
        tanh => Tanh,
        sqrt => Sqrt,
        /// `1 / sqrt(self)`.
        rsqrt => Rsqrt,
        /// The error function.
        erf => Erf,
        abs => Abs,
        /// `ln(1 + self)`, exact near 0.
        log1p => Log1p,
        sin => Sin,
        cos => Cos,
        floor => Floor,
        ceil => Ceil,
    }

    /// `self` to the power `rhs` (floats).
    #[track_caller]
    pub fn pow(self, rhs: impl Operand<'k>) -> Vector<'k> {
        self.binary(BinaryOp::Pow, rhs)
    }

    /// `atan2(self, rhs)`, the angle of `(rhs, self)` (f32).
    #[track_caller]
    pub fn atan2(self, rhs: impl Operand<'k>) -> Vector<'k> {
        self.binary(BinaryOp::Atan2, rhs)
    }

    /// -1, 0 or 1 by the sign of each element (`jnp.sign`: a zero, of either sign, and NaN
    /// stay as they are).
    #[track_caller]
    pub fn sign(self) -> Vector<'k> {
        let (Some(one), Some(zero)) = (self.constant_like(1.0), self.constant_like(0.0)) else {
            return self.same(None);
        };
        let (one, zero) = (self.same(Some(one)), self.same(Some(zero)));
        let negative = self.lt(zero).select(-one, self);
        self.gt(zero).select(one, negative)
    }

    /// `1 / self`.
    #[track_caller]
    pub fn recip(self) -> Vector<'k> {
        let Some(one) = self.constant_like(1.0) else { return self.same(None) };
        self.same(Some(one)).binary(BinaryOp::Div, self)
    }

    /// `1 / (1 + exp(-self))`.
    #[track_caller]
    pub fn sigmoid(self) -> Vector<'k> {
        (-self).exp().add_scalar(1.0).recip()
    }

    /// The value in another float type (`arith.extf` / `arith.truncf`); itself when it already
    /// has that type.
    #[track_caller]
    pub fn cast(self, to: DType) -> Vector<'k> {
        let Some(x) = self.v else { return self };
        self.same(self.t.with(|k| k.convert(x, to)))
    }

    /// The value broadcast to `shape` (leading dims added, size-1 dims stretched).
    #[track_caller]
    pub fn broadcast_to(self, shape: &[u64]) -> Vector<'k> {
        let Some(x) = self.v else { return self };
        self.same(self.t.with(|k| k.broadcast(x, shape)))
    }

    /// The same elements in another shape.
    #[track_caller]
    pub fn reshape(self, shape: &[u64]) -> Vector<'k> {
        let Some(x) = self.v else { return self };
        self.same(self.t.with(|k| k.shape_cast(x, shape)))
    }

    #[track_caller]
    fn reduce(self, kind: Reduce, axis: i64) -> Vector<'k> {
        let Some(x) = self.v else { return self };
        let rank = self.shape().len() as i64;
        let d = if axis < 0 { axis + rank } else { axis };
        if !(0..rank).contains(&d) {
            let e = BuildError {
                kernel: self.t.name(),
                op: "vector.multi_reduction",
                kind: ErrorKind::Axis,
                message: format!("axis {axis} of a rank-{rank} vector"),
            };
            self.t.record(e, Location::caller());
            return self.same(None);
        }
        self.same(self.t.with(|k| k.reduce(kind, x, &[d as usize])))
    }

    /// The sum over `axis` (negative counts from the end), kept as a size-1 dim.
    #[track_caller]
    pub fn sum(self, axis: i64) -> Vector<'k> {
        self.reduce(Reduce::Sum, axis)
    }

    /// The maximum over `axis`, kept as a size-1 dim.
    #[track_caller]
    pub fn amax(self, axis: i64) -> Vector<'k> {
        self.reduce(Reduce::Max, axis)
    }

    /// `self · rhs` on the MXU, accumulated in f32 (an f32 result).
    #[track_caller]
    pub fn matmul(self, rhs: Vector<'k>) -> Vector<'k> {
        self.matmul_as(rhs, false, false)
    }

    /// `self · rhsᵀ` on the MXU (`q @ k.T`), accumulated in f32.
    #[track_caller]
    pub fn matmul_t(self, rhs: Vector<'k>) -> Vector<'k> {
        self.matmul_as(rhs, false, true)
    }

    /// `selfᵀ · rhs` on the MXU (`x.T @ dy`, a weight gradient), accumulated in f32.
    #[track_caller]
    pub fn t_matmul(self, rhs: Vector<'k>) -> Vector<'k> {
        self.matmul_as(rhs, true, false)
    }

    #[track_caller]
    fn matmul_as(self, rhs: Vector<'k>, transpose_lhs: bool, transpose_rhs: bool) -> Vector<'k> {
        let (l, r) = (self.shape(), rhs.shape());
        if self.v.is_none() || rhs.v.is_none() {
            return self.same(None);
        }
        let rows = if transpose_lhs { l.get(1) } else { l.first() }.copied().unwrap_or(1);
        let cols = if transpose_rhs { r.first() } else { r.get(1) }.copied().unwrap_or(1);
        let acc = self.t.zeros(DType::F32, &[rows, cols]);
        self.t.matmul_transposed(self, rhs, acc, transpose_lhs, transpose_rhs)
    }

    /// The same `i32` scalar, promised to be a multiple of `by`: `pl.multiple_of(x, by)`.
    #[track_caller]
    pub fn multiple_of(self, by: u64) -> Vector<'k> {
        let Some(x) = self.v else { return self };
        self.same(self.t.with(|k| k.assume_multiple(x, by)))
    }

    /// `cond ? a : b`, elementwise when `self` (the condition) is a vector.
    #[track_caller]
    pub fn select(self, a: Vector<'k>, b: impl Operand<'k>) -> Vector<'k> {
        let (Some(c), Some(x), Some(y)) = (self.v, a.v, b.value(&a)) else {
            return self.same(None);
        };
        self.same(self.t.with(|k| k.select(c, x, y)))
    }

    #[track_caller]
    pub fn eq(self, rhs: impl Operand<'k>) -> Vector<'k> {
        self.compare(Compare::Eq, rhs)
    }

    #[track_caller]
    pub fn ne(self, rhs: impl Operand<'k>) -> Vector<'k> {
        self.compare(Compare::Ne, rhs)
    }

    #[track_caller]
    pub fn lt(self, rhs: impl Operand<'k>) -> Vector<'k> {
        self.compare(Compare::Lt, rhs)
    }

    #[track_caller]
    pub fn le(self, rhs: impl Operand<'k>) -> Vector<'k> {
        self.compare(Compare::Le, rhs)
    }

    #[track_caller]
    pub fn gt(self, rhs: impl Operand<'k>) -> Vector<'k> {
        self.compare(Compare::Gt, rhs)
    }

    #[track_caller]
    pub fn ge(self, rhs: impl Operand<'k>) -> Vector<'k> {
        self.compare(Compare::Ge, rhs)
    }
}

macro_rules! binary_operator {
    ($trait:ident, $method:ident, $op:ident) => {
        impl<'k, R: Operand<'k>> std::ops::$trait<R> for Vector<'k> {
            type Output = Vector<'k>;
            #[track_caller]
            fn $method(self, rhs: R) -> Vector<'k> {
                self.binary(BinaryOp::$op, rhs)
            }
        }

        impl<'k> std::ops::$trait<Vector<'k>> for f64 {
            type Output = Vector<'k>;
            #[track_caller]
            fn $method(self, rhs: Vector<'k>) -> Vector<'k> {
                let lhs = rhs.same(rhs.constant_like(self));
                lhs.binary(BinaryOp::$op, rhs)
            }
        }

        impl<'k> std::ops::$trait<Vector<'k>> for i64 {
            type Output = Vector<'k>;
            #[track_caller]
            fn $method(self, rhs: Vector<'k>) -> Vector<'k> {
                let lhs = rhs.same(rhs.constant_like(self as f64));
                lhs.binary(BinaryOp::$op, rhs)
            }
        }
    };
}

binary_operator!(Add, add, Add);
binary_operator!(Sub, sub, Sub);
binary_operator!(Mul, mul, Mul);
binary_operator!(Div, div, Div);
binary_operator!(Rem, rem, Rem);

impl<'k> std::ops::Neg for Vector<'k> {
    type Output = Vector<'k>;
    #[track_caller]
    fn neg(self) -> Vector<'k> {
        self.unary(UnaryOp::Neg)
    }
}
