//! Eager dispatch on the real CPU plugin: the standard kernels against f64 references computed
//! here, memoisation, fallbacks with reasons and counters, strict mode.

#[path = "support/data.rs"]
mod test_data;

use std::sync::Arc;

use tpu_kernels::registration::StaticValue;
use tpu_kernels::{DType, TensorType};
use tpu_kernels_registry::cache::{CacheConfig, CompileCache};
use tpu_kernels_registry::numerics::{Tolerance, assert_close};
use tpu_kernels_registry::pjrt::testing::cpu_client_for_tests;
use tpu_kernels_registry::{DispatchError, Dispatcher, FallbackReason, HostTensor, Registry};

fn dispatcher() -> Option<Dispatcher> {
    let client = cpu_client_for_tests(1)?;
    let cache = Arc::new(CompileCache::new(CacheConfig::memory_only(64)));
    Some(Dispatcher::new(Registry::global().expect("registry"), client, cache).expect("dispatcher"))
}

/// Deterministic values in [-3, 3).
fn data(n: usize, seed: u64) -> Vec<f32> {
    test_data::uniform(n, seed, -3.0, 3.0)
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn run(
    d: &Dispatcher,
    op: &str,
    inputs: &[(TensorType, Vec<f32>)],
    statics: &[(&'static str, StaticValue)],
) -> Vec<Vec<f32>> {
    let raw: Vec<Vec<u8>> = inputs.iter().map(|(_, v)| bytes(v)).collect();
    let host: Vec<HostTensor<'_>> = inputs
        .iter()
        .zip(&raw)
        .map(|((ty, _), data)| HostTensor { ty, data, contiguous: true })
        .collect();
    let out = d.call(op, &host, statics).unwrap_or_else(|e| panic!("{op}: {e}"));
    out.iter().map(|b| b.to_vec::<f32>().expect("f32 output")).collect()
}

fn f32_ty(dims: &[u64]) -> TensorType {
    TensorType::new(DType::F32, dims)
}

#[test]
fn elementwise_kernels_match_f64_references() {
    let Some(d) = dispatcher() else { return };
    let x = data(4 * 33, 1);
    let ty = f32_ty(&[4, 33]);
    let xs = [(ty, x.clone())];
    let tanh_statics = [("approximate", StaticValue::Str("tanh".into()))];
    let got = run(&d, "aten::gelu", &xs, &tanh_statics);
    let want: Vec<f64> = x
        .iter()
        .map(|&v| {
            let v = f64::from(v);
            0.5 * v
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
        })
        .collect();
    assert_close("gelu_tanh", &got[0], &want, Tolerance::abs(1e-5));
    let got = run(&d, "aten::silu", &xs, &[]);
    let want: Vec<f64> = x.iter().map(|&v| f64::from(v) / (1.0 + (-f64::from(v)).exp())).collect();
    assert_close("silu", &got[0], &want, Tolerance::abs(1e-5));
}

#[test]
fn normalisation_and_softmax_match_f64_references() {
    let Some(d) = dispatcher() else { return };
    let (rows, cols) = (5usize, 33usize);
    let x = data(rows * cols, 2);
    let w = data(cols, 3);
    let got = run(
        &d,
        "tpuk::rms_norm",
        &[(f32_ty(&[5, 33]), x.clone()), (f32_ty(&[33]), w.clone())],
        &[("eps", StaticValue::Float(1e-6))],
    );
    let mut want = Vec::new();
    for r in 0..rows {
        let row: Vec<f64> = x[r * cols..(r + 1) * cols].iter().map(|v| f64::from(*v)).collect();
        let ms = row.iter().map(|v| v * v).sum::<f64>() / cols as f64;
        want.extend(row.iter().zip(&w).map(|(v, w)| v / (ms + 1e-6).sqrt() * f64::from(*w)));
    }
    assert_close("rms_norm", &got[0], &want, Tolerance::abs(1e-5));

    let got = run(
        &d,
        "aten::_softmax",
        &[(f32_ty(&[5, 33]), x.clone())],
        &[("dim", StaticValue::Int(-1)), ("half_to_float", StaticValue::Bool(false))],
    );
    let mut want = Vec::new();
    for r in 0..rows {
        let row: Vec<f64> = x[r * cols..(r + 1) * cols].iter().map(|v| f64::from(*v)).collect();
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        want.extend(row.iter().map(|v| (v - m).exp() / s));
    }
    assert_close("softmax", &got[0], &want, Tolerance::abs(1e-6));
}

#[test]
fn matmul_epilogue_matches_reference() {
    let Some(d) = dispatcher() else { return };
    let (m, k, n) = (7usize, 33usize, 5usize);
    let (x, w, b) = (data(m * k, 4), data(k * n, 5), data(n, 6));
    let got = run(
        &d,
        "tpuk::matmul_bias_act",
        &[(f32_ty(&[7, 33]), x.clone()), (f32_ty(&[33, 5]), w.clone()), (f32_ty(&[5]), b.clone())],
        &[("activation", StaticValue::Str("relu".into()))],
    );
    let mut want = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k).map(|p| f64::from(x[i * k + p]) * f64::from(w[p * n + j])).sum();
            want[i * n + j] = (dot + f64::from(b[j])).max(0.0);
        }
    }
    assert_close("matmul", &got[0], &want, Tolerance::abs(1e-4));
}

#[test]
fn repeated_calls_are_memoised_and_counted() {
    let Some(d) = dispatcher() else { return };
    let xs = [(f32_ty(&[8]), data(8, 7))];
    for _ in 0..5 {
        run(&d, "aten::silu", &xs, &[]);
    }
    let stats = d.stats();
    let silu = &stats.ops["aten::silu.default"];
    assert_eq!((silu.calls, silu.substituted), (5, 5));
    assert_eq!(silu.kernels["silu"], 5);
    let cache = d.cache().stats();
    assert_eq!(cache.compiles, 1, "memoised calls must not reach the compiler again");
}

#[test]
fn fallbacks_carry_reasons_and_are_counted() {
    let Some(d) = dispatcher() else { return };
    let ty = f32_ty(&[4]);
    let data = bytes(&[1.0, 2.0, 3.0, 4.0]);
    let input = [HostTensor { ty: &ty, data: &data, contiguous: true }];

    let err = d.call("aten::not_an_op", &input, &[]).unwrap_err();
    assert!(matches!(err.fallback().reason, FallbackReason::NoKernel(_)), "{err}");

    let strided = [HostTensor { ty: &ty, data: &data, contiguous: false }];
    let err = d.call("aten::silu", &strided, &[]).unwrap_err();
    assert!(err.to_string().contains("input 0 is not contiguous"), "{err}");

    let short = [HostTensor { ty: &ty, data: &data[..8], contiguous: true }];
    let err = d.call("aten::silu", &short, &[]).unwrap_err();
    assert!(matches!(err.fallback().reason, FallbackReason::BadInput(_)), "{err}");
    assert!(err.to_string().contains("needs 16 bytes"), "{err}");

    let ints = TensorType::new(DType::I32, [4]);
    let int_input = [HostTensor { ty: &ints, data: &data, contiguous: true }];
    let err = d.call("aten::silu", &int_input, &[]).unwrap_err();
    assert!(err.to_string().contains("dtype i32 not in"), "{err}");

    let stats = d.stats();
    assert_eq!(stats.ops["aten::silu.default"].fallbacks["no_kernel"], 2);
    assert_eq!(stats.ops["aten::silu.default"].fallbacks["bad_input"], 1);
    assert_eq!(stats.ops["aten::not_an_op.default"].fallbacks["no_kernel"], 1);
    assert_eq!(stats.total_fallbacks(), 4);
}

#[test]
fn no_fallback_turns_fallbacks_into_errors() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let cache = Arc::new(CompileCache::new(CacheConfig::memory_only(8)));
    let d = Dispatcher::new(Registry::global().unwrap(), client, cache).unwrap().no_fallback(true);
    let ty = f32_ty(&[2]);
    let data = bytes(&[1.0, 2.0]);
    let err = d.call("aten::nope", &[HostTensor { ty: &ty, data: &data, contiguous: true }], &[]);
    assert!(matches!(err, Err(DispatchError::Forbidden(_))));
}

#[test]
fn a_reused_input_address_reads_the_memory_as_it_is_at_each_call() {
    use tpu_kernels_registry::pjrt::AlignedHostBuffer;
    let Some(d) = dispatcher() else { return };
    let ty = f32_ty(&[16]);
    let mut host = AlignedHostBuffer::<f32>::zeroed(16).expect("16 floats");
    let silu = |v: f32| f64::from(v) / (1.0 + (-f64::from(v)).exp());
    for round in 0..3 {
        // The same page-aligned memory each round (so the same PJRT view of it), new values.
        for (i, v) in host.iter_mut().enumerate() {
            *v = (i as f32 - 8.0) * (round as f32 + 1.0) * 0.25;
        }
        let values: Vec<f32> = host.to_vec();
        // SAFETY: any f32 slice is readable as bytes.
        let bytes = unsafe { std::slice::from_raw_parts(host.as_ptr().cast::<u8>(), 64) };
        let input = [HostTensor { ty: &ty, data: bytes, contiguous: true }];
        let out = d.call("aten::silu", &input, &[]).unwrap()[0].to_vec::<f32>().unwrap();
        let want: Vec<f64> = values.iter().map(|v| silu(*v)).collect();
        assert_close(&format!("silu round {round}"), &out, &want, Tolerance::abs(1e-5));
    }
}

/// `bytes` copied to a 64-byte aligned place in a fresh vector (the runtime aliases only
/// aligned host memory), or, with `misalign`, 4 bytes past one; the vector and the offset.
fn placed(bytes: &[u8], misalign: bool) -> (Vec<u8>, usize) {
    let mut v = vec![0u8; bytes.len() + 128];
    let base = v.as_ptr() as usize;
    let offset = base.next_multiple_of(64) - base + if misalign { 4 } else { 0 };
    v[offset..offset + bytes.len()].copy_from_slice(bytes);
    (v, offset)
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// AdamW's state is updated where it lies: the program writes into the caller's memory
/// (donated), the addresses do not move, and the values are those of the functional call.
#[test]
fn in_place_kernels_write_the_callers_memory() {
    let Some(d) = dispatcher() else { return };
    let n = 8 * 128;
    let ty = f32_ty(&[8, 128]);
    let step_ty = f32_ty(&[]);
    let state: Vec<Vec<u8>> = (0..4)
        .map(|i| {
            let v = data(n, 40 + i);
            bytes(&if i == 3 { v.iter().map(|x| x.abs()).collect() } else { v })
        })
        .collect();
    let step = bytes(&[3.0]);
    fn with_step<'a>(
        s: &[&'a [u8]],
        ty: &'a TensorType,
        step_ty: &'a TensorType,
        step: &'a [u8],
    ) -> Vec<HostTensor<'a>> {
        let mut h: Vec<HostTensor<'a>> =
            s.iter().map(|data| HostTensor { ty, data, contiguous: true }).collect();
        h.push(HostTensor { ty: step_ty, data: step, contiguous: true });
        h
    }
    let plain: Vec<&[u8]> = state.iter().map(Vec::as_slice).collect();
    let want: Vec<Vec<f32>> = d
        .call("tpuk::adamw_step", &with_step(&plain, &ty, &step_ty, &step), &[])
        .expect("functional call")
        .iter()
        .map(|b| b.to_vec::<f32>().expect("f32"))
        .collect();
    assert_eq!(floats(&state[0]), floats(plain[0]), "a functional call leaves its inputs");

    for misalign in [false, true] {
        let mut placed: Vec<(Vec<u8>, usize)> = state.iter().map(|s| placed(s, misalign)).collect();
        let views: Vec<&[u8]> = placed.iter().map(|(v, o)| &v[*o..*o + 4 * n]).collect();
        let before: Vec<usize> = views.iter().map(|v| v.as_ptr() as usize).collect();
        let before_stats = d.stats().ops["tpuk::adamw_step.default"].clone();
        // SAFETY: the lent inputs (0, 2, 3) are this test's own vectors, unused meanwhile.
        let rest = unsafe {
            d.call_in_place(
                "tpuk::adamw_step",
                &with_step(&views, &ty, &step_ty, &step),
                &[],
                &[0, 2, 3],
            )
        }
        .expect("in-place call");
        assert!(rest.is_empty(), "every output of adamw_step is an in-place update");
        let stats = d.stats().ops["tpuk::adamw_step.default"].clone();
        let (in_place, by_copy) = (
            stats.updated_in_place - before_stats.updated_in_place,
            stats.updated_by_copy - before_stats.updated_by_copy,
        );
        if misalign {
            assert_eq!((in_place, by_copy), (0, 3), "unaligned memory is updated by a copy");
        } else {
            assert_eq!((in_place, by_copy), (3, 0), "aligned memory is donated");
        }
        let after: Vec<usize> = placed.iter().map(|(v, o)| v[*o..].as_ptr() as usize).collect();
        assert_eq!(before, after);
        for (k, i) in [0usize, 2, 3].into_iter().enumerate() {
            let (v, o) = &mut placed[i];
            assert_eq!(floats(&v[*o..*o + 4 * n]), want[k], "state {i} (misaligned: {misalign})");
        }
        assert_eq!(floats(&placed[1].0[placed[1].1..placed[1].1 + 4 * n]), floats(&state[1]));
    }

    // The parameter passed again as the gradient: read-only memory the program reads is not
    // donated; the update is copied in after the run, and equals the functional result.
    let (p, po) = placed(&state[0], false);
    let (m, mo) = placed(&state[2], false);
    let (v, vo) = placed(&state[3], false);
    let shared: Vec<&[u8]> =
        vec![&p[po..po + 4 * n], &p[po..po + 4 * n], &m[mo..mo + 4 * n], &v[vo..vo + 4 * n]];
    let want: Vec<Vec<f32>> = d
        .call("tpuk::adamw_step", &with_step(&shared, &ty, &step_ty, &step), &[])
        .expect("functional call")
        .iter()
        .map(|b| b.to_vec::<f32>().expect("f32"))
        .collect();
    let before = d.stats().ops["tpuk::adamw_step.default"].updated_by_copy;
    // SAFETY: as above; input 1 aliases input 0, which the dispatcher must notice.
    unsafe {
        d.call_in_place(
            "tpuk::adamw_step",
            &with_step(&shared, &ty, &step_ty, &step),
            &[],
            &[0, 2, 3],
        )
    }
    .expect("in-place call");
    assert_eq!(d.stats().ops["tpuk::adamw_step.default"].updated_by_copy - before, 1);
    assert_eq!(floats(&p[po..po + 4 * n]), want[0]);

    // Lending other inputs than the kernel updates is refused before anything is written.
    let (p2, o2) = placed(&state[0], false);
    let views: Vec<&[u8]> =
        vec![&p2[o2..o2 + 4 * n], plain[1], &m[mo..mo + 4 * n], &v[vo..vo + 4 * n]];
    // SAFETY: as above.
    let err = unsafe {
        d.call_in_place("tpuk::adamw_step", &with_step(&views, &ty, &step_ty, &step), &[], &[0])
    }
    .expect_err("a mismatched loan");
    assert!(err.to_string().contains("updates inputs [0, 2, 3] in place"), "{err}");
    assert_eq!(floats(&p2[o2..o2 + 4 * n]), floats(&state[0]), "nothing written");
}

#[test]
fn large_outputs_are_written_into_reused_pool_memory() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let cache = Arc::new(CompileCache::new(CacheConfig::memory_only(64)));
    let d = Dispatcher::new(Registry::global().unwrap(), client, cache).unwrap();
    // Every output pooled, however small (the default starts at 256 KiB).
    let d = d.pool_outputs_from(Some(0));
    let x = data(7 * 129, 11);
    let ty = f32_ty(&[7, 129]);
    let raw = bytes(&x);
    let host = [HostTensor { ty: &ty, data: &raw, contiguous: true }];
    let address = |b: &tpu_kernels_registry::pjrt::Buffer| {
        b.read_in_place(|bytes| bytes.as_ptr() as usize).expect("read")
    };
    let want: Vec<f64> = x.iter().map(|&v| f64::from(v) / (1.0 + (-f64::from(v)).exp())).collect();
    let first = d.call("aten::silu", &host, &[]).expect("silu");
    assert!(first[0].is_zero_copy(), "the output owns its pool block");
    assert_close("silu", &first[0].to_vec::<f32>().unwrap(), &want, Tolerance::abs(1e-5));
    let at = address(&first[0]);
    let pool = tpu_kernels_registry::host_pool::HostPool::global().stats();
    assert!(pool.allocated >= raw.len(), "the block is held while the output lives: {pool:?}");
    drop(first);
    // The block went back to the pool, and the next call's output is written into it.
    let second = d.call("aten::silu", &host, &[]).expect("silu");
    assert_eq!(address(&second[0]), at, "the freed block is reused");
    assert_close("silu", &second[0].to_vec::<f32>().unwrap(), &want, Tolerance::abs(1e-5));
    let silu = &d.stats().ops["aten::silu.default"];
    assert_eq!((silu.substituted, silu.outputs_pooled, silu.outputs_pool_missed), (2, 2, 0));

    // Several outputs (the row statistics of layer_norm's forward), each into its own block.
    let w = data(129, 12);
    let b = data(129, 13);
    let (wb, bb) = (bytes(&w), bytes(&b));
    let vty = f32_ty(&[129]);
    let inputs = [
        HostTensor { ty: &ty, data: &raw, contiguous: true },
        HostTensor { ty: &vty, data: &wb, contiguous: true },
        HostTensor { ty: &vty, data: &bb, contiguous: true },
    ];
    let statics = [("eps", StaticValue::Float(1e-5))];
    let out = d.call("aten::native_layer_norm", &inputs, &statics).expect("layer_norm");
    let n = out.len() as u64;
    assert!(n >= 1 && out.iter().all(|b| b.is_zero_copy()));
    let ln = &d.stats().ops["aten::native_layer_norm.default"];
    assert_eq!(ln.outputs_pooled, n);

    // Off: fresh outputs, none pooled.
    let Some(client) = cpu_client_for_tests(1) else { return };
    let cache = Arc::new(CompileCache::new(CacheConfig::memory_only(64)));
    let off = Dispatcher::new(Registry::global().unwrap(), client, cache).unwrap();
    let off = off.pool_outputs_from(None);
    let fresh = off.call("aten::silu", &host, &[]).expect("silu");
    assert!(!fresh[0].is_zero_copy());
    assert_eq!(off.stats().ops["aten::silu.default"].outputs_pooled, 0);
}
