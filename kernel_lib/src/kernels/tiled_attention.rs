//! Flash attention as tiled (Mosaic) kernels: the forward of PyTorch's CPU flash overload
//! (`aten::_scaled_dot_product_flash_attention_for_cpu`, without `attn_mask` and with an
//! additive one of rank 2 or 4 that broadcasts along any of batch, heads and queries),
//! `(out, logsumexp)`, with an online softmax over key/value blocks; `tpuk::attention` (the
//! output alone, a rank-4 mask); and the backward of the unmasked forward.
//!
//! `query [B, H, L, E]`, `key`/`value` `[B, G, S, E]` are seen as `[B * H, L, E]` and
//! `[B * G, S, E]`. The grid is `(B * H, L / bq, S / bk)`, blocks of 128 rows where the
//! lengths allow (Pallas's default; else the largest multiple of 8 that divides, or the whole
//! length when at most 128): one query block of one head per
//! `(g, i)`, key/value blocks along the sequential (`arbitrary`) last axis. Query head `g` reads
//! key/value head `g / (H / G)` (grouped-query attention: `b * H + h` over the group size is
//! `b * G + h / group`). Per query block, f32 scratch keeps the running row max `m`, the running
//! sum `l` and the unnormalised output `acc`; at the last key block `out = acc / l` and
//! `logsumexp = m + log(l)`. With `is_causal` (top-left aligned, as PyTorch: key position at
//! most query position), scores past the diagonal are masked and a key block wholly past a
//! query block's last row is skipped: no MXU work, no exponentials. Scores, the softmax and the
//! accumulation are f32, and so is every product with a probability or a score gradient (the
//! 16-bit operand is widened): Pallas rounds those to the input type for the MXU's bf16 rate,
//! which puts a bf16 output 50-120x past the numerics harness's tolerance (the f32 result
//! rounded once) where rows cancel; here accuracy comes first.
//!
//! Its backward, [`tiled_sdpa_flash_backward`], is FlashAttention-2's: the probabilities are
//! recomputed from the saved `logsumexp`, per key/value block.

use crate::DType;
use crate::mosaic::dsl::{Block, Tiled, all, ds};
use crate::tpu_kernel;

/// A masked score: far below any real one, yet `exp(mask - m)` is 0, not NaN, for finite `m`
/// (Pallas's `DEFAULT_MASK_VALUE`).
pub(crate) const MASK: f64 = -0.7 * f32::MAX as f64;

#[tpu_kernel(
    aten = "aten::_scaled_dot_product_flash_attention_for_cpu",
    schema(query, key, value, dropout_p, is_causal, attn_mask, scale),
    dtypes = [f32, bf16],
    same_dtype,
    shapes(query = [B, H, L, E], key = [B, G, S, E], value = [B, G, S, E]),
    defaults(dropout_p = 0.0, is_causal = false, scale = -0.0),
    require(dropout_p == 0.0),
    cache_key = [dropout_p, is_causal, scale],
    output = [same_as(query), tensor(f32, [B, H, L])],
    backward = tiled_sdpa_flash_backward,
    priority = -1,
    tiled(
        tiles(
            BH = B * H,
            BG = B * G,
            group = H / G,
            bq = tile(L, 128, 8),
            bk = tile(S, 128, 8),
        ),
        grid = [BH, L / bq, S / bk],
        semantics = [parallel, parallel, arbitrary],
        inputs(
            query = block([1, bq, E], |g, i, j| (g, i, 0)).view([BH, L, E]),
            key = block([1, bk, E], |g, i, j| (g / group, j, 0)).view([BG, S, E]),
            value = block([1, bk, E], |g, i, j| (g / group, j, 0)).view([BG, S, E]),
        ),
        outputs(
            out = block([1, bq, E], |g, i, j| (g, i, 0)).view([BH, L, E]),
            logsumexp = block([1, bq, 1], |g, i, j| (g, i, 0)).view([BH, L, 1]),
        ),
        scratch(m = vmem(f32, [bq, 1]), l = vmem(f32, [bq, 1]), acc = vmem(f32, [bq, E])),
    ),
    canonical = [
        "f32[1,2,256,128], f32[1,2,256,128], f32[1,2,256,128]; is_causal=true",
        "bf16[1,4,128,128], bf16[1,2,384,128], bf16[1,2,384,128]",
        "f32[2,4,16,32], f32[2,2,24,32], f32[2,2,24,32]; is_causal=true, scale=0.3",
    ],
)]
#[allow(clippy::too_many_arguments, reason = "three inputs, two outputs, three scratch buffers")]
pub fn tiled_sdpa_flash(
    k: &Tiled,
    query: Block,
    key: Block,
    value: Block,
    out: Block,
    logsumexp: Block,
    m: Block,
    l: Block,
    acc: Block,
    dropout_p: f64,
    is_causal: bool,
    scale: f64,
) {
    let _ = dropout_p;
    let state = Online { m, l, acc };
    flash_forward(k, [query, key, value], None, (out, Some(logsumexp)), state, is_causal, scale);
}

/// The flash forward with an additive `[ML, S]` mask (`ML` 1 or `L`; f32 or a 16-bit float),
/// the same for every batch and head, as a model's causal, banded or padding mask (PyTorch
/// turns a boolean mask into this before the op): the mask's `[bq, bk]` block (or `[1, bk]`
/// row) is added to each score block. A mask of rank 4 goes to
/// [`fn@tiled_sdpa_flash_masked_4d`]; of rank 1 or 3, to the StableHLO kernel.
#[tpu_kernel(
    aten = "aten::_scaled_dot_product_flash_attention_for_cpu",
    schema(query, key, value, dropout_p, is_causal, attn_mask, scale),
    dtypes = [f32, bf16],
    shapes(
        query = [B, H, L, E],
        key = [B, G, S, E],
        value = [B, G, S, E],
        attn_mask = [ML, S],
    ),
    defaults(dropout_p = 0.0, is_causal = false, scale = -0.0),
    require(dropout_p == 0.0),
    cache_key = [dropout_p, is_causal, scale],
    output = [same_as(query), tensor(f32, [B, H, L])],
    backward = sdpa_flash_cpu_masked_backward,
    priority = -1,
    tiled(
        tiles(
            BH = B * H,
            BG = B * G,
            group = H / G,
            bq = tile(L, 128, 8),
            bk = tile(S, 512, 128),
            ml = broadcast(ML, L),
            mq = min(bq, ml),
            ldiv = L / ml,
        ),
        grid = [BH, L / bq, S / bk],
        semantics = [parallel, parallel, arbitrary],
        inputs(
            query = block([1, bq, E], |g, i, j| (g, i, 0)).view([BH, L, E]),
            key = block([1, bk, E], |g, i, j| (g / group, j, 0)).view([BG, S, E]),
            value = block([1, bk, E], |g, i, j| (g / group, j, 0)).view([BG, S, E]),
            attn_mask = block([mq, bk], |g, i, j| (i / ldiv, j)),
        ),
        outputs(
            out = block([1, bq, E], |g, i, j| (g, i, 0)).view([BH, L, E]),
            logsumexp = block([1, bq, 1], |g, i, j| (g, i, 0)).view([BH, L, 1]),
        ),
        scratch(m = vmem(f32, [bq, 1]), l = vmem(f32, [bq, 1]), acc = vmem(f32, [bq, E])),
    ),
    canonical = [
        "f32[1,2,256,128], f32[1,2,256,128], f32[1,2,256,128], f32[256,256]; is_causal=true",
        "bf16[1,4,128,128], bf16[1,2,1024,128], bf16[1,2,1024,128], f32[128,1024]",
        "f32[2,4,16,32], f32[2,2,24,32], f32[2,2,24,32], f32[16,24]; scale=0.3",
        "bf16[1,2,256,64], bf16[1,2,256,64], bf16[1,2,256,64], bf16[1,256]",
    ],
)]
#[allow(clippy::too_many_arguments, reason = "four inputs, two outputs, three scratch buffers")]
pub fn tiled_sdpa_flash_masked(
    k: &Tiled,
    query: Block,
    key: Block,
    value: Block,
    attn_mask: Block,
    out: Block,
    logsumexp: Block,
    m: Block,
    l: Block,
    acc: Block,
    dropout_p: f64,
    is_causal: bool,
    scale: f64,
) {
    let _ = dropout_p;
    let state = Online { m, l, acc };
    let qkv = [query, key, value];
    flash_forward(k, qkv, Some(attn_mask), (out, Some(logsumexp)), state, is_causal, scale);
}

/// The flash forward with an additive mask of rank 4, `[MB, MH, ML, S]`, each of `MB`, `MH`,
/// `ML` 1 or the batch, head or query length it broadcasts along (a padding mask `[B, 1, 1,
/// S]`, a per-head bias `[1, H, L, S]`, a full `[B, H, L, S]`). The mask is seen as `[MB * MH,
/// ML, S]`; query head `g` of the `B * H` axis reads mask row `(g / (H / MH)) % (MB * MH)`
/// (batch `b` and head `h` where the mask has them, 0 where it broadcasts).
#[tpu_kernel(
    aten = "aten::_scaled_dot_product_flash_attention_for_cpu",
    schema(query, key, value, dropout_p, is_causal, attn_mask, scale),
    dtypes = [f32, bf16],
    shapes(
        query = [B, H, L, E],
        key = [B, G, S, E],
        value = [B, G, S, E],
        attn_mask = [MB, MH, ML, S],
    ),
    defaults(dropout_p = 0.0, is_causal = false, scale = -0.0),
    require(dropout_p == 0.0),
    cache_key = [dropout_p, is_causal, scale],
    output = [same_as(query), tensor(f32, [B, H, L])],
    backward = sdpa_flash_cpu_masked_backward,
    priority = -1,
    tiled(
        tiles(
            BH = B * H,
            BG = B * G,
            group = H / G,
            bq = tile(L, 128, 8),
            bk = tile(S, 512, 128),
            mb = broadcast(MB, B),
            mh = broadcast(MH, H),
            ml = broadcast(ML, L),
            MBH = mb * mh,
            hdiv = H / mh,
            mq = min(bq, ml),
            ldiv = L / ml,
        ),
        grid = [BH, L / bq, S / bk],
        semantics = [parallel, parallel, arbitrary],
        inputs(
            query = block([1, bq, E], |g, i, j| (g, i, 0)).view([BH, L, E]),
            key = block([1, bk, E], |g, i, j| (g / group, j, 0)).view([BG, S, E]),
            value = block([1, bk, E], |g, i, j| (g / group, j, 0)).view([BG, S, E]),
            attn_mask = block([1, mq, bk], |g, i, j| (g / hdiv % MBH, i / ldiv, j))
                .view([MBH, ML, S]),
        ),
        outputs(
            out = block([1, bq, E], |g, i, j| (g, i, 0)).view([BH, L, E]),
            logsumexp = block([1, bq, 1], |g, i, j| (g, i, 0)).view([BH, L, 1]),
        ),
        scratch(m = vmem(f32, [bq, 1]), l = vmem(f32, [bq, 1]), acc = vmem(f32, [bq, E])),
    ),
    canonical = [
        "f32[2,2,256,128], f32[2,2,256,128], f32[2,2,256,128], f32[2,1,1,256]; is_causal=true",
        "bf16[2,4,128,64], bf16[2,2,512,64], bf16[2,2,512,64], bf16[1,4,128,512]",
        "f32[2,4,16,32], f32[2,2,24,32], f32[2,2,24,32], f32[2,4,16,24]; scale=0.3",
        "f32[3,2,16,32], f32[3,2,24,32], f32[3,2,24,32], f32[1,1,16,24]",
    ],
)]
#[allow(clippy::too_many_arguments, reason = "four inputs, two outputs, three scratch buffers")]
pub fn tiled_sdpa_flash_masked_4d(
    k: &Tiled,
    query: Block,
    key: Block,
    value: Block,
    attn_mask: Block,
    out: Block,
    logsumexp: Block,
    m: Block,
    l: Block,
    acc: Block,
    dropout_p: f64,
    is_causal: bool,
    scale: f64,
) {
    let _ = dropout_p;
    let state = Online { m, l, acc };
    let qkv = [query, key, value];
    flash_forward(k, qkv, Some(attn_mask), (out, Some(logsumexp)), state, is_causal, scale);
}

/// `tpuk::attention` (the output alone) with a rank-4 additive mask, as
/// [`fn@tiled_sdpa_flash_masked_4d`] computes it; its backward is the StableHLO
/// `attention_backward`, which also gives the mask its gradient.
#[tpu_kernel(
    op = "tpuk::attention",
    dtypes = [f32, bf16],
    shapes(query = [B, H, L, E], key = [B, G, S, E], value = [B, G, S, E], mask = [MB, MH, ML, S]),
    defaults(is_causal = false, scale = -0.0),
    cache_key = [is_causal, scale],
    output = same_as(query),
    backward = attention_backward,
    priority = -1,
    tiled(
        tiles(
            BH = B * H,
            BG = B * G,
            group = H / G,
            bq = tile(L, 128, 8),
            bk = tile(S, 512, 128),
            mb = broadcast(MB, B),
            mh = broadcast(MH, H),
            ml = broadcast(ML, L),
            MBH = mb * mh,
            hdiv = H / mh,
            mq = min(bq, ml),
            ldiv = L / ml,
        ),
        grid = [BH, L / bq, S / bk],
        semantics = [parallel, parallel, arbitrary],
        inputs(
            query = block([1, bq, E], |g, i, j| (g, i, 0)).view([BH, L, E]),
            key = block([1, bk, E], |g, i, j| (g / group, j, 0)).view([BG, S, E]),
            value = block([1, bk, E], |g, i, j| (g / group, j, 0)).view([BG, S, E]),
            mask = block([1, mq, bk], |g, i, j| (g / hdiv % MBH, i / ldiv, j)).view([MBH, ML, S]),
        ),
        outputs(out = block([1, bq, E], |g, i, j| (g, i, 0)).view([BH, L, E])),
        scratch(m = vmem(f32, [bq, 1]), l = vmem(f32, [bq, 1]), acc = vmem(f32, [bq, E])),
    ),
    canonical = [
        "f32[2,4,128,64], f32[2,4,128,64], f32[2,4,128,64], f32[2,1,1,128]; is_causal=true",
        "bf16[1,4,128,128], bf16[1,2,256,128], bf16[1,2,256,128], bf16[1,4,128,256]",
        "f32[2,4,5,8], f32[2,2,7,8], f32[2,2,7,8], f32[2,1,5,7]; scale=0.3",
    ],
)]
#[allow(clippy::too_many_arguments, reason = "four inputs, one output, three scratch buffers")]
pub fn tiled_attention_4d(
    k: &Tiled,
    query: Block,
    key: Block,
    value: Block,
    mask: Block,
    out: Block,
    m: Block,
    l: Block,
    acc: Block,
    is_causal: bool,
    scale: f64,
) {
    let state = Online { m, l, acc };
    flash_forward(k, [query, key, value], Some(mask), (out, None), state, is_causal, scale);
}

/// The online softmax's running state per query block (f32 scratch): the row max, the row sum
/// and the unnormalised output.
struct Online<'k> {
    m: Block<'k>,
    l: Block<'k>,
    acc: Block<'k>,
}

/// The flash forward's body at grid step `(g, i, j)`: reset the state at the first key block,
/// fold key block `j` into it (unless causal masking leaves the block no work), and write
/// `out = acc / l` and `logsumexp = m + log(l)` at the last.
fn flash_forward<'k>(
    k: &'k Tiled,
    [query, key, value]: [Block<'k>; 3],
    mask: Option<Block<'k>>,
    (out, logsumexp): (Block<'k>, Option<Block<'k>>),
    Online { m, l, acc }: Online<'k>,
    is_causal: bool,
    scale: f64,
) {
    let (bq, e) = (acc.shape()[0], acc.shape()[1]);
    let bk = key.shape()[1];
    // -0 is PyTorch's `None`: 1 / sqrt(E); an explicit 0 is a zero scale.
    let scale =
        if scale == 0.0 && scale.is_sign_negative() { 1.0 / (e as f64).sqrt() } else { scale };
    let (i, j) = (k.program_id(1), k.program_id(2));
    k.when(j.eq(0), || {
        m.store(k.full(DType::F32, &[bq, 1], MASK));
        l.store(k.zeros(DType::F32, &[bq, 1]));
        acc.store(k.zeros(DType::F32, &[bq, e]));
    });
    let step = || {
        let q = query.load().reshape(&[bq, e]);
        let v = value.load().reshape(&[bk, e]);
        let mut s = q.matmul_t(key.load().reshape(&[bk, e])) * scale;
        if let Some(mask) = mask {
            // `[mq, bk]` (or `[1, mq, bk]`), `mq` 1 when the mask broadcasts along the queries.
            let shape = mask.shape();
            let rows = shape[shape.len() - 2..].to_vec();
            s = s + mask.load().reshape(&rows).cast(DType::F32);
        }
        if is_causal {
            let row = k.iota(&[bq, bk], 0) + (i * bq as i64).broadcast_to(&[bq, bk]);
            let col = k.iota(&[bq, bk], 1) + (j * bk as i64).broadcast_to(&[bq, bk]);
            s = col.le(row).select(s, MASK);
        }
        let m_prev = m.load();
        let m_new = m_prev.maximum(s.amax(-1));
        let p = (s - m_new).exp();
        let alpha = (m_prev - m_new).exp();
        l.store(l.load() * alpha + p.sum(-1));
        acc.store(acc.load() * alpha + p.matmul(v.cast(DType::F32)));
        m.store(m_new);
    };
    if is_causal {
        // A key block has work when its first key is at most the query block's last row.
        k.when((j * bk as i64).le(i * bq as i64 + (bq as i64 - 1)), step);
    } else {
        step();
    }
    k.when(j.eq(k.num_programs(2) - 1), || {
        let total = l.load();
        out.store((acc.load() / total).cast(out.dtype()).reshape(&[1, bq, e]));
        if let Some(logsumexp) = logsumexp {
            logsumexp.store((m.load() + total.log()).reshape(&[1, bq, 1]));
        }
    });
}

/// The flash-attention backward (`aten::_scaled_dot_product_flash_attention_for_cpu_backward`
/// without a mask): `(grad_query, grad_key, grad_value)`, grouped-query heads included.
///
/// With `G` key/value heads and `group = H / G` query heads each, the query-side arrays are
/// seen as `[B * G, group, L, E]` (a free reshape: the heads of one group are adjacent) and the
/// grid is `(B * G, S / bk, group, L / bq)`: for each key/value block `j`, the query blocks `i`
/// of every head `h` of its group run in order (all but the first axis `arbitrary`), and per
/// step, with `p = exp(q kᵀ * scale - logsumexp)` recomputed from the forward's saved statistics
/// and `delta = rowsum(grad_out * out)`: `dv += pᵀ grad_out`, `ds = p * (grad_out vᵀ - delta) *
/// scale`, `dk += dsᵀ q` (f32 scratch of the key/value block, summed over the group's heads and
/// written when its last query block is done) and `dq[h, i] += ds k` (an f32 scratch of the
/// group's whole query length, written at the group's last step). With `is_causal` a query
/// block wholly before a key block is skipped. 16-bit inputs stay with the StableHLO backward:
/// `delta` from a saved 16-bit `out` is off by its rounding, which puts `grad_query` past the
/// harness's tolerance where rows cancel (PyTorch's own CPU backward misses it by 190x); the
/// StableHLO backward recomputes the output in f32.
#[tpu_kernel(
    aten = "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    schema(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask, scale),
    dtypes = [f32],
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
    priority = -1,
    tiled(
        tiles(
            BG = B * G,
            group = H / G,
            GL = group * L,
            bq = tile(L, 128, 8),
            bk = tile(S, 128, 8),
        ),
        grid = [BG, S / bk, group, L / bq],
        semantics = [parallel, arbitrary, arbitrary, arbitrary],
        inputs(
            grad_out = block([1, 1, bq, E], |g, j, h, i| (g, h, i, 0)).view([BG, group, L, E]),
            query = block([1, 1, bq, E], |g, j, h, i| (g, h, i, 0)).view([BG, group, L, E]),
            key = block([1, bk, E], |g, j, h, i| (g, j, 0)).view([BG, S, E]),
            value = block([1, bk, E], |g, j, h, i| (g, j, 0)).view([BG, S, E]),
            out = block([1, 1, bq, E], |g, j, h, i| (g, h, i, 0)).view([BG, group, L, E]),
            logsumexp = block([1, 1, bq, 1], |g, j, h, i| (g, h, i, 0)).view([BG, group, L, 1]),
        ),
        outputs(
            grad_query = block([1, GL, E], |g, j, h, i| (g, 0, 0)).view([BG, GL, E]),
            grad_key = block([1, bk, E], |g, j, h, i| (g, j, 0)).view([BG, S, E]),
            grad_value = block([1, bk, E], |g, j, h, i| (g, j, 0)).view([BG, S, E]),
        ),
        scratch(dq = vmem(f32, [GL, E]), dk = vmem(f32, [bk, E]), dv = vmem(f32, [bk, E])),
    ),
    canonical = [
        "f32[1,2,256,128], f32[1,2,256,128], f32[1,2,256,128], f32[1,2,256,128], f32[1,2,256,128], f32[1,2,256]; is_causal=true",
        "f32[1,2,128,128], f32[1,2,128,128], f32[1,2,384,128], f32[1,2,384,128], f32[1,2,128,128], f32[1,2,128]",
        "f32[2,2,16,32], f32[2,2,16,32], f32[2,2,24,32], f32[2,2,24,32], f32[2,2,16,32], f32[2,2,16]; is_causal=true, scale=0.3",
        "f32[1,4,256,64], f32[1,4,256,64], f32[1,2,256,64], f32[1,2,256,64], f32[1,4,256,64], f32[1,4,256]; is_causal=true",
    ],
)]
#[allow(
    clippy::too_many_arguments,
    reason = "the op's six inputs, three outputs, three accumulators"
)]
pub fn tiled_sdpa_flash_backward(
    k: &Tiled,
    grad_out: Block,
    query: Block,
    key: Block,
    value: Block,
    out: Block,
    logsumexp: Block,
    grad_query: Block,
    grad_key: Block,
    grad_value: Block,
    dq: Block,
    dk: Block,
    dv: Block,
    dropout_p: f64,
    is_causal: bool,
    scale: f64,
) {
    let _ = dropout_p;
    let (bk, e) = (dk.shape()[0], dk.shape()[1]);
    let (group_len, bq) = (dq.shape()[0], query.shape()[2]);
    let l_len = bq * k.grid()[3];
    let scale =
        if scale == 0.0 && scale.is_sign_negative() { 1.0 / (e as f64).sqrt() } else { scale };
    let (j, h, i) = (k.program_id(1), k.program_id(2), k.program_id(3));
    let last = |axis: usize| k.program_id(axis).eq(k.num_programs(axis) - 1);
    let first = |axis: usize| k.program_id(axis).eq(0);
    k.when(first(1), || {
        k.when(first(2), || k.when(first(3), || dq.store(k.zeros(DType::F32, &[group_len, e]))))
    });
    k.when(first(2), || {
        k.when(first(3), || {
            dk.store(k.zeros(DType::F32, &[bk, e]));
            dv.store(k.zeros(DType::F32, &[bk, e]));
        })
    });
    let step = || {
        let rows = [bq, e];
        let (q, g, o) = (
            query.load().reshape(&rows),
            grad_out.load().reshape(&rows),
            out.load().reshape(&rows),
        );
        let kk = key.load().reshape(&[bk, e]);
        let v = value.load().reshape(&[bk, e]);
        let mut s = q.matmul_t(kk) * scale;
        if is_causal {
            let row = k.iota(&[bq, bk], 0) + (i * bq as i64).broadcast_to(&[bq, bk]);
            let col = k.iota(&[bq, bk], 1) + (j * bk as i64).broadcast_to(&[bq, bk]);
            s = col.le(row).select(s, MASK);
        }
        let p = (s - logsumexp.load().reshape(&[bq, 1])).exp();
        dv.store(dv.load() + p.t_matmul(g.cast(DType::F32)));
        let delta = (g.cast(DType::F32) * o.cast(DType::F32)).sum(-1);
        let dp = g.matmul_t(v);
        let d_s = p * (dp - delta) * scale;
        dk.store(dk.load() + d_s.t_matmul(q.cast(DType::F32)));
        let row0 = (h * l_len as i64 + i * bq as i64).multiple_of(bq);
        let at = [ds(row0, bq), all()];
        dq.store_at(&at, dq.load_at(&at) + d_s.matmul(kk.cast(DType::F32)));
    };
    if is_causal {
        // A query block has work when its last row reaches the key block's first key.
        k.when((j * bk as i64).le(i * bq as i64 + (bq as i64 - 1)), step);
    } else {
        step();
    }
    k.when(last(2), || {
        k.when(last(3), || {
            grad_key.store(dk.load().cast(grad_key.dtype()).reshape(&[1, bk, e]));
            grad_value.store(dv.load().cast(grad_value.dtype()).reshape(&[1, bk, e]));
        })
    });
    k.when(last(1), || {
        k.when(last(2), || {
            k.when(last(3), || {
                let dq_all = dq.load().cast(grad_query.dtype());
                grad_query.store(dq_all.reshape(&[1, group_len, e]));
            })
        })
    });
}
