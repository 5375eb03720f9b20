//! Scaled dot-product attention: the kernels behind PyTorch's CPU flash-attention overloads
//! (`aten::_scaled_dot_product_flash_attention_for_cpu` and its backward, with and without an
//! `attn_mask`), and the new op `tpuk::attention` with its backward.
//!
//! Shapes follow PyTorch: `query [B, H, L, E]`, `key` and `value` `[B, Hk, S, E]` with `H` a
//! multiple of `Hk` (grouped-query attention: query head `h` reads key/value head
//! `h / (H / Hk)`). Scores are `query @ key^T * scale` (`scale` -0, the default, stands for
//! PyTorch's `None`: `1 / sqrt(E)`; an explicit 0 is a zero scale), plus the mask (additive for a float mask; a `bool` mask keeps where true),
//! with the causal mask aligned top-left as PyTorch's (`key <= query` position). Everything is
//! computed in f32 for 16-bit inputs and rounded once; the forward's `logsumexp` stays f32, as
//! PyTorch's (`[B, H, L]`). Dropout inside attention is not done here: the flash kernels require
//! `dropout_p == 0`.

use crate::builder::Tensor;
use crate::error::BuildError;
use crate::ir::DotDims;
use crate::tpu_kernel;
use crate::types::{DType, Shape};

use super::{shape_error, upcast};

/// Static sizes of `t`, or a build error naming the kernel.
fn dims(kernel: &str, t: Tensor<'_>) -> Result<Vec<u64>, BuildError> {
    t.shape()
        .0
        .iter()
        .map(|d| d.as_static())
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| shape_error(kernel, "attention", format!("{} needs static sizes", t.ty())))
}

fn dtype_mismatch(kernel: &str, what: &str, a: Tensor<'_>, b: Tensor<'_>) -> BuildError {
    BuildError {
        kernel: kernel.to_owned(),
        op: "attention",
        kind: crate::ErrorKind::Unsupported,
        message: format!("{what}: {} and {} differ in element type", a.ty(), b.ty()),
    }
}

/// One attention problem, inputs upcast and checked.
struct Attention<'b> {
    kernel: &'static str,
    q: Tensor<'b>,
    k: Tensor<'b>,
    v: Tensor<'b>,
    mask: Option<Tensor<'b>>,
    causal: bool,
    scale: f64,
    /// `H / Hk`: query heads per key/value head.
    group: u64,
    /// `[B, H, L, S]`.
    scores_shape: Vec<u64>,
}

impl<'b> Attention<'b> {
    fn new(
        kernel: &'static str,
        query: Tensor<'b>,
        key: Tensor<'b>,
        value: Tensor<'b>,
        mask: Option<Tensor<'b>>,
        causal: bool,
        scale: f64,
    ) -> Result<Attention<'b>, BuildError> {
        for (what, t) in [("key", key), ("value", value)] {
            if t.dtype() != query.dtype() {
                return Err(dtype_mismatch(kernel, what, query, t));
            }
        }
        let (qd, kd, vd) = (dims(kernel, query)?, dims(kernel, key)?, dims(kernel, value)?);
        if kd != vd {
            let message = format!("key {} and value {} differ in shape", key.ty(), value.ty());
            return Err(shape_error(kernel, "attention", message));
        }
        let (heads, kv_heads) = (qd[1], kd[1]);
        if kv_heads == 0 || heads % kv_heads != 0 {
            let message = format!(
                "query has {heads} heads, not a multiple of key/value's {kv_heads} ({} vs {})",
                query.ty(),
                key.ty()
            );
            return Err(shape_error(kernel, "attention", message));
        }
        if !(scale >= 0.0 && scale.is_finite()) {
            let message = format!("scale = {scale} (-0 means 1/sqrt(E); otherwise at least 0)");
            return Err(shape_error(kernel, "attention", message));
        }
        // -0, the default, stands for PyTorch's `None`; an explicit 0 is a zero scale.
        let unset = scale == 0.0 && scale.is_sign_negative();
        let scale = if unset { 1.0 / (qd[3] as f64).sqrt() } else { scale };
        let scores_shape = vec![qd[0], heads, qd[2], kd[2]];
        let group = heads / kv_heads;
        let mask = match mask {
            None => None,
            Some(m) => Some(Self::prepare_mask(kernel, query, m, &scores_shape)?),
        };
        let expand = |t: Tensor<'b>| -> Tensor<'b> {
            let t = upcast(t);
            if group == 1 {
                return t;
            }
            // [B, Hk, S, E] -> [B, Hk, G, S, E] -> [B, H, S, E]
            let wide = [kd[0], kv_heads, group, kd[2], kd[3]];
            t.reshape([kd[0], kv_heads, 1, kd[2], kd[3]])
                .broadcast_to(&Shape::from(wide))
                .reshape([kd[0], heads, kd[2], kd[3]])
        };
        Ok(Attention {
            kernel,
            q: upcast(query),
            k: expand(key),
            v: expand(value),
            mask,
            causal,
            scale,
            group,
            scores_shape,
        })
    }

    /// The mask broadcast to `[B, H, L, S]`: `bool`, or f32 (additive).
    fn prepare_mask(
        kernel: &str,
        query: Tensor<'b>,
        mask: Tensor<'b>,
        scores: &[u64],
    ) -> Result<Tensor<'b>, BuildError> {
        let md = dims(kernel, mask)?;
        let fits = md.len() <= 4
            && md.iter().rev().zip(scores.iter().rev()).all(|(&m, &s)| m == 1 || m == s);
        if !fits {
            let message = format!(
                "attn_mask {} does not broadcast to the scores' shape {:?}",
                mask.ty(),
                scores
            );
            return Err(shape_error(kernel, "attention", message));
        }
        let m = match mask.dtype() {
            DType::Bool => mask,
            d if d == DType::F32 || d == query.dtype() => upcast(mask),
            _ => {
                return Err(BuildError {
                    kernel: kernel.to_owned(),
                    op: "attention",
                    kind: crate::ErrorKind::Unsupported,
                    message: format!(
                        "attn_mask {} must be bool, f32 or the query's element type ({})",
                        mask.ty(),
                        query.dtype().short_name()
                    ),
                });
            }
        };
        Ok(m.broadcast_to(&Shape::of(scores)))
    }

    fn dot(
        &self,
        lhs: Tensor<'b>,
        rhs: Tensor<'b>,
        contract: (i64, i64),
    ) -> Result<Tensor<'b>, BuildError> {
        let dims = DotDims {
            lhs_batch: vec![0, 1],
            rhs_batch: vec![0, 1],
            lhs_contracting: vec![contract.0],
            rhs_contracting: vec![contract.1],
        };
        lhs.builder().dot_general(lhs, rhs, dims, None, Some(DType::F32))
    }

    /// Masked, scaled scores `[B, H, L, S]` in f32.
    fn scores(&self) -> Result<Tensor<'b>, BuildError> {
        let s = self.dot(self.q, self.k, (3, 3))? * self.scale;
        let neg_inf = s.full_like(f64::NEG_INFINITY);
        let s = match self.mask {
            None => s,
            Some(m) if m.dtype() == DType::Bool => m.select(s, neg_inf),
            Some(m) => s + m,
        };
        if !self.causal {
            return Ok(s);
        }
        let b = s.builder();
        let ty = s.ty().with_dtype(DType::I64);
        let (rows, cols) = (b.iota(ty.clone(), 2)?, b.iota(ty, 3)?);
        Ok(cols.le(rows).select(s, neg_inf))
    }

    /// The softmax's pieces along the keys: `(m, e, l)` with `m` the row maximum, `e = exp(s -
    /// m)` and `l = sum(e)`, where a row every key of which is masked out (`m = -inf`) takes
    /// `m = 0`, so its `e` and `l` are 0 rather than NaN.
    fn softmax_parts(
        &self,
        s: Tensor<'b>,
    ) -> Result<(Tensor<'b>, Tensor<'b>, Tensor<'b>), BuildError> {
        let m = s.amax(&[-1], true);
        let m = m.eq(m.full_like(f64::NEG_INFINITY)).select(m.full_like(0.0), m);
        let e = (s - m).exp();
        let l = e.sum(&[-1], true);
        Ok((m, e, l))
    }

    /// `l` with its zeros (fully masked rows) replaced by 1: dividing by it leaves those rows 0.
    fn nonzero(l: Tensor<'b>) -> Tensor<'b> {
        l.eq(l.full_like(0.0)).select(l.full_like(1.0), l)
    }

    /// `(out, logsumexp)`: out `[B, H, L, E]` f32, logsumexp `[B, H, L]` f32. A row every key
    /// of which is masked out gives zeros and a logsumexp of 0, as PyTorch's CPU kernel.
    fn forward(&self) -> Result<(Tensor<'b>, Tensor<'b>), BuildError> {
        let (m, e, l) = self.softmax_parts(self.scores()?)?;
        let out = self.dot(e, self.v, (3, 2))? / Self::nonzero(l);
        let empty = l.eq(l.full_like(0.0));
        let lse = empty.select(l.full_like(0.0), m + l.log());
        Ok((out, lse.reshape(Shape::of(&self.scores_shape[..3]))))
    }

    /// `(dq, dk, dv, dscores)` for `grad` (`[B, H, L, E]`). `dk` and `dv` are summed back over
    /// each key/value head's query group; `dscores` is the gradient of the masked scores (that of
    /// an additive mask).
    ///
    /// The softmax and the output are recomputed in f32 from the inputs rather than taken from
    /// the forward's saved `out` and `logsumexp`: a rounded 16-bit `out` would put its rounding
    /// error into every gradient through `rowsum(grad * out)`, and the recomputation is
    /// consistent with the inputs whatever produced the saved values.
    fn backward(
        &self,
        grad: Tensor<'b>,
    ) -> Result<(Tensor<'b>, Tensor<'b>, Tensor<'b>, Tensor<'b>), BuildError> {
        let (_, e, l) = self.softmax_parts(self.scores()?)?;
        let p = e / Self::nonzero(l);
        let g = upcast(grad);
        let dv = self.dot(p, g, (2, 2))?;
        let dp = self.dot(g, self.v, (3, 3))?;
        let delta = (g * self.dot(p, self.v, (3, 2))?).sum(&[-1], true);
        let ds = p * (dp - delta);
        let dq = self.dot(ds, self.k, (3, 2))? * self.scale;
        let dk = self.dot(ds, self.q, (2, 2))? * self.scale;
        Ok((dq, self.fold(dk), self.fold(dv), ds))
    }

    /// `[B, H, S, E]` summed over each group of `H / Hk` heads: `[B, Hk, S, E]`.
    fn fold(&self, t: Tensor<'b>) -> Tensor<'b> {
        if self.group == 1 {
            return t;
        }
        let d: Vec<u64> = t.shape().0.iter().map(|d| d.as_static().unwrap_or(1)).collect();
        let kv = d[1] / self.group;
        t.reshape([d[0], kv, self.group, d[2], d[3]]).sum(&[2], false)
    }

    /// The gradient of an additive `mask` of `mask`'s own shape: `dscores` summed over the
    /// dimensions the mask was broadcast along. A `bool` mask has none: zeros.
    fn mask_grad(&self, mask: Tensor<'b>, ds: Tensor<'b>) -> Result<Tensor<'b>, BuildError> {
        if mask.dtype() == DType::Bool {
            return Ok(mask.full_like(0.0));
        }
        let md = dims(self.kernel, mask)?;
        let lead = 4 - md.len();
        let axes: Vec<i64> = (0..4)
            .filter(|&i| i < lead || md[i - lead] == 1 && self.scores_shape[i] != 1)
            .map(|i| i as i64)
            .collect();
        let reduced = if axes.is_empty() { ds } else { ds.sum(&axes, false) };
        Ok(reduced.reshape(mask.shape()).cast(mask.dtype()))
    }
}

/// Checks the forward's saved tensors: `out` has the query's type, `logsumexp` is f32.
fn check_saved(
    kernel: &str,
    grad: Tensor<'_>,
    query: Tensor<'_>,
    out: Tensor<'_>,
) -> Result<(), BuildError> {
    for (what, t) in [("grad_out", grad), ("out", out)] {
        if t.dtype() != query.dtype() {
            return Err(dtype_mismatch(kernel, what, query, t));
        }
        if t.shape() != query.shape() {
            let message = format!("{what} {} and query {} differ in shape", t.ty(), query.ty());
            return Err(shape_error(kernel, "attention", message));
        }
    }
    Ok(())
}

/// The flash overloads' forward: `(out, f32 logsumexp)`.
fn flash_forward<'b>(
    kernel: &'static str,
    [query, key, value]: [Tensor<'b>; 3],
    mask: Option<Tensor<'b>>,
    is_causal: bool,
    scale: f64,
) -> Result<(Tensor<'b>, Tensor<'b>), BuildError> {
    let a = Attention::new(kernel, query, key, value, mask, is_causal, scale)?;
    let (out, lse) = a.forward()?;
    Ok((out.cast(query.dtype()), lse))
}

/// The flash overloads' backward: `(grad_query, grad_key, grad_value)`.
fn flash_backward<'b>(
    kernel: &'static str,
    grad_out: Tensor<'b>,
    [query, key, value]: [Tensor<'b>; 3],
    out: Tensor<'b>,
    mask: Option<Tensor<'b>>,
    is_causal: bool,
    scale: f64,
) -> Result<(Tensor<'b>, Tensor<'b>, Tensor<'b>), BuildError> {
    check_saved(kernel, grad_out, query, out)?;
    let a = Attention::new(kernel, query, key, value, mask, is_causal, scale)?;
    let (dq, dk, dv, _) = a.backward(grad_out)?;
    Ok((dq.cast(query.dtype()), dk.cast(key.dtype()), dv.cast(value.dtype())))
}

// ----- PyTorch's CPU flash-attention overloads -----

/// `aten::_scaled_dot_product_flash_attention_for_cpu` without `attn_mask`: `(out, logsumexp)`.
#[tpu_kernel(
    aten = "aten::_scaled_dot_product_flash_attention_for_cpu",
    schema(query, key, value, dropout_p, is_causal, attn_mask, scale),
    dtypes = [f32, bf16, f16],
    shapes(query = [B, H, L, E], key = [B, G, S, E], value = [B, G, S, E]),
    defaults(dropout_p = 0.0, is_causal = false, scale = -0.0),
    require(dropout_p == 0.0),
    cache_key = [dropout_p, is_causal, scale],
    output = [same_as(query), tensor(f32, [B, H, L])],
    backward = sdpa_flash_cpu_backward,
    canonical = [
        "f32[2,4,16,32], f32[2,4,16,32], f32[2,4,16,32]; is_causal=true",
        "bf16[1,2,8,64], bf16[1,2,8,64], bf16[1,2,8,64]",
        "f32[2,4,5,8], f32[2,2,7,8], f32[2,2,7,8]; is_causal=true, scale=0.3",
        "f16[1,1,1,8], f16[1,1,3,8], f16[1,1,3,8]",
    ],
)]
pub fn sdpa_flash_cpu(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    dropout_p: f64,
    is_causal: bool,
    scale: f64,
) -> Result<(Tensor, Tensor), BuildError> {
    let _ = dropout_p;
    flash_forward("sdpa_flash_cpu", [query, key, value], None, is_causal, scale)
}

/// `aten::_scaled_dot_product_flash_attention_for_cpu` with `attn_mask` (bool, f32 or the
/// query's type, broadcastable to `[B, H, L, S]`): `(out, logsumexp)`.
#[tpu_kernel(
    aten = "aten::_scaled_dot_product_flash_attention_for_cpu",
    schema(query, key, value, dropout_p, is_causal, attn_mask, scale),
    dtypes = [f32, bf16, f16],
    shapes(query = [B, H, L, E], key = [B, G, S, E], value = [B, G, S, E], attn_mask = [..]),
    defaults(dropout_p = 0.0, is_causal = false, scale = -0.0),
    require(dropout_p == 0.0),
    cache_key = [dropout_p, is_causal, scale],
    output = [same_as(query), tensor(f32, [B, H, L])],
    backward = sdpa_flash_cpu_masked_backward,
    canonical = [
        "f32[2,4,16,32], f32[2,4,16,32], f32[2,4,16,32], f32[16,16]",
        "bf16[1,2,8,64], bf16[1,2,8,64], bf16[1,2,8,64], f32[1,1,8,8]",
        "f32[2,4,5,8], f32[2,2,7,8], f32[2,2,7,8], bool[2,1,5,7]",
    ],
)]
#[allow(clippy::too_many_arguments)]
pub fn sdpa_flash_cpu_masked(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor,
    dropout_p: f64,
    is_causal: bool,
    scale: f64,
) -> Result<(Tensor, Tensor), BuildError> {
    let _ = dropout_p;
    flash_forward("sdpa_flash_cpu_masked", [query, key, value], Some(attn_mask), is_causal, scale)
}

/// `aten::_scaled_dot_product_flash_attention_for_cpu_backward` without `attn_mask`:
/// `(grad_query, grad_key, grad_value)`. The forward's `out` and `logsumexp` are checked (types
/// and shapes) but not read: the softmax is recomputed in f32 (see `Attention::backward`).
#[tpu_kernel(
    aten = "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    schema(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask, scale),
    dtypes = [f32, bf16, f16],
    shapes(
        grad_out = [B, H, L, E],
        query = [B, H, L, E],
        key = [B, G, S, E],
        value = [B, G, S, E],
        out = [B, H, L, E],
        logsumexp = f32[B, H, L],
    ),
    defaults(dropout_p = 0.0, is_causal = false, scale = -0.0),
    require(dropout_p == 0.0),
    cache_key = [dropout_p, is_causal, scale],
    output = [same_as(query), same_as(key), same_as(value)],
    canonical = [
        "f32[2,4,16,32], f32[2,4,16,32], f32[2,4,16,32], f32[2,4,16,32], f32[2,4,16,32], f32[2,4,16]; is_causal=true",
        "bf16[1,2,8,64], bf16[1,2,8,64], bf16[1,2,8,64], bf16[1,2,8,64], bf16[1,2,8,64], f32[1,2,8]",
        "f32[2,4,5,8], f32[2,4,5,8], f32[2,2,7,8], f32[2,2,7,8], f32[2,4,5,8], f32[2,4,5]; is_causal=true, scale=0.3",
    ],
)]
#[allow(clippy::too_many_arguments)]
pub fn sdpa_flash_cpu_backward(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    out: Tensor,
    logsumexp: Tensor,
    dropout_p: f64,
    is_causal: bool,
    scale: f64,
) -> Result<(Tensor, Tensor, Tensor), BuildError> {
    let _ = (dropout_p, logsumexp); // logsumexp: guarded f32[B, H, L]; the softmax is recomputed
    let qkv = [query, key, value];
    flash_backward("sdpa_flash_cpu_backward", grad_out, qkv, out, None, is_causal, scale)
}

/// `aten::_scaled_dot_product_flash_attention_for_cpu_backward` with `attn_mask`:
/// `(grad_query, grad_key, grad_value)` (PyTorch gives the mask no gradient here).
#[tpu_kernel(
    aten = "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    schema(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask, scale),
    dtypes = [f32, bf16, f16],
    shapes(
        grad_out = [B, H, L, E],
        query = [B, H, L, E],
        key = [B, G, S, E],
        value = [B, G, S, E],
        out = [B, H, L, E],
        logsumexp = f32[B, H, L],
        attn_mask = [..],
    ),
    defaults(dropout_p = 0.0, is_causal = false, scale = -0.0),
    require(dropout_p == 0.0),
    cache_key = [dropout_p, is_causal, scale],
    output = [same_as(query), same_as(key), same_as(value)],
    canonical = [
        "f32[2,4,16,32], f32[2,4,16,32], f32[2,4,16,32], f32[2,4,16,32], f32[2,4,16,32], f32[2,4,16], f32[16,16]",
        "f32[2,4,5,8], f32[2,4,5,8], f32[2,2,7,8], f32[2,2,7,8], f32[2,4,5,8], f32[2,4,5], bool[2,1,5,7]",
        "bf16[1,2,8,64], bf16[1,2,8,64], bf16[1,2,8,64], bf16[1,2,8,64], bf16[1,2,8,64], f32[1,2,8], bf16[8,8]",
    ],
)]
#[allow(clippy::too_many_arguments)]
pub fn sdpa_flash_cpu_masked_backward(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    out: Tensor,
    logsumexp: Tensor,
    attn_mask: Tensor,
    dropout_p: f64,
    is_causal: bool,
    scale: f64,
) -> Result<(Tensor, Tensor, Tensor), BuildError> {
    let _ = (dropout_p, logsumexp); // logsumexp: guarded f32[B, H, L]; the softmax is recomputed
    let (k, qkv) = ("sdpa_flash_cpu_masked_backward", [query, key, value]);
    flash_backward(k, grad_out, qkv, out, Some(attn_mask), is_causal, scale)
}

// ----- the new op -----

/// Attention as one op: `softmax(query @ key^T * scale + mask) @ value`, with an additive
/// `mask` (f32 or the query's type; a large negative value masks out) broadcastable to
/// `[B, H, L, S]`, `is_causal` adding the top-left causal mask. Its backward,
/// [`fn@attention_backward`], recomputes the softmax and also gives the mask its gradient.
#[tpu_kernel(
    op = "tpuk::attention",
    dtypes = [f32, bf16, f16],
    shapes(query = [B, H, L, E], key = [B, G, S, E], value = [B, G, S, E], mask = [..]),
    defaults(is_causal = false, scale = -0.0),
    cache_key = [is_causal, scale],
    output = same_as(query),
    backward = attention_backward,
    canonical = [
        "f32[2,4,16,32], f32[2,4,16,32], f32[2,4,16,32], f32[16,16]; is_causal=true",
        "bf16[1,2,8,64], bf16[1,2,8,64], bf16[1,2,8,64], bf16[1,1,8,8]",
        "f32[2,4,5,8], f32[2,2,7,8], f32[2,2,7,8], f32[2,1,5,7]; scale=0.3",
        "f16[1,1,1,8], f16[1,1,3,8], f16[1,1,3,8], f16[1]",
    ],
)]
pub fn attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor,
    is_causal: bool,
    scale: f64,
) -> Result<Tensor, BuildError> {
    additive_only("attention", query, mask)?;
    let a = Attention::new("attention", query, key, value, Some(mask), is_causal, scale)?;
    Ok(a.forward()?.0.cast(query.dtype()))
}

/// Gradient of [`fn@attention`] for `grad`: `(dquery, dkey, dvalue, dmask)`, `dmask` of the
/// mask's shape (the scores' gradient summed over the dimensions the mask broadcasts along).
#[tpu_kernel(
    op = "tpuk::attention_backward",
    dtypes = [f32, bf16, f16],
    shapes(
        grad = [B, H, L, E],
        query = [B, H, L, E],
        key = [B, G, S, E],
        value = [B, G, S, E],
        mask = [..],
    ),
    defaults(is_causal = false, scale = -0.0),
    cache_key = [is_causal, scale],
    output = [same_as(query), same_as(key), same_as(value), same_as(mask)],
    canonical = [
        "f32[2,4,16,32], f32[2,4,16,32], f32[2,4,16,32], f32[2,4,16,32], f32[16,16]; is_causal=true",
        "bf16[1,2,8,64], bf16[1,2,8,64], bf16[1,2,8,64], bf16[1,2,8,64], bf16[1,1,8,8]",
        "f32[2,4,5,8], f32[2,4,5,8], f32[2,2,7,8], f32[2,2,7,8], f32[2,1,5,7]; scale=0.3",
    ],
)]
pub fn attention_backward(
    grad: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor,
    is_causal: bool,
    scale: f64,
) -> Result<(Tensor, Tensor, Tensor, Tensor), BuildError> {
    let k = "attention_backward";
    additive_only(k, query, mask)?;
    if grad.dtype() != query.dtype() {
        return Err(dtype_mismatch(k, "grad", query, grad));
    }
    let a = Attention::new(k, query, key, value, Some(mask), is_causal, scale)?;
    let (dq, dk, dv, ds) = a.backward(grad)?;
    let dmask = a.mask_grad(mask, ds)?;
    Ok((dq.cast(query.dtype()), dk.cast(key.dtype()), dv.cast(value.dtype()), dmask))
}

/// `tpuk::attention`'s mask is additive: f32 or the query's type.
fn additive_only(kernel: &str, query: Tensor<'_>, mask: Tensor<'_>) -> Result<(), BuildError> {
    if mask.dtype() == DType::F32 || mask.dtype() == query.dtype() {
        return Ok(());
    }
    Err(BuildError {
        kernel: kernel.to_owned(),
        op: "attention",
        kind: crate::ErrorKind::Unsupported,
        message: format!(
            "mask {} must be additive: f32 or the query's element type ({})",
            mask.ty(),
            query.dtype().short_name()
        ),
    })
}
