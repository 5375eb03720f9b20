//! Differential test of the Rust tiling rule (`tpu_kernels::mosaic::check::tiling`) against
//! libtpu's own verdict: over dtypes, array shapes and block shapes, a copy kernel is accepted
//! by Rust exactly when libtpu compiles it, for v5e and v6e; likewise the VMEM budget, under
//! each target's default scoped limit and under a kernel's own `vmem_limit_bytes`.
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

#[path = "support/tiled_kernels.rs"]
mod tiled_kernels;

use tpu_kernels::DType;
use tpu_kernels::mosaic::{IndexExpr, Kernel, check, custom_call_module};
use tpu_kernels_registry::pjrt::testing::libtpu_for_tests;
use tpu_kernels_registry::pjrt::{CompileOptions, Program, Topology};

/// `o = x` over blocks `block` of `array`, the grid covering the array.
fn copy(dtype: DType, array: [u64; 2], block: [u64; 2]) -> Kernel {
    let grid = [array[0] / block[0], array[1] / block[1]];
    tiled_kernels::copy(
        "copy",
        dtype,
        &array,
        &block,
        &grid,
        &[IndexExpr::Grid(0), IndexExpr::Grid(1)],
    )
    .unwrap()
}

#[test]
fn rust_accepts_a_block_exactly_when_libtpu_compiles_it() {
    let Some(libtpu) = libtpu_for_tests() else { return };
    let topologies: Vec<Topology> =
        ["v5e:1x1", "v6e:1x1"].iter().map(|t| Topology::new(&libtpu, t).unwrap()).collect();
    let arrays = [[256u64, 512u64], [16, 100], [64, 256], [24, 384]];
    let blocks = [
        [8u64, 128u64],
        [16, 128],
        [32, 128],
        [8, 256],
        [4, 128],
        [1, 128],
        [8, 100],
        [16, 100],
        [24, 128],
        [2, 384],
    ];
    let mut disagreements = Vec::new();
    let mut cases = 0;
    for dtype in [DType::F32, DType::BF16, DType::I8] {
        for array in arrays {
            for block in blocks.iter().copied().chain([array]) {
                if block[0] > array[0]
                    || block[1] > array[1]
                    || array[0] % block[0] != 0
                    || array[1] % block[1] != 0
                {
                    continue;
                }
                let kernel = copy(dtype, array, block);
                let rust = check::tiling(&kernel).is_ok();
                let text = custom_call_module(&kernel);
                for topology in &topologies {
                    cases += 1;
                    let verdict =
                        topology.compile(&Program::text(text.clone()), &CompileOptions::new());
                    let libtpu_ok = verdict.is_ok();
                    if rust != libtpu_ok {
                        let why = verdict
                            .err()
                            .map(|e| e.to_string().lines().next().unwrap_or_default().to_owned());
                        disagreements.push(format!(
                            "{dtype} array {array:?} block {block:?} on {}: rust {}, libtpu {} {}",
                            topology.name(),
                            if rust { "accepts" } else { "refuses" },
                            if libtpu_ok { "compiles" } else { "refuses" },
                            why.unwrap_or_default()
                        ));
                    }
                }
            }
        }
    }
    assert!(cases > 100, "{cases} cases");
    assert!(
        disagreements.is_empty(),
        "{} of {cases} cases disagree:\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
}

/// Compiles each `(what, kernel)` for v5e and v6e; fails listing every case where Rust's VMEM
/// check and libtpu's compile disagree.
fn vmem_verdicts_agree(cases: &[(String, Kernel)]) {
    let Some(libtpu) = libtpu_for_tests() else { return };
    let mut disagreements = Vec::new();
    for (topology, target) in [("v5e:1x1", check::Target::V5E), ("v6e:1x1", check::Target::V6E)] {
        let topology = Topology::new(&libtpu, topology).unwrap();
        for (what, kernel) in cases {
            let rust = check::vmem(kernel, target).is_ok();
            let verdict = topology
                .compile(&Program::text(custom_call_module(kernel)), &CompileOptions::new());
            if rust != verdict.is_ok() {
                let libtpu = verdict.err().map_or("compiles".to_owned(), |e| {
                    e.to_string().lines().next().unwrap_or_default().to_owned()
                });
                disagreements.push(format!(
                    "{what} ({} bytes) on {}: rust {}, libtpu {libtpu}",
                    check::vmem_bytes(kernel),
                    topology.name(),
                    if rust { "accepts" } else { "refuses" },
                ));
            }
        }
    }
    assert!(
        disagreements.is_empty(),
        "{} of {} cases disagree:\n{}",
        disagreements.len(),
        2 * cases.len(),
        disagreements.join("\n")
    );
}

#[test]
fn rust_accepts_a_vmem_budget_exactly_when_libtpu_compiles_it() {
    // A copy of f32 [rows, 2048] blocks: in and out, double-buffered: rows * 32 KiB.
    let mut cases = Vec::new();
    for rows in [128u64, 256, 384, 496, 512, 528, 640, 768, 1008, 1024, 1040, 1280] {
        for dtype in [DType::F32, DType::BF16] {
            let cols = if dtype == DType::F32 { 2048 } else { 4096 };
            let kernel = copy(dtype, [rows * 2, cols], [rows, cols]);
            cases.push((format!("{dtype} block [{rows}, {cols}]"), kernel));
        }
    }
    vmem_verdicts_agree(&cases);
}

#[test]
fn rust_accepts_a_vmem_limit_exactly_when_libtpu_compiles_under_it() {
    // f32 [rows, 2048] copy blocks, in and out, double-buffered: rows * 32 KiB. Around each
    // limit (rows * 32 KiB = limit at rows = 32 * MiB): 8 MiB is under both targets'
    // defaults, 48 and 100 MiB over them.
    let mut cases = Vec::new();
    for limit_mib in [8u64, 48, 100] {
        for rows in [32 * limit_mib - 64, 32 * limit_mib, 32 * limit_mib + 64] {
            let mut kernel = copy(DType::F32, [rows * 2, 2048], [rows, 2048]);
            kernel.vmem_limit_bytes = Some(limit_mib << 20);
            cases.push((format!("block [{rows}, 2048] under a {limit_mib} MiB limit"), kernel));
        }
    }
    vmem_verdicts_agree(&cases);
}
