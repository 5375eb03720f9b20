"""`F.scaled_dot_product_attention` under eager substitution and torch.compile: the CPU
flash-attention overloads reach the kernel that takes exactly the call's tensors (with or without
`attn_mask`), head-transposed views are copied rather than falling back, and gradients match
PyTorch. `tpuk::attention` through its custom op and autograd pairing."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from tpu_kernels.testing import no_fallbacks  # noqa: E402
from tpu_kernels.torch import report, substitute  # noqa: E402
from tpu_kernels.torch._bindings import TABLE  # noqa: E402

FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu.default"
FLASH_BWD = "aten::_scaled_dot_product_flash_attention_for_cpu_backward.default"


def _kernel_counts(op: str) -> dict[str, int]:
    return dict(report().ops.get(op, {}).get("kernels", {}))


def _ran(before: dict[str, int], op: str) -> dict[str, int]:
    after = _kernel_counts(op)
    return {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}


def _qkv(b=2, h=4, l=5, s=7, e=8, hk=None, transposed=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    hk = hk or h
    if transposed:  # as models make them: [B, L, H, E] viewed as [B, H, L, E]
        q = torch.randn(b, l, h, e, generator=g).transpose(1, 2)
        k, v = (torch.randn(b, s, hk, e, generator=g).transpose(1, 2) for _ in range(2))
    else:
        q = torch.randn(b, h, l, e, generator=g)
        k, v = (torch.randn(b, hk, s, e, generator=g) for _ in range(2))
    return [t.requires_grad_() for t in (q, k, v)]


def _fwd_bwd(q, k, v, **kw):
    out = F.scaled_dot_product_attention(q, k, v, **kw)
    grad = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    return (out, *torch.autograd.grad(out, (q, k, v), grad))


@pytest.mark.parametrize(
    ("kw", "kernel"),
    [
        ({"is_causal": True}, "sdpa_flash_cpu"),
        ({"attn_mask": torch.randn(5, 7)}, "sdpa_flash_cpu_masked"),
        ({"attn_mask": torch.rand(2, 1, 5, 7) > 0.2}, "sdpa_flash_cpu_masked"),
        ({"scale": 0.25}, "sdpa_flash_cpu"),
    ],
    ids=["causal", "float-mask", "bool-mask", "scale"],
)
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "head-transposed"])
def test_sdpa_substitutes_forward_and_backward(kw, kernel, transposed):
    q, k, v = _qkv(transposed=transposed)
    if "attn_mask" in kw and kw["attn_mask"].dtype == torch.bool:
        kw["attn_mask"][..., 0] = True  # every row keeps a key
    ref = _fwd_bwd(q, k, v, **kw)
    before, before_bwd = _kernel_counts(FLASH), _kernel_counts(FLASH_BWD)
    with substitute("debug"):  # a fallback would raise
        got = _fwd_bwd(q, k, v, **kw)
    assert _ran(before, FLASH) == {kernel: 1}
    assert _ran(before_bwd, FLASH_BWD) == {f"{kernel}_backward": 1}
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-6)


def test_grouped_query_attention():
    q, k, v = _qkv(h=4, hk=2)
    ref = _fwd_bwd(q, k, v, is_causal=True, enable_gqa=True)
    before = _kernel_counts(FLASH_BWD)
    with substitute("strict"):
        got = _fwd_bwd(q, k, v, is_causal=True, enable_gqa=True)
    assert _ran(before, FLASH_BWD) == {"sdpa_flash_cpu_backward": 1}
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-6)


def test_a_kernel_never_drops_an_argument_it_does_not_take():
    """The plan's variant without a mask refuses a call that gives one; the masked variant
    takes it; a dtype the kernels do not take falls back to PyTorch."""
    plan = TABLE.plan(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
    plain = next(v for v in plan.variants if "sdpa_flash_cpu" in v.kernels)
    q, k, v = (t.detach() for t in _qkv())
    mask = torch.zeros(5, 7)
    reason = plain.bind((q, k, v), {"attn_mask": mask})
    assert reason == "argument `attn_mask` is given; kernel sdpa_flash_cpu / tiled_sdpa_flash does not take it"
    tensors, _ = plan.bind((q, k, v), {"attn_mask": mask})
    assert len(tensors) == 4 and tensors[3] is mask
    before = report().ops.get(FLASH, {}).get("fallbacks", {}).get("no_kernel", 0)
    q64, k64, v64 = (t.double() for t in (q, k, v))
    with substitute("strict"):
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q64, k64, v64, 0.0, True)
    ref = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q64, k64, v64, 0.0, True)
    torch.testing.assert_close(out[0], ref[0])
    assert report().ops[FLASH]["fallbacks"]["no_kernel"] == before + 1


def test_attention_op_autograd_and_opcheck():
    """`torch.ops.tpuk.attention` (additive mask) against the math, through its autograd pairing
    with `attention_backward` (the mask gets its gradient, summed over broadcast dims)."""
    from tpu_kernels.torch import custom_ops

    custom_ops()
    q, k, v = _qkv(h=4, hk=2)
    mask = torch.randn(2, 1, 5, 7, requires_grad=True)
    out = torch.ops.tpuk.attention(q, k, v, mask, True, 0.0)
    grad = torch.randn(out.shape)
    got = torch.autograd.grad(out, (q, k, v, mask), grad)

    qq, kk, vv, mm = (t.detach().double().requires_grad_() for t in (q, k, v, mask))
    kr, vr = kk.repeat_interleave(2, 1), vv.repeat_interleave(2, 1)
    causal = torch.ones(5, 7, dtype=torch.bool).tril()
    s = (qq @ kr.transpose(-1, -2)) / 8**0.5 + mm
    ref_out = torch.softmax(s.masked_fill(~causal, float("-inf")), -1) @ vr
    ref = torch.autograd.grad(ref_out, (qq, kk, vv, mm), grad.double())
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-6)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)
    torch.library.opcheck(torch.ops.tpuk.attention.default, (q, k, v, mask, True, 0.0))


def test_compiled_graph_inlines_the_masked_kernel():
    import tpu_kernels.torch  # noqa: F401  (registers the backend)

    q, k, v = (t.detach() for t in _qkv(seed=3))
    mask = torch.randn(5, 7)

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    n = len(report().compiled["graphs"])
    with no_fallbacks(kernels=["sdpa_flash_cpu_masked"], programs=1):
        out = torch.compile(f, backend="tpu_kernels")(q, k, v, mask)
    torch.testing.assert_close(out, f(q, k, v, mask), rtol=1e-5, atol=2e-6)
    graphs = report().compiled["graphs"][n:]
    assert any("sdpa_flash_cpu_masked" in g["kernels"] for g in graphs), graphs


def test_a_fully_masked_row_gives_zeros_as_pytorch():
    """A query row whose every key is masked out (-inf): PyTorch's CPU flash attention gives a
    zero output, a logsumexp of 0 and zero gradients; so do the kernels (no NaN)."""
    q, k, v = (t.detach() for t in _qkv(b=1, h=2, l=3, s=4, e=8))
    mask = torch.zeros(3, 4)
    mask[1, :] = float("-inf")
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    ref = flash(q, k, v, 0.0, False, attn_mask=mask)
    with substitute("debug"):
        got = flash(q, k, v, 0.0, False, attn_mask=mask)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-6)
    g = torch.randn(q.shape)
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    ref_grads = bwd(g, q, k, v, ref[0], ref[1], 0.0, False, attn_mask=mask)
    with substitute("debug"):
        grads = bwd(g, q, k, v, ref[0], ref[1], 0.0, False, attn_mask=mask)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-6)
        assert torch.isfinite(a).all()


def test_an_explicit_zero_scale_is_a_zero_scale():
    """`scale=0.0` (uniform attention) is not PyTorch's `None` (1/sqrt(E)): the kernels' default
    is -0.0, so an explicit 0 computes what PyTorch computes."""
    q, k, v = (t.detach() for t in _qkv())
    ref = F.scaled_dot_product_attention(q, k, v, scale=0.0)
    before = _kernel_counts(FLASH)
    with substitute("debug"):
        got = F.scaled_dot_product_attention(q, k, v, scale=0.0)
    assert _ran(before, FLASH) == {"sdpa_flash_cpu": 1}
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=2e-6)
