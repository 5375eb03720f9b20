//! The fault switch (`tpu_kernels_registry::fault`) on the real CPU plugin, and the proof that
//! the Rust numerics check fails when a kernel's output breaks: a NaN (or off-by-one) output
//! computed by PJRT is refused by `numerics::check_close`, a run fault is a counted error, a
//! lowering fault fails the graph, and clearing the faults restores the kernel.
//!
//! Faults are process-wide: this file is its own test binary and its tests take one lock.

use std::sync::{Arc, Mutex, PoisonError};

use tpu_kernels::{DType, TensorType};
use tpu_kernels_registry::cache::{CacheConfig, CompileCache};
use tpu_kernels_registry::fault::{self, Fault};
use tpu_kernels_registry::graph::{Graph, IndexResolver, lower};
use tpu_kernels_registry::numerics::{Mismatch, Tolerance, check_close};
use tpu_kernels_registry::pjrt::testing::cpu_client_for_tests;
use tpu_kernels_registry::{DispatchError, Dispatcher, HostTensor, Registry};

static LOCK: Mutex<()> = Mutex::new(());

/// Clears the faults when a test ends, passing or not.
struct Faults;

impl Faults {
    fn set(faults: Vec<Fault>) -> Faults {
        fault::set(faults);
        Faults
    }
}

impl Drop for Faults {
    fn drop(&mut self) {
        fault::set(Vec::new());
    }
}

fn dispatcher() -> Option<Dispatcher> {
    let client = cpu_client_for_tests(1)?;
    let cache = Arc::new(CompileCache::new(CacheConfig::memory_only(64)));
    Some(Dispatcher::new(Registry::global().expect("registry"), client, cache).expect("dispatcher"))
}

fn xs() -> Vec<f32> {
    (0..64).map(|i| (i as f32 - 32.0) / 8.0).collect()
}

fn silu_reference(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v) / (1.0 + (-f64::from(v)).exp())).collect()
}

/// silu on `x` through the dispatcher: the output, or the dispatcher's error.
fn silu(d: &Dispatcher, x: &[f32]) -> Result<Vec<f32>, Box<DispatchError>> {
    let ty = TensorType::new(DType::F32, [8u64, 8]);
    let data: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let out =
        d.call("aten::silu", &[HostTensor { ty: &ty, data: &data, contiguous: true }], &[])?;
    Ok(out[0].to_vec::<f32>().expect("f32 output"))
}

#[test]
fn a_nan_output_fails_the_numerics_check() {
    let _lock = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(d) = dispatcher() else { return };
    let x = xs();
    let want = silu_reference(&x);
    let tol = Tolerance::abs(1e-5);
    check_close(&silu(&d, &x).unwrap(), &want, tol).expect("silu is right without a fault");
    {
        let _faults = Faults::set(vec![Fault::Nan { kernel: "silu".into() }]);
        // The kernel ran (no fallback): PJRT computed the NaNs, and the check refuses them.
        let got = silu(&d, &x).expect("the corrupted kernel still runs");
        assert!(got.iter().all(|v| v.is_nan()), "{got:?}");
        let err = check_close(&got, &want, tol).expect_err("a NaN output must fail");
        assert!(matches!(err, Mismatch::Values { bad: 64, .. }), "{err}");
        assert!(err.to_string().contains("actual NaN"), "{err}");
    }
    // The memoised corrupted executable is dropped with the fault.
    check_close(&silu(&d, &x).unwrap(), &want, tol).expect("silu is right again");
}

#[test]
fn an_offset_output_fails_the_numerics_check() {
    let _lock = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(d) = dispatcher() else { return };
    let x = xs();
    let want = silu_reference(&x);
    let _faults = Faults::set(vec![Fault::Offset { kernel: "silu".into() }]);
    let got = silu(&d, &x).expect("the corrupted kernel still runs");
    let err = check_close(&got, &want, Tolerance::abs(1e-5)).expect_err("off by one must fail");
    assert!(matches!(err, Mismatch::Values { bad: 64, .. }), "{err}");
    // Another kernel is untouched.
    let ty = TensorType::new(DType::F32, [8u64, 8]);
    let data: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let statics = [("approximate", tpu_kernels::registration::StaticValue::Str("none".into()))];
    let out =
        d.call("aten::gelu", &[HostTensor { ty: &ty, data: &data, contiguous: true }], &statics);
    assert!(out.is_ok(), "{:?}", out.err());
}

#[test]
fn a_run_fault_is_a_counted_execute_error() {
    let _lock = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(d) = dispatcher() else { return };
    let _faults = Faults::set(vec![Fault::RunError { kernel: Some("silu".into()) }]);
    let err = silu(&d, &xs()).expect_err("the run fails");
    let fallback = err.fallback();
    assert!(fallback.reason.is_error(), "{fallback}");
    assert_eq!(fallback.reason.category(), "execute");
    assert!(fallback.to_string().contains("injected fault"), "{fallback}");
    let stats = d.stats();
    assert_eq!(stats.ops["aten::silu.default"].fallbacks.get("execute"), Some(&1));
}

#[test]
fn a_lowering_fault_fails_every_graph() {
    let _lock = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/graphs/gpt_block_fwd.json"),
    )
    .expect("graph file");
    let graph = Graph::from_json(&text).expect("graph");
    let index = Registry::global().expect("registry").index();
    let resolver = IndexResolver::new(index, tpu_kernels::registration::Platform::Cpu);
    lower(&graph, &resolver).expect("lowers without a fault");
    let _faults = Faults::set(vec![Fault::LowerError]);
    let err = lower(&graph, &resolver).expect_err("the lowering fails");
    assert!(err.to_string().contains("injected fault"), "{err}");
}
