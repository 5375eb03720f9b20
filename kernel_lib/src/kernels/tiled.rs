//! Tiled (Mosaic) variants of standard kernels, written with `#[tpu_kernel(tiled(...))]`.
//!
//! They bind the same ops as their StableHLO counterparts. On a TPU the tiled variant is
//! selected (it is what runs there); on the CPU its twin is measurably slower than the
//! StableHLO kernel (docs/perf-log.md, "Tiled twins on the CPU"), so its priority is below the
//! StableHLO kernel's and it runs there only when tiled kernels are forced
//! (`TPUK_FORCE_TILED=1`, `Registry::set_force_tiled`, `tpu_kernels.force_tiled`).

use crate::mosaic::dsl::{Block, Tiled, Vector};
use crate::tpu_kernel;
use crate::{DType, ErrorKind};

/// `activation` applied to the f32 block `y`; an activation the epilogue does not have
/// declines the call.
pub fn activate<'k>(k: &'k Tiled, y: Vector<'k>, activation: &str) -> Vector<'k> {
    match activation {
        "none" => y,
        "relu" => y.maximum(0.0),
        "silu" => y * y.sigmoid(),
        "gelu_tanh" => {
            let inner = (y + y * y * y * 0.044715) * (2.0 / std::f64::consts::PI).sqrt();
            y * (inner.tanh() + 1.0) * 0.5
        }
        "gelu" => y * ((y * std::f64::consts::FRAC_1_SQRT_2).erf() + 1.0) * 0.5,
        other => {
            k.fail(ErrorKind::Unsupported, format!("no `{other}` epilogue"));
            y
        }
    }
}

/// The K loop of a tiled matmul: `acc` zeroed at the first K step, `x · weight` added at each.
pub fn accumulate(k: &Tiled, x: Block<'_>, weight: Block<'_>, acc: Block<'_>) {
    let step = k.program_id(2);
    k.when(step.eq(0), || acc.store(k.zeros(DType::F32, &acc.shape())));
    acc.store(acc.load() + x.load().matmul(weight.load()));
}

/// `act(x @ weight + bias)` in blocks: an f32 VMEM accumulator over the `arbitrary` K axis,
/// the bias and the activation applied once, at the last K step.
#[tpu_kernel(
    op = "tpuk::matmul_bias_act",
    dtypes = [f32, bf16],
    same_dtype,
    shapes(x = [M, K], weight = [K, N], bias = [N]),
    defaults(activation = "none"),
    cache_key = [activation],
    output = like(x, [M, N]),
    priority = -1,
    tiled(
        tiles(bm = tile(M, 256, 8), bn = tile(N, 256, 128), bk = tile(K, 512, 128)),
        grid = [M / bm, N / bn, K / bk],
        semantics = [parallel, parallel, arbitrary],
        inputs(
            x = block([bm, bk], |i, j, k| (i, k)),
            weight = block([bk, bn], |i, j, k| (k, j)),
            bias = block([1, bn], |i, j, k| (0, j)).view([1, N]),
        ),
        outputs(out = block([bm, bn], |i, j, k| (i, j))),
        scratch(acc = vmem(f32, [bm, bn])),
    ),
    canonical = [
        "f32[256,1536], f32[1536,512], f32[512]; activation=gelu_tanh",
        "bf16[512,1024], bf16[1024,512], bf16[512]; activation=silu",
        "f32[7,128], f32[128,128], f32[128]; activation=relu",
        "f32[16,256], f32[256,384], f32[384]",
    ],
)]
pub fn tiled_matmul_bias_act(
    k: &Tiled,
    x: Block,
    weight: Block,
    bias: Block,
    out: Block,
    acc: Block,
    activation: &str,
) {
    accumulate(k, x, weight, acc);
    let last = k.program_id(2).eq(k.num_programs(2) - 1);
    k.when(last, || {
        let y = acc.load() + bias.load().cast(DType::F32);
        out.store(activate(k, y, activation).cast(out.dtype()));
    });
}

/// `act(x @ weight)` in blocks, as [`fn@tiled_matmul_bias_act`] without the bias.
#[tpu_kernel(
    op = "tpuk::matmul_act",
    dtypes = [f32, bf16],
    same_dtype,
    shapes(x = [M, K], weight = [K, N]),
    defaults(activation = "none"),
    cache_key = [activation],
    output = like(x, [M, N]),
    priority = -1,
    tiled(
        tiles(bm = tile(M, 256, 8), bn = tile(N, 256, 128), bk = tile(K, 512, 128)),
        grid = [M / bm, N / bn, K / bk],
        semantics = [parallel, parallel, arbitrary],
        inputs(
            x = block([bm, bk], |i, j, k| (i, k)),
            weight = block([bk, bn], |i, j, k| (k, j)),
        ),
        outputs(out = block([bm, bn], |i, j, k| (i, j))),
        scratch(acc = vmem(f32, [bm, bn])),
    ),
    canonical = [
        "f32[256,1024], f32[1024,256]; activation=silu",
        "bf16[128,512], bf16[512,256]; activation=gelu_tanh",
        "f32[7,128], f32[128,256]; activation=relu",
    ],
)]
pub fn tiled_matmul_act(
    k: &Tiled,
    x: Block,
    weight: Block,
    out: Block,
    acc: Block,
    activation: &str,
) {
    accumulate(k, x, weight, acc);
    let last = k.program_id(2).eq(k.num_programs(2) - 1);
    k.when(last, || out.store(activate(k, acc.load(), activation).cast(out.dtype())));
}

/// RMSNorm over blocks of rows: `x` (any leading dims) seen as `[rows, D]`, each block of rows
/// normalised in f32 and scaled by the weight, whose one block every step reads.
#[tpu_kernel(
    op = "tpuk::rms_norm",
    dtypes = [f32, bf16],
    same_dtype,
    shapes(x = [.., D], weight = [D]),
    defaults(eps = 1e-6),
    cache_key = [eps],
    output = same_as(x),
    priority = -1,
    backward = rms_norm_backward,
    tiled(
        tiles(R = numel(x) / D, br = tile(R, max(8, cdiv(262144, D)), 8)),
        grid = [R / br],
        semantics = [parallel],
        inputs(
            x = block([br, D], |i| (i, 0)).view([R, D]),
            weight = block([1, D], |i| (0, 0)).view([1, D]),
        ),
        outputs(out = block([br, D], |i| (i, 0)).view([R, D])),
    ),
    canonical = [
        "f32[256,1024], f32[1024]",
        "bf16[2,128,512], bf16[512]; eps=1e-5",
        "f32[8,128], f32[128]",
        "f32[3,7,256], f32[256]",
    ],
)]
pub fn tiled_rms_norm(x: Block, weight: Block, out: Block, eps: f64) {
    let xf = x.load().cast(DType::F32);
    let d = xf.shape().last().copied().unwrap_or(1) as f64;
    let ms = (xf * xf).sum(-1) * (1.0 / d);
    let y = xf * (ms + eps).rsqrt() * weight.load().cast(DType::F32);
    out.store(y.cast(out.dtype()));
}

// ----- softmax, log-softmax and their backwards, over row blocks -----
//
// Each views its input as `[rows, D]` and normalises one block of rows per grid step, in f32,
// the whole last dim in the block (`D` up to what 256K elements a block leaves: the row count
// is a multiple of 8 dividing the rows). They reduce the last dim only (`dim = -1`); another
// dim stays with the StableHLO kernels.

/// The row-block plan every row-wise tiled kernel here shares: at most 256K elements (1 MiB
/// of f32) a block, at least 8 rows.
macro_rules! row_kernel_doc {
    () => {
        "One grid step per block of `br` rows (`br` a multiple of 8 dividing the rows, at most \
         256K elements a block, or every row when fewer than 8)."
    };
}

/// `softmax(x, dim=-1)` over blocks of rows: `exp(x - max) / sum(exp(x - max))` in f32.
#[doc = row_kernel_doc!()]
#[tpu_kernel(
    aten = "aten::_softmax",
    dtypes = [f32, bf16],
    shapes(self_ = [.., D]),
    defaults(dim = -1, half_to_float = false),
    require(dim == -1, half_to_float == false),
    cache_key = [dim, half_to_float],
    output = same_as(self_),
    priority = -1,
    tiled(
        tiles(R = numel(self_) / D, br = tile(R, max(8, cdiv(262144, D)), 8)),
        grid = [R / br],
        semantics = [parallel],
        inputs(self_ = block([br, D], |i| (i, 0)).view([R, D])),
        outputs(out = block([br, D], |i| (i, 0)).view([R, D])),
    ),
    canonical = ["f32[256,1024]; dim=-1", "bf16[4,8,512]; dim=-1", "f32[3,7,33]; dim=-1"],
)]
pub fn tiled_softmax(self_: Block, out: Block, dim: i64, half_to_float: bool) {
    let _ = (dim, half_to_float);
    let x = self_.load().cast(DType::F32);
    let e = (x - x.amax(-1)).exp();
    out.store((e / e.sum(-1)).cast(out.dtype()));
}

/// `log_softmax(x, dim=-1)` over blocks of rows: `x - max - log(sum(exp(x - max)))` in f32.
#[doc = row_kernel_doc!()]
#[tpu_kernel(
    aten = "aten::_log_softmax",
    dtypes = [f32, bf16],
    shapes(self_ = [.., D]),
    defaults(dim = -1, half_to_float = false),
    require(dim == -1, half_to_float == false),
    cache_key = [dim, half_to_float],
    output = same_as(self_),
    priority = -1,
    tiled(
        tiles(R = numel(self_) / D, br = tile(R, max(8, cdiv(262144, D)), 8)),
        grid = [R / br],
        semantics = [parallel],
        inputs(self_ = block([br, D], |i| (i, 0)).view([R, D])),
        outputs(out = block([br, D], |i| (i, 0)).view([R, D])),
    ),
    canonical = ["f32[256,1024]; dim=-1", "bf16[4,8,512]; dim=-1", "f32[3,7,33]; dim=-1"],
)]
pub fn tiled_log_softmax(self_: Block, out: Block, dim: i64, half_to_float: bool) {
    let _ = (dim, half_to_float);
    let x = self_.load().cast(DType::F32);
    let shifted = x - x.amax(-1);
    out.store((shifted - shifted.exp().sum(-1).log()).cast(out.dtype()));
}

/// `input_dtype`, the forward input's type a softmax backward is told, must be its tensors'
/// own (a `half_to_float` forward has no kernel here), else the call is refused.
fn same_input_dtype(k: &Tiled, out: Block<'_>, input_dtype: &str) {
    let want = super::backward::torch_name(out.dtype());
    let given = input_dtype.strip_prefix("torch.").unwrap_or(input_dtype);
    if given != want {
        k.fail(
            ErrorKind::Unsupported,
            format!(
                "input_dtype {given} differs from the output's {want} (a half_to_float forward); \
                 this kernel takes the forward's own type"
            ),
        );
    }
}

/// Gradient of softmax along the last dim from its output `y`: `y * (grad - sum(grad * y))`.
#[doc = row_kernel_doc!()]
#[tpu_kernel(
    aten = "aten::_softmax_backward_data",
    dtypes = [f32, bf16],
    same_dtype,
    shapes(grad_output = [.., D], output = [.., D]),
    defaults(dim = -1),
    require(dim == -1),
    cache_key = [dim],
    ignore_in_cache_key(input_dtype = "checked equal to the tensors' element type"),
    output = same_as(output),
    priority = -1,
    tiled(
        tiles(R = numel(output) / D, br = tile(R, max(8, cdiv(262144, D)), 8)),
        grid = [R / br],
        semantics = [parallel],
        inputs(
            grad_output = block([br, D], |i| (i, 0)).view([R, D]),
            output = block([br, D], |i| (i, 0)).view([R, D]),
        ),
        outputs(grad_input = block([br, D], |i| (i, 0)).view([R, D])),
    ),
    canonical = [
        "f32[256,1024], f32[256,1024]; dim=-1, input_dtype=float32",
        "bf16[4,8,512], bf16[4,8,512]; dim=-1, input_dtype=bfloat16",
        "f32[3,7,33], f32[3,7,33]; dim=-1, input_dtype=float32",
    ],
)]
pub fn tiled_softmax_backward(
    k: &Tiled,
    grad_output: Block,
    output: Block,
    grad_input: Block,
    dim: i64,
    input_dtype: &str,
) {
    let _ = dim;
    same_input_dtype(k, output, input_dtype);
    let (g, y) = (grad_output.load().cast(DType::F32), output.load().cast(DType::F32));
    grad_input.store((y * (g - (g * y).sum(-1))).cast(grad_input.dtype()));
}

/// Gradient of log-softmax along the last dim from its output `y`: `grad - exp(y) * sum(grad)`.
#[doc = row_kernel_doc!()]
#[tpu_kernel(
    aten = "aten::_log_softmax_backward_data",
    dtypes = [f32, bf16],
    same_dtype,
    shapes(grad_output = [.., D], output = [.., D]),
    defaults(dim = -1),
    require(dim == -1),
    cache_key = [dim],
    ignore_in_cache_key(input_dtype = "checked equal to the tensors' element type"),
    output = same_as(output),
    priority = -1,
    tiled(
        tiles(R = numel(output) / D, br = tile(R, max(8, cdiv(262144, D)), 8)),
        grid = [R / br],
        semantics = [parallel],
        inputs(
            grad_output = block([br, D], |i| (i, 0)).view([R, D]),
            output = block([br, D], |i| (i, 0)).view([R, D]),
        ),
        outputs(grad_input = block([br, D], |i| (i, 0)).view([R, D])),
    ),
    canonical = [
        "f32[256,1024], f32[256,1024]; dim=-1, input_dtype=float32",
        "bf16[4,8,512], bf16[4,8,512]; dim=-1, input_dtype=bfloat16",
        "f32[3,7,33], f32[3,7,33]; dim=-1, input_dtype=float32",
    ],
)]
pub fn tiled_log_softmax_backward(
    k: &Tiled,
    grad_output: Block,
    output: Block,
    grad_input: Block,
    dim: i64,
    input_dtype: &str,
) {
    let _ = dim;
    same_input_dtype(k, output, input_dtype);
    let (g, y) = (grad_output.load().cast(DType::F32), output.load().cast(DType::F32));
    grad_input.store((g - y.exp() * g.sum(-1)).cast(grad_input.dtype()));
}

// ----- layer norm, and the norms' backwards -----

/// Layer norm over the last dim in blocks of rows: `(out, mean, rstd)` as
/// `aten::native_layer_norm` gives them (`mean` and `rstd` of shape `[.., 1]`), in f32.
#[doc = row_kernel_doc!()]
#[tpu_kernel(
    aten = "aten::native_layer_norm",
    schema(input, normalized_shape, weight, bias, eps),
    dtypes = [f32, bf16],
    same_dtype,
    shapes(input = [.., D], weight = [D], bias = [D]),
    defaults(eps = 1e-5),
    cache_key = [eps],
    output = [same_as(input), reduced(input, -1), reduced(input, -1)],
    priority = -1,
    tiled(
        tiles(R = numel(input) / D, br = tile(R, max(8, cdiv(262144, D)), 8)),
        grid = [R / br],
        semantics = [parallel],
        inputs(
            input = block([br, D], |i| (i, 0)).view([R, D]),
            weight = block([1, D], |i| (0, 0)).view([1, D]),
            bias = block([1, D], |i| (0, 0)).view([1, D]),
        ),
        outputs(
            out = block([br, D], |i| (i, 0)).view([R, D]),
            mean = block([br, 1], |i| (i, 0)).view([R, 1]),
            rstd = block([br, 1], |i| (i, 0)).view([R, 1]),
        ),
    ),
    canonical = [
        "f32[256,1024], f32[1024], f32[1024]",
        "bf16[4,8,512], bf16[512], bf16[512]; eps=1e-6",
        "f32[3,7,33], f32[33], f32[33]",
    ],
)]
#[allow(clippy::too_many_arguments, reason = "three inputs and three outputs, as the op has")]
pub fn tiled_layer_norm(
    input: Block,
    weight: Block,
    bias: Block,
    out: Block,
    mean: Block,
    rstd: Block,
    eps: f64,
) {
    let x = input.load().cast(DType::F32);
    let inv_d = 1.0 / x.shape().last().copied().unwrap_or(1) as f64;
    let mu = x.sum(-1) * inv_d;
    let centered = x - mu;
    let r = ((centered * centered).sum(-1) * inv_d + eps).rsqrt();
    let (w, b) = (weight.load().cast(DType::F32), bias.load().cast(DType::F32));
    out.store((centered * r * w + b).cast(out.dtype()));
    mean.store(mu.cast(mean.dtype()));
    rstd.store(r.cast(rstd.dtype()));
}

/// Gradient of layer norm from the forward's saved `mean` and `rstd`:
/// `(grad_input, grad_weight, grad_bias)`. With `xhat = (x - mean) * rstd` and
/// `gw = grad_out * weight`: `grad_input = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))`
/// per row; `grad_weight = sum(grad_out * xhat)` and `grad_bias = sum(grad_out)` over the rows,
/// accumulated in f32 scratch across the sequential (`arbitrary`) row blocks and written at the
/// last one.
#[doc = row_kernel_doc!()]
#[tpu_kernel(
    aten = "aten::native_layer_norm_backward",
    schema(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask),
    dtypes = [f32, bf16],
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
    priority = -1,
    tiled(
        tiles(R = numel(input) / D, br = tile(R, max(8, cdiv(262144, D)), 8)),
        grid = [R / br],
        semantics = [arbitrary],
        inputs(
            grad_out = block([br, D], |i| (i, 0)).view([R, D]),
            input = block([br, D], |i| (i, 0)).view([R, D]),
            mean = block([br, 1], |i| (i, 0)).view([R, 1]),
            rstd = block([br, 1], |i| (i, 0)).view([R, 1]),
            weight = block([1, D], |i| (0, 0)).view([1, D]),
            bias = block([1, D], |i| (0, 0)).view([1, D]),
        ),
        outputs(
            grad_input = block([br, D], |i| (i, 0)).view([R, D]),
            grad_weight = block([1, D], |i| (0, 0)).view([1, D]),
            grad_bias = block([1, D], |i| (0, 0)).view([1, D]),
        ),
        scratch(dw = vmem(f32, [1, D]), db = vmem(f32, [1, D])),
    ),
    canonical = [
        "f32[256,1024], f32[256,1024], f32[256,1], f32[256,1], f32[1024], f32[1024]",
        "bf16[4,8,512], bf16[4,8,512], bf16[4,8,1], bf16[4,8,1], bf16[512], bf16[512]",
        "f32[3,7,33], f32[3,7,33], f32[3,7,1], f32[3,7,1], f32[33], f32[33]",
    ],
)]
#[allow(clippy::too_many_arguments, reason = "six inputs, three outputs and two accumulators")]
pub fn tiled_layer_norm_backward(
    k: &Tiled,
    grad_out: Block,
    input: Block,
    mean: Block,
    rstd: Block,
    weight: Block,
    bias: Block,
    grad_input: Block,
    grad_weight: Block,
    grad_bias: Block,
    dw: Block,
    db: Block,
) {
    let _ = bias;
    let (g, x, mu, r, w) = (f32(grad_out), f32(input), f32(mean), f32(rstd), f32(weight));
    let inv_d = 1.0 / x.shape().last().copied().unwrap_or(1) as f64;
    let xhat = (x - mu) * r;
    let gw = g * w;
    let dx = r * (gw - gw.sum(-1) * inv_d - xhat * ((gw * xhat).sum(-1) * inv_d));
    grad_input.store(dx.cast(grad_input.dtype()));
    column_sums(k, &[(g * xhat, dw, grad_weight), (g, db, grad_bias)]);
}

/// The whole block, in f32.
#[track_caller]
fn f32(b: Block<'_>) -> Vector<'_> {
    b.load().cast(DType::F32)
}

/// For each `(rows, acc, out)`: `acc` zeroed at the first grid step, `rows` summed over its
/// rows into it at every step, `out` written from it at the last: a `[1, D]` sum over every
/// row block of a sequential grid.
#[track_caller]
fn column_sums<'k>(k: &'k Tiled, sums: &[(Vector<'k>, Block<'k>, Block<'k>)]) {
    let first = k.program_id(0).eq(0);
    k.when(first, || {
        for (_, acc, _) in sums {
            acc.store(k.zeros(DType::F32, &acc.shape()));
        }
    });
    for (rows, acc, _) in sums {
        acc.store(acc.load() + rows.sum(0));
    }
    let last = k.program_id(0).eq(k.num_programs(0) - 1);
    k.when(last, || {
        for (_, acc, out) in sums {
            out.store(acc.load().cast(out.dtype()));
        }
    });
}

/// Gradient of RMSNorm for `grad`, the gradient of its output: `(dx, dweight)`. With
/// `r = rsqrt(mean(x²) + eps)` and `gw = grad * weight`: `dx = r * gw - x * r³ * mean(gw * x)`
/// per row, and `dweight = sum(grad * x * r)` over the rows, accumulated in f32 scratch across
/// the sequential row blocks.
#[doc = row_kernel_doc!()]
#[tpu_kernel(
    op = "tpuk::rms_norm_backward",
    dtypes = [f32, bf16],
    same_dtype,
    shapes(grad = [.., D], x = [.., D], weight = [D]),
    defaults(eps = 1e-6),
    cache_key = [eps],
    output = [same_as(x), same_as(weight)],
    priority = -1,
    tiled(
        tiles(R = numel(x) / D, br = tile(R, max(8, cdiv(262144, D)), 8)),
        grid = [R / br],
        semantics = [arbitrary],
        inputs(
            grad = block([br, D], |i| (i, 0)).view([R, D]),
            x = block([br, D], |i| (i, 0)).view([R, D]),
            weight = block([1, D], |i| (0, 0)).view([1, D]),
        ),
        outputs(
            dx = block([br, D], |i| (i, 0)).view([R, D]),
            dweight = block([1, D], |i| (0, 0)).view([1, D]),
        ),
        scratch(dw = vmem(f32, [1, D])),
    ),
    canonical = [
        "f32[256,1024], f32[256,1024], f32[1024]",
        "bf16[4,8,512], bf16[4,8,512], bf16[512]; eps=1e-5",
        "f32[3,7,33], f32[3,7,33], f32[33]",
    ],
)]
#[allow(clippy::too_many_arguments, reason = "three inputs, two outputs and an accumulator")]
pub fn tiled_rms_norm_backward(
    k: &Tiled,
    grad: Block,
    x: Block,
    weight: Block,
    dx: Block,
    dweight: Block,
    dw: Block,
    eps: f64,
) {
    let (g, xf, w) = (f32(grad), f32(x), f32(weight));
    let inv_d = 1.0 / xf.shape().last().copied().unwrap_or(1) as f64;
    let r = ((xf * xf).sum(-1) * inv_d + eps).rsqrt();
    let gw = g * w;
    let d = r * gw - xf * r * r * r * ((gw * xf).sum(-1) * inv_d);
    dx.store(d.cast(dx.dtype()));
    column_sums(k, &[(g * xf * r, dw, dweight)]);
}
