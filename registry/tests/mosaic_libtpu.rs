//! Tiled kernels built with `tpu_kernels::mosaic` compile for real TPU generations: the Mosaic
//! text inside a `tpu_custom_call` goes through libtpu's compile-only path for v5e and v6e.
//! Blocks that break the tiling rule or the VMEM budget are refused in Rust, and libtpu
//! refuses the same kernels when the Rust checks are bypassed.
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

#[path = "support/tiled_kernels.rs"]
mod tiled_kernels;

use tiled_kernels::{copy, matmul, rms_norm, silu_mul, ty};
use tpu_kernels::mosaic::{
    Form, IndexExpr, Kernel, Semantics, Target, TiledBuilder, check, custom_call_module_as,
};
use tpu_kernels::{DType, ErrorKind};
use tpu_kernels_registry::pjrt::testing::libtpu_for_tests;
use tpu_kernels_registry::pjrt::{CompileOptions, Plugin, Program, Topology};

use IndexExpr::{Const, Grid};
use Semantics::Parallel;

const TOPOLOGIES: [&str; 2] = ["v5e:1x1", "v6e:1x1"];

/// Compiles the kernel in both printed forms; the shipped form's result (the two must agree).
fn compile(libtpu: &Plugin, topology: &str, kernel: &Kernel) -> Result<usize, String> {
    let shipped = compile_as(libtpu, topology, kernel, Form::Shipped);
    let readable = compile_as(libtpu, topology, kernel, Form::Readable);
    assert_eq!(
        shipped.is_ok(),
        readable.is_ok(),
        "{}: shipped {shipped:?}, readable {readable:?}",
        kernel.name
    );
    shipped
}

fn compile_as(
    libtpu: &Plugin,
    topology: &str,
    kernel: &Kernel,
    form: Form,
) -> Result<usize, String> {
    let topology = Topology::new(libtpu, topology).map_err(|e| e.to_string())?;
    let text = custom_call_module_as(kernel, form);
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
            let size = compile(&libtpu, topology, kernel)
                .unwrap_or_else(|e| panic!("{} on {topology}: {e}", kernel.name));
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
    let kernel =
        copy("copy", DType::F32, &[4096, 2048], &[4096, 2048], &[1], &[Const(0), Const(0)])
            .unwrap();
    check::tiling(&kernel).unwrap();
    check::coverage(&kernel).unwrap();
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
    let half = || {
        copy("half", DType::F32, &[256, 128], &[128, 128], &[1], &[Grid(0), Const(0)])
            .and_then(|k| check::coverage(&k))
    };
    let err = half().unwrap_err();
    assert_eq!(err.kind, ErrorKind::Coverage, "{err}");
    assert!(err.to_string().contains("writes 1 of the 2 blocks"), "{err}");
    // An index map past the end of the array.
    let over = || {
        copy("over", DType::F32, &[256, 128], &[128, 128], &[4], &[Grid(0), Const(0)])
            .and_then(|k| check::coverage(&k))
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

#[test]
fn a_libtpu_error_names_the_rust_line_of_the_op() {
    let Some(libtpu) = libtpu_for_tests() else { return };
    // i8 vector arithmetic, which Mosaic does not implement on v5e: accepted by the Rust checks
    // (they know types, not what each generation implements), refused by libtpu.
    let t = ty(DType::I8, &[16, 256]);
    let mut k = TiledBuilder::new("i8_add", &[2], &[Parallel]).unwrap();
    let x = k.input(t.clone(), &[8, 256], &[Grid(0), Const(0)]).unwrap();
    let o = k.output(t, &[8, 256], &[Grid(0), Const(0)]).unwrap();
    let v = k.load(x).unwrap();
    let line = line!() + 1;
    let r = k.add(v, v).unwrap();
    k.store(o, r).unwrap();
    let kernel = k.finish().unwrap();
    for form in [Form::Shipped, Form::Readable] {
        let e = compile_as(&libtpu, "v5e:1x1", &kernel, form).unwrap_err();
        let at = format!("loc(\"{}\":{line}:", file!());
        assert!(e.contains("Only vector<i16> and vector<i32> are supported"), "{form:?}: {e}");
        assert!(e.contains(&at), "{form:?}: the error does not name {at}: {e}");
    }
}
