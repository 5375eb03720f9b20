//! An external kernel crate: kernels written in Rust and kernels imported from `jax.export`,
//! registered with `#[tpu_kernel]`.
//!
//! A binary or test that wants these kernels in the registry names the crate, or the linker
//! drops its registrations:
//!
//! ```
//! use kernels_demo as _;
//!
//! let names: Vec<&str> = tpu_kernels::registered().iter().map(|k| k.name).collect();
//! assert!(names.contains(&"fused_add_rms_norm"));
//! assert!(names.contains(&"mha"));
//! ```

use tpu_kernels::{BuildError, Tensor, tpu_kernel};

/// `silu(gate) * up`, the SwiGLU feed-forward gate: a new op in this crate's namespace.
#[tpu_kernel(
    op = "mylib::gated_silu",
    dtypes = [f32, bf16],
    same_dtype,
    shapes(gate = [.., F], up = [.., F]),
    output = same_as(gate),
    backward = gated_silu_backward,
    canonical = ["f32[8,256], f32[8,256]", "bf16[4,128], bf16[4,128]", "f32[3,5], f32[3,5]"],
)]
pub fn gated_silu(gate: Tensor, up: Tensor) -> Tensor {
    let g = gate.cast(tpu_kernels::DType::F32);
    (g * g.sigmoid() * up.cast(tpu_kernels::DType::F32)).cast(gate.dtype())
}

/// The gradient of [`gated_silu`]: `(d gate, d up)` from the output gradient.
#[tpu_kernel(
    op = "mylib::gated_silu_backward",
    dtypes = [f32, bf16],
    same_dtype,
    shapes(gate = [.., F], up = [.., F], grad = [.., F]),
    output = [same_as(gate), same_as(up)],
    canonical = [
        "f32[8,256], f32[8,256], f32[8,256]",
        "bf16[4,128], bf16[4,128], bf16[4,128]",
        "f32[3,5], f32[3,5], f32[3,5]",
    ],
)]
pub fn gated_silu_backward(gate: Tensor, up: Tensor, grad: Tensor) -> (Tensor, Tensor) {
    let f32 = tpu_kernels::DType::F32;
    let (g, u, dy) = (gate.cast(f32), up.cast(f32), grad.cast(f32));
    let s = g.sigmoid();
    let silu = g * s;
    let dsilu = s * (g * (1.0 - s) + 1.0);
    ((dy * u * dsilu).cast(gate.dtype()), (dy * silu).cast(up.dtype()))
}

/// `x + residual`, then RMSNorm of the sum: `(normed, sum)`, the pre-norm transformer step.
/// Hidden sizes must be a multiple of 128 (one TPU lane row).
#[tpu_kernel(
    op = "mylib::fused_add_rms_norm",
    dtypes = [f32, bf16],
    same_dtype,
    shapes(x = [.., D], residual = [.., D], weight = [D]),
    require(D % 128 == 0),
    defaults(eps = 1e-6, label = ""),
    cache_key = [eps],
    ignore_in_cache_key(label = "only names the call in traces; the module is the same"),
    output = [same_as(x), same_as(x)],
    priority = 5,
    canonical = [
        "f32[8,128], f32[8,128], f32[128]",
        "bf16[4,256], bf16[4,256], bf16[256]; eps=1e-5",
        "f32[3,128], f32[3,128], f32[128]; label=layer0",
    ],
)]
pub fn fused_add_rms_norm(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: f64,
    label: &str,
) -> Result<(Tensor, Tensor), BuildError> {
    let _ = label;
    let f32 = tpu_kernels::DType::F32;
    let sum = x.cast(f32) + residual.cast(f32);
    let ms = (sum * sum).mean(&[-1], true);
    let normed = sum * (ms + eps).rsqrt() * weight.cast(f32);
    Ok((normed.cast(x.dtype()), sum.cast(x.dtype())))
}

/// Multi-head attention `softmax(q kᵀ / √64) v` over f32[2, 8, 16, 64], exported from a Pallas
/// kernel by `export_kernels.py`: the TPU variant is a Mosaic `tpu_custom_call`, the CPU
/// variant the same kernel in interpret mode.
#[tpu_kernel(
    op = "mylib::mha",
    shapes(q = f32[B, 8, S, 64], k = f32[B, 8, S, 64], v = f32[B, 8, S, 64]),
    import(tpu = "kernels/attention.tpu.mlir", cpu = "kernels/attention.cpu.mlir"),
)]
pub fn mha(q: Tensor, k: Tensor, v: Tensor) -> Tensor;
