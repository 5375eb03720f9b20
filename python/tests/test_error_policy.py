"""Fallback categories and the error policy: a call no kernel takes is declined and always falls
back; a failure of a kernel or of the package is an error, counted as such, and raises
`InternalError` under the "raise" policy on every path (the Python strict handler, the native
one, fused programs, compiled graphs, the dispatch API of imported ops)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tpu_kernels as tk  # noqa: E402
from tpu_kernels.errors import InternalError  # noqa: E402
from tpu_kernels.testing import error_policy, inject_fault, no_fallbacks  # noqa: E402
from tpu_kernels.torch import report, substitute  # noqa: E402


def test_policy_is_set_and_restored():
    assert tk.error_policy() == "raise"  # the test suite's (conftest)
    with error_policy("fallback"):
        assert tk.error_policy() == "fallback"
    assert tk.error_policy() == "raise"
    with pytest.raises(ValueError, match="'fallback', 'raise'"):
        tk.set_error_policy("ignore")


def test_a_declined_call_falls_back_under_either_policy():
    x = torch.randn(4, 8, dtype=torch.float64)  # no kernel takes f64
    before = report()
    with substitute("strict"):
        y = F.silu(x)
    torch.testing.assert_close(y, F.silu(x))
    after = report()
    assert after.declined() > before.declined()
    assert after.errors() == before.errors()
    assert after.fallbacks("aten::silu.default", "no_kernel") == before.fallbacks("aten::silu.default", "no_kernel") + 1


def test_a_failing_kernel_raises_on_the_python_and_the_native_strict_paths():
    x = torch.randn(4, 8)
    with inject_fault("run:silu"):
        mode = substitute("strict")
        # The first call of an op takes the Python handler, the next ones the native one.
        for path in ("python", "native"):
            with mode, pytest.raises(InternalError, match="injected fault: kernel `silu`"):
                F.silu(x)
        before = report().fallbacks("aten::silu.default", "execute")
        with error_policy("fallback"), mode:
            y = F.silu(x)
        torch.testing.assert_close(y, F.silu(x))  # PyTorch computed it
        assert report().fallbacks("aten::silu.default", "execute") == before + 1
        # The helper sees the error even though the values are right.
        with pytest.raises(AssertionError, match=r"aten::silu.default: 1 error \(execute\)"):
            with no_fallbacks(), error_policy("fallback"), mode:
                F.silu(x)


def test_a_failing_program_raises_in_fused_and_compiled_modes():
    import tpu_kernels.torch.backend  # noqa: F401  (registers the backend)

    x = torch.randn(8, 16)
    with inject_fault("run"):
        with pytest.raises(InternalError, match="fused program replayed"):
            with substitute("fused"):
                y = F.silu(x) * 2
        torch._dynamo.reset()
        f = torch.compile(lambda t: F.silu(t) * 3, backend="tpu_kernels")
        with pytest.raises(InternalError, match="graph ran in PyTorch"):
            f(x)
        with error_policy("fallback"):
            torch.testing.assert_close(f(x), F.silu(x) * 3)
    assert report().fallbacks(category="replay") >= 2
    del y


def test_an_unlowerable_recorded_op_is_declined_not_an_error():
    """A fused recording of an op no kernel takes and the default table does not lower (f64
    layer norm) replays in PyTorch, counted as `unlowerable`, not raised."""
    x, w, b = torch.randn(4, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    before = report().fallbacks("fused", "unlowerable")
    errors = report().errors()
    with substitute("fused"):
        y = F.layer_norm(x, [8], w, b) * 2
    torch.testing.assert_close(y, F.layer_norm(x, [8], w, b) * 2)
    assert report().fallbacks("fused", "unlowerable") == before + 1
    assert report().errors() == errors


def test_an_imported_op_whose_kernel_fails_raises_instead_of_running_the_jax_function(cleanup):
    import os

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    tk.register_jax(jax.nn.softplus, name="pol_softplus", op="pol::softplus", signatures=["f32[8,128]"])
    x = torch.randn(8, 128)
    with inject_fault("run:pol_softplus"):
        with pytest.raises(InternalError, match="injected fault"):
            torch.ops.pol.softplus(x)
        with error_policy("fallback"):  # the JAX function computes it, and it is counted
            torch.testing.assert_close(torch.ops.pol.softplus(x), F.softplus(x))
    assert tk.stats()["ops"]["pol::softplus.default"]["fallbacks"] == {"execute": 2}
