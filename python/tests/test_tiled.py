"""Tiled (Mosaic) kernels end to end on the CPU: with tiled kernels forced
(`tpu_kernels.testing.force_tiled`), the tiled matmul-with-epilogue and RMSNorm run as their
CPU twins under eager strict and fused modes and under ``torch.compile``, and match PyTorch;
a block of layer norm, causal flash attention and log-softmax trains (forward and backward)
through the tiled kernels in eager strict mode and under ``torch.compile``, and so does a
language-model head with grouped-query attention and the tiled cross-entropy over vocabulary
tiles.
Each block demands that the tiled kernel itself ran (`no_fallbacks(kernels=[...])`); without
forcing, the CPU takes the StableHLO kernels instead.
"""

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
import tpu_kernels as tk  # noqa: E402
from tpu_kernels.testing import force_tiled, no_fallbacks  # noqa: E402
from tpu_kernels.torch import custom_ops, substitute  # noqa: E402

custom_ops()  # torch.ops.tpuk.*

TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 2e-2)}


def _rms(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def test_selection_takes_the_tiled_variant_only_when_forced():
    sig = "f32[16,256], f32[256,384], f32[384]"
    assert tk.select("tpuk::matmul_bias_act", sig, {"activation": "gelu_tanh"}) == "matmul_bias_act"
    with force_tiled():
        assert tk.select("tpuk::matmul_bias_act", sig, {"activation": "gelu_tanh"}) == "tiled_matmul_bias_act"
    assert tk.select("tpuk::matmul_bias_act", sig, {"activation": "gelu_tanh"}, platform="tpu") == (
        "tiled_matmul_bias_act"
    )
    assert tk.kernel("tiled_rms_norm")["tiled"] and not tk.kernel("rms_norm")["tiled"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_eager_strict_runs_the_tiled_kernels(dtype):
    custom_ops()
    torch.manual_seed(0)
    x = torch.randn(2, 64, 256).to(dtype)
    w = torch.randn(256).to(dtype)
    a = torch.randn(16, 512).to(dtype)
    b = (torch.randn(512, 384) / 512**0.5).to(dtype)
    bias = torch.randn(384).to(dtype)
    with force_tiled(), no_fallbacks(kernels=["tiled_rms_norm", "tiled_matmul_bias_act"]):
        with substitute("strict"):
            y = torch.ops.tpuk.rms_norm(x, w, 1e-6)
            z = torch.ops.tpuk.matmul_bias_act(a, b, bias, "gelu_tanh")
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(y, _rms(x, w), rtol=rtol, atol=atol)
    ref = F.gelu(a.float() @ b.float() + bias.float(), approximate="tanh").to(dtype)
    torch.testing.assert_close(z, ref, rtol=rtol, atol=atol)


def test_fused_mode_inlines_the_tiled_kernels():
    torch.manual_seed(1)
    lin = torch.nn.Linear(256, 384)
    x = torch.randn(16, 256)
    w = torch.randn(384)

    def f(t):
        return F.rms_norm(F.gelu(lin(t)), [384], w, 1e-6)

    with torch.no_grad():
        expected = f(x)
        with force_tiled(), no_fallbacks(kernels=["tiled_matmul_bias_act", "tiled_rms_norm"], programs=1):
            with substitute("fused"):
                got = f(x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_torch_compile_runs_the_tiled_kernels():
    torch.manual_seed(2)
    lin = torch.nn.Linear(256, 384)
    x = torch.randn(16, 256)

    def f(t):
        return F.silu(lin(t))

    torch._dynamo.reset()
    with torch.no_grad(), force_tiled(), no_fallbacks(kernels=["tiled_matmul_bias_act"], programs=1):
        got = torch.compile(f, backend="tpu_kernels")(x)
    torch.testing.assert_close(got, f(x), rtol=1e-5, atol=1e-5)


def test_interpreter_reads_the_printed_text_and_refuses_what_is_not_tiled():
    from tpu_kernels import _native

    x = torch.randn(8, 128, dtype=torch.float64)
    w = torch.randn(128, dtype=torch.float64)
    (out,) = _native.tiled_interpret("tiled_rms_norm", "f32[8,128], f32[128]", [x.flatten().tolist(), w.tolist()])
    got = torch.tensor(out).reshape(8, 128)
    torch.testing.assert_close(got.float(), _rms(x.float(), w.float()), rtol=2e-5, atol=2e-5)
    with pytest.raises(tk.SignatureMismatchError, match="not a tiled kernel"):
        _native.tiled_interpret("rms_norm", "f32[8,128], f32[128]", [x.flatten().tolist(), w.tolist()])


def _block(x, ln_w, ln_b, heads=2):
    """Layer norm, causal self-attention over `heads` heads and log-softmax, as a model's
    block computes them (the ATen ops the tiled row and attention kernels bind)."""
    b, l, d = x.shape
    h = F.layer_norm(x, [d], ln_w, ln_b)
    q = h.view(b, l, heads, d // heads).transpose(1, 2)
    a = F.scaled_dot_product_attention(q, q * 0.5, q, is_causal=True)
    return F.log_softmax(a.transpose(1, 2).reshape(b, l, d), -1)


TRAINING_KERNELS = [
    "tiled_layer_norm",
    "tiled_sdpa_flash",
    "tiled_log_softmax",
    "tiled_log_softmax_backward",
    "tiled_sdpa_flash_backward",
    "tiled_layer_norm_backward",
]
TRAINING_OPS = [
    "aten::native_layer_norm.default",
    "aten::native_layer_norm_backward.default",
    "aten::_scaled_dot_product_flash_attention_for_cpu.default",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward.default",
    "aten::_log_softmax.default",
    "aten::_log_softmax_backward_data.default",
]


def _leaves(seed):
    torch.manual_seed(seed)
    x = torch.randn(2, 256, 256, requires_grad=True)
    w = (1 + 0.1 * torch.randn(256)).requires_grad_()
    b = (0.1 * torch.randn(256)).requires_grad_()
    return x, w, b


def _grads(fn, seed):
    x, w, b = _leaves(seed)
    out = fn(x, w, b)
    out.backward(torch.cos(torch.arange(out.numel(), dtype=torch.float32)).view_as(out))
    return out.detach(), x.grad, w.grad, b.grad


def test_eager_strict_trains_through_the_tiled_attention_and_row_kernels():
    """Forward and backward of layer norm, causal flash attention and log-softmax in eager
    strict mode, tiled kernels forced: each tiled kernel ran (none fell back), and the output
    and the gradients match PyTorch's."""
    expected = _grads(_block, 3)
    with force_tiled(), no_fallbacks(kernels=sorted(set(TRAINING_KERNELS)), ops=TRAINING_OPS):
        with substitute("strict"):
            got = _grads(_block, 3)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=2e-4, atol=2e-4)


def test_torch_compile_trains_through_the_tiled_attention_and_row_kernels():
    """The same block under ``torch.compile`` (forward and backward graphs lowered to programs),
    tiled kernels forced: the tiled kernels ran inside the programs."""
    expected = _grads(_block, 4)
    torch._dynamo.reset()
    compiled = torch.compile(_block, backend="tpu_kernels")
    with force_tiled(), no_fallbacks(kernels=sorted(set(TRAINING_KERNELS)), programs=2):
        got = _grads(compiled, 4)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=2e-4, atol=2e-4)


def test_eager_strict_runs_the_masked_tiled_attention():
    """An additive [L, S] float mask (a banded one) goes to the masked tiled flash kernel."""
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 2, 256, 64) for _ in range(3))
    band = torch.ones(256, 256).triu(-32).tril(32).bool()
    mask = torch.zeros(256, 256).masked_fill(~band, -1e4)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with force_tiled(), no_fallbacks(kernels=["tiled_sdpa_flash_masked"], ops=TRAINING_OPS):
        with substitute("strict"):
            got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-5)


def test_eager_strict_runs_the_broadcast_boolean_mask_tiled_attention():
    """A boolean key-padding mask [B, 1, 1, S] (the shape transformers builds), which SDPA turns
    into an additive one, goes to the 4-D masked tiled flash kernel, its broadcast dims read in
    place; grouped-query heads too."""
    torch.manual_seed(6)
    q = torch.randn(2, 4, 128, 64)
    k, v = (torch.randn(2, 2, 256, 64) for _ in range(2))
    keep = torch.ones(2, 1, 1, 256, dtype=torch.bool)
    keep[0, ..., 200:] = False
    keep[1, ..., 64:] = False
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
    with force_tiled(), no_fallbacks(kernels=["tiled_sdpa_flash_masked_4d"], ops=TRAINING_OPS):
        with substitute("strict"):
            got = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
    torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-5)


# ----- a language-model head: grouped-query attention and cross-entropy over vocabulary tiles -----

VOCAB = 4096  # two vocabulary tiles of 2048


def _lm_logits(x, ln_w, ln_b, kv, vocab):
    """Layer norm, causal attention with 4 query heads over 2 key/value heads and a projection
    to the vocabulary: logits `[B * L, VOCAB]`."""
    b, l, d = x.shape
    h = F.layer_norm(x, [d], ln_w, ln_b)
    q = h.view(b, l, 4, d // 4).transpose(1, 2)
    k = (h @ kv[0]).view(b, l, 2, d // 4).transpose(1, 2)
    v = (h @ kv[1]).view(b, l, 2, d // 4).transpose(1, 2)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return a.transpose(1, 2).reshape(b * l, d) @ vocab


def _lm_loss(x, ln_w, ln_b, kv, vocab, target):
    """The head's logits through `tpuk::cross_entropy`: a scalar loss."""
    return torch.ops.tpuk.cross_entropy(_lm_logits(x, ln_w, ln_b, kv, vocab), target)


LM_KERNELS = [
    "tiled_layer_norm",
    "tiled_sdpa_flash",
    "tiled_cross_entropy",
    "tiled_cross_entropy_backward",
    "tiled_sdpa_flash_backward",
    "tiled_layer_norm_backward",
]
LM_OPS = [
    "aten::native_layer_norm.default",
    "aten::native_layer_norm_backward.default",
    "aten::_scaled_dot_product_flash_attention_for_cpu.default",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward.default",
    "tpuk::cross_entropy.default",
    "tpuk::cross_entropy_backward.default",
]


def _lm_grads(fn, seed):
    torch.manual_seed(seed)
    d = 256
    x = torch.randn(2, 128, d, requires_grad=True)
    ln_w = (1 + 0.1 * torch.randn(d)).requires_grad_()
    ln_b = (0.1 * torch.randn(d)).requires_grad_()
    kv = (torch.randn(2, d, d // 2) / d**0.5).requires_grad_()
    vocab = (torch.randn(d, VOCAB) / d**0.5).requires_grad_()
    target = torch.randint(0, VOCAB, (2 * 128,))
    loss = fn(x, ln_w, ln_b, kv, vocab, target)
    loss.backward()
    return loss.detach(), x.grad, ln_w.grad, ln_b.grad, kv.grad, vocab.grad


def _lm_expected(seed):
    """The same model with PyTorch's cross-entropy: every row's target is in range, so the two
    losses are the same function."""

    def fn(x, ln_w, ln_b, kv, vocab, target):
        return F.cross_entropy(_lm_logits(x, ln_w, ln_b, kv, vocab), target)

    return _lm_grads(fn, seed)


def test_eager_strict_trains_an_lm_head_through_gqa_attention_and_tiled_cross_entropy():
    """Forward and backward of a language-model head in eager strict mode, tiled kernels forced:
    the grouped-query flash forward and backward and the tiled cross-entropy and its backward
    ran (none fell back), and the loss and every gradient match PyTorch's."""
    expected = _lm_expected(6)
    with force_tiled(), no_fallbacks(kernels=LM_KERNELS, ops=LM_OPS):
        with substitute("strict"):
            got = _lm_grads(_lm_loss, 6)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=2e-4, atol=2e-4)


def test_torch_compile_trains_an_lm_head_through_gqa_attention_and_tiled_cross_entropy():
    """The same head under ``torch.compile``: the tiled kernels ran inside the forward and
    backward programs."""
    expected = _lm_expected(7)
    torch._dynamo.reset()
    compiled = torch.compile(_lm_loss, backend="tpu_kernels")
    with force_tiled(), no_fallbacks(kernels=LM_KERNELS, programs=2):
        got = _lm_grads(compiled, 7)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=2e-4, atol=2e-4)
