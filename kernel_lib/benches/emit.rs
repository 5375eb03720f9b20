//! Build + verify + print of every registered kernel at a 1024x4096 signature.
//!
//! Criterion measures each kernel; a summary table (median, min, max in microseconds over
//! repeated runs) prints at the end. Target: rms_norm <= 50 us.

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

fn main() {
    let cases: Vec<(&KernelRegistration, KernelSignature)> =
        registered().into_iter().filter_map(|k| Some((k, big_signature(k)?))).collect();

    let mut c = Criterion::default().configure_from_args();
    {
        let mut group = c.benchmark_group("emit_1024x4096");
        for (k, sig) in &cases {
            group.bench_function(k.name, |b| b.iter(|| emit(k, black_box(sig))));
        }
        group.finish();
    }
    c.final_summary();

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
