//! Tiled kernels built with `tpu_kernels::mosaic`, shared by the libtpu, tiling and CPU-twin
//! tests.
#![allow(dead_code, reason = "each test binary uses some of these kernels")]

use tpu_kernels::mosaic::{Compare, IndexExpr, Kernel, MType, Reduce, Semantics, TiledBuilder};
use tpu_kernels::{BuildError, DType, TensorType};

use IndexExpr::{Const, Grid};
use Semantics::{Arbitrary, Parallel};

pub fn ty(dtype: DType, dims: &[u64]) -> TensorType {
    TensorType::new(dtype, dims)
}

/// `silu(a) * b` over 128x128 blocks of [256, 512], computed in f32 for bf16 inputs.
pub fn silu_mul(dtype: DType, block: [u64; 2]) -> Result<TiledBuilder, BuildError> {
    let (m, n) = (256, 512);
    let mut k =
        TiledBuilder::new("silu_mul", &[m / block[0], n / block[1]], &[Parallel, Parallel])?;
    let a = k.input(ty(dtype, &[m, n]), &block, &[Grid(0), Grid(1)])?;
    let b = k.input(ty(dtype, &[m, n]), &block, &[Grid(0), Grid(1)])?;
    let o = k.output(ty(dtype, &[m, n]), &block, &[Grid(0), Grid(1)])?;
    let x = k.load(a)?;
    let x = k.convert(x, DType::F32)?;
    let y = k.load(b)?;
    let y = k.convert(y, DType::F32)?;
    let one = k.splat(DType::F32, &block, 1.0)?;
    let nx = k.neg(x)?;
    let e = k.exp(nx)?;
    let den = k.add(one, e)?;
    let s = k.div(x, den)?;
    let r = k.mul(s, y)?;
    let r = k.convert(r, dtype)?;
    k.store(o, r)?;
    Ok(k)
}

/// RMSNorm over rows of [256, 1024]: blocks of 8 rows, the weight's one block at every step.
pub fn rms_norm(dtype: DType) -> Result<Kernel, BuildError> {
    let (m, d, rows) = (256u64, 1024u64, 8u64);
    let mut k = TiledBuilder::new("rms_norm_rows", &[m / rows], &[Parallel])?;
    let x = k.input(ty(dtype, &[m, d]), &[rows, d], &[Grid(0), Const(0)])?;
    let w = k.input(ty(dtype, &[1, d]), &[1, d], &[Const(0), Const(0)])?;
    let o = k.output(ty(dtype, &[m, d]), &[rows, d], &[Grid(0), Const(0)])?;
    let xv = k.load(x)?;
    let xv = k.convert(xv, DType::F32)?;
    let sq = k.mul(xv, xv)?;
    let ss = k.reduce(Reduce::Sum, sq, &[1])?;
    let inv_d = k.splat(DType::F32, &[rows, 1], 1.0 / d as f64)?;
    let ms = k.mul(ss, inv_d)?;
    let eps = k.splat(DType::F32, &[rows, 1], 1e-6)?;
    let ms = k.add(ms, eps)?;
    let r = k.rsqrt(ms)?;
    let r = k.broadcast(r, &[rows, d])?;
    let wv = k.load(w)?;
    let wv = k.convert(wv, DType::F32)?;
    let wv = k.broadcast(wv, &[rows, d])?;
    let y = k.mul(xv, r)?;
    let y = k.mul(y, wv)?;
    let y = k.convert(y, dtype)?;
    k.store(o, y)?;
    k.finish()
}

/// [512, 512] @ [512, 512] in 128³ blocks: an f32 VMEM accumulator over the `arbitrary` K axis,
/// zeroed at its first step and written out (in the inputs' type) at its last.
pub fn matmul(dtype: DType) -> Result<Kernel, BuildError> {
    let (n, t) = (512u64, 128u64);
    let g = n / t;
    let mut k = TiledBuilder::new("matmul", &[g, g, g], &[Parallel, Parallel, Arbitrary])?;
    let a = k.input(ty(dtype, &[n, n]), &[t, t], &[Grid(0), Grid(2)])?;
    let b = k.input(ty(dtype, &[n, n]), &[t, t], &[Grid(2), Grid(1)])?;
    let o = k.output(ty(dtype, &[n, n]), &[t, t], &[Grid(0), Grid(1)])?;
    let acc = k.scratch(MType::vmem(DType::F32, &[t, t]))?;
    let kk = k.program_id(2)?;
    let zero = k.i32(0)?;
    let first = k.compare(Compare::Eq, kk, zero)?;
    k.when(first, |k| {
        let z = k.splat(DType::F32, &[t, t], 0.0)?;
        k.store(acc, z)
    })?;
    let av = k.load(a)?;
    let bv = k.load(b)?;
    let cv = k.load(acc)?;
    let c = k.matmul(av, bv, cv, false)?;
    k.store(acc, c)?;
    let last_k = k.i32((g - 1) as i32)?;
    let last = k.compare(Compare::Eq, kk, last_k)?;
    k.when(last, |k| {
        let r = k.load(acc)?;
        let r = k.convert(r, dtype)?;
        k.store(o, r)
    })?;
    k.finish()
}

/// `o = x` over blocks `block` of `array`, both windows at `index_map`, over `grid`; verified
/// only (scoping and types), so callers can put the tiling, coverage and VMEM checks to the test.
pub fn copy(
    name: &str,
    dtype: DType,
    array: &[u64],
    block: &[u64],
    grid: &[u64],
    index_map: &[IndexExpr],
) -> Result<Kernel, BuildError> {
    let t = ty(dtype, array);
    let mut k = TiledBuilder::new(name, grid, &vec![Parallel; grid.len()])?;
    let x = k.input(t.clone(), block, index_map)?;
    let o = k.output(t, block, index_map)?;
    let v = k.load(x)?;
    k.store(o, v)?;
    k.finish_without_layout_checks()
}

/// Both printed forms of `kernel` compile with libtpu for v5e and v6e (nothing to do when the
/// tests run without libtpu, which `TPUK_REQUIRE_RUNTIMES` turns into a failure).
pub fn compiles_for_v5e_and_v6e(kernel: &Kernel) {
    use tpu_kernels::mosaic::{Form, custom_call_module_as};
    use tpu_kernels_registry::pjrt::{CompileOptions, Program, Topology};
    let Some(libtpu) = tpu_kernels_registry::pjrt::testing::libtpu_for_tests() else { return };
    for topology in ["v5e:1x1", "v6e:1x1"] {
        let topo = Topology::new(&libtpu, topology).unwrap_or_else(|e| panic!("{topology}: {e}"));
        for form in [Form::Shipped, Form::Readable] {
            topo.compile(
                &Program::text(custom_call_module_as(kernel, form)),
                &CompileOptions::new(),
            )
            .unwrap_or_else(|e| panic!("{} on {topology} ({form:?}): {e}", kernel.name));
        }
    }
}
