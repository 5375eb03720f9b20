//! Cross-entropy over vocabulary tiles as tiled (Mosaic) kernels: `tpuk::cross_entropy` and its
//! backward, bound where the StableHLO kernels bind.
//!
//! `logits [N, C]` is read in `[bn, bc]` blocks, the vocabulary along the sequential last grid
//! axis: an online logsumexp (a running row max `m` and sum `l` in f32 scratch, rescaled at each
//! vocabulary tile as flash attention's online softmax is) and the logit at each row's target
//! (picked by comparing the tile's column indices with it) give each row's loss `m + log(l) -
//! logits[target]` at the last tile, and the mean over rows is summed across the row blocks.
//! No `[N, C]` softmax is ever formed: a step holds one `[bn, bc]` block. Class indices arrive
//! as `i32` ([`crate::mosaic::window_dtype`]: Mosaic has no 64-bit integers; the wrapper
//! converts the caller's `i64`). As the StableHLO kernel, every row counts (no `ignore_index`),
//! and a target outside `0..C` picks no logit.
//!
//! Vocabulary tiles are multiples of 128 dividing `C` (at most 2048 wide), or the whole row
//! when `C <= 2048`: a vocabulary no such tile divides (GPT-2's 50257) is declined and the
//! StableHLO kernel takes it.

use super::tiled_attention::MASK;
use crate::mosaic::dsl::{Block, Tiled, Vector};
use crate::tpu_kernel;
use crate::{DType, ErrorKind};

/// The online logsumexp's state per row block (f32 scratch `[bn, 1]`): the running row max and
/// the running sum of `exp(logit - max)`.
struct RowStats<'k> {
    m: Block<'k>,
    l: Block<'k>,
}

impl<'k> RowStats<'k> {
    /// Reset at the first vocabulary tile (`j == 0`), then fold the tile's f32 logits `s` in.
    #[track_caller]
    fn fold(&self, k: &'k Tiled, j: Vector<'k>, s: Vector<'k>) {
        let rows = [s.shape()[0], 1];
        k.when(j.eq(0), || {
            self.m.store(k.full(DType::F32, &rows, MASK));
            self.l.store(k.zeros(DType::F32, &rows));
        });
        let m_prev = self.m.load();
        let m_new = m_prev.maximum(s.amax(-1));
        self.l.store(self.l.load() * (m_prev - m_new).exp() + (s - m_new).exp().sum(-1));
        self.m.store(m_new);
    }

    /// `log(sum(exp(row)))` of every row folded so far.
    #[track_caller]
    fn logsumexp(&self) -> Vector<'k> {
        self.m.load() + self.l.load().log()
    }
}

/// Where each row's target class falls in vocabulary tile `j` of `[bn, bc]` logits: an `i1`
/// `[bn, bc]` mask, true at `(r, c)` when `j * bc + c == target[r]`.
#[track_caller]
fn target_mask<'k>(k: &'k Tiled, j: Vector<'k>, target: Block<'k>, tile: [u64; 2]) -> Vector<'k> {
    let col = k.iota(&tile, 1) + (j * tile[1] as i64).broadcast_to(&tile);
    col.eq(target.load().broadcast_to(&tile))
}

/// Cross entropy with class indices, the mean over rows of `logsumexp(logits[i]) -
/// logits[i, target[i]]`, over vocabulary tiles with an online logsumexp (module docs). The
/// grid is `(N / bn, C / bc)`, both axes sequential: the rows' losses are summed in an f32
/// scratch across row blocks and the mean written at the last step. `found` counts the tiles
/// a row's target fell in (0 or 1), so that a target outside `0..C` adds 0.
#[tpu_kernel(
    op = "tpuk::cross_entropy",
    dtypes = [f32, bf16],
    shapes(logits = [N, C], target = i64[N]),
    output = like(logits, []),
    backward = tiled_cross_entropy_backward,
    priority = -1,
    tiled(
        tiles(bn = tile(N, 256, 8), bc = tile(C, 2048, 128)),
        grid = [N / bn, C / bc],
        semantics = [arbitrary, arbitrary],
        inputs(
            logits = block([bn, bc], |i, j| (i, j)),
            target = block([bn, 1], |i, j| (i, 0)).view([N, 1]),
        ),
        outputs(loss = block([1, 1], |i, j| (0, 0)).view([1, 1])),
        scratch(
            m = vmem(f32, [bn, 1]),
            l = vmem(f32, [bn, 1]),
            picked = vmem(f32, [bn, 1]),
            found = vmem(f32, [bn, 1]),
            total = vmem(f32, [1, 1]),
        ),
    ),
    canonical = [
        "f32[256,4096], i64[256]",
        "bf16[16,32000], i64[16]",
        "f32[7,33], i64[7]",
    ],
)]
#[allow(clippy::too_many_arguments, reason = "two inputs, one output, five scratch buffers")]
pub fn tiled_cross_entropy(
    k: &Tiled,
    logits: Block,
    target: Block,
    loss: Block,
    m: Block,
    l: Block,
    picked: Block,
    found: Block,
    total: Block,
) {
    let tile = [logits.shape()[0], logits.shape()[1]];
    let rows = tile[0] * k.grid()[0];
    let (i, j) = (k.program_id(0), k.program_id(1));
    let stats = RowStats { m, l };
    let s = logits.load().cast(DType::F32);
    stats.fold(k, j, s);
    k.when(j.eq(0), || {
        picked.store(k.zeros(DType::F32, &[tile[0], 1]));
        found.store(k.zeros(DType::F32, &[tile[0], 1]));
    });
    let hit = target_mask(k, j, target, tile);
    picked.store(picked.load() + hit.select(s, 0.0).sum(-1));
    found.store(found.load() + hit.select(k.full(DType::F32, &tile, 1.0), 0.0).sum(-1));
    k.when(j.eq(k.num_programs(1) - 1), || {
        // A row whose target is in no tile adds 0 (`found` is 0), as the StableHLO kernel.
        let row_loss = stats.logsumexp() * found.load() - picked.load();
        k.when(i.eq(0), || total.store(k.zeros(DType::F32, &[1, 1])));
        total.store(total.load() + row_loss.sum(0));
        k.when(i.eq(k.num_programs(0) - 1), || {
            loss.store((total.load() * (1.0 / rows as f64)).cast(loss.dtype()));
        });
    });
}

/// Gradient of [`fn@tiled_cross_entropy`] for `grad`, the gradient of its scalar output:
/// `(dlogits, dtarget)`, `dlogits = grad * (softmax(logits) - one_hot(target)) / N` and
/// `dtarget` zeros (class indices have no gradient). A row whose target is outside `0..C` adds
/// a constant 0 to the loss, so its gradient is 0.
///
/// Two passes over each row block's vocabulary tiles, the grid's middle axis `p`: at `p = 0`
/// the online logsumexp of the rows, at `p = 1` each tile's gradient from it,
/// `exp(logits - logsumexp)` less 1 at the target. The softmax is never held whole. The
/// gradient's block index does not depend on `p`, so the first pass writes each block once
/// more, with contents the second pass replaces (the cost of a fixed index map: logits are read
/// twice and the gradient written twice).
#[tpu_kernel(
    op = "tpuk::cross_entropy_backward",
    dtypes = [f32, bf16],
    shapes(grad = [..], logits = [N, C], target = i64[N]),
    output = [same_as(logits), same_as(target)],
    priority = -1,
    tiled(
        tiles(bn = tile(N, 256, 8), bc = tile(C, 2048, 128)),
        grid = [N / bn, 2, C / bc],
        semantics = [parallel, arbitrary, arbitrary],
        inputs(
            grad = block([1, 1], |i, p, j| (0, 0)).view([1, 1]),
            logits = block([bn, bc], |i, p, j| (i, j)),
            target = block([bn, 1], |i, p, j| (i, 0)).view([N, 1]),
        ),
        outputs(
            dlogits = block([bn, bc], |i, p, j| (i, j)),
            dtarget = block([bn, 1], |i, p, j| (i, 0)).view([N, 1]),
        ),
        scratch(m = vmem(f32, [bn, 1]), l = vmem(f32, [bn, 1]), found = vmem(f32, [bn, 1])),
    ),
    canonical = [
        "f32[], f32[256,4096], i64[256]",
        "bf16[], bf16[16,32000], i64[16]",
        "f32[1], f32[7,33], i64[7]",
    ],
)]
#[allow(clippy::too_many_arguments, reason = "three inputs, two outputs, three scratch buffers")]
pub fn tiled_cross_entropy_backward(
    k: &Tiled,
    grad: Block,
    logits: Block,
    target: Block,
    dlogits: Block,
    dtarget: Block,
    m: Block,
    l: Block,
    found: Block,
) {
    if grad.dtype() != logits.dtype() {
        k.fail(
            ErrorKind::Unsupported,
            format!("grad {} and logits {} differ in element type", grad.dtype(), logits.dtype()),
        );
        return;
    }
    let tile = [logits.shape()[0], logits.shape()[1]];
    let rows = tile[0] * k.grid()[0];
    let (p, j) = (k.program_id(1), k.program_id(2));
    let stats = RowStats { m, l };
    let s = logits.load().cast(DType::F32);
    let hit = target_mask(k, j, target, tile);
    k.when(p.eq(0), || {
        stats.fold(k, j, s);
        k.when(j.eq(0), || found.store(k.zeros(DType::F32, &[tile[0], 1])));
        found.store(found.load() + hit.select(k.full(DType::F32, &tile, 1.0), 0.0).sum(-1));
    });
    k.when(p.eq(1), || {
        let prob = (s - stats.logsumexp()).exp() * found.load();
        let scale = grad.load().cast(DType::F32) * (1.0 / rows as f64);
        dlogits.store((hit.select(prob - 1.0, prob) * scale).cast(dlogits.dtype()));
    });
    dtarget.store(k.zeros(DType::I32, &[tile[0], 1]));
}
