//! Selection among 1,000 registered kernels, and what a cached eager call adds on top of PJRT.
//!
//! Targets: selection <= 100 ns median; a cached `Dispatcher::call` <= 2 us over the same
//! uploads + execute done by hand. Both print side by side at the end.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use criterion::Criterion;
use tpu_kernels::registration::{
    Guard, KernelRegistration, KernelSignature, Platform, StaticKind, StaticParam, StaticValue,
};
use tpu_kernels::{BuildError, DType, Module, TensorType};
use tpu_kernels_registry::cache::{CacheConfig, CompileCache};
use tpu_kernels_registry::pjrt::{Buffer, Client, ClientOptions, ElementType, Plugin};
use tpu_kernels_registry::{
    CallMeta, Dispatcher, HostTensor, Index, Kernel, KernelSource, Registry,
};

fn unused_build(_: &KernelSignature) -> Result<Module, BuildError> {
    Err(BuildError {
        kernel: "bench".into(),
        op: "build",
        kind: tpu_kernels::ErrorKind::Verify,
        message: "selection benchmark kernels are never built".into(),
    })
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// 100 ops x 10 kernels each, told apart by a static `variant` and a rank guard.
fn thousand_kernels() -> Index {
    const STATICS: &[StaticParam] = &[StaticParam::new("variant", StaticKind::Int)];
    let mut kernels = Vec::new();
    for op in 0..100 {
        let op_name: &'static str = leak(format!("bench::op{op}"));
        for v in 0..10 {
            let guards: &'static [Guard] = Box::leak(Box::new([
                Guard::StaticEq { name: "variant", value: leak(v.to_string()) },
                Guard::Rank { input: 0, min: 1, max: 4 },
                Guard::SameDType,
            ]));
            let ops: &'static [&'static str] = Box::leak(Box::new([op_name]));
            let record = KernelRegistration::new(leak(format!("k{op}_{v}")), unused_build)
                .ops(ops)
                .inputs(&["x", "y"])
                .statics(STATICS)
                .guards(guards)
                .dtypes(&[DType::F32, DType::BF16]);
            kernels.push(Arc::new(Kernel {
                ops: vec![format!("{op_name}.default")],
                record,
                source: KernelSource::Built,
                runtime: true,
            }));
        }
    }
    Index::build(kernels).expect("benchmark index builds")
}

fn median_ns(mut f: impl FnMut(), runs: usize) -> (f64, f64, f64) {
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[runs / 2], times[0], times[runs - 1])
}

/// Median, min and max, in nanoseconds.
type Spread = (f64, f64, f64);

/// Like [`median_ns`] for two functions timed alternately, call by call, so that drift on a
/// noisy machine hits both; also the median of their per-pair differences (`b - a`).
fn paired_median_ns(
    mut a: impl FnMut(),
    mut b: impl FnMut(),
    runs: usize,
) -> (Spread, Spread, f64) {
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_nanos() as f64
    };
    let (mut ta, mut tb, mut diff) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let x = time(&mut a);
        let y = time(&mut b);
        ta.push(x);
        tb.push(y);
        diff.push(y - x);
    }
    let stats = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[runs / 2], v[0], v[runs - 1])
    };
    let d = stats(diff).0;
    (stats(ta), stats(tb), d)
}

fn main() {
    let index = thousand_kernels();
    assert_eq!(index.len(), 1000);
    let sig = KernelSignature {
        inputs: vec![TensorType::new(DType::F32, [8, 128]), TensorType::new(DType::F32, [8, 128])],
        statics: vec![("variant", StaticValue::Int(7))],
    };
    let contiguous = [true, true];
    let call = CallMeta { sig: &sig, contiguous: &contiguous, platform: Platform::Cpu };
    assert_eq!(index.select("bench::op42.default", &call).expect("selects").name(), "k42_7");

    let mut c = Criterion::default().configure_from_args();
    c.bench_function("select_among_1000", |b| {
        b.iter(|| {
            black_box(index.select(black_box("bench::op42.default"), black_box(&call))).is_ok()
        })
    });

    // Eager call overhead on the CPU plugin: silu on 16 floats.
    let plugin = Plugin::cpu().expect("PJRT CPU plugin (run `scripts/dev setup`)");
    let client = Client::new(&plugin, ClientOptions::new()).expect("client");
    let cache = Arc::new(CompileCache::new(CacheConfig::memory_only(16)));
    let registry = Registry::global().expect("registry");
    let dispatcher = Dispatcher::new(registry, client.clone(), cache.clone()).expect("dispatcher");
    let ty = TensorType::new(DType::F32, [16]);
    let data: Vec<u8> = (0..16).flat_map(|i| (i as f32 * 0.1).to_le_bytes()).collect();
    let input = [HostTensor { ty: &ty, data: &data, contiguous: true }];
    let outputs = dispatcher.call("aten::silu", &input, &[]).expect("silu runs");
    assert_eq!(outputs[0].dims(), &[16]);
    // The same executable, driven by hand as the dispatcher drives it: the input read in place
    // through a view cache, execute, wait. The difference is the dispatcher's own work (memo
    // lookup, fault check, counters).
    let sig = KernelSignature { inputs: vec![ty.clone()], statics: vec![] };
    let kernel = registry.index().kernel("silu").expect("silu").clone();
    let text = kernel.module_text(&sig, Platform::Cpu).expect("module").text;
    let exe = cache
        .get_or_compile(
            &client,
            &tpu_kernels_registry::pjrt::Program::text(text.to_string()),
            &Default::default(),
        )
        .expect("compiled")
        .executable;
    let views = tpu_kernels_registry::pjrt::ViewCache::default();
    let raw = || {
        let b = views.input(&client, &data, ElementType::F32, &[16]).expect("input");
        let out: Vec<Buffer> = exe.execute(&[&b]).expect("execute");
        black_box(out);
    };
    let dispatched = || {
        black_box(dispatcher.call("aten::silu", &input, &[]).expect("dispatch"));
    };
    c.bench_function("pjrt_view_execute_16", |b| b.iter(raw));
    c.bench_function("dispatcher_call_16", |b| b.iter(dispatched));
    c.final_summary();

    let runs = 20_000;
    let (sel, sel_min, sel_max) =
        median_ns(|| drop(black_box(index.select("bench::op42.default", black_box(&call)))), runs);
    let ((pjrt, pjrt_min, pjrt_max), (disp, disp_min, disp_max), overhead) =
        paired_median_ns(raw, dispatched, runs);
    println!("\nregistry and dispatch ({runs} runs each; nanoseconds)");
    println!("{:<44} {:>10} {:>10} {:>10}", "measure", "median", "min", "max");
    println!(
        "{:<44} {:>10.0} {:>10.0} {:>10.0}",
        "select among 1,000 kernels (target <= 100)", sel, sel_min, sel_max
    );
    println!(
        "{:<44} {:>10.0} {:>10.0} {:>10.0}",
        "PJRT input view + execute, silu f32[16]", pjrt, pjrt_min, pjrt_max
    );
    println!(
        "{:<44} {:>10.0} {:>10.0} {:>10.0}",
        "Dispatcher::call, silu f32[16]", disp, disp_min, disp_max
    );
    // The median of the per-pair differences: each call against the raw run just before it.
    println!("{:<44} {:>10.0}", "dispatch overhead (target <= 2000)", overhead);
}
