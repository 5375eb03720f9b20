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
