//! Build + verify + print of every registered kernel at a 1024x4096 signature, and of every
//! tiled kernel's Mosaic module at each of its canonical signatures.
//!
//! Criterion measures each kernel; summary tables (median, min, max in microseconds over
//! repeated runs) print at the end. Targets: rms_norm <= 50 us; a tiled kernel's build +
//! verify (tiling, coverage, VMEM) + print of the shipped custom-call module <= 1 ms per
//! signature.

use std::hint::black_box;
use std::time::Instant;

use criterion::Criterion;
use tpu_kernels::{KernelRegistration, KernelSignature, Shape, registered};

/// The kernel's first rank-2 canonical signature, scaled so its first input is 1024x4096 (other
/// inputs' dimensions that matched the first input's follow along).
fn big_signature(k: &KernelRegistration) -> Option<KernelSignature> {
    let sigs = k.canonical_signatures().ok()?;
    let mut sig = sigs.into_iter().find(|s| s.inputs[0].rank() == 2)?;
    let first = sig.inputs[0].shape.static_dims()?;
    let (rows, cols) = (first[0], first[1]);
    for t in &mut sig.inputs {
        let dims: Vec<u64> = t
            .shape
            .static_dims()?
            .into_iter()
            .map(|d| {
                if d == cols {
                    4096
                } else if d == rows {
                    1024
                } else {
                    d
                }
            })
            .collect();
        t.shape = Shape::of(&dims);
    }
    Some(sig)
}

fn emit(k: &KernelRegistration, sig: &KernelSignature) -> usize {
    let module = k.emit(sig).expect("kernel builds");
    module.to_text().len()
}

/// A tiled kernel's path to libtpu: build the Mosaic kernel, verify it and check its tiling,
/// coverage and v5e VMEM, print the shipped form inside its custom-call module.
fn emit_tiled(k: &KernelRegistration, sig: &KernelSignature) -> usize {
    let kernel = k.tiled_kernel(sig).expect("tiled").expect("kernel builds");
    tpu_kernels::mosaic::check::vmem(&kernel, tpu_kernels::mosaic::Target::V5E).expect("fits");
    k.emit_text(sig, tpu_kernels::registration::Platform::Tpu).expect("prints").len()
}

fn main() {
    let cases: Vec<(&KernelRegistration, KernelSignature)> =
        registered().into_iter().filter_map(|k| Some((k, big_signature(k)?))).collect();
    let tiled: Vec<(&KernelRegistration, KernelSignature)> = registered()
        .into_iter()
        .filter(|k| k.is_tiled())
        .flat_map(|k| k.canonical_signatures().unwrap_or_default().into_iter().map(move |s| (k, s)))
        .collect();

    let mut c = Criterion::default().configure_from_args();
    {
        let mut group = c.benchmark_group("emit_1024x4096");
        for (k, sig) in &cases {
            group.bench_function(k.name, |b| b.iter(|| emit(k, black_box(sig))));
        }
        group.finish();
        let mut group = c.benchmark_group("tiled_mosaic");
        for (k, sig) in &tiled {
            group.bench_function(format!("{}@{}", k.name, sig.label()), |b| {
                b.iter(|| emit_tiled(k, black_box(sig)))
            });
        }
        group.finish();
    }
    c.final_summary();

    println!(
        "\ntiled kernels: Mosaic emit, build + verify + check + print of the shipped module (microseconds, 500 runs each)"
    );
    println!(
        "{:<22} {:>9} {:>9} {:>9} {:>8}  signature",
        "kernel", "median", "min", "max", "bytes"
    );
    for (k, sig) in &tiled {
        let mut times: Vec<f64> = (0..500)
            .map(|_| {
                let t = Instant::now();
                black_box(emit_tiled(k, black_box(sig)));
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        times.sort_by(f64::total_cmp);
        println!(
            "{:<22} {:>9.2} {:>9.2} {:>9.2} {:>8}  {}",
            k.name,
            times[times.len() / 2],
            times[0],
            times[times.len() - 1],
            emit_tiled(k, sig),
            sig.label()
        );
    }

    println!("\nbuild + verify + print at 1024x4096 (microseconds, 2000 runs each)");
    println!(
        "{:<18} {:>9} {:>9} {:>9} {:>8}  signature",
        "kernel", "median", "min", "max", "bytes"
    );
    for (k, sig) in &cases {
        let mut times: Vec<f64> = (0..2000)
            .map(|_| {
                let t = Instant::now();
                black_box(emit(k, black_box(sig)));
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let bytes = emit(k, sig);
        let shapes: Vec<String> = sig.inputs.iter().map(|t| t.short()).collect();
        println!(
            "{:<18} {:>9.2} {:>9.2} {:>9.2} {:>8}  {}",
            k.name,
            times[times.len() / 2],
            times[0],
            times[times.len() - 1],
            bytes,
            shapes.join(", ")
        );
    }
}
