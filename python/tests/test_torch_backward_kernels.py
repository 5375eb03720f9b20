"""The softmax, log-softmax and layer-norm backward kernels where training reaches them: eager
autograd under every substitution mode and aot_autograd's backward graph under torch.compile,
against plain PyTorch; and the calls they must leave to PyTorch (an output mask that leaves an
output out, a `half_to_float` forward)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

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
    got = torch.compile(step, backend="tpu_kernels")()
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    kernels = {k for g in report().compiled["graphs"][n:] for k in g["kernels"]}
    assert set(BACKWARD_OPS.values()) <= kernels, kernels


def test_an_output_mask_that_leaves_an_output_out_falls_back():
    """`native_layer_norm_backward` with `output_mask=[True, False, True]`: PyTorch returns None
    for the grad it was not asked for; the kernel computes all three, so the call is PyTorch's."""
    x, w, b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
    _, mean, rstd = torch.native_layer_norm(x, [8], w, b, 1e-5)
    g = torch.randn(4, 8)
    op = "aten::native_layer_norm_backward.default"
    before = report().ops.get(op, {}).get("fallbacks", {}).get("bad_input", 0)
    with substitute("strict"):
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(g, x, [8], mean, rstd, w, b, [True, False, True])
    assert dw is None and dx is not None and db is not None
    r = report().ops[op]
    assert r["fallbacks"]["bad_input"] == before + 1
    assert "`output_mask` is [True, False, True]" in r["last_fallback"]


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
