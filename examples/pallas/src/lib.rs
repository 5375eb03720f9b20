//! Pallas kernels written in Python (`kernels.py`), saved as .mlir files by `save_mlir.py`
//! (`tpu_kernels.save_mlir`), and shipped in this Rust crate: the macro checks each signature
//! against the files at compile time and registers both variants.
//!
//! ```
//! use pallas_examples as _;
//!
//! let k = tpu_kernels::registered().into_iter().find(|k| k.name == "silu_mul").unwrap();
//! assert!(k.is_imported());
//! ```

use tpu_kernels::{Tensor, tpu_kernel};

/// `silu(x) * y` over (8, 128) blocks (`kernels.silu_mul`).
#[tpu_kernel(
    op = "tpuk_examples::silu_mul",
    shapes(x = f32[16, 256], y = f32[16, 256]),
    import(tpu = "mlir/pallas_silu_mul.tpu.mlir", cpu = "mlir/pallas_silu_mul.cpu.mlir"),
)]
pub fn silu_mul(x: Tensor, y: Tensor) -> Tensor;

/// `x @ y` over 128x128 tiles with an f32 VMEM accumulator (`kernels.matmul`).
#[tpu_kernel(
    op = "tpuk_examples::matmul",
    shapes(x = f32[256, 256], y = f32[256, 256]),
    import(tpu = "mlir/pallas_matmul.tpu.mlir", cpu = "mlir/pallas_matmul.cpu.mlir"),
)]
pub fn matmul(x: Tensor, y: Tensor) -> Tensor;

/// RMS norm over rows of 512, for any number of rows: a plain jax function exported once with a
/// symbolic row count `b` (`save_mlir.py`). The registry refines the module to each call's row
/// count in Rust, so a process without Python runs it too.
#[tpu_kernel(
    op = "tpuk_examples::rms_norm_rows",
    shapes(x = f32[B, 512], w = f32[512]),
    output = same_as(x),
    import(tpu = "mlir/rms_norm_rows.tpu.mlir", cpu = "mlir/rms_norm_rows.cpu.mlir"),
)]
pub fn rms_norm_rows(x: Tensor, w: Tensor) -> Tensor;
