"""The softmax, log-softmax and layer-norm backward kernels where training reaches them: eager
autograd under every substitution mode and aot_autograd's backward graph under torch.compile,
against plain PyTorch; and the calls they must leave to PyTorch (an output mask that leaves an
output out, a `half_to_float` forward)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from tpu_kernels.testing import no_fallbacks  # noqa: E402
from tpu_kernels.torch import report, substitute  # noqa: E402

BACKWARD_OPS = {
    "aten::_softmax_backward_data.default": "softmax_backward",
    "aten::_log_softmax_backward_data.default": "log_softmax_backward",
    "aten::native_layer_norm_backward.default": "layer_norm_backward",
}


def _model_step():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 10))
    x, y = torch.randn(8, 16), torch.randint(0, 10, (8,))

    def step():
        m.zero_grad()
        out = m(x)
        loss = F.cross_entropy(out, y) + F.softmax(out, -1).pow(2).sum()
        loss.backward()
        return [loss.detach()] + [p.grad.clone() for p in m.parameters()]

    return step


def _kernel_counts() -> dict[str, int]:
    ops = report().ops
    return {op: ops.get(op, {}).get("kernels", {}).get(k, 0) for op, k in BACKWARD_OPS.items()}


@pytest.mark.parametrize("mode", ["strict", "debug"])
def test_eager_training_step_runs_the_backward_kernels(mode):
    step = _model_step()
    ref = step()
    before = _kernel_counts()
    with no_fallbacks(kernels=list(BACKWARD_OPS.values()), ops=list(BACKWARD_OPS)):
        with substitute(mode):
            got = step()
    after = _kernel_counts()
    assert all(after[op] == before[op] + 1 for op in BACKWARD_OPS), (before, after)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_compiled_backward_graph_inlines_the_backward_kernels():
    import tpu_kernels.torch  # noqa: F401  (registers the backend)

    step = _model_step()
    ref = step()
    n = len(report().compiled["graphs"])
    # The backward graph's program runs, and the backward kernels in it (counted at run time).
    with no_fallbacks(kernels=list(BACKWARD_OPS.values()), programs=2):
        got = torch.compile(step, backend="tpu_kernels")()
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    kernels = {k for g in report().compiled["graphs"][n:] for k in g["kernels"]}
    assert set(BACKWARD_OPS.values()) <= kernels, kernels


@pytest.mark.parametrize("mode", ["strict", "debug"])
def test_an_output_mask_leaves_outputs_out_as_pytorch_does(mode):
    """`native_layer_norm_backward` with `output_mask=[False, True, True]` (a pre-norm block's
    first norm, whose input needs no gradient): the kernel computes all three and the call
    returns None where PyTorch does."""
    x, w, b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
    _, mean, rstd = torch.native_layer_norm(x, [8], w, b, 1e-5)
    g = torch.randn(4, 8)
    op = "aten::native_layer_norm_backward.default"
    for mask in ([False, True, True], [True, False, True], [True, True, False]):
        ref = torch.ops.aten.native_layer_norm_backward(g, x, [8], mean, rstd, w, b, mask)
        before = _kernel_counts()[op]
        with substitute(mode):
            got = torch.ops.aten.native_layer_norm_backward(g, x, [8], mean, rstd, w, b, mask)
        assert _kernel_counts()[op] == before + 1
        for a, e, keep in zip(got, ref, mask):
            assert (a is None) == (e is None) == (not keep)
            if keep:
                torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def _pre_norm_encoder_step(seed: int):
    """A training step of a small `nn.TransformerEncoderLayer(norm_first=True)`, returning the
    parameter gradients: its first LayerNorm's backward asks for no input gradient."""
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
    x = torch.randn(2, 5, 32)

    def step():
        layer.zero_grad()
        layer(x).square().mean().backward()
        return [p.grad.clone() for p in layer.parameters()]

    return step


def test_pre_norm_encoder_trains_under_debug():
    """Under debug every substituted op is checked, and nothing falls back."""
    step = _pre_norm_encoder_step(1)
    ref = step()
    before = _kernel_counts()
    with substitute("debug"):
        got = step()
    op = "aten::native_layer_norm_backward.default"
    assert _kernel_counts()[op] == before[op] + 2
    for a, e in zip(got, ref):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


def test_a_half_to_float_softmax_backward_falls_back_with_the_reason():
    """`input_dtype` differing from the tensors' type (a `half_to_float` forward) is refused by
    the kernel body; the strict mode records why and PyTorch computes the gradient."""
    y = torch.softmax(torch.randn(4, 8), -1)
    g = torch.randn(4, 8)
    op = "aten::_softmax_backward_data.default"
    with substitute("strict"):
        got = torch._softmax_backward_data(g, y, -1, torch.bfloat16)
    torch.testing.assert_close(got, torch._softmax_backward_data(g, y, -1, torch.bfloat16))
    assert "input_dtype bfloat16 differs from the output's float32" in report().ops[op]["last_fallback"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_debug_mode_takes_16_bit_layer_norm(dtype):
    """PyTorch's CPU `native_layer_norm` keeps mean and rstd in the 16-bit input type where its
    meta function says f32; the kernel follows the CPU kernel and debug mode accepts that."""
    torch.manual_seed(0)
    ln = nn.LayerNorm(32).to(dtype)
    x = torch.randn(4, 32, dtype=dtype, requires_grad=True)
    ref = ln(x)
    ref.float().square().sum().backward()
    ref_grads = [x.grad.clone(), ln.weight.grad.clone()]
    x.grad, ln.weight.grad, ln.bias.grad = None, None, None
    with substitute("debug"):
        out = ln(x)
        out.float().square().sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, ref_grads[0], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(ln.weight.grad, ref_grads[1], rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("mode", ["strict", "debug", "fused", "compile"])
def test_bf16_pre_norm_encoder_training_step(mode):
    """A bf16 `TransformerEncoderLayer(norm_first=True)` step: LayerNorm's 16-bit mean and rstd
    (PyTorch's CPU dtype, not its meta function's f32) flow from the forward kernel to the
    backward, in every mode; results within bf16 rounding of plain PyTorch."""
    import tpu_kernels.torch  # noqa: F401  (registers the backend)

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True, norm_first=True,
                                       activation="gelu").to(torch.bfloat16)
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)

    def step():
        layer.zero_grad()
        y = layer(x)
        y.float().square().mean().backward()
        return [y.detach()] + [p.grad.clone() for p in layer.parameters()]

    ref = step()
    if mode == "compile":
        got = torch.compile(step, backend="tpu_kernels")()
    else:
        with substitute(mode):
            got = step()
    for a, b in zip(got, ref):
        scale = b.float().abs().max().item() + 1e-6
        assert (a.float() - b.float()).abs().max().item() <= 2**-6 * scale


def test_compiled_pre_norm_backward_keeps_partial_output_masks_in_the_graph():
    """The first norm's `native_layer_norm_backward` asks for no input gradient (FX gives None
    for it); the graph still declares that output's type, so the node stays in the lowered
    program, on the kernel, instead of splitting the graph."""
    import tpu_kernels.torch  # noqa: F401  (registers the backend)

    step = _pre_norm_encoder_step(2)
    ref = step()
    n = len(report().compiled["graphs"])
    eager_before = dict(report().compiled["eager_nodes"])
    with no_fallbacks(kernels=["layer_norm_backward"], programs=2) as ran:
        got = torch.compile(step, backend="tpu_kernels")()
    assert ran.kernels["layer_norm_backward"] == 2, ran.kernels
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    backward = [g for g in report().compiled["graphs"][n:] if g["name"].startswith("backward")]
    assert backward and backward[0]["kernels"].count("layer_norm_backward") == 2, backward
    assert report().compiled["eager_nodes"] == eager_before
