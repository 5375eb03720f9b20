//! The typed, fallible builder of Mosaic kernels.
//!
//! Declare the grid, then the windows (inputs, then outputs) and scratch buffers, then write the
//! body: every op infers its result type with [`infer`](super::ir::infer()) and refuses operands it
//! cannot take with a [`BuildError`] naming the kernel, the op and the types. [`finish`]
//! verifies the kernel and checks its tiling and coverage (see [`check`](super::check)).
//!
//! [`finish`]: TiledBuilder::finish

use crate::error::{BuildError, ErrorKind};
use crate::ir::{RegionId, ValueId};
use crate::types::{DType, TensorType};

use super::ir::{
    BinaryOp, Compare, IndexExpr, InferCx, Instr, Kernel, Loc, Op, Reduce, Region, Scalar,
    Semantics, UnaryOp, Window, infer, op_name,
};
use super::types::MType;

/// A value of the kernel being built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MValue(pub ValueId);

/// Builds one [`Kernel`].
#[derive(Debug)]
pub struct TiledBuilder {
    kernel: Kernel,
    /// The region ops go to, innermost last.
    stack: Vec<RegionId>,
    /// Whether the body has ops (windows and scratch come before).
    started: bool,
    outputs_started: bool,
    /// The source location ops are recorded at, when a caller sets it (the tiled-kernel
    /// language, whose ops reach the builder through closures `#[track_caller]` cannot see
    /// through); otherwise each op's own caller.
    at: Option<Loc>,
}

struct Cx<'a>(&'a [MType]);

impl InferCx for Cx<'_> {
    fn ty(&self, v: ValueId) -> &MType {
        &self.0[v.0 as usize]
    }
}

impl TiledBuilder {
    /// A kernel `name` over `grid`, one [`Semantics`] per grid axis.
    pub fn new(
        name: impl Into<String>,
        grid: &[u64],
        semantics: &[Semantics],
    ) -> Result<TiledBuilder, BuildError> {
        let name = name.into();
        let err = |message: String| BuildError {
            kernel: name.clone(),
            op: "grid",
            kind: ErrorKind::Shape,
            message,
        };
        if grid.len() != semantics.len() {
            return Err(err(format!(
                "{} grid axes but {} dimension semantics",
                grid.len(),
                semantics.len()
            )));
        }
        if grid.is_empty() {
            return Err(err(
                "a tiled kernel has at least one grid axis (one step: grid [1])".into()
            ));
        }
        if let Some(axis) = grid.iter().position(|g| *g == 0) {
            return Err(err(format!("grid axis {axis} has no steps")));
        }
        let kernel = Kernel {
            name,
            grid: grid.to_vec(),
            semantics: semantics.to_vec(),
            prefetch: Vec::new(),
            windows: Vec::new(),
            num_inputs: 0,
            scratch: Vec::new(),
            aliases: Vec::new(),
            vmem_limit_bytes: None,
            values: vec![MType::Scalar(DType::I32); grid.len()],
            regions: vec![Region::default()],
        };
        Ok(TiledBuilder {
            kernel,
            stack: vec![RegionId(0)],
            started: false,
            outputs_started: false,
            at: None,
        })
    }

    fn error(&self, op: &'static str, kind: ErrorKind, message: String) -> BuildError {
        BuildError { kernel: self.kernel.name.clone(), op, kind, message }
    }

    fn window(
        &mut self,
        what: &'static str,
        array: TensorType,
        block: &[u64],
        index_map: &[IndexExpr],
    ) -> Result<MValue, BuildError> {
        if self.started || !self.kernel.scratch.is_empty() {
            let m = "windows are declared before scratch buffers and the body".to_owned();
            return Err(self.error(what, ErrorKind::Verify, m));
        }
        let n = self.kernel.windows.len();
        let Some(dims) = array.shape.static_dims() else {
            return Err(self.error(
                what,
                ErrorKind::Shape,
                format!("window {n}: {array} has symbolic dims"),
            ));
        };
        if block.len() != dims.len() || index_map.len() != dims.len() {
            let m = format!(
                "window {n}: block {block:?} and index map of {} dims for {array} of rank {}",
                index_map.len(),
                dims.len()
            );
            return Err(self.error(what, ErrorKind::Shape, m));
        }
        let (g, p) = (self.kernel.grid.len(), self.kernel.prefetch.len());
        for e in index_map {
            let (axis, table) = match *e {
                IndexExpr::Grid(axis) => (axis, None),
                IndexExpr::GridDiv { axis, by, modulo } => {
                    if by == 0 {
                        let m = format!("window {n}: the index map divides grid axis {axis} by 0");
                        return Err(self.error(what, ErrorKind::Axis, m));
                    }
                    if modulo == Some(0) {
                        let m =
                            format!("window {n}: the index map takes grid axis {axis} modulo 0");
                        return Err(self.error(what, ErrorKind::Axis, m));
                    }
                    (axis, None)
                }
                IndexExpr::Prefetch { table, axis } => (axis, Some(table)),
                IndexExpr::Const(_) => continue,
            };
            if axis >= g {
                let m =
                    format!("window {n}: the index map reads grid axis {axis} of a {g}-axis grid");
                return Err(self.error(what, ErrorKind::Axis, m));
            }
            if let Some(t) = table.filter(|t| *t >= p) {
                let m = format!(
                    "window {n}: the index map reads scalar-prefetch table {t}; the kernel has {p}"
                );
                return Err(self.error(what, ErrorKind::Axis, m));
            }
        }
        self.kernel.windows.push(Window {
            array: array.clone(),
            block: block.to_vec(),
            index_map: index_map.to_vec(),
        });
        self.kernel.values.push(MType::vmem(array.dtype, block));
        Ok(MValue(ValueId((self.kernel.values.len() - 1) as u32)))
    }

    /// A scalar-prefetch table: a 1-d `i32` array the custom call takes before its inputs,
    /// whole in SMEM. Index maps read it ([`IndexExpr::Prefetch`]) to pick blocks by data, and
    /// the body reads it with [`Self::scalar_load`]; it is never written. Tables are declared
    /// before the windows.
    pub fn prefetch(&mut self, array: TensorType) -> Result<MValue, BuildError> {
        if !self.kernel.windows.is_empty() || !self.kernel.scratch.is_empty() || self.started {
            let m = "scalar-prefetch tables are declared before the windows".to_owned();
            return Err(self.error("scalar_prefetch", ErrorKind::Verify, m));
        }
        let p = self.kernel.prefetch.len();
        let dims = array.shape.static_dims().unwrap_or_default();
        if array.dtype != DType::I32 || dims.len() != 1 || dims[0] == 0 {
            let m = format!(
                "table {p} is {array}: a scalar-prefetch table is a 1-d, non-empty i32 array"
            );
            return Err(self.error("scalar_prefetch", ErrorKind::DType, m));
        }
        self.kernel.prefetch.push(array);
        self.kernel.values.push(MType::smem(DType::I32, &dims));
        Ok(MValue(ValueId((self.kernel.values.len() - 1) as u32)))
    }

    /// Sets the scoped VMEM the kernel may use (`vmem_limit_bytes`), in place of the target's
    /// default: [`check::vmem`](super::check::vmem) checks against it, and the custom call
    /// carries it. At most [`check::VMEM_CAPACITY`](super::check::VMEM_CAPACITY) bytes.
    pub fn vmem_limit(&mut self, bytes: u64) -> Result<(), BuildError> {
        let cap = super::check::VMEM_CAPACITY;
        if bytes == 0 || bytes > cap || !bytes.is_multiple_of(1024) {
            let m = format!(
                "vmem_limit_bytes {bytes}: a limit is a positive multiple of 1 KiB, at most the {cap} bytes of VMEM a TensorCore has"
            );
            return Err(self.error("vmem_limit_bytes", ErrorKind::VmemLimit, m));
        }
        self.kernel.vmem_limit_bytes = Some(bytes);
        Ok(())
    }

    /// An input: the array, its block shape, and the block index per dim from the grid.
    pub fn input(
        &mut self,
        array: TensorType,
        block: &[u64],
        index_map: &[IndexExpr],
    ) -> Result<MValue, BuildError> {
        if self.outputs_started {
            let m = "inputs are declared before outputs".to_owned();
            return Err(self.error("input", ErrorKind::Verify, m));
        }
        let v = self.window("input", array, block, index_map)?;
        self.kernel.num_inputs += 1;
        Ok(v)
    }

    /// An output: the array, its block shape, and the block index per dim from the grid.
    pub fn output(
        &mut self,
        array: TensorType,
        block: &[u64],
        index_map: &[IndexExpr],
    ) -> Result<MValue, BuildError> {
        self.outputs_started = true;
        self.window("output", array, block, index_map)
    }

    /// Makes output `output` (counted from 0 among the outputs) the same buffer as input
    /// `input`: `input_output_aliases = {input: output}`. The two arrays must have one type.
    pub fn alias(&mut self, input: usize, output: usize) -> Result<(), BuildError> {
        let n_in = self.kernel.num_inputs;
        let (Some(i), Some(o)) =
            (self.kernel.windows.get(input), self.kernel.windows.get(n_in + output))
        else {
            let m = format!("input {input} and output {output}: no such windows");
            return Err(self.error("alias", ErrorKind::Verify, m));
        };
        if input >= n_in {
            let m = format!("window {input} is not an input");
            return Err(self.error("alias", ErrorKind::Verify, m));
        }
        if i.array != o.array {
            let m = format!(
                "input {input} ({}) and output {output} ({}) alias one buffer: they need one type",
                i.array, o.array
            );
            return Err(self.error("alias", ErrorKind::DType, m));
        }
        if self.kernel.aliases.iter().any(|(a, b)| *a == input || *b == output) {
            let m = format!("input {input} or output {output} is aliased twice");
            return Err(self.error("alias", ErrorKind::Verify, m));
        }
        self.kernel.aliases.push((input, output));
        Ok(())
    }

    /// A scratch buffer (a memref), kept across grid steps.
    pub fn scratch(&mut self, ty: MType) -> Result<MValue, BuildError> {
        if self.started {
            let m = "scratch buffers are declared before the body".to_owned();
            return Err(self.error("scratch", ErrorKind::Verify, m));
        }
        if !ty.is_memref() {
            return Err(self.error(
                "scratch",
                ErrorKind::DType,
                format!("scratch must be a memref, not {ty}"),
            ));
        }
        self.kernel.scratch.push(ty.clone());
        self.kernel.values.push(ty);
        Ok(MValue(ValueId((self.kernel.values.len() - 1) as u32)))
    }

    /// The index of grid axis `axis` (an `i32` scalar).
    pub fn program_id(&self, axis: usize) -> Result<MValue, BuildError> {
        if axis >= self.kernel.grid.len() {
            let m = format!("axis {axis} of a {}-axis grid", self.kernel.grid.len());
            return Err(self.error("program_id", ErrorKind::Axis, m));
        }
        Ok(MValue(ValueId(axis as u32)))
    }

    /// The number of steps of grid axis `axis`, as an `i32` constant.
    #[track_caller]
    pub fn num_programs(&mut self, axis: usize) -> Result<MValue, BuildError> {
        let Some(n) = self.kernel.grid.get(axis).copied() else {
            let m = format!("axis {axis} of a {}-axis grid", self.kernel.grid.len());
            return Err(self.error("num_programs", ErrorKind::Axis, m));
        };
        self.constant(Scalar::Int(n as i64), MType::Scalar(DType::I32))
    }

    /// The type of `v`.
    pub fn ty(&self, v: MValue) -> &MType {
        self.kernel.ty(v.0)
    }

    /// Appends `op`; returns its results.
    #[track_caller]
    fn push(&mut self, op: Op) -> Result<Vec<MValue>, BuildError> {
        self.started = true;
        let cx = Cx(&self.kernel.values);
        let name = op_name(&op, &cx);
        let types = infer(&op, &cx).map_err(|e| e.in_kernel(&self.kernel.name, name))?;
        let mut results = Vec::with_capacity(types.len());
        for t in types {
            self.kernel.values.push(t);
            results.push(ValueId((self.kernel.values.len() - 1) as u32));
        }
        let region = *self.stack.last().unwrap_or(&RegionId(0));
        // The caller's location, taken here: `#[track_caller]` does not reach into a closure.
        let caller = Loc::of(std::panic::Location::caller());
        let loc = self.at.unwrap_or(caller);
        let region = &mut self.kernel.regions[region.0 as usize];
        region.instrs.push(Instr { op, results: results.clone() });
        region.locs.push(loc);
        Ok(results.into_iter().map(MValue).collect())
    }

    #[track_caller]
    fn one(&mut self, op: Op) -> Result<MValue, BuildError> {
        let name = op_name(&op, &Cx(&self.kernel.values));
        self.push(op)?.pop().ok_or_else(|| self.error(name, ErrorKind::Verify, "no result".into()))
    }

    /// A scalar, `index` or splat vector constant.
    #[track_caller]
    pub fn constant(&mut self, value: Scalar, ty: MType) -> Result<MValue, BuildError> {
        self.one(Op::Constant { value, ty })
    }

    /// A vector of `shape` with every element `value` (rounded to `dtype`).
    #[track_caller]
    pub fn splat(&mut self, dtype: DType, shape: &[u64], value: f64) -> Result<MValue, BuildError> {
        let value = if dtype.is_float() { Scalar::Float(value) } else { Scalar::Int(value as i64) };
        self.constant(value, MType::vector(dtype, shape))
    }

    /// An `i32` scalar constant.
    #[track_caller]
    pub fn i32(&mut self, value: i32) -> Result<MValue, BuildError> {
        self.constant(Scalar::Int(i64::from(value)), MType::Scalar(DType::I32))
    }

    #[track_caller]
    pub fn binary(&mut self, op: BinaryOp, a: MValue, b: MValue) -> Result<MValue, BuildError> {
        self.one(Op::Binary(op, a.0, b.0))
    }

    #[track_caller]
    pub fn add(&mut self, a: MValue, b: MValue) -> Result<MValue, BuildError> {
        self.binary(BinaryOp::Add, a, b)
    }

    #[track_caller]
    pub fn sub(&mut self, a: MValue, b: MValue) -> Result<MValue, BuildError> {
        self.binary(BinaryOp::Sub, a, b)
    }

    #[track_caller]
    pub fn mul(&mut self, a: MValue, b: MValue) -> Result<MValue, BuildError> {
        self.binary(BinaryOp::Mul, a, b)
    }

    #[track_caller]
    pub fn div(&mut self, a: MValue, b: MValue) -> Result<MValue, BuildError> {
        self.binary(BinaryOp::Div, a, b)
    }

    #[track_caller]
    pub fn max(&mut self, a: MValue, b: MValue) -> Result<MValue, BuildError> {
        self.binary(BinaryOp::Max, a, b)
    }

    #[track_caller]
    pub fn unary(&mut self, op: UnaryOp, x: MValue) -> Result<MValue, BuildError> {
        self.one(Op::Unary(op, x.0))
    }

    #[track_caller]
    pub fn exp(&mut self, x: MValue) -> Result<MValue, BuildError> {
        self.unary(UnaryOp::Exp, x)
    }

    #[track_caller]
    pub fn rsqrt(&mut self, x: MValue) -> Result<MValue, BuildError> {
        self.unary(UnaryOp::Rsqrt, x)
    }

    #[track_caller]
    pub fn neg(&mut self, x: MValue) -> Result<MValue, BuildError> {
        self.unary(UnaryOp::Neg, x)
    }

    #[track_caller]
    pub fn compare(&mut self, c: Compare, a: MValue, b: MValue) -> Result<MValue, BuildError> {
        self.one(Op::Compare(c, a.0, b.0))
    }

    #[track_caller]
    pub fn select(&mut self, cond: MValue, a: MValue, b: MValue) -> Result<MValue, BuildError> {
        self.one(Op::Select(cond.0, a.0, b.0))
    }

    /// A float value in another float type (`arith.extf` / `arith.truncf`); `x` itself when
    /// it already has that type.
    #[track_caller]
    pub fn convert(&mut self, x: MValue, to: DType) -> Result<MValue, BuildError> {
        if self.ty(x).dtype() == Some(to) {
            return Ok(x);
        }
        self.one(Op::Convert { x: x.0, to })
    }

    #[track_caller]
    pub fn broadcast(&mut self, x: MValue, shape: &[u64]) -> Result<MValue, BuildError> {
        self.one(Op::Broadcast { x: x.0, shape: shape.to_vec() })
    }

    #[track_caller]
    pub fn shape_cast(&mut self, x: MValue, shape: &[u64]) -> Result<MValue, BuildError> {
        self.one(Op::ShapeCast { x: x.0, shape: shape.to_vec() })
    }

    #[track_caller]
    fn zero_indices(
        &mut self,
        memref: MValue,
        what: &'static str,
    ) -> Result<Vec<ValueId>, BuildError> {
        let ty = self.ty(memref).clone();
        if !ty.is_memref() {
            return Err(self.error(
                what,
                ErrorKind::DType,
                format!("takes a block or a scratch buffer, not {ty}"),
            ));
        }
        let zero = self.constant(Scalar::Int(0), MType::Index)?;
        Ok(vec![zero.0; ty.shape().len()])
    }

    /// The whole block (or scratch buffer) as a vector.
    #[track_caller]
    pub fn load(&mut self, memref: MValue) -> Result<MValue, BuildError> {
        let indices = self.zero_indices(memref, "vector.load")?;
        let shape = self.ty(memref).shape().to_vec();
        self.one(Op::Load { memref: memref.0, indices, shape })
    }

    /// The indices of a sub-slice: each start (an `i32` scalar) as an `index`.
    #[track_caller]
    fn slice_indices(
        &mut self,
        memref: MValue,
        starts: &[MValue],
        what: &'static str,
    ) -> Result<Vec<ValueId>, BuildError> {
        let ty = self.ty(memref).clone();
        if !ty.is_memref() || starts.len() != ty.shape().len() {
            return Err(self.error(
                what,
                ErrorKind::Shape,
                format!(
                    "{} starts for {ty}: one per dim of a block or scratch buffer",
                    starts.len()
                ),
            ));
        }
        starts.iter().map(|s| self.one(Op::IndexCast(s.0)).map(|v| v.0)).collect()
    }

    /// The `shape` window of a block (or scratch buffer) starting at `starts` (one `i32`
    /// scalar per dim): `ref[pl.ds(start, size), ...]`.
    #[track_caller]
    pub fn load_at(
        &mut self,
        memref: MValue,
        starts: &[MValue],
        shape: &[u64],
    ) -> Result<MValue, BuildError> {
        let indices = self.slice_indices(memref, starts, "vector.load")?;
        self.one(Op::Load { memref: memref.0, indices, shape: shape.to_vec() })
    }

    /// Writes `value` into a block (or scratch buffer) at `starts` (one `i32` scalar per dim).
    #[track_caller]
    pub fn store_at(
        &mut self,
        memref: MValue,
        starts: &[MValue],
        value: MValue,
    ) -> Result<(), BuildError> {
        let indices = self.slice_indices(memref, starts, "tpu.vector_store")?;
        self.push(Op::Store { memref: memref.0, indices, value: value.0 })?;
        Ok(())
    }

    /// One element of an SMEM buffer at `at` (one `i32` scalar per dim).
    #[track_caller]
    pub fn scalar_load(&mut self, memref: MValue, at: &[MValue]) -> Result<MValue, BuildError> {
        let indices = self.slice_indices(memref, at, "memref.load")?;
        self.one(Op::ScalarLoad { memref: memref.0, indices })
    }

    /// Writes one element of an SMEM buffer at `at`.
    #[track_caller]
    pub fn scalar_store(
        &mut self,
        memref: MValue,
        at: &[MValue],
        value: MValue,
    ) -> Result<(), BuildError> {
        let p = self.kernel.prefetch.len() as u32;
        let g = self.kernel.grid.len() as u32;
        if (g..g + p).contains(&memref.0.0) {
            let m = format!("scalar-prefetch table {} is read-only", memref.0.0 - g);
            return Err(self.error("memref.store", ErrorKind::Verify, m));
        }
        let indices = self.slice_indices(memref, at, "memref.store")?;
        self.push(Op::ScalarStore { memref: memref.0, indices, value: value.0 })?;
        Ok(())
    }

    /// An `i32` vector of `shape` counting along `dim` (`jax.lax.broadcasted_iota`).
    #[track_caller]
    pub fn iota(&mut self, shape: &[u64], dim: usize) -> Result<MValue, BuildError> {
        self.one(Op::Iota { dim, shape: shape.to_vec() })
    }

    /// `x` (an `i32` scalar) promised to be a multiple of `by` (`pl.multiple_of`).
    #[track_caller]
    pub fn assume_multiple(&mut self, x: MValue, by: u64) -> Result<MValue, BuildError> {
        self.one(Op::AssumeMultiple { x: x.0, by })
    }

    /// Opens a counted loop over `lo..hi` by `step` (`i32` scalars): the ops added until
    /// [`Self::end_for`] form its body; returns the induction variable.
    #[track_caller]
    pub fn begin_for(
        &mut self,
        lo: MValue,
        hi: MValue,
        step: MValue,
    ) -> Result<MValue, BuildError> {
        let body = RegionId(self.kernel.regions.len() as u32);
        self.kernel.regions.push(Region::default());
        self.kernel.values.push(MType::Scalar(DType::I32));
        let iv = ValueId((self.kernel.values.len() - 1) as u32);
        self.push(Op::For { lo: lo.0, hi: hi.0, step: step.0, iv, body })?;
        self.stack.push(body);
        Ok(MValue(iv))
    }

    /// Closes the innermost loop [`Self::begin_for`] opened.
    pub fn end_for(&mut self) {
        self.end_when();
    }

    /// Writes `value` to the whole block (or scratch buffer).
    #[track_caller]
    pub fn store(&mut self, memref: MValue, value: MValue) -> Result<(), BuildError> {
        let indices = self.zero_indices(memref, "tpu.vector_store")?;
        self.push(Op::Store { memref: memref.0, indices, value: value.0 })?;
        Ok(())
    }

    /// Reduces `x` over `dims` (sum or max), keeping them as size-1 dims.
    #[track_caller]
    pub fn reduce(
        &mut self,
        kind: Reduce,
        x: MValue,
        dims: &[usize],
    ) -> Result<MValue, BuildError> {
        let ty = self.ty(x).clone();
        let MType::Vector { shape, dtype } = &ty else {
            return Err(self.error(
                "vector.multi_reduction",
                ErrorKind::DType,
                format!("takes a vector, not {ty}"),
            ));
        };
        if let Some(d) = dims.iter().find(|d| **d >= shape.len()) {
            let m = format!("dim {d} of {ty}");
            return Err(self.error("vector.multi_reduction", ErrorKind::Axis, m));
        }
        let kept: Vec<u64> =
            shape.iter().enumerate().filter(|(i, _)| !dims.contains(i)).map(|(_, d)| *d).collect();
        if kept.is_empty() {
            let m = format!("reduces every dim of {ty}: keep at least one");
            return Err(self.error("vector.multi_reduction", ErrorKind::Axis, m));
        }
        let init = match (kind, dtype.is_float()) {
            (Reduce::Sum, true) => Scalar::Float(0.0),
            (Reduce::Sum, false) => Scalar::Int(0),
            (Reduce::Max, true) => Scalar::Float(f64::NEG_INFINITY),
            (Reduce::Max, false) => Scalar::Int(i64::from(i32::MIN)),
        };
        let acc = self.constant(init, MType::vector(*dtype, &kept))?;
        let reduced =
            self.one(Op::MultiReduce { kind, x: x.0, acc: acc.0, dims: dims.to_vec() })?;
        let keep: Vec<u64> =
            shape.iter().enumerate().map(|(i, d)| if dims.contains(&i) { 1 } else { *d }).collect();
        self.shape_cast(reduced, &keep)
    }

    /// `acc + lhs · rhs` (`rhs` transposed when asked) on the MXU, accumulated in f32.
    #[track_caller]
    pub fn matmul(
        &mut self,
        lhs: MValue,
        rhs: MValue,
        acc: MValue,
        transpose_rhs: bool,
    ) -> Result<MValue, BuildError> {
        self.matmul_transposed(lhs, rhs, acc, false, transpose_rhs)
    }

    /// `acc + op(lhs) · op(rhs)` on the MXU, accumulated in f32, where `op` transposes the
    /// operands asked (`lhsᵀ · rhs` is a weight gradient, `xᵀ · dy`).
    #[track_caller]
    pub fn matmul_transposed(
        &mut self,
        lhs: MValue,
        rhs: MValue,
        acc: MValue,
        transpose_lhs: bool,
        transpose_rhs: bool,
    ) -> Result<MValue, BuildError> {
        self.one(Op::Matmul { lhs: lhs.0, rhs: rhs.0, acc: acc.0, transpose_lhs, transpose_rhs })
    }

    /// Runs the ops `body` adds only when `cond` (an `i1` scalar) holds.
    #[track_caller]
    pub fn when(
        &mut self,
        cond: MValue,
        body: impl FnOnce(&mut TiledBuilder) -> Result<(), BuildError>,
    ) -> Result<(), BuildError> {
        self.begin_when(cond)?;
        let result = body(self);
        self.end_when();
        result
    }

    /// Opens the region of a `when`: the ops added until [`Self::end_when`] run only when
    /// `cond` (an `i1` scalar) holds. For callers that cannot lend the builder to a closure.
    #[track_caller]
    pub fn begin_when(&mut self, cond: MValue) -> Result<(), BuildError> {
        let then = RegionId(self.kernel.regions.len() as u32);
        self.kernel.regions.push(Region::default());
        self.push(Op::If { cond: cond.0, then })?;
        self.stack.push(then);
        Ok(())
    }

    /// Closes the innermost region [`Self::begin_when`] opened (the body stays open).
    pub fn end_when(&mut self) {
        if self.stack.len() > 1 {
            self.stack.pop();
        }
    }

    /// Records the ops added until the next call at `at` (`None`: at each op's caller).
    pub fn set_location(&mut self, at: Option<Loc>) {
        self.at = at;
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.kernel.name
    }

    /// The grid.
    pub fn grid(&self) -> &[u64] {
        &self.kernel.grid
    }

    /// Verifies the kernel and checks its tiling and coverage.
    pub fn finish(self) -> Result<Kernel, BuildError> {
        let kernel = self.finish_without_layout_checks()?;
        super::check::tiling(&kernel)?;
        super::check::coverage(&kernel)?;
        Ok(kernel)
    }

    /// Verifies the kernel (scoping and types) without the tiling and coverage checks: for
    /// comparing those checks with libtpu's own verdicts on the same kernel.
    pub fn finish_without_layout_checks(self) -> Result<Kernel, BuildError> {
        if self.kernel.num_inputs == self.kernel.windows.len() {
            let m = "a kernel has at least one output".to_owned();
            return Err(self.error("func.func", ErrorKind::Verify, m));
        }
        super::check::verify(&self.kernel)?;
        Ok(self.kernel)
    }
}
