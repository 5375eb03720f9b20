//! The standard kernels, declared with [`tpu_kernel`](crate::tpu_kernel) like any other.
//!
//! Every kernel computes in f32 when given a 16-bit float (bf16, f16) and rounds once at the end,
//! as PyTorch's CPU kernels do; reductions accumulate in f32 too. Each kernel's parameters bind
//! to its op's schema by name (`self_` is the schema's `self`); [`math`] holds the plain tensor
//! functions the kernels share.

use crate::builder::Tensor;
use crate::error::BuildError;
use crate::registration::KernelSignature;
use crate::tpu_kernel;
use crate::types::DType;

/// The type arithmetic happens in for inputs of `dtype`.
fn compute_type(dtype: DType) -> DType {
    match dtype {
        DType::BF16 | DType::F16 => DType::F32,
        other => other,
    }
}

fn upcast(x: Tensor<'_>) -> Tensor<'_> {
    x.cast(compute_type(x.dtype()))
}

/// Tensor functions the kernels are made of, usable inside any kernel body.
pub mod math {
    use super::upcast;
    use crate::builder::Tensor;

    /// `x * Φ(x)` with the exact normal CDF: `0.5 x (1 + erf(x / √2))`.
    pub fn gelu_exact(x: Tensor<'_>) -> Tensor<'_> {
        let xf = upcast(x);
        let cdf = (xf * std::f64::consts::FRAC_1_SQRT_2).erf() + 1.0;
        (xf * cdf * 0.5).cast(x.dtype())
    }

    /// The tanh approximation: `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
    pub fn gelu_tanh(x: Tensor<'_>) -> Tensor<'_> {
        let xf = upcast(x);
        let sqrt_2_over_pi = (2.0 / std::f64::consts::PI).sqrt();
        let inner = (xf + xf * xf * xf * 0.044715) * sqrt_2_over_pi;
        (xf * (inner.tanh() + 1.0) * 0.5).cast(x.dtype())
    }

    /// `exp(x - max) / sum(exp(x - max))` along `dim`.
    pub fn softmax(x: Tensor<'_>, dim: i64) -> Tensor<'_> {
        let xf = upcast(x);
        let shifted = xf - xf.amax(&[dim], true);
        let e = shifted.exp();
        (e / e.sum(&[dim], true)).cast(x.dtype())
    }

    /// `x - max - log(sum(exp(x - max)))` along `dim`.
    pub fn log_softmax(x: Tensor<'_>, dim: i64) -> Tensor<'_> {
        let xf = upcast(x);
        let shifted = xf - xf.amax(&[dim], true);
        (shifted - shifted.exp().sum(&[dim], true).log()).cast(x.dtype())
    }
}

// ----- activations -----

/// GELU with the exact normal CDF (erf).
#[tpu_kernel(
    aten = "aten::gelu",
    dtypes = [f32, bf16, f16],
    defaults(approximate = "none"),
    require(approximate == "none"),
    cache_key = [approximate],
    output = same_as(self_),
    canonical = ["f32[8,128]", "bf16[4,256]", "f32[3,7,33]", "f16[1,5]"],
)]
pub fn gelu(self_: Tensor, approximate: &str) -> Tensor {
    let _ = approximate;
    math::gelu_exact(self_)
}

/// GELU, tanh approximation.
#[tpu_kernel(
    aten = "aten::gelu",
    dtypes = [f32, bf16, f16],
    defaults(approximate = "tanh"),
    require(approximate == "tanh"),
    cache_key = [approximate],
    output = same_as(self_),
    canonical = ["f32[8,128]", "bf16[4,256]", "f32[3,7,33]", "f16[1,5]"],
)]
pub fn gelu_tanh(self_: Tensor, approximate: &str) -> Tensor {
    let _ = approximate;
    math::gelu_tanh(self_)
}

/// SiLU (swish): x * sigmoid(x).
#[tpu_kernel(
    aten = "aten::silu",
    dtypes = [f32, bf16, f16],
    output = same_as(self_),
    canonical = ["f32[8,128]", "bf16[4,256]", "f32[3,7,33]", "f16[1,5]"],
)]
pub fn silu(self_: Tensor) -> Tensor {
    let xf = upcast(self_);
    (xf * xf.sigmoid()).cast(self_.dtype())
}

// ----- normalisation -----

/// RMSNorm over the last dimension, scaled by a weight.
#[tpu_kernel(
    op = "tpuk::rms_norm",
    dtypes = [f32, bf16, f16],
    same_dtype,
    shapes(x = [.., D], weight = [D]),
    defaults(eps = 1e-6),
    cache_key = [eps],
    output = same_as(x),
    backward = rms_norm_backward,
    canonical = ["f32[8,128], f32[128]", "bf16[4,256], bf16[256]", "f32[3,5,33], f32[33]; eps=1e-5"],
)]
pub fn rms_norm(x: Tensor, weight: Tensor, eps: f64) -> Tensor {
    let xf = upcast(x);
    let ms = (xf * xf).mean(&[-1], true);
    let normed = xf * (ms + eps).rsqrt();
    (normed * upcast(weight)).cast(x.dtype())
}

/// Gradient of [`rms_norm`] for `grad`, the gradient of its output: `(dx, dweight)`.
///
/// With `r = rsqrt(mean(x², -1) + eps)` and `gw = grad * weight`:
/// `dx = r * gw - x * r³ * mean(gw * x, -1)` and `dweight = sum(grad * x * r)` over every
/// dimension but the last. Computed in f32 for 16-bit inputs.
#[tpu_kernel(
    op = "tpuk::rms_norm_backward",
    dtypes = [f32, bf16, f16],
    same_dtype,
    shapes(grad = [.., D], x = [.., D], weight = [D]),
    defaults(eps = 1e-6),
    cache_key = [eps],
    output = [same_as(x), same_as(weight)],
    canonical = [
        "f32[8,128], f32[8,128], f32[128]",
        "bf16[4,256], bf16[4,256], bf16[256]",
        "f32[3,5,33], f32[3,5,33], f32[33]; eps=1e-5",
    ],
)]
pub fn rms_norm_backward(grad: Tensor, x: Tensor, weight: Tensor, eps: f64) -> (Tensor, Tensor) {
    let (gf, xf, wf) = (upcast(grad), upcast(x), upcast(weight));
    let r = ((xf * xf).mean(&[-1], true) + eps).rsqrt();
    let gw = gf * wf;
    let dx = r * gw - xf * r * r * r * (gw * xf).mean(&[-1], true);
    let leading: Vec<i64> = (0..x.rank() as i64 - 1).collect();
    let dw = (gf * xf * r).sum(&leading, false);
    (dx.cast(x.dtype()), dw.cast(weight.dtype()))
}

/// Layer norm over the last dimension: (out, mean, rstd).
///
/// Returns `(out, mean, rstd)` as `aten::native_layer_norm` does (mean and rstd keep the
/// normalised dimension as size 1).
#[tpu_kernel(
    aten = "aten::native_layer_norm",
    schema(input, normalized_shape, weight, bias, eps),
    dtypes = [f32, bf16, f16],
    same_dtype,
    shapes(input = [.., D], weight = [D], bias = [D]),
    defaults(eps = 1e-5),
    cache_key = [eps],
    output = [same_as(input), reduced(input, -1), reduced(input, -1)],
    canonical = [
        "f32[8,128], f32[128], f32[128]",
        "bf16[4,256], bf16[256], bf16[256]",
        "f32[3,5,33], f32[33], f32[33]",
    ],
)]
pub fn layer_norm(
    input: Tensor,
    weight: Tensor,
    bias: Tensor,
    eps: f64,
) -> (Tensor, Tensor, Tensor) {
    let xf = upcast(input);
    let mean = xf.mean(&[-1], true);
    let centered = xf - mean;
    let var = (centered * centered).mean(&[-1], true);
    let rstd = (var + eps).rsqrt();
    let out = centered * rstd * upcast(weight) + upcast(bias);
    (out.cast(input.dtype()), mean.cast(input.dtype()), rstd.cast(input.dtype()))
}

// ----- softmax -----

/// Numerically stable softmax along `dim`.
#[tpu_kernel(
    aten = "aten::_softmax",
    dtypes = [f32, bf16, f16],
    defaults(dim = -1, half_to_float = false),
    require(half_to_float == false),
    cache_key = [dim, half_to_float],
    output = same_as(self_),
    canonical = ["f32[8,128]; dim=-1", "bf16[4,256]; dim=1", "f32[3,7,33]; dim=1"],
)]
pub fn softmax(self_: Tensor, dim: i64, half_to_float: bool) -> Tensor {
    let _ = half_to_float;
    math::softmax(self_, dim)
}

/// Numerically stable log-softmax along `dim`.
#[tpu_kernel(
    aten = "aten::_log_softmax",
    dtypes = [f32, bf16, f16],
    defaults(dim = -1, half_to_float = false),
    require(half_to_float == false),
    cache_key = [dim, half_to_float],
    output = same_as(self_),
    canonical = ["f32[8,128]; dim=-1", "bf16[4,256]; dim=1", "f32[3,7,33]; dim=1"],
)]
pub fn log_softmax(self_: Tensor, dim: i64, half_to_float: bool) -> Tensor {
    let _ = half_to_float;
    math::log_softmax(self_, dim)
}

// ----- matmul with epilogue -----

/// Activations the matmul epilogue can apply.
pub const ACTIVATIONS: &[&str] = &["none", "relu", "gelu", "gelu_tanh", "silu"];

/// x @ weight + bias, then an activation epilogue (none, relu, gelu, gelu_tanh, silu).
#[tpu_kernel(
    op = "tpuk::matmul_bias_act",
    dtypes = [f32, bf16, f16],
    same_dtype,
    shapes(x = [M, K], weight = [K, N], bias = [N]),
    defaults(activation = "none"),
    cache_key = [activation],
    output = like(x, [M, N]),
    canonical = [
        "f32[8,64], f32[64,128], f32[128]; activation=gelu",
        "bf16[16,128], bf16[128,256], bf16[256]; activation=silu",
        "f32[7,33], f32[33,5], f32[5]; activation=relu",
        "f32[4,32], f32[32,16], f32[16]",
    ],
)]
pub fn matmul_bias_act(
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    activation: &str,
) -> Result<Tensor, BuildError> {
    let acc = compute_type(x.dtype());
    let y = x.matmul_to(weight, Some(acc)) + upcast(bias);
    let y = match activation {
        "none" => y,
        "relu" => y.maximum(y.scalar(0.0)),
        // The GELU and SiLU epilogues call the registered kernels' modules as private
        // functions, so the emitted module shows where each one went.
        "gelu" | "gelu_tanh" | "silu" => {
            let sub = KernelSignature { inputs: vec![y.ty()], statics: Vec::new() };
            let module = match activation {
                "gelu" => gelu::module(&sub)?,
                "gelu_tanh" => gelu_tanh::module(&sub)?,
                _ => silu::module(&sub)?,
            };
            y.builder().call(&module, &[y])?[0]
        }
        other => {
            return Err(BuildError {
                kernel: "matmul_bias_act".to_owned(),
                op: "epilogue",
                kind: crate::ErrorKind::DType,
                message: format!(
                    "unknown activation `{other}` (known: {})",
                    ACTIVATIONS.join(", ")
                ),
            });
        }
    };
    Ok(y.cast(x.dtype()))
}
