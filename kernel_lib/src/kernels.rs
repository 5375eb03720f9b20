//! The standard kernels, declared with [`tpu_kernel`] like any other.
//!
//! Every kernel computes in f32 when given a 16-bit float (bf16, f16) and rounds once at the end,
//! as PyTorch's CPU kernels do; reductions accumulate in f32 too. Each kernel's parameters bind
//! to its op's schema by name (`self_` is the schema's `self`); [`math`] holds the plain tensor
//! functions the kernels share.

use crate::builder::Tensor;
use crate::error::BuildError;
use crate::ir::GatherDims;
use crate::registration::KernelSignature;
use crate::tpu_kernel;
use crate::types::{DType, Dim, Shape, TensorType};

pub mod backward;
pub mod sdpa;
pub mod tiled;
pub mod tiled_attention;
pub mod tiled_loss;

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

/// `N` upcasts of `x`, one per consumer. For a 16-bit `x` each is its own convert of its own
/// copy (`Tensor::copies`): one convert shared by a reduction and another consumer is written
/// out whole in f32 by XLA:CPU and read back (48 MiB of traffic for a bf16[1024,4096] input
/// that is 8 MiB itself). An `x` already in its compute type is returned as it is.
fn upcasts<const N: usize>(x: Tensor<'_>) -> [Tensor<'_>; N] {
    if compute_type(x.dtype()) == x.dtype() { [x; N] } else { x.copies().map(upcast) }
}

/// Tensor functions the kernels are made of, usable inside any kernel body.
pub mod math {
    use super::upcast;
    use crate::builder::Tensor;
    use crate::types::{Dim, Shape};

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

    /// `f(xs, dim)` for tensors of one shape, a rank-0 shape seen as `[1]` along dim 0 and the
    /// result made rank 0 again: PyTorch normalises a scalar along dim 0 or -1 over itself.
    pub fn along_dim<'b>(
        xs: &[Tensor<'b>],
        dim: i64,
        f: impl FnOnce(&[Tensor<'b>], i64) -> Tensor<'b>,
    ) -> Tensor<'b> {
        // Another dim of a scalar is out of range: left to fail, as PyTorch does.
        if xs.first().is_some_and(|x| !x.shape().0.is_empty()) || !matches!(dim, 0 | -1) {
            return f(xs, dim);
        }
        let one = Shape(vec![Dim::Static(1)]);
        let seen: Vec<Tensor<'b>> = xs.iter().map(|x| x.reshape(one.clone())).collect();
        f(&seen, 0).reshape(Shape::scalar())
    }

    /// `exp(x - max) / sum(exp(x - max))` along `dim`.
    pub fn softmax(x: Tensor<'_>, dim: i64) -> Tensor<'_> {
        along_dim(&[x], dim, |x, dim| softmax_of(x[0], dim))
    }

    fn softmax_of(x: Tensor<'_>, dim: i64) -> Tensor<'_> {
        let xf = upcast(x);
        let shifted = xf - xf.amax(&[dim], true);
        let e = shifted.exp();
        (e / e.sum(&[dim], true)).cast(x.dtype())
    }

    /// `x - max - log(sum(exp(x - max)))` along `dim`.
    pub fn log_softmax(x: Tensor<'_>, dim: i64) -> Tensor<'_> {
        along_dim(&[x], dim, |x, dim| log_softmax_of(x[0], dim))
    }

    fn log_softmax_of(x: Tensor<'_>, dim: i64) -> Tensor<'_> {
        // Two copies of the row max (`Tensor::copies`) and of the input (`upcasts`): were
        // `x - max` one value feeding both the sum and the output, XLA:CPU would write it out
        // whole between them, a fourth pass over memory.
        let [x_max, x_sum, x_out] = super::upcasts(x);
        let [max_sum, max_out] = x_max.amax(&[dim], true).copies();
        let log_sum = (x_sum - max_sum).exp().sum(&[dim], true).log();
        ((x_out - max_out) - log_sum).cast(x.dtype())
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
    let [x_sum, x_out] = upcasts(x);
    let ms = (x_sum * x_sum).mean(&[-1], true);
    let normed = x_out * (ms + eps).rsqrt();
    (normed * upcast(weight)).cast(x.dtype())
}

/// Gradient of [`fn@rms_norm`] for `grad`, the gradient of its output: `(dx, dweight)`.
///
/// With `r = rsqrt(mean(x², -1) + eps)` and `gw = grad * weight`:
/// `dx = gw * r - x * (r³ * mean(gw * x, -1))` and `dweight = sum(grad * x * r)` over every
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
pub fn rms_norm_backward(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor), BuildError> {
    if grad.shape() != x.shape() {
        let message = format!("grad {} and x {} differ in shape", grad.ty(), x.ty());
        return Err(shape_error("rms_norm_backward", "rms_norm_backward", message));
    }
    // The row sum, the column sum and `dx` each read their own copies of the inputs (16-bit
    // ones converted apart, `upcasts`) and broadcast their own copy of the weight and of `r`
    // (`Tensor::copies`), so that no large value is shared between two of them: XLA:CPU would
    // write a shared one out whole.
    let [g_sum, g_dw, g_out] = upcasts(grad);
    let [x_ms, x_sum, x_dw, x_out] = upcasts(x);
    let r = ((x_ms * x_ms).mean(&[-1], true) + eps).rsqrt();
    let [w_sum, w_out] = upcast(weight).copies();
    let [r_sum, r_out] = r.copies();
    let leading: Vec<i64> = (0..x.rank() as i64 - 1).collect();
    let m = (g_sum * w_sum * x_sum).mean(&[-1], true);
    let dw = (g_dw * x_dw * r_sum).sum(&leading, false);
    let dx = g_out * w_out * r_out - x_out * (r_out * r_out * r_out * m);
    Ok((dx.cast(x.dtype()), dw.cast(weight.dtype())))
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
    let [x_mean, x_var, x_out] = upcasts(input);
    let mean = x_mean.mean(&[-1], true);
    // The variance and the output each subtract their own copy of the mean (`Tensor::copies`),
    // so the centered input is not one value two passes share: XLA:CPU would write it out
    // whole. The variance's pass folds its centering in, the output's likewise: 3 passes over
    // the input in all, each with PyTorch's own `(x - mean) * rstd`.
    let [mean_var, mean_out] = mean.copies();
    let centered = x_var - mean_var;
    let var = (centered * centered).mean(&[-1], true);
    let rstd = (var + eps).rsqrt();
    let out = (x_out - mean_out) * rstd * upcast(weight) + upcast(bias);
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
    Ok(epilogue("matmul_bias_act", y, activation)?.cast(x.dtype()))
}

/// `activation` applied to the f32 matmul result `y`.
fn epilogue<'b>(kernel: &str, y: Tensor<'b>, activation: &str) -> Result<Tensor<'b>, BuildError> {
    Ok(match activation {
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
                kernel: kernel.to_owned(),
                op: "epilogue",
                kind: crate::ErrorKind::Unsupported,
                message: format!(
                    "unknown activation `{other}` (known: {})",
                    ACTIVATIONS.join(", ")
                ),
            });
        }
    })
}

/// x @ weight, then an activation epilogue (none, relu, gelu, gelu_tanh, silu): what a compiled
/// graph's `mm` followed by an activation becomes.
#[tpu_kernel(
    op = "tpuk::matmul_act",
    dtypes = [f32, bf16, f16],
    same_dtype,
    shapes(x = [M, K], weight = [K, N]),
    defaults(activation = "none"),
    cache_key = [activation],
    output = like(x, [M, N]),
    canonical = [
        "f32[8,64], f32[64,128]; activation=gelu_tanh",
        "bf16[16,128], bf16[128,256]; activation=relu",
        "f32[7,33], f32[33,5]; activation=silu",
    ],
)]
pub fn matmul_act(x: Tensor, weight: Tensor, activation: &str) -> Result<Tensor, BuildError> {
    let y = x.matmul_to(weight, Some(compute_type(x.dtype())));
    Ok(epilogue("matmul_act", y, activation)?.cast(x.dtype()))
}

// ----- gated activations -----

/// A build error of a kernel body, for a shape the guards cannot express.
fn shape_error(kernel: &str, op: &'static str, message: String) -> BuildError {
    BuildError { kernel: kernel.to_owned(), op, kind: crate::ErrorKind::Unsupported, message }
}

/// SwiGLU: `silu(gate) * up`, elementwise over tensors of one shape.
#[tpu_kernel(
    op = "tpuk::swiglu",
    dtypes = [f32, bf16, f16],
    same_dtype,
    shapes(gate = [.., H], up = [.., H]),
    output = same_as(gate),
    backward = swiglu_backward,
    canonical = ["f32[8,128], f32[8,128]", "bf16[4,256], bf16[4,256]", "f32[3,5,33], f32[3,5,33]"],
)]
pub fn swiglu(gate: Tensor, up: Tensor) -> Result<Tensor, BuildError> {
    if gate.shape() != up.shape() {
        let message = format!("gate {} and up {} differ in shape", gate.ty(), up.ty());
        return Err(shape_error("swiglu", "swiglu", message));
    }
    let (gf, uf) = (upcast(gate), upcast(up));
    Ok((gf * gf.sigmoid() * uf).cast(gate.dtype()))
}

/// Gradient of [`fn@swiglu`] for `grad`, the gradient of its output: `(dgate, dup)`.
///
/// With `s = sigmoid(gate)`: `dgate = grad * up * s * (1 + gate * (1 - s))` and
/// `dup = grad * gate * s`. Computed in f32 for 16-bit inputs.
#[tpu_kernel(
    op = "tpuk::swiglu_backward",
    dtypes = [f32, bf16, f16],
    same_dtype,
    shapes(grad = [.., H], gate = [.., H], up = [.., H]),
    output = [same_as(gate), same_as(up)],
    canonical = [
        "f32[8,128], f32[8,128], f32[8,128]",
        "bf16[4,256], bf16[4,256], bf16[4,256]",
        "f32[3,5,33], f32[3,5,33], f32[3,5,33]",
    ],
)]
pub fn swiglu_backward(
    grad: Tensor,
    gate: Tensor,
    up: Tensor,
) -> Result<(Tensor, Tensor), BuildError> {
    if grad.shape() != gate.shape() || gate.shape() != up.shape() {
        let message =
            format!("grad {}, gate {} and up {} differ in shape", grad.ty(), gate.ty(), up.ty());
        return Err(shape_error("swiglu_backward", "swiglu_backward", message));
    }
    // Each output computes its own sigmoid from its own copy of the gate (`Tensor::copies`):
    // a shared one is written out whole by XLA:CPU and read back by both, which costs more
    // than a second sigmoid (4.21 -> 2.71 ms at f32[1024,4096]). 16-bit inputs are converted
    // apart for each output (`upcasts`) for the same reason.
    let [g_gate, g_up] = upcasts(grad);
    let uf = upcast(up);
    let [x_gate, x_up] = gate.copies().map(upcast);
    let s = x_gate.sigmoid();
    let dgate = g_gate * uf * s * ((1.0 - s) * x_gate + 1.0);
    let dup = g_up * x_up * x_up.sigmoid();
    Ok((dgate.cast(gate.dtype()), dup.cast(up.dtype())))
}

// ----- losses -----

/// `target`'s one-hot rows over the `[N, C]` shape of `logits` (an `i1` mask).
/// `rows` (`[N]`, or `[N, C]` like the logits) with each row whose target is outside `0..C` set
/// to 0: the rows of targets that select no class. Decided from the `[N]` targets, not from a
/// reduction over the `[N, C]` one-hot matrix.
fn zero_rows_out_of_range<'b>(
    kernel: &str,
    logits: Tensor<'b>,
    target: Tensor<'b>,
    rows: Tensor<'b>,
) -> Result<Tensor<'b>, BuildError> {
    let Some(classes) = logits.shape().0[1].as_static() else {
        let message = format!("logits {} need a static class count", logits.ty());
        return Err(shape_error(kernel, "one_hot", message));
    };
    let mut shape = vec![logits.shape().0[0].clone()];
    if rows.shape().0.len() == 2 {
        shape.push(Dim::Static(1));
    }
    let shape = Shape(shape);
    let from_zero = target.ge(target.full_like(0.0)).reshape(shape.clone());
    let below = target.lt(target.full_like(classes as f64)).reshape(shape);
    let zero = rows.full_like(0.0);
    Ok(from_zero.select(below.select(rows, zero), zero))
}

/// `x[i, target[i]]` for each row `i` of `x[N, C]` (`[N]`), by a gather batched over the rows
/// (rows stay parallel when SPMD partitioning splits them): an index outside `0..C` is clamped
/// into range, so callers mask those rows ([`zero_rows_out_of_range`]).
fn pick_per_row<'b>(x: Tensor<'b>, target: Tensor<'b>) -> Result<Tensor<'b>, BuildError> {
    let b = x.builder();
    let n = x.shape().0[0].clone();
    let indices = target.reshape(Shape(vec![n, Dim::Static(1)]));
    let dims = GatherDims {
        offset_dims: vec![],
        collapsed_slice_dims: vec![1],
        operand_batching_dims: vec![0],
        start_indices_batching_dims: vec![0],
        start_index_map: vec![1],
        index_vector_dim: 1,
    };
    b.gather(x, indices, dims, &[1, 1])
}

fn one_hot<'b>(logits: Tensor<'b>, target: Tensor<'b>) -> Result<Tensor<'b>, BuildError> {
    let shape = logits.shape();
    let classes = logits.builder().iota(logits.ty().with_dtype(DType::I64), 1)?;
    let rows = target.reshape(Shape(vec![shape.0[0].clone(), Dim::Static(1)]));
    Ok(classes.eq(rows.broadcast_to(&shape)))
}

/// Cross entropy with class indices: the mean over rows of `-log_softmax(logits)[i, target[i]]`.
///
/// Fused log-softmax and NLL (`aten::cross_entropy` with `reduction = "mean"`, no weights, no
/// label smoothing). Every target counts: there is no `ignore_index`, and a target outside
/// `0..C` selects no class (its row contributes 0 to the sum, 1 to the count).
#[tpu_kernel(
    op = "tpuk::cross_entropy",
    dtypes = [f32, bf16, f16],
    shapes(logits = [N, C], target = i64[N]),
    output = like(logits, []),
    backward = cross_entropy_backward,
    canonical = ["f32[8,128], i64[8]", "bf16[4,256], i64[4]", "f32[7,33], i64[7]", "f16[1,5], i64[1]"],
)]
pub fn cross_entropy(logits: Tensor, target: Tensor) -> Result<Tensor, BuildError> {
    // Each pass converts a 16-bit input apart (`upcasts`): one shared convert would be written
    // out whole in f32.
    let [l_max, l_sum, lf] = upcasts(logits);
    let n = logits.shape().0[0].clone();
    let max = l_max.amax(&[1], true);
    let log_sum = (l_sum - max).exp().sum(&[1], false).log();
    // Row i's loss `-log_softmax(x)[i, t] = (max - x[i, t]) + log_sum`, the same roundings as
    // negating `(x[i, t] - max) - log_sum`, with `x[i, t]` gathered from the logits: no [N, C]
    // log-probabilities or one-hot selection is formed, two passes over the logits in all.
    let picked = pick_per_row(lf, target)?;
    let rows = (max.reshape(Shape(vec![n])) - picked) + log_sum;
    // A target outside 0..C picks nothing: its row adds 0.
    let in_range = zero_rows_out_of_range("cross_entropy", logits, target, rows)?;
    Ok(in_range.mean(&[0], false).cast(logits.dtype()))
}

/// Gradient of [`fn@cross_entropy`] for `grad`, the gradient of its scalar output:
/// `(dlogits, dtarget)`.
///
/// `dlogits = grad * (softmax(logits) - one_hot(target)) / N`, 0 on a row whose target is
/// outside `0..C` (it adds a constant 0 to the loss). `grad` is the loss's gradient:
/// one element, as a scalar (what autograd passes) or any shape of size 1 (`[1]`). Class indices
/// have no gradient: `dtarget` is zeros of the target's type, there so that the pairing returns
/// one gradient per tensor input (autograd drops it: an integer target never requires one).
#[tpu_kernel(
    op = "tpuk::cross_entropy_backward",
    dtypes = [f32, bf16, f16],
    shapes(grad = [..], logits = [N, C], target = i64[N]),
    output = [same_as(logits), same_as(target)],
    canonical = [
        "f32[], f32[8,128], i64[8]",
        "bf16[], bf16[4,256], i64[4]",
        "f32[1], f32[7,33], i64[7]",
        "f16[], f16[1,5], i64[1]",
    ],
)]
pub fn cross_entropy_backward(
    grad: Tensor,
    logits: Tensor,
    target: Tensor,
) -> Result<(Tensor, Tensor), BuildError> {
    const KERNEL: &str = "cross_entropy_backward";
    if grad.dtype() != logits.dtype() {
        return Err(BuildError {
            kernel: KERNEL.to_owned(),
            op: KERNEL,
            kind: crate::ErrorKind::Unsupported,
            message: format!(
                "grad {} and logits {} differ in element type",
                grad.ty(),
                logits.ty()
            ),
        });
    }
    if grad.shape().0.iter().any(|d| d.as_static() != Some(1)) {
        let message = format!("grad {} is not the gradient of a scalar (one element)", grad.ty());
        return Err(shape_error(KERNEL, KERNEL, message));
    }
    let lf = upcast(logits);
    let n = logits.shape().0[0].as_static().unwrap_or(1);
    let e = (lf - lf.amax(&[1], true)).exp();
    let softmax = e / e.sum(&[1], true);
    let hot = one_hot(logits, target)?.select(lf.full_like(1.0), lf.full_like(0.0));
    // A row whose target selects no class adds a constant 0 to the loss: its gradient is 0.
    let rows = zero_rows_out_of_range(KERNEL, logits, target, softmax - hot)?;
    let scale = upcast(grad).reshape(Shape::scalar()) * (1.0 / n as f64);
    let dlogits = rows * scale;
    Ok((dlogits.cast(logits.dtype()), target.full_like(0.0)))
}

// ----- position embeddings -----

/// Rotary position embedding, "rotate half" form (GPT-NeoX, LLaMA).
///
/// With `x1, x2` the two halves of the last dimension of `x[B, S, H, D]`:
/// `concat(x1 * cos - x2 * sin, x2 * cos + x1 * sin)`, `cos` and `sin` (`[S, D/2]`) broadcast
/// over the batch and the heads.
#[tpu_kernel(
    op = "tpuk::rotary",
    dtypes = [f32, bf16, f16],
    same_dtype,
    shapes(x = [B, S, H, D], cos = [S, R], sin = [S, R]),
    require(D % 2 == 0),
    output = same_as(x),
    canonical = [
        "f32[2,8,4,64], f32[8,32], f32[8,32]",
        "bf16[1,16,2,128], bf16[16,64], bf16[16,64]",
        "f32[3,5,1,6], f32[5,3], f32[5,3]",
    ],
)]
pub fn rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Result<Tensor, BuildError> {
    let shape = x.shape();
    let dims: Option<Vec<u64>> = shape.0.iter().map(|d| d.as_static()).collect();
    let half = cos.shape().0[1].as_static();
    let (Some(dims), Some(half)) = (dims, half) else {
        return Err(shape_error("rotary", "rotary", format!("{} needs static sizes", x.ty())));
    };
    if dims[3] != 2 * half {
        let message = format!("cos/sin {} must be half as wide as x {}", cos.ty(), x.ty());
        return Err(shape_error("rotary", "rotary", message));
    }
    let b = x.builder();
    let (d, h) = (dims[3] as i64, half as i64);
    let xf = upcast(x);
    let (lo, hi, step) =
        ([0, 0, 0, 0], [dims[0] as i64, dims[1] as i64, dims[2] as i64, h], [1; 4]);
    let x1 = b.slice(xf, &lo, &hi, &step)?;
    let x2 = b.slice(xf, &[0, 0, 0, h], &[hi[0], hi[1], hi[2], d], &step)?;
    let half_shape = x1.shape();
    let [c, s] =
        [cos, sin].map(|t| upcast(t).reshape([1, dims[1], 1, half]).broadcast_to(&half_shape));
    let out = b.concatenate(&[x1 * c - x2 * s, x2 * c + x1 * s], 3)?;
    Ok(out.cast(x.dtype()))
}

// ----- optimisers -----

/// A build error for a tensor whose element type differs from the first input's.
fn dtype_error(kernel: &str, message: String) -> BuildError {
    BuildError {
        kernel: kernel.to_owned(),
        op: "dtype",
        kind: crate::ErrorKind::Unsupported,
        message,
    }
}

/// `1 - beta^step` for an f32 `step` tensor, accurate for `beta` near 1.
///
/// `beta^step = exp(step * ln(beta))`, and `1 - exp(y) = -expm1(y)` with
/// `expm1(y) = 2 tanh(y/2) / (1 - tanh(y/2))`: no cancellation for `y <= 0`, where computing
/// `1 - pow(f32(beta), step)` would lose the digits of `1 - beta` (`beta2 = 0.999`).
fn one_minus_pow<'b>(beta: f64, step: Tensor<'b>) -> Tensor<'b> {
    let t = (step * (0.5 * beta.ln())).tanh();
    -(t * 2.0) / (1.0 - t)
}

/// One AdamW step (PyTorch's `torch.optim.AdamW`, decoupled weight decay, no amsgrad):
/// `(new_param, new_exp_avg, new_exp_avg_sq)`.
///
/// With `g = grad`, `t = step` (an f32 scalar tensor, the step count after this update, so a new
/// step does not recompile): `p *= 1 - lr * weight_decay`; `m = beta1 * m + (1 - beta1) * g`;
/// `v = beta2 * v + (1 - beta2) * g²`; `p -= lr / (1 - beta1^t) * m / (sqrt(v) /
/// sqrt(1 - beta2^t) + eps)`. Computed in f32 for 16-bit tensors (`param`, `grad`, `exp_avg`,
/// `exp_avg_sq` share one element type and one shape). It updates `param`, `exp_avg` and
/// `exp_avg_sq` in place (`mutates`): the op `tpuk::adamw_step` takes them as `Tensor(a!)` and
/// returns nothing, and its module donates them to outputs 0, 1 and 2 (`tf.aliasing_output`),
/// so an eager call writes the new state into the tensors' own memory with no copy. Inputs no
/// AdamW state has are clamped so the update stays finite: a `step` below 1 counts as 1, a
/// negative `exp_avg_sq` as 0.
#[tpu_kernel(
    op = "tpuk::adamw_step",
    dtypes = [f32, bf16, f16],
    shapes(param = [..], grad = [..], exp_avg = [..], exp_avg_sq = [..], step = f32[]),
    defaults(lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2),
    cache_key = [lr, beta1, beta2, eps, weight_decay],
    output = [same_as(param), same_as(param), same_as(param)],
    mutates = [param, exp_avg, exp_avg_sq],
    canonical = [
        "f32[8,128], f32[8,128], f32[8,128], f32[8,128], f32[]",
        "bf16[4,256], bf16[4,256], bf16[4,256], bf16[4,256], f32[]",
        "f32[3,5,33], f32[3,5,33], f32[3,5,33], f32[3,5,33], f32[]; lr=0.01, weight_decay=0.0",
        "f16[1], f16[1], f16[1], f16[1], f32[]",
    ],
)]
#[allow(clippy::too_many_arguments)]
pub fn adamw_step(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: Tensor,
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
) -> Result<(Tensor, Tensor, Tensor), BuildError> {
    const KERNEL: &str = "adamw_step";
    for (name, t) in [("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)] {
        if t.dtype() != param.dtype() {
            let message =
                format!("{name} {} and param {} differ in element type", t.ty(), param.ty());
            return Err(dtype_error(KERNEL, message));
        }
        if t.shape() != param.shape() {
            let message = format!("{name} {} and param {} differ in shape", t.ty(), param.ty());
            return Err(shape_error(KERNEL, KERNEL, message));
        }
    }
    let (p, g, m, v) = (upcast(param), upcast(grad), upcast(exp_avg), upcast(exp_avg_sq));
    // Out of AdamW's domain only: no state has a step below 1 or a negative second moment.
    let (step, v) = (step.maximum(step.scalar(1.0)), v.maximum(v.scalar(0.0)));
    let p = p * (1.0 - lr * weight_decay);
    let m = m * beta1 + g * (1.0 - beta1);
    let v = v * beta2 + g * g * (1.0 - beta2);
    let step_size = lr / one_minus_pow(beta1, step);
    let denom = v.sqrt() / one_minus_pow(beta2, step).sqrt() + eps;
    let p = p - m / denom * step_size;
    let dtype = param.dtype();
    Ok((p.cast(dtype), m.cast(dtype), v.cast(dtype)))
}

// ----- regularisation -----

/// The `murmur3` 32-bit finaliser (`fmix32`), a bijection on `u32` with full avalanche.
fn fmix32(x: Tensor<'_>) -> Tensor<'_> {
    fn sh(x: Tensor<'_>, n: f64) -> Tensor<'_> {
        x.xor(x.shift_right_logical(x.scalar(n)))
    }
    let x = sh(x, 16.0) * (0x85eb_ca6b_u32 as f64);
    let x = sh(x, 13.0) * (0xc2b2_ae35_u32 as f64);
    sh(x, 16.0)
}

fn dropout_output(sig: &KernelSignature) -> Result<Vec<TensorType>, String> {
    let x = sig.inputs.first().ok_or("dropout takes x")?;
    Ok(vec![x.clone(), x.with_dtype(DType::Bool)])
}

/// Dropout with a counter-based RNG: `(out, mask)`, `out = x * mask * (1 / (1 - p))` (in f32
/// for 16-bit `x`, rounded once; 0 where dropped, all zeros for `p = 1`), `mask` true where kept.
///
/// The RNG is a pure function of `(seed, i)`, `i` the element's row-major index in the
/// flattened `x` (so it does not depend on tiling or on how a device splits the work), with
/// wrapping `u32` arithmetic and `fmix32` murmur3's finaliser
/// (`x ^= x >> 16; x *= 0x85ebca6b; x ^= x >> 13; x *= 0xc2b2ae35; x ^= x >> 16`):
///
/// - `lo`, `hi`: the low and high 32 bits of the `i64` `seed` (a scalar tensor, so a new seed
///   does not recompile);
/// - `key = fmix32(fmix32(lo ^ 0x9e3779b9) ^ hi)`;
/// - `h = fmix32(i ^ key)`, `u = (h >> 8) / 2^24`, uniform on `[0, 1)` in steps of `2^-24`;
/// - kept where `u >= p`, i.e. `h >> 8 >= ceil(p * 2^24)`.
///
/// `fmix32` being a bijection, one seed gives distinct `h` for distinct indices; two seeds give
/// masks that are permutations of one another's index pattern (`i -> i ^ key1 ^ key2`), not
/// independent streams. At most `2^32` elements.
#[tpu_kernel(
    op = "tpuk::dropout",
    dtypes = [f32, bf16, f16],
    shapes(x = [..], seed = i64[]),
    defaults(p = 0.1),
    cache_key = [p],
    output_fn = dropout_output,
    canonical = [
        "f32[8,128], i64[]",
        "bf16[4,256], i64[]; p=0.5",
        "f32[3,5,33], i64[]; p=0.25",
        "f16[1], i64[]",
    ],
)]
pub fn dropout(x: Tensor, seed: Tensor, p: f64) -> Result<(Tensor, Tensor), BuildError> {
    const KERNEL: &str = "dropout";
    if !(0.0..=1.0).contains(&p) {
        let message = format!("p = {p} is not a probability in [0, 1]");
        return Err(BuildError {
            kernel: KERNEL.to_owned(),
            op: KERNEL,
            kind: crate::ErrorKind::Unsupported,
            message,
        });
    }
    let dims: Option<Vec<u64>> = x.shape().0.iter().map(|d| d.as_static()).collect();
    let Some(dims) = dims else {
        return Err(shape_error(KERNEL, KERNEL, format!("{} needs static sizes", x.ty())));
    };
    let n: u64 = dims.iter().product();
    if n > 1 << 32 {
        return Err(shape_error(KERNEL, KERNEL, format!("{} has over 2^32 elements", x.ty())));
    }
    let b = x.builder();
    let s32 = seed.scalar(32.0);
    let lo = seed.shift_left(s32).shift_right_logical(s32).cast(DType::U32);
    let hi = seed.shift_right_logical(s32).cast(DType::U32);
    let key = fmix32(fmix32(lo.xor(lo.scalar(0x9e37_79b9_u32 as f64))).xor(hi));
    let flat = b.iota(TensorType::new(DType::U32, [n]), 0)?;
    let index = flat.reshape(x.shape());
    let h = fmix32(index.xor(key));
    let bits = h.shift_right_logical(h.scalar(8.0));
    let threshold = (p * (1u64 << 24) as f64).ceil();
    let keep = if threshold >= (1u64 << 24) as f64 {
        bits.lt(bits.scalar(0.0)) // never: p = 1 (or within 2^-24 of it) drops everything
    } else {
        bits.ge(bits.scalar(threshold))
    };
    let xf = upcast(x);
    let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
    let out = keep.select(xf * scale, xf.full_like(0.0));
    Ok((out.cast(x.dtype()), keep))
}
