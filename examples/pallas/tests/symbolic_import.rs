//! A kernel exported by jax with a symbolic row count and linked in through
//! `#[tpu_kernel(import(...))]`: in this process there is no Python, and the registry refines
//! the module to each call's shapes in Rust before compiling it.
#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use std::sync::Arc;

use pallas_examples as _;
use tpu_kernels::registration::{KernelSignature, Platform};
use tpu_kernels::{DType, TensorType};
use tpu_kernels_registry::cache::{CacheConfig, CompileCache};
use tpu_kernels_registry::numerics::{Tolerance, assert_close};
use tpu_kernels_registry::pjrt::Topology;
use tpu_kernels_registry::pjrt::testing::{cpu_client_for_tests, libtpu_for_tests};
use tpu_kernels_registry::{DispatchError, Dispatcher, FallbackReason, HostTensor, Registry};

const OP: &str = "tpuk_examples::rms_norm_rows";

fn dispatcher() -> Option<Dispatcher> {
    let client = cpu_client_for_tests(1)?;
    let cache = Arc::new(CompileCache::new(CacheConfig::memory_only(16)));
    Some(Dispatcher::new(Registry::global().unwrap(), client, cache).unwrap())
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 250.0 - 2.0
        })
        .collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn reference(x: &[f32], w: &[f32]) -> Vec<f64> {
    x.chunks(512)
        .flat_map(|row| {
            let ms = row.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / 512.0;
            let scale = 1.0 / (ms + 1e-6).sqrt();
            row.iter().zip(w).map(move |(v, w)| f64::from(*v) * scale * f64::from(*w))
        })
        .collect()
}

#[test]
fn one_symbolic_export_runs_at_every_row_count() {
    let Some(d) = dispatcher() else { return };
    let w = values(512, 7);
    let w_ty = TensorType::new(DType::F32, [512]);
    for rows in [1u64, 3, 64] {
        let x = values(rows as usize * 512, rows as u32);
        let x_ty = TensorType::new(DType::F32, [rows, 512]);
        let (xb, wb) = (bytes(&x), bytes(&w));
        let inputs = [
            HostTensor { ty: &x_ty, data: &xb, contiguous: true },
            HostTensor { ty: &w_ty, data: &wb, contiguous: true },
        ];
        let out = d.call(OP, &inputs, &[]).unwrap_or_else(|e| panic!("{rows} rows: {e}"));
        assert_eq!(out[0].dims(), &[rows as i64, 512]);
        let got = out[0].to_vec::<f32>().unwrap();
        let want = reference(&x, &w);
        assert_close(&format!("{rows} rows"), &got, &want, Tolerance::abs(1e-5));
    }
    let stats = d.stats();
    assert_eq!(stats.ops[&format!("{OP}.default")].substituted, 3, "{stats:?}");
}

#[test]
fn the_refined_module_is_static_and_compiles_for_tpu() {
    let registry = Registry::global().unwrap();
    let index = registry.index();
    let kernel = index.kernel("rms_norm_rows").expect("rms_norm_rows is registered");
    let sig = KernelSignature {
        inputs: vec![TensorType::new(DType::F32, [5, 512]), TensorType::new(DType::F32, [512])],
        statics: vec![],
    };
    let text = kernel.module_text(&sig, Platform::Cpu).unwrap().text;
    assert!(!text.contains('?'), "{text}");
    assert!(!text.contains("shape_assertion") && !text.contains("dynamic_broadcast_in_dim"));
    assert!(text.contains("tensor<5x512xf32>"), "{text}");
    let Some(libtpu) = libtpu_for_tests() else { return };
    let topology = Topology::new(&libtpu, "v5e:1x1").unwrap();
    let report = tpu_kernels_registry::check::tpu_compile(&topology, kernel, &sig).unwrap();
    assert!(report.executable_bytes > 0);
}

#[test]
fn a_call_the_export_forbids_falls_back_with_jax_s_message() {
    let Some(d) = dispatcher() else { return };
    // Zero rows: the export asserts b >= 1.
    let x_ty = TensorType::new(DType::F32, [0, 512]);
    let w_ty = TensorType::new(DType::F32, [512]);
    let wb = bytes(&values(512, 1));
    let inputs = [
        HostTensor { ty: &x_ty, data: &[], contiguous: true },
        HostTensor { ty: &w_ty, data: &wb, contiguous: true },
    ];
    let err = match d.call(OP, &inputs, &[]) {
        Err(DispatchError::Fallback(f)) => f,
        other => panic!("expected a fallback, got {other:?}"),
    };
    assert!(matches!(err.reason, FallbackReason::Compile(_)), "{err}");
    let message = err.to_string();
    assert!(message.contains("rms_norm_rows"), "{message}");
    assert!(message.contains("Expected value >= 1 for dimension variable 'b'"), "{message}");
}
