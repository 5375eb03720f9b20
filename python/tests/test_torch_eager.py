"""Eager substitution: strict and debug modes, fallbacks with reasons, the report."""

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
tkt = pytest.importorskip("tpu_kernels.torch")
from tpu_kernels.errors import InternalError  # noqa: E402
from tpu_kernels.testing import error_policy  # noqa: E402
from tpu_kernels.testing import no_fallbacks  # noqa: E402
from tpu_kernels.torch import SubstitutionError, report, substitute  # noqa: E402


def _subs(op):
    return report().substituted(op)


def test_strict_substitutes_registered_ops_and_matches_eager():
    x = torch.randn(8, 64)
    w, b = torch.randn(64), torch.randn(64)
    cases = {
        "aten::silu.default": lambda: F.silu(x),
        "aten::gelu.default": lambda: F.gelu(x) + F.gelu(x, approximate="tanh"),
        "aten::_softmax.default": lambda: torch.softmax(x, -1),
        "aten::_log_softmax.default": lambda: torch.log_softmax(x, 1),
        "aten::native_layer_norm.default": lambda: F.layer_norm(x, (64,), w, b),
    }
    for op, f in cases.items():
        before = _subs(op)
        expected = f()
        with substitute("strict"):
            got = f()
        assert _subs(op) > before, op
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_other_ops_run_as_usual():
    x = torch.randn(4, 4)
    with substitute("strict"):
        y = (x @ x).relu().cumsum(0)
    torch.testing.assert_close(y, (x @ x).relu().cumsum(0))


@pytest.mark.parametrize(
    "make,category,needle",
    [
        (lambda: torch.randn(8, 16, dtype=torch.float64), "no_kernel", "dtype f64"),
        (lambda: torch.randn(16, 8).t(), "no_kernel", "not contiguous"),
        (lambda: torch.randn(16).expand(4, 16), "no_kernel", "not contiguous"),
        (lambda: torch.randn(8, 16, device="meta"), "bad_input", "device `meta`"),
    ],
)
def test_strict_falls_back_with_a_reason(make, category, needle):
    x = make()
    op = "aten::silu.default"
    before = report().ops.get(op, {}).get("fallbacks", {}).get(category, 0)
    with substitute("strict"):
        y = F.silu(x)
    r = report()
    assert r.ops[op]["fallbacks"][category] == before + 1
    assert needle in r.ops[op]["last_fallback"]
    assert y.shape == x.shape and y.device == x.device
    if x.device.type == "cpu":
        torch.testing.assert_close(y, F.silu(x))


def test_kernel_error_falls_back_in_strict(monkeypatch):
    x = torch.randn(8)
    mode = substitute("strict")

    def broken(*a):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(mode, "_call", broken)
    before = report().fallbacks("aten::silu.default", "internal")
    with error_policy("fallback"), mode:
        y = F.silu(x)
    torch.testing.assert_close(y, F.silu(x))
    assert "kernel exploded" in report().ops["aten::silu.default"]["last_fallback"]
    # An error in the binding code is counted as one (`internal`), never as "no kernel", and
    # raises under the "raise" policy.
    assert report().fallbacks("aten::silu.default", "internal") == before + 1
    fresh = substitute("strict")  # the first call of an op takes the Python handler
    monkeypatch.setattr(fresh, "_call", broken)
    with error_policy("raise"), fresh, pytest.raises(InternalError, match="kernel exploded"):
        F.silu(x)


def test_debug_matches_and_falls_back_on_declines_as_strict_does():
    x = torch.randn(8, 32)
    with substitute("debug"), no_fallbacks(kernels=["silu"]):
        y = F.silu(x)
    torch.testing.assert_close(y, F.silu(x))
    # No kernel takes f64: PyTorch's result, the fallback counted with its reason.
    with substitute("debug"), no_fallbacks(allow={"aten::silu.default": "f64"}) as ran:
        y = F.silu(x.double())
    assert ran.fallbacks == {("aten::silu.default", "no_kernel"): 1}
    assert "f64" in report().ops["aten::silu.default"]["last_fallback"]
    torch.testing.assert_close(y, F.silu(x.double()))
    with substitute("debug"), no_fallbacks(allow={"aten::silu.default": "meta"}) as ran:
        y = F.silu(torch.randn(4, device="meta"))
    assert y.device.type == "meta" and sum(ran.fallbacks.values()) == 1


def test_debug_checks_pytorchs_own_outputs_too_naming_the_users_line():
    x = torch.tensor([1.0, -1.0, 4.0])
    with substitute("debug"), pytest.raises(SubstitutionError) as e:
        torch.log(x)
    message = str(e.value)
    assert "aten::log.default (no kernel: PyTorch's): output 0 has 1 NaN and 0 Inf values from finite inputs" in message
    assert f"test_torch_eager.py:{e.traceback[0].lineno + 1}" in message, message
    # Inf from finite inputs is often meant (log(0)): a warning once per op and line.
    with substitute("debug"), pytest.warns(RuntimeWarning, match=r"aten::log.default.*1 Inf values from finite inputs"):
        torch.log(torch.tensor([0.0, 1.0]))
    # Non-finite inputs give non-finite outputs: no error.
    with substitute("debug"):
        y = torch.log(torch.tensor([float("nan"), 1.0]))
    assert y.isnan()[0]
    # torch.empty's memory is uninitialised: never checked.
    with substitute("debug"):
        torch.empty(1024)


def test_debug_checks_nan_and_shape(monkeypatch):
    x = torch.randn(8)
    mode = substitute("debug")
    bad = torch.full((8,), float("nan"))
    monkeypatch.setattr(mode, "_call", lambda *a: ("silu", [bad.__dlpack__()]))
    with mode, pytest.raises(SubstitutionError, match=r"aten::silu.default \(kernel silu\).*NaN"):
        F.silu(x)
    wrong = torch.zeros(3)
    monkeypatch.setattr(mode, "_call", lambda *a: ("silu", [wrong.__dlpack__()]))
    with mode, pytest.raises(SubstitutionError, match=r"kernel silu.*output 0"):
        F.silu(x)


def test_autograd_through_substituted_ops():
    x = torch.randn(4, 16, requires_grad=True)
    with substitute("strict"):
        y = torch.log_softmax(F.silu(x), -1).sum()
        y.backward()
    g = x.grad.clone()
    x.grad = None
    torch.log_softmax(F.silu(x), -1).sum().backward()
    torch.testing.assert_close(g, x.grad)


def test_outputs_are_zero_copy_views_of_kernel_buffers():
    import tpu_kernels as tk

    x = torch.randn(1024)
    # Through the dispatch API the PJRT output buffer's address is known: the torch tensor made
    # from it through DLPack points at that very memory.
    (device,) = tk.Dispatcher().call("aten::silu.default", [x])
    t = torch.from_dlpack(device)
    assert t.data_ptr() == device.data_ptr
    with substitute("strict"):
        y = F.silu(x)
    # Strict mode's output is a DLPack import of the PJRT buffer too: memory torch did not
    # allocate (a fixed-size, non-resizable storage), where a copy into a torch allocation (what
    # PyTorch's own op or a clone gives) is resizable.
    for zero_copy in (t, y):
        assert not zero_copy.untyped_storage().resizable()
    assert F.silu(x).untyped_storage().resizable() and y.clone().untyped_storage().resizable()
    assert y.data_ptr() != x.data_ptr()
    y.add_(1)  # the kernel's buffer is the tensor's own, writable memory
    torch.testing.assert_close(y, F.silu(x) + 1)


def test_report_counts_time_and_cache():
    x = torch.randn(8, 8)
    with substitute("strict"):
        for _ in range(3):
            F.silu(x)
    r = report()
    assert r.kernel_time_s > 0
    assert r.cache["compiles"] + r.cache["memory_hits"] + r.cache["disk_hits"] >= 1
    assert "silu" in r.kernels_ran()
    text = str(r)
    assert "aten::silu.default" in text and "time in kernels" in text


def test_mode_name_is_checked():
    with pytest.raises(ValueError, match="strict"):
        substitute("eager")


def test_top_level_names():
    import tpu_kernels

    x = torch.randn(8)
    with tpu_kernels.substitute(mode="strict"):
        y = F.silu(x)
    torch.testing.assert_close(y, F.silu(x))
    assert tpu_kernels.report().substituted("aten::silu.default") >= 1
