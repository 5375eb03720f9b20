"""Kernels that define new ops appear as torch.library custom ops that pass opcheck."""

import contextlib

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


def _new_op_kernels():
    import tpu_kernels as tk

    return sorted(
        (k for k in tk.kernels() if k["canonical"] and any(o.startswith("tpuk::") for o in k["ops"])),
        key=lambda k: k["name"],
    )


_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "i64": torch.int64}


def _canonical_args(kernel):
    """Arguments for the kernel's op from its first canonical signature: random tensors
    (class indices within the logits' width, a positive step count), then the statics."""
    tensors_text, _, statics_text = kernel["canonical"][0].partition(";")
    g = torch.Generator().manual_seed(0)
    shapes = []
    for t in tensors_text.split("],"):
        dtype, _, dims = t.strip().rstrip("]").partition("[")
        shapes.append((_DTYPES[dtype.strip()], [int(d) for d in dims.split(",") if d.strip()]))
    args = []
    by_name = dict(zip(kernel["inputs"], shapes))
    for name, (dtype, dims) in zip(kernel["inputs"], shapes):
        if dtype == torch.int64:
            high = by_name["logits"][1][-1] if name == "target" else 2**31
            args.append(torch.randint(0, high, dims, generator=g))
        elif name == "step":
            args.append(torch.full(dims, 3.0))
        else:
            args.append(torch.randn(dims, generator=g).to(dtype))
    kinds = {s[0]: s[1] for s in kernel["statics"]}
    statics = {}
    for part in statics_text.split(","):
        if "=" in part:
            k, v = (x.strip() for x in part.split("=", 1))
            statics[k] = {"float": float, "int": int, "bool": lambda t: t == "true"}.get(kinds[k], str)(v)
    return tuple(args), statics


@pytest.mark.parametrize("kernel", _new_op_kernels(), ids=lambda k: k["name"])
def test_opcheck(kernel):
    """Every new op a standard kernel defines passes opcheck (schema, fake function, autograd
    registration, aot dispatch) at its first canonical signature, and the kernel computes it."""
    from tpu_kernels.testing import force_tiled, no_fallbacks

    custom_ops()
    (op,) = [o for o in kernel["ops"] if o.startswith("tpuk::")]
    overload = getattr(torch.ops.tpuk, op.split("::")[1].split(".")[0]).default
    args, statics = _canonical_args(kernel)
    # A tiled kernel is below its StableHLO counterpart on the CPU: forced, its twin runs.
    tiled = force_tiled() if kernel["tiled"] else contextlib.nullcontext()
    with tiled, no_fallbacks(kernels=[kernel["name"]]):
        torch.library.opcheck(overload, args, statics)


def test_custom_op_under_compile_is_inlined():
    custom_ops()
    import tpu_kernels.torch.backend  # noqa: F401
    from tpu_kernels.torch import report

    x, w = torch.randn(4, 32), torch.randn(32)
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: torch.ops.tpuk.rms_norm(a, b) * 2, backend="tpu_kernels", fullgraph=True)
    from tpu_kernels.testing import no_fallbacks

    with no_fallbacks(kernels=["rms_norm"], programs=1):
        out = f(x, w)
    torch.testing.assert_close(out, rms_ref(x, w) * 2, rtol=1e-5, atol=1e-5)
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
