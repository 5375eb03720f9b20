"""Kernels that define new ops appear as torch.library custom ops that pass opcheck."""

import pytest

torch = pytest.importorskip("torch")
from tpu_kernels.torch import custom_ops  # noqa: E402


def rms_ref(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_ops_are_registered():
    ops = custom_ops()
    assert {"tpuk::rms_norm.default", "tpuk::matmul_bias_act.default"} <= set(ops)
    assert "eps" in str(torch.ops.tpuk.rms_norm.default._schema)


def test_values():
    custom_ops()
    x, w = torch.randn(4, 32), torch.randn(32)
    torch.testing.assert_close(torch.ops.tpuk.rms_norm(x, w, 1e-5), rms_ref(x, w, 1e-5), rtol=1e-5, atol=1e-5)
    a, b, c = torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)
    torch.testing.assert_close(
        torch.ops.tpuk.matmul_bias_act(a, b, c, "relu"), torch.relu(a @ b + c), rtol=1e-5, atol=1e-5
    )


def test_fake_from_output_rule():
    custom_ops()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out = torch.ops.tpuk.matmul_bias_act(torch.empty(8, 16), torch.empty(16, 4), torch.empty(4))
    assert out.shape == (8, 4) and out.dtype == torch.float32
    meta = torch.ops.tpuk.rms_norm(torch.empty(3, 5, 8, device="meta"), torch.empty(8, device="meta"))
    assert meta.shape == (3, 5, 8)


@pytest.mark.parametrize(
    "op,args",
    [
        ("rms_norm", lambda: (torch.randn(4, 32), torch.randn(32), 1e-6)),
        ("matmul_bias_act", lambda: (torch.randn(8, 16), torch.randn(16, 4), torch.randn(4), "gelu")),
    ],
)
def test_opcheck(op, args):
    custom_ops()
    torch.library.opcheck(getattr(torch.ops.tpuk, op).default, args())


def test_custom_op_under_compile_is_inlined():
    custom_ops()
    import tpu_kernels.torch.backend  # noqa: F401
    from tpu_kernels.torch import report

    x, w = torch.randn(4, 32), torch.randn(32)
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: torch.ops.tpuk.rms_norm(a, b) * 2, backend="tpu_kernels", fullgraph=True)
    torch.testing.assert_close(f(x, w), rms_ref(x, w) * 2, rtol=1e-5, atol=1e-5)
    assert "rms_norm" in report().compiled["graphs"][-1]["kernels"]


def test_kernel_refusal_runs_the_reference_or_is_an_error_not_a_crash(monkeypatch):
    """f64 is no kernel's dtype: the op's PyTorch reference answers; an op without a reference
    raises `KernelOpError` with the reason."""
    custom_ops()
    from tpu_kernels.torch import _references
    from tpu_kernels.torch._custom_ops import KernelOpError

    x, w = torch.randn(4, 32, dtype=torch.float64), torch.randn(32, dtype=torch.float64)
    torch.testing.assert_close(torch.ops.tpuk.rms_norm(x, w), rms_ref(x, w, 1e-6))
    monkeypatch.delitem(_references.REFERENCES, "tpuk::rms_norm.default")
    with pytest.raises(KernelOpError, match=r"tpuk::rms_norm: .*dtype f64 not in"):
        torch.ops.tpuk.rms_norm(x, w)


def test_autograd_from_the_backward_pairing():
    """`tpuk::rms_norm` names `rms_norm_backward`: its gradients come from that kernel and match
    autograd through the reference formula."""
    custom_ops()
    assert "tpuk::rms_norm_backward.default" in custom_ops()
    x = torch.randn(3, 5, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)
    g = torch.randn(3, 5, 32)
    torch.ops.tpuk.rms_norm(x, w, 1e-5).backward(g)
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    rms_ref(xr, wr, 1e-5).backward(g)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad, wr.grad, rtol=1e-5, atol=1e-5)


def test_opcheck_with_gradients():
    custom_ops()
    x = torch.randn(4, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)
    torch.library.opcheck(torch.ops.tpuk.rms_norm.default, (x, w, 1e-6))
