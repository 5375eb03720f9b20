//! The tiled flash attention's structure: with `is_causal` every MXU product of the forward
//! and the backward sits inside the `scf.if` that skips a key block wholly past the query
//! block's last row (no MXU work, no exponentials on it); without it they run at every step.
//! The backward, from a forward's saved `out` and `logsumexp`, matches the StableHLO backward
//! (which recomputes them), and the interpreter of its printed text matches its twin. Grouped-query heads read their
//! key/value head through `g / group` in the transform functions. (Compiles for v5e and v6e and
//! numerics against the twin, the interpreter and the StableHLO kernel are in
//! `tiled_kernels.rs`; against PyTorch in the Python numerics harness.)
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

use tpu_kernels::kernels::tiled_attention::tiled_sdpa_flash;
use tpu_kernels::mosaic::print_kernel;

fn readable(sig: &str) -> String {
    let sig = tiled_sdpa_flash::REGISTRATION.parse_signature(sig).unwrap();
    print_kernel(&tiled_sdpa_flash::kernel(&sig).unwrap())
}

/// The indent of each `tpu.matmul` line of the kernel body.
fn matmul_depths(text: &str) -> Vec<usize> {
    text.lines()
        .filter(|l| l.trim_start().contains("= tpu.matmul"))
        .map(|l| l.len() - l.trim_start().len())
        .collect()
}

#[test]
fn causal_blocks_past_the_diagonal_do_no_mxu_work() {
    let causal = readable("f32[1,2,256,128], f32[1,2,256,128], f32[1,2,256,128]; is_causal=true");
    // The body's ops are at 4 spaces; the skip's `scf.if` holds both products at 6.
    assert_eq!(matmul_depths(&causal), vec![6, 6], "{causal}");
    assert!(causal.contains("iteration_bounds = array<i64: 2, 2, 2>"), "{causal}");
    let full = readable("f32[1,2,256,128], f32[1,2,256,128], f32[1,2,256,128]");
    assert_eq!(matmul_depths(&full), vec![4, 4], "{full}");
    // The backward's five products (s, dv, dp, dk, dq) likewise.
    use tpu_kernels::kernels::tiled_attention::tiled_sdpa_flash_backward as bwd;
    let sig = "f32[1,2,256,128], f32[1,2,256,128], f32[1,2,256,128], f32[1,2,256,128], \
               f32[1,2,256,128], f32[1,2,256]; is_causal=true";
    let sig = bwd::REGISTRATION.parse_signature(sig).unwrap();
    let text = print_kernel(&bwd::kernel(&sig).unwrap());
    assert_eq!(matmul_depths(&text), vec![6; 5], "{text}");
}

#[test]
fn grouped_query_heads_read_their_key_value_head() {
    let text = readable("bf16[1,4,128,128], bf16[1,2,384,128], bf16[1,2,384,128]");
    // Four query heads over two key/value heads: the key and value index maps divide by 2.
    assert_eq!(text.matches("arith.divsi %arg0, %c0_i32 : i32").count(), 2, "{text}");
    assert_eq!(text.matches("arith.constant 2 : i32").count(), 2, "{text}");
    assert!(text.contains("iteration_bounds = array<i64: 4, 1, 3>"), "{text}");
    // A head count the key/value heads do not divide is declined, not an error.
    let record = &tiled_sdpa_flash::REGISTRATION;
    let odd = record.parse_signature("f32[1,3,16,32], f32[1,2,16,32], f32[1,2,16,32]").unwrap();
    assert!(tiled_sdpa_flash::plan(&odd).is_err());
}

/// Runs `kernel`'s CPU module (the tiled twin, or a StableHLO kernel) on f32 `inputs`.
fn run_cpu(
    client: &tpu_kernels_registry::pjrt::Client,
    kernel: &tpu_kernels_registry::Kernel,
    sig: &tpu_kernels::registration::KernelSignature,
    inputs: &[Vec<f32>],
) -> Vec<Vec<f32>> {
    use tpu_kernels_registry::pjrt::{CompileOptions, Program};
    let text = kernel.module_text(sig, tpu_kernels::registration::Platform::Cpu).unwrap().text;
    let exe = client.compile(&Program::text(text.to_string()), &CompileOptions::new()).unwrap();
    let buffers: Vec<_> = sig
        .inputs
        .iter()
        .zip(inputs)
        .map(|(t, x)| {
            let dims: Vec<i64> = t.shape.static_dims().unwrap().iter().map(|d| *d as i64).collect();
            client.buffer_from_host(x, &dims).unwrap()
        })
        .collect();
    let refs: Vec<_> = buffers.iter().collect();
    exe.execute(&refs).unwrap().iter().map(|b| b.to_vec::<f32>().unwrap()).collect()
}

#[test]
fn the_backward_from_a_forwards_saved_state_matches_the_stablehlo_backward() {
    use tpu_kernels::kernels::tiled_attention::tiled_sdpa_flash_backward;
    use tpu_kernels_registry::numerics::{Tolerance, assert_close};
    let Some(client) = tpu_kernels_registry::pjrt::testing::cpu_client_for_tests(1) else {
        return;
    };
    let index = tpu_kernels_registry::Index::from_inventory().unwrap();
    // Two query and three key/value blocks per head, causal (one block skipped), and one
    // with lengths no 128 divides.
    for (q_shape, kv_shape, statics) in [
        ("f32[1,2,256,64]", "f32[1,2,384,64]", "is_causal=true"),
        ("f32[2,2,40,32]", "f32[2,2,24,32]", "is_causal=false, scale=0.3"),
    ] {
        let fwd_sig = format!("{q_shape}, {kv_shape}, {kv_shape}; {statics}");
        let fwd_sig = tiled_sdpa_flash::REGISTRATION.parse_signature(&fwd_sig).unwrap();
        let n = |s: &str| -> usize {
            let dims = s.trim_start_matches("f32[").trim_end_matches(']');
            dims.split(',').map(|d| d.parse::<usize>().unwrap()).product()
        };
        let data = |len: usize, seed: usize| -> Vec<f32> {
            (0..len).map(|i| (((i * 7 + seed * 13) % 29) as f32 - 14.0) / 8.0).collect()
        };
        let (q, kk, v) = (data(n(q_shape), 1), data(n(kv_shape), 2), data(n(kv_shape), 3));
        let forward = index.kernel("tiled_sdpa_flash").unwrap();
        let saved = run_cpu(&client, forward, &fwd_sig, &[q.clone(), kk.clone(), v.clone()]);
        let lse_shape = q_shape.rsplit_once(',').unwrap().0.to_owned() + "]";
        let bwd_sig = format!(
            "{q_shape}, {q_shape}, {kv_shape}, {kv_shape}, {q_shape}, {lse_shape}; {statics}"
        );
        let bwd_sig = tiled_sdpa_flash_backward::REGISTRATION.parse_signature(&bwd_sig).unwrap();
        let grad = data(n(q_shape), 4);
        let inputs = [grad, q, kk, v, saved[0].clone(), saved[1].clone()];
        let tiled =
            run_cpu(&client, index.kernel("tiled_sdpa_flash_backward").unwrap(), &bwd_sig, &inputs);
        let reference =
            run_cpu(&client, index.kernel("sdpa_flash_cpu_backward").unwrap(), &bwd_sig, &inputs);
        for (what, (a, b)) in ["dq", "dk", "dv"].iter().zip(tiled.iter().zip(&reference)) {
            let a64: Vec<f64> = a.iter().map(|x| f64::from(*x)).collect();
            let b64: Vec<f64> = b.iter().map(|x| f64::from(*x)).collect();
            assert_close(&format!("{q_shape} {what}"), &a64, &b64, Tolerance::new(1e-4, 1e-4));
        }
        // The printed Mosaic text, interpreted, agrees with the twin on the same state.
        let built = tiled_sdpa_flash_backward::kernel(&bwd_sig).unwrap();
        let outputs = tiled_sdpa_flash_backward::REGISTRATION.output_types(&bwd_sig).unwrap();
        let text = tpu_kernels::mosaic::custom_call_module_for(
            &built,
            tpu_kernels::mosaic::Form::Shipped,
            &bwd_sig.inputs,
            &outputs,
        );
        let f64s: Vec<Vec<f64>> =
            inputs.iter().map(|x| x.iter().map(|v| f64::from(*v)).collect()).collect();
        let interpreted = tpu_kernels::mosaic::interpret(&text, &f64s).unwrap();
        for (what, (a, b)) in ["dq", "dk", "dv"].iter().zip(interpreted.iter().zip(&tiled)) {
            let b64: Vec<f64> = b.iter().map(|x| f64::from(*x)).collect();
            assert_close(
                &format!("{q_shape} {what} interpreter"),
                a,
                &b64,
                Tolerance::new(1e-4, 1e-4),
            );
        }
    }
}
