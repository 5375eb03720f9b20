//! Backward kernels of PyTorch's softmax, log-softmax and layer norm, bound to the ATen
//! overloads autograd calls in eager mode and that aot_autograd puts in backward graphs:
//! `aten::_softmax_backward_data`, `aten::_log_softmax_backward_data` and
//! `aten::native_layer_norm_backward`. Computed in f32 for 16-bit inputs, rounded once.

use crate::builder::Tensor;
use crate::error::BuildError;
use crate::tpu_kernel;
use crate::types::DType;

use super::math::along_dim;
use super::{shape_error, upcast};

/// The torch name of `dtype` (`float32`), as a `ScalarType` argument binds to a str static.
pub(crate) fn torch_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float32",
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        DType::F64 => "float64",
        _ => "other",
    }
}

/// Checks the two tensors of a softmax backward: one element type and one shape, and
/// `input_dtype` (the forward input's type) equal to it: a forward run with `half_to_float`
/// (16-bit input, f32 output) has no kernel here.
fn check_softmax_backward(
    kernel: &str,
    grad_output: Tensor<'_>,
    output: Tensor<'_>,
    input_dtype: &str,
) -> Result<(), BuildError> {
    if grad_output.dtype() != output.dtype() || grad_output.shape() != output.shape() {
        let message =
            format!("grad_output {} and output {} differ in type", grad_output.ty(), output.ty());
        return Err(shape_error(kernel, "softmax_backward", message));
    }
    let expected = torch_name(output.dtype());
    let given = input_dtype.strip_prefix("torch.").unwrap_or(input_dtype);
    if given != expected {
        return Err(BuildError {
            kernel: kernel.to_owned(),
            op: "input_dtype",
            kind: crate::ErrorKind::Unsupported,
            message: format!(
                "input_dtype {given} differs from the output's {expected} (a half_to_float \
                 forward); this kernel takes the forward's own type"
            ),
        });
    }
    Ok(())
}

/// Gradient of softmax along `dim` from its output `y`: `y * (grad - sum(grad * y, dim))`.
#[tpu_kernel(
    aten = "aten::_softmax_backward_data",
    dtypes = [f32, bf16, f16],
    same_dtype,
    defaults(dim = -1),
    cache_key = [dim],
    ignore_in_cache_key(input_dtype = "checked equal to the tensors' element type"),
    output = same_as(output),
    canonical = [
        "f32[8,128], f32[8,128]; dim=-1, input_dtype=float32",
        "bf16[4,256], bf16[4,256]; dim=1, input_dtype=bfloat16",
        "f32[3,7,33], f32[3,7,33]; dim=1, input_dtype=float32",
    ],
)]
pub fn softmax_backward(
    grad_output: Tensor,
    output: Tensor,
    dim: i64,
    input_dtype: &str,
) -> Result<Tensor, BuildError> {
    check_softmax_backward("softmax_backward", grad_output, output, input_dtype)?;
    Ok(along_dim(&[grad_output, output], dim, |t, dim| {
        let (g, y) = (upcast(t[0]), upcast(t[1]));
        (y * (g - (g * y).sum(&[dim], true))).cast(output.dtype())
    }))
}

/// Gradient of log-softmax along `dim` from its output `y`: `grad - exp(y) * sum(grad, dim)`.
#[tpu_kernel(
    aten = "aten::_log_softmax_backward_data",
    dtypes = [f32, bf16, f16],
    same_dtype,
    defaults(dim = -1),
    cache_key = [dim],
    ignore_in_cache_key(input_dtype = "checked equal to the tensors' element type"),
    output = same_as(output),
    canonical = [
        "f32[8,128], f32[8,128]; dim=-1, input_dtype=float32",
        "bf16[4,256], bf16[4,256]; dim=1, input_dtype=bfloat16",
        "f32[3,7,33], f32[3,7,33]; dim=1, input_dtype=float32",
    ],
)]
pub fn log_softmax_backward(
    grad_output: Tensor,
    output: Tensor,
    dim: i64,
    input_dtype: &str,
) -> Result<Tensor, BuildError> {
    check_softmax_backward("log_softmax_backward", grad_output, output, input_dtype)?;
    Ok(along_dim(&[grad_output, output], dim, |t, dim| {
        let (g, y) = (upcast(t[0]), upcast(t[1]));
        (g - y.exp() * g.sum(&[dim], true)).cast(output.dtype())
    }))
}

/// Gradient of [`layer_norm`](fn@super::layer_norm) (`aten::native_layer_norm` over the last
/// dimension): `(grad_input, grad_weight, grad_bias)`.
///
/// From the forward's saved `mean` and `rstd` (as PyTorch does: the op has no `eps` to
/// recompute them with; for 16-bit inputs their rounding dominates the error), with `xhat = (input - mean) * rstd` and `gw = grad_out * weight`:
/// `grad_input = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))` over the last dimension,
/// `grad_weight = sum(grad_out * xhat)` and `grad_bias = sum(grad_out)` over the others. `bias`
/// is bound only so a call with one reaches this kernel (the gradient does not read it); calls
/// without weight or bias, or whose `output_mask` leaves an output out, stay with PyTorch.
#[tpu_kernel(
    aten = "aten::native_layer_norm_backward",
    schema(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask),
    dtypes = [f32, bf16, f16],
    same_dtype,
    shapes(
        grad_out = [.., D],
        input = [.., D],
        mean = [.., 1],
        rstd = [.., 1],
        weight = [D],
        bias = [D],
    ),
    output = [same_as(input), same_as(weight), same_as(bias)],
    canonical = [
        "f32[8,128], f32[8,128], f32[8,1], f32[8,1], f32[128], f32[128]",
        "bf16[4,256], bf16[4,256], bf16[4,1], bf16[4,1], bf16[256], bf16[256]",
        "f32[3,5,33], f32[3,5,33], f32[3,5,1], f32[3,5,1], f32[33], f32[33]",
    ],
)]
pub fn layer_norm_backward(
    grad_out: Tensor,
    input: Tensor,
    mean: Tensor,
    rstd: Tensor,
    weight: Tensor,
    bias: Tensor,
) -> Result<(Tensor, Tensor, Tensor), BuildError> {
    const KERNEL: &str = "layer_norm_backward";
    let rows = &input.shape().0[..input.rank() - 1];
    for (what, t) in [("grad_out", grad_out), ("mean", mean), ("rstd", rstd)] {
        let lead = &t.shape().0[..t.rank().saturating_sub(1)];
        if t.rank() != input.rank() || lead != rows {
            let message = format!("{what} {} does not match input {}", t.ty(), input.ty());
            return Err(shape_error(KERNEL, KERNEL, message));
        }
    }
    let [g_s1, g_s2, g_dw, g_db, g_out] = super::upcasts(grad_out);
    let [x_s2, x_dw, x_out] = super::upcasts(input);
    let w = upcast(weight);
    let (mu, r) = (upcast(mean), upcast(rstd));
    // Each of the four reductions and `grad_input` reads its own copy of the inputs (16-bit
    // ones converted apart, `upcasts`) and of the weight, mean and rstd it needs
    // (`Tensor::copies`): a `g * w` or `xhat` shared between two consumers would
    // be written out whole by XLA:CPU and read back, 32 MiB more traffic each at
    // f32[1024,4096]. `mean(gw * xhat)` is `rstd * mean(gw * (x - mean))`, rstd factored out.
    let [w_s1, w_s2, w_out] = w.copies();
    let [mu_s2, mu_dw, mu_out] = mu.copies();
    let [r_dw, r_out] = r.copies();
    let m1 = (g_s1 * w_s1).mean(&[-1], true);
    let m2 = (g_s2 * w_s2 * (x_s2 - mu_s2)).mean(&[-1], true) * r;
    let dx = r_out * (g_out * w_out - m1 - (x_out - mu_out) * r_out * m2);
    let leading: Vec<i64> = (0..input.rank() as i64 - 1).collect();
    let dw = (g_dw * ((x_dw - mu_dw) * r_dw)).sum(&leading, false);
    let db = g_db.sum(&leading, false);
    Ok((dx.cast(input.dtype()), dw.cast(weight.dtype()), db.cast(bias.dtype())))
}
