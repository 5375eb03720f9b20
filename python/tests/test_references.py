"""The PyTorch references of the standard new ops (`tpuk::*`): every one has a reference, each
agrees with its kernel on the numerics harness's inputs, and a call no kernel takes runs the
reference instead of raising."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tpu_kernels as tk  # noqa: E402
from tpu_kernels.torch import custom_ops, report  # noqa: E402
from tpu_kernels.torch._references import REFERENCES  # noqa: E402

from test_numerics import CASES, DTYPES, _seed  # noqa: E402

NEW_OP_CASES = [c for c in CASES if c.op.startswith("tpuk::")]


def test_every_standard_new_op_has_a_reference():
    ops = {op for k in tk.kernels() if not k["runtime"] for op in k["ops"] if op.startswith("tpuk::")}
    assert ops == set(REFERENCES), sorted(ops ^ set(REFERENCES))


@pytest.mark.parametrize("case", NEW_OP_CASES, ids=lambda c: c.id)
def test_reference_agrees_with_the_kernel(case):
    made = case.make(_seed(f"{case.id}-ref"))
    inputs = [
        t if t.dtype == torch.bool else t.long() if i in case.integer_inputs else t.float()
        for i, t in enumerate(made)
    ]
    statics = {k: v("f32") if callable(v) else v for k, v in case.statics.items()}
    kernel = tk.call(case.op, *[t.clone() for t in inputs], **statics)
    ref = REFERENCES[case.op](*[t.clone() for t in inputs], **statics)
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert len(kernel) == len(ref)
    for k, r in zip(kernel, ref):
        assert k.dtype == r.dtype and k.shape == r.shape
        if k.is_floating_point():
            torch.testing.assert_close(k, r, rtol=2e-5, atol=2e-5)
        else:
            assert torch.equal(k, r)


def test_a_call_no_kernel_takes_runs_the_reference():
    """f64 is outside every kernel's dtypes: the op still answers (the reference), and the
    dispatcher counts the fallback with its reason."""
    ops = custom_ops()
    x, w = torch.randn(4, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    op = "tpuk::rms_norm.default"
    before = report().ops.get(op, {}).get("fallbacks", {})
    out = ops[op](x, w, 1e-6)
    torch.testing.assert_close(out, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
    after = report().ops[op]["fallbacks"]
    assert sum(after.values()) == sum(before.values()) + 1
    assert "f64" in report().ops[op]["last_fallback"]
    # And through autograd: the backward's reference too.
    xg = x.clone().requires_grad_()
    ops[op](xg, w, 1e-6).sum().backward()
    xr = x.clone().requires_grad_()
    (xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6) * w).sum().backward()
    torch.testing.assert_close(xg.grad, xr.grad)
