//! 8 threads x 100k dispatch decisions (every 1,000th one also executes on the CPU plugin) while
//! another thread registers and removes runtime kernels: no error, counters consistent.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tpu_kernels::registration::{KernelRegistration, KernelSignature, Platform};
use tpu_kernels::{BuildError, DType, Module, TensorType};
use tpu_kernels_registry::cache::{CacheConfig, CompileCache};
use tpu_kernels_registry::numerics::{Tolerance, assert_close};
use tpu_kernels_registry::pjrt::testing::cpu_client_for_tests;
use tpu_kernels_registry::{CallMeta, Dispatcher, HostTensor, Kernel, KernelSource, Registry};

fn never_built(_: &KernelSignature) -> Result<Module, BuildError> {
    unreachable!("runtime kernels of this test are selected, never built")
}

const THREADS: usize = 8;
const DECISIONS: usize = 100_000;
const EXECUTE_EVERY: usize = 1_000;

#[test]
fn dispatch_from_eight_threads_while_kernels_come_and_go() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    // A registry of its own (same linked-in kernels), leaked for the dispatcher's 'static.
    let registry: &'static Registry = Box::leak(Box::new(Registry::new().unwrap()));
    let cache = Arc::new(CompileCache::new(CacheConfig::memory_only(16)));
    let dispatcher = Dispatcher::new(registry, client, cache).unwrap();
    let stop = AtomicBool::new(false);
    let registrations = AtomicU64::new(0);
    let executed = AtomicU64::new(0);

    std::thread::scope(|s| {
        // Registers and removes kernels on an op the workers never call, and one on the op they
        // do call but at a lower priority than the standard kernel, so selection must stay put.
        s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name: &'static str = Box::leak(format!("rt_{}", n % 4).into_boxed_str());
                let record = KernelRegistration::new(name, never_built)
                    .ops(&["aten::silu"])
                    .inputs(&["self"])
                    .priority(-1 - (n % 4) as i32)
                    .dtypes(&[DType::F32]);
                let kernel = Kernel {
                    ops: vec!["aten::silu.default".into()],
                    record,
                    source: KernelSource::Built,
                    runtime: false,
                };
                registry.register(kernel).expect("runtime registration");
                registry.unregister(name).expect("runtime removal");
                n += 1;
            }
            registrations.store(n, Ordering::Relaxed);
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (dispatcher, executed) = (&dispatcher, &executed);
                s.spawn(move || {
                    let ty = TensorType::new(DType::F32, [16]);
                    let data: Vec<u8> =
                        (0..16).flat_map(|i| (i as f32 + t as f32).to_le_bytes()).collect();
                    let want: Vec<f64> = (0..16)
                        .map(|i| {
                            let x = f64::from(i as f32 + t as f32);
                            x / (1.0 + (-x).exp())
                        })
                        .collect();
                    let sig = KernelSignature { inputs: vec![ty.clone()], statics: vec![] };
                    let contiguous = [true];
                    let call =
                        CallMeta { sig: &sig, contiguous: &contiguous, platform: Platform::Cpu };
                    for i in 0..DECISIONS {
                        let k = registry.select("aten::silu", &call).expect("selection");
                        assert_eq!(k.name(), "silu", "a lower-priority runtime kernel won");
                        if i % EXECUTE_EVERY == 0 {
                            let input = [HostTensor { ty: &ty, data: &data, contiguous: true }];
                            let out = dispatcher.call("aten::silu", &input, &[]).expect("dispatch");
                            let v = out[0].to_vec::<f32>().unwrap();
                            assert_close("silu", &v, &want, Tolerance::new(1e-5, 1e-6));
                            executed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
        stop.store(true, Ordering::Relaxed);
    });

    assert!(registrations.load(Ordering::Relaxed) > 0, "no registrations happened");
    let stats = dispatcher.stats();
    let silu = &stats.ops["aten::silu.default"];
    let expected = (THREADS * DECISIONS / EXECUTE_EVERY) as u64;
    assert_eq!(executed.load(Ordering::Relaxed), expected);
    assert_eq!(silu.calls, expected);
    assert_eq!(silu.substituted, expected);
    assert_eq!(silu.kernels["silu"], expected);
    assert!(silu.fallbacks.is_empty(), "{:?}", silu.fallbacks);
    assert_eq!(registry.index().len(), Registry::new().unwrap().index().len());
}
