"""Pattern fusion in compiled graphs: RMSNorm as torch.compile decomposes it becomes
`tpuk::rms_norm`, and a linear layer's matmul with its activation becomes `tpuk::matmul_bias_act`
(`tpuk::matmul_act` without a bias), in inference graphs; a training graph that saves the
intermediates for its backward keeps the decomposed ops. Values match PyTorch eager."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tpu_kernels.torch  # noqa: E402,F401  (registers the backend)
from tpu_kernels.testing import no_fallbacks  # noqa: E402
from tpu_kernels.torch import report, substitute  # noqa: E402

g = torch.Generator().manual_seed(0)
X, W = torch.randn(2, 8, 32, generator=g), torch.randn(32, generator=g)
A, WL, B = torch.randn(16, 32, generator=g), torch.randn(64, 32, generator=g), torch.randn(64, generator=g)

CASES = {
    "F.rms_norm": (lambda x, w: F.rms_norm(x, [32], w, 1e-6), (X, W), "rms_norm"),
    "written-out rms_norm": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w, (X, W), "rms_norm"),
    "weight first, x*x": (lambda x, w: w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)), (X, W), "rms_norm"),
    "linear+gelu": (lambda a, w, b: F.gelu(F.linear(a, w, b)), (A, WL, B), "matmul_bias_act"),
    "linear+silu (3-d input)": (lambda a, w, b: F.silu(F.linear(a.view(2, 8, 32), w, b)), (A, WL, B), "matmul_bias_act"),
    "linear+relu": (lambda a, w, b: F.relu(F.linear(a, w, b)), (A, WL, B), "matmul_bias_act"),
    "matmul+gelu(tanh)": (lambda a, w: F.gelu(a @ w.t(), approximate="tanh"), (A, WL), "matmul_act"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_inference_graph_fuses(name):
    f, args, kernel = CASES[name]
    n = len(report().compiled["graphs"])
    with torch.no_grad():
        with no_fallbacks(kernels=[kernel], programs=1) as ran:
            out = torch.compile(f, backend="tpu_kernels")(*args)
        ref = f(*args)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=4e-6)
    kernels = [k for gr in report().compiled["graphs"][n:] for k in gr["kernels"]]
    assert kernels == [kernel], kernels
    assert ran.kernels == {kernel: 1}, ran.kernels  # lowered into the program, and ran there once


# `F.rms_norm` in eager adds eps in place (`add_` on an intermediate): recorded as `add`.
@pytest.mark.parametrize("name", ["F.rms_norm", "written-out rms_norm", "linear+gelu"])
def test_fused_eager_mode_fuses_the_recorded_chain(name):
    f, args, kernel = CASES[name]
    with no_fallbacks(kernels=[kernel], programs=1):
        with substitute("fused"):
            out = f(*args)
            out = out + 0  # recorded
    torch.testing.assert_close(out, f(*args), rtol=1e-5, atol=4e-6)


def test_training_graph_keeps_the_saved_intermediates():
    x = X.clone().requires_grad_()
    w = W.clone().requires_grad_()

    def f(x, w):
        return F.rms_norm(x, [32], w, 1e-6)

    n = len(report().compiled["graphs"])
    with no_fallbacks(programs=2):
        out = torch.compile(f, backend="tpu_kernels")(x, w)
        out.sum().backward()
    ref_x, ref_w = X.clone().requires_grad_(), W.clone().requires_grad_()
    f(ref_x, ref_w).sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-5, atol=4e-6)
    torch.testing.assert_close(w.grad, ref_w.grad, rtol=1e-5, atol=4e-5)
    forward = report().compiled["graphs"][n]
    assert "rms_norm" not in forward["kernels"], forward


def test_fused_mode_records_in_place_ops_on_pending_values():
    """`y.add_(1)` on a value the recording produced becomes `add` (no materialisation); on a
    user's tensor, or on a pending value a view aliases, it materialises and mutates for real."""
    x = torch.randn(64, 32)
    flushes = report().fused["flushes"]
    with substitute("fused"):
        y = torch.exp(x)
        y.add_(1.0)
        y.mul_(2.0)
        z = torch.tanh(y)
    assert report().fused["flushes"] == flushes + 1  # only leaving the mode
    torch.testing.assert_close(z, torch.tanh((torch.exp(x) + 1.0) * 2.0))

    user = x.clone()
    with substitute("fused"):
        e = torch.exp(x)
        user.add_(e)  # the user's own tensor: mutated for real
        v = e.view(-1)
        e.mul_(3.0)  # a view aliases `e`: materialises
    torch.testing.assert_close(user, x + torch.exp(x))
    torch.testing.assert_close(e, torch.exp(x) * 3.0)
    torch.testing.assert_close(v, (torch.exp(x) * 3.0).view(-1))


def test_fused_mode_in_place_on_a_view_reaches_its_base():
    """`v = e.view(-1); v.mul_(3)` on a pending `e`: the write must show in `e` (the view is not
    re-pointed on its own)."""
    x = torch.randn(16, 8)
    with substitute("fused"):
        e = torch.exp(x)
        v = e.view(-1)
        v.mul_(3.0)
        w = torch.tanh(e)
    torch.testing.assert_close(e, torch.exp(x) * 3.0)
    torch.testing.assert_close(v, (torch.exp(x) * 3.0).view(-1))
    torch.testing.assert_close(w, torch.tanh(torch.exp(x) * 3.0))
