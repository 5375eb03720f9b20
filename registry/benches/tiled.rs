//! The tiled (Mosaic) kernels: libtpu's compile time for each one at each canonical signature
//! (v5e and v6e, the shipped form), and on the CPU the twin against the StableHLO kernel of the
//! same op, both compiled once and run in the same loop (interleaved, medians) on the same
//! random inputs. The ratio is what sets the tiled kernels' CPU priority below their StableHLO
//! counterparts' (docs/perf-log.md).
//!
//! `cargo bench -p tpu-kernels-registry --bench tiled` (needs `scripts/dev setup`).

use std::hint::black_box;
use std::time::Instant;

use criterion::Criterion;
use tpu_kernels::registration::{KernelSignature, Platform};
use tpu_kernels_registry::check::random_bytes;
use tpu_kernels_registry::dispatch::upload;
use tpu_kernels_registry::pjrt::{
    Buffer, Client, ClientOptions, CompileOptions, LoadedExecutable, Plugin, Program, Topology,
};
use tpu_kernels_registry::{Index, Kernel, normalize_op};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Case {
    kernel: std::sync::Arc<Kernel>,
    other: std::sync::Arc<Kernel>,
    sig: KernelSignature,
}

/// Signatures measured beside the canonical ones: cross-entropy at a 32k (Llama 2) and a 128k
/// (Llama 3: 128256) vocabulary.
const EXTRA: &[(&str, &str)] = &[
    ("tiled_cross_entropy", "f32[256,32000], i64[256]"),
    ("tiled_cross_entropy", "f32[256,128256], i64[256]"),
    ("tiled_cross_entropy_backward", "f32[], f32[256,32000], i64[256]"),
    ("tiled_cross_entropy_backward", "f32[], f32[256,128256], i64[256]"),
];

fn cases(index: &Index) -> Vec<Case> {
    let mut out = Vec::new();
    for k in index.kernels().filter(|k| k.record.is_tiled()) {
        let op = normalize_op(k.record.ops[0]);
        let extra = EXTRA.iter().filter(|(name, _)| *name == k.name()).map(|(_, sig)| {
            k.complete_statics(k.record.parse_signature(sig).expect("parses")).expect("statics")
        });
        for sig in k.record.canonical_signatures().unwrap_or_default().into_iter().chain(extra) {
            let Some(other) = index
                .candidates(&op)
                .iter()
                .find(|o| !o.record.is_tiled() && o.record.accepts(&sig).is_ok())
            else {
                continue;
            };
            out.push(Case { kernel: k.clone(), other: other.clone(), sig });
        }
    }
    out
}

fn compile(client: &Client, k: &Kernel, sig: &KernelSignature) -> LoadedExecutable {
    let text = k.module_text(sig, Platform::Cpu).expect("emits").text.to_string();
    client.compile(&Program::text(text), &CompileOptions::new()).expect("compiles")
}

fn main() {
    let index = Index::from_inventory().expect("index");
    let cases = cases(&index);

    println!("\nlibtpu compile, shipped Mosaic form (ms, median of 3)");
    println!("{:<22} {:>9} {:>9}  signature", "kernel", "v5e", "v6e");
    match Plugin::libtpu() {
        Err(e) => println!("*** SKIPPED libtpu compile times: {e}"),
        Ok(libtpu) => {
            let topologies: Vec<Topology> = ["v5e:1x1", "v6e:1x1"]
                .iter()
                .map(|t| Topology::new(&libtpu, t).expect("topology"))
                .collect();
            for c in &cases {
                let text = c.kernel.module_text(&c.sig, Platform::Tpu).expect("emits").text;
                let program = Program::text(text.to_string());
                let ms: Vec<f64> = topologies
                    .iter()
                    .map(|t| {
                        median(
                            (0..3)
                                .map(|_| {
                                    let start = Instant::now();
                                    t.compile(&program, &CompileOptions::new()).expect("compiles");
                                    start.elapsed().as_secs_f64() * 1e3
                                })
                                .collect(),
                        )
                    })
                    .collect();
                println!(
                    "{:<22} {:>9.1} {:>9.1}  {}",
                    c.kernel.name(),
                    ms[0],
                    ms[1],
                    c.sig.label()
                );
            }
        }
    }

    let plugin = match Plugin::cpu() {
        Ok(p) => p,
        Err(e) => {
            println!("*** SKIPPED tiled CPU bench: {e}");
            return;
        }
    };
    let client = Client::new(&plugin, ClientOptions::new().cpu_device_count(1)).expect("client");
    let mut c = Criterion::default().configure_from_args();
    let mut rows = Vec::new();
    {
        let mut group = c.benchmark_group("tiled_twin_vs_stablehlo");
        for case in &cases {
            let twin = compile(&client, &case.kernel, &case.sig);
            let hlo = compile(&client, &case.other, &case.sig);
            let inputs: Vec<Buffer> = case
                .sig
                .inputs
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    upload(&client, t, &random_bytes(t, i as u64 + 1).expect("data"))
                        .expect("upload")
                })
                .collect();
            let refs: Vec<&Buffer> = inputs.iter().collect();
            let label = format!("{}@{}", case.kernel.name(), case.sig.label());
            group.bench_function(format!("{label}/twin"), |b| {
                b.iter(|| black_box(twin.execute(&refs).expect("runs")))
            });
            group.bench_function(format!("{label}/stablehlo"), |b| {
                b.iter(|| black_box(hlo.execute(&refs).expect("runs")))
            });
            let (mut t_twin, mut t_hlo) = (Vec::new(), Vec::new());
            for _ in 0..30 {
                let s = Instant::now();
                black_box(twin.execute(&refs).expect("runs"));
                t_twin.push(s.elapsed().as_secs_f64() * 1e6);
                let s = Instant::now();
                black_box(hlo.execute(&refs).expect("runs"));
                t_hlo.push(s.elapsed().as_secs_f64() * 1e6);
            }
            rows.push((case, median(t_twin), median(t_hlo)));
        }
        group.finish();
    }
    c.final_summary();

    println!("\ntiled twin vs StableHLO kernel on the CPU (us, median of 30 interleaved runs)");
    println!(
        "{:<22} {:<18} {:>10} {:>10} {:>7}  signature",
        "tiled kernel", "StableHLO kernel", "twin", "stablehlo", "ratio"
    );
    for (case, twin, hlo) in rows {
        println!(
            "{:<22} {:<18} {:>10.1} {:>10.1} {:>7.2}  {}",
            case.kernel.name(),
            case.other.name(),
            twin,
            hlo,
            twin / hlo,
            case.sig.label()
        );
    }
}
