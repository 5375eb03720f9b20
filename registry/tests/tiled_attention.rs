//! The tiled flash-attention forward's structure: with `is_causal` both MXU products sit inside
//! the `scf.if` that skips a key block wholly past the query block's last row (no MXU work, no
//! exponentials on it); without it they run at every step. Grouped-query heads read their
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
