//! Tiled kernels built with `tpu_kernels::mosaic` compile for real TPU generations: the Mosaic
//! text inside a `tpu_custom_call` goes through libtpu's compile-only path for v5e and v6e.
//! Blocks that break the tiling rule or the VMEM budget are refused in Rust, and libtpu
//! refuses the same kernels when the Rust checks are bypassed.

use tpu_kernels::mosaic::{
    Compare, IndexExpr, Kernel, MType, Reduce, Semantics, Target, TiledBuilder, check,
    custom_call_module,
};
use tpu_kernels::{BuildError, DType, ErrorKind, TensorType};
use tpu_kernels_registry::pjrt::testing::libtpu_for_tests;
use tpu_kernels_registry::pjrt::{CompileOptions, Plugin, Program, Topology};

use IndexExpr::{Const, Grid};
use Semantics::{Arbitrary, Parallel};

const TOPOLOGIES: [&str; 2] = ["v5e:1x1", "v6e:1x1"];

fn ty(dtype: DType, dims: &[u64]) -> TensorType {
    TensorType::new(dtype, dims)
}

/// `silu(a) * b` over 128x128 blocks of [256, 512], computed in f32 for bf16 inputs.
fn silu_mul(dtype: DType, block: [u64; 2]) -> Result<TiledBuilder, BuildError> {
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
fn rms_norm(dtype: DType) -> Result<Kernel, BuildError> {
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
fn matmul(dtype: DType) -> Result<Kernel, BuildError> {
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

fn compile(libtpu: &Plugin, topology: &str, kernel: &Kernel) -> Result<usize, String> {
    let topology = Topology::new(libtpu, topology).map_err(|e| e.to_string())?;
    let text = custom_call_module(kernel);
    topology
        .compile(&Program::text(text), &CompileOptions::new())
        .map(|c| c.serialized_size())
        .map_err(|e| e.to_string())
}

#[test]
fn tiled_kernels_compile_for_v5e_and_v6e() {
    let Some(libtpu) = libtpu_for_tests() else { return };
    let mut kernels = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        kernels.push(silu_mul(dtype, [128, 128]).and_then(TiledBuilder::finish).unwrap());
        kernels.push(rms_norm(dtype).unwrap());
        kernels.push(matmul(dtype).unwrap());
    }
    for kernel in &kernels {
        for topology in TOPOLOGIES {
            let target = if topology.starts_with("v5e") { Target::V5E } else { Target::V6E };
            check::vmem(kernel, target).unwrap();
            let size = compile(&libtpu, topology, kernel).unwrap_or_else(|e| {
                panic!("{} on {topology}: {e}\n{}", kernel.name, custom_call_module(kernel))
            });
            assert!(size > 1000, "{} on {topology}: {size} bytes", kernel.name);
        }
    }
}

#[test]
fn the_printed_text_is_deterministic_and_names_the_mosaic_ops() {
    let a = tpu_kernels::mosaic::print_kernel(&matmul(DType::BF16).unwrap());
    let b = tpu_kernels::mosaic::print_kernel(&matmul(DType::BF16).unwrap());
    assert_eq!(a, b);
    for needle in [
        "iteration_bounds = array<i64: 4, 4, 4>",
        "#tpu.dimension_semantics<arbitrary>",
        "scratch_operands = 1 : i64",
        "tpu.matmul",
        "transpose_lhs_hint = false",
        "scf.if",
        "{strides = array<i32>} : memref<128x128xf32, #tpu.memory_space<vmem>>, vector<128x128xf32>,",
        "arith.truncf",
        "func.func @transform_0(%arg0: i32, %arg1: i32, %arg2: i32) -> (i32, i32)",
        "return %arg0, %arg2 : i32, i32",
    ] {
        assert!(a.contains(needle), "missing {needle:?} in\n{a}");
    }
}

#[test]
fn a_mis_tiled_block_is_refused_in_rust_and_by_libtpu() {
    let err = silu_mul(DType::F32, [8, 100]).and_then(TiledBuilder::finish).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Tiling, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("kernel `silu_mul`") && text.contains("input 0: block [8, 100]"),
        "{text}"
    );
    // libtpu agrees: the same kernel, the Rust checks bypassed.
    let Some(libtpu) = libtpu_for_tests() else { return };
    let unchecked = silu_mul(DType::F32, [8, 100]).unwrap().finish_without_layout_checks().unwrap();
    for topology in TOPOLOGIES {
        let e = compile(&libtpu, topology, &unchecked).unwrap_err();
        assert!(e.contains("E2002") || e.contains("tiling"), "{topology}: {e}");
    }
}

#[test]
fn a_vmem_overflow_is_refused_in_rust_and_by_libtpu() {
    // f32 [4096, 2048] in and out, one block each, double-buffered: 128 MiB.
    let build = || -> Result<TiledBuilder, BuildError> {
        let t = ty(DType::F32, &[4096, 2048]);
        let mut k = TiledBuilder::new("copy", &[1], &[Parallel])?;
        let x = k.input(t.clone(), &[4096, 2048], &[Const(0), Const(0)])?;
        let o = k.output(t, &[4096, 2048], &[Const(0), Const(0)])?;
        let v = k.load(x)?;
        k.store(o, v)?;
        Ok(k)
    };
    let kernel = build().and_then(TiledBuilder::finish).unwrap();
    for target in [Target::V5E, Target::V6E] {
        let err = check::vmem(&kernel, target).unwrap_err();
        assert_eq!(err.kind, ErrorKind::VmemLimit, "{err}");
        assert!(err.to_string().contains(&format!("{}'s scoped limit", target.name)), "{err}");
    }
    let Some(libtpu) = libtpu_for_tests() else { return };
    for topology in TOPOLOGIES {
        let e = compile(&libtpu, topology, &kernel).unwrap_err();
        assert!(e.contains("E1001") || e.contains("Vmem"), "{topology}: {e}");
    }
}

#[test]
fn grids_that_leave_the_array_or_part_of_an_output_are_refused() {
    // Half the grid: the output's second half would be left unwritten (libtpu compiles it).
    let half = || -> Result<Kernel, BuildError> {
        let t = ty(DType::F32, &[256, 128]);
        let mut k = TiledBuilder::new("half", &[1], &[Parallel])?;
        let x = k.input(t.clone(), &[128, 128], &[Grid(0), Const(0)])?;
        let o = k.output(t, &[128, 128], &[Grid(0), Const(0)])?;
        let v = k.load(x)?;
        k.store(o, v)?;
        k.finish()
    };
    let err = half().unwrap_err();
    assert_eq!(err.kind, ErrorKind::Coverage, "{err}");
    assert!(err.to_string().contains("writes 1 of the 2 blocks"), "{err}");
    // An index map past the end of the array.
    let over = || -> Result<Kernel, BuildError> {
        let t = ty(DType::F32, &[256, 128]);
        let mut k = TiledBuilder::new("over", &[4], &[Parallel])?;
        let x = k.input(t.clone(), &[128, 128], &[Grid(0), Const(0)])?;
        let o = k.output(t, &[128, 128], &[Grid(0), Const(0)])?;
        let v = k.load(x)?;
        k.store(o, v)?;
        k.finish()
    };
    let err = over().unwrap_err();
    assert_eq!(err.kind, ErrorKind::Coverage, "{err}");
    assert!(err.to_string().contains("input 0: at grid point [2]"), "{err}");
}

#[test]
fn body_type_errors_name_the_kernel_the_op_and_the_types() {
    let mut k = TiledBuilder::new("bad", &[2], &[Parallel]).unwrap();
    let t = ty(DType::F32, &[16, 128]);
    let x = k.input(t.clone(), &[8, 128], &[Grid(0), Const(0)]).unwrap();
    let _o = k.output(t, &[8, 128], &[Grid(0), Const(0)]).unwrap();
    let v = k.load(x).unwrap();
    let w = k.splat(DType::F32, &[8, 1], 1.0).unwrap();
    let err = k.add(v, w).unwrap_err().to_string();
    assert_eq!(
        err,
        "kernel `bad`: arith.addf: operand types differ: vector<8x128xf32> vs vector<8x1xf32>"
    );
    let acc = k.splat(DType::F32, &[8, 8], 0.0).unwrap();
    let err = k.matmul(v, v, acc, false).unwrap_err().to_string();
    assert!(
        err.starts_with(
            "kernel `bad`: tpu.matmul: contracting dims differ: vector<8x128xf32> has 128"
        ),
        "{err}"
    );
    let err = k.input(ty(DType::F32, &[8, 128]), &[8, 128], &[Const(0), Const(0)]).unwrap_err();
    assert!(err.to_string().contains("inputs are declared before outputs"), "{err}");
    let err = k.output(ty(DType::F32, &[8, 128]), &[8, 128], &[Const(0), Const(0)]).unwrap_err();
    assert!(
        err.to_string().contains("windows are declared before scratch buffers and the body"),
        "{err}"
    );
}
