"""The native hot path of `substitute("strict")`: the handler PyTorch calls, what it takes, what
it hands to the Python handler, and a registration made while a mode is active."""

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
from tpu_kernels.torch import report, substitute  # noqa: E402


def _native_handler(mode):
    return mode.__dict__["__torch_dispatch__"]


def test_strict_mode_dispatches_through_the_native_handler_bound_to_it():
    mode = substitute("strict")
    handler = _native_handler(mode)
    assert type(handler).__name__ == "StrictDispatch"
    assert handler.__self__ is mode
    # debug keeps the Python handler: it checks every output.
    assert "__torch_dispatch__" not in substitute("debug").__dict__


def test_native_path_takes_plain_calls_statics_and_kwargs():
    x = torch.randn(8, 64)
    before = report().substituted("aten::gelu.default")
    with substitute("strict"):
        a = F.gelu(x, approximate="tanh")  # a static given
        b = F.gelu(x)  # the static's torch default
        c = torch.ops.aten.gelu.default(x, approximate="none")  # a keyword static
        s = torch.softmax(x, dim=-1)  # positional int and bool statics
    assert report().substituted("aten::gelu.default") == before + 3
    torch.testing.assert_close(a, F.gelu(x, approximate="tanh"), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b, F.gelu(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c, F.gelu(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, torch.softmax(x, -1), rtol=1e-5, atol=1e-5)


def test_multi_output_kernels_return_tuples():
    x, w, b = torch.randn(4, 32), torch.randn(32), torch.randn(32)
    with substitute("strict"):
        out, mean, rstd = torch.ops.aten.native_layer_norm.default(x, [32], w, b, 1e-5)
    want = torch.ops.aten.native_layer_norm.default(x, [32], w, b, 1e-5)
    for g, e in zip((out, mean, rstd), want):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_unusual_calls_go_to_the_python_handler_with_its_reasons():
    x = torch.randn(16, 8)
    with substitute("strict"):
        y = F.silu(x.t())  # strided: the Python handler's fallback
        z = F.silu(x.to(torch.float64))  # a dtype no kernel takes: the dispatcher's fallback
    torch.testing.assert_close(y, F.silu(x.t()))
    torch.testing.assert_close(z, F.silu(x.to(torch.float64)))
    last = report().ops["aten::silu.default"]["last_fallback"]
    assert "f64" in last or "float64" in last, last


def test_a_kernel_registered_inside_an_active_mode_is_used_from_the_next_call():
    jax = pytest.importorskip("jax")
    import tpu_kernels as tk

    def imp_sign(self):
        return jax.numpy.sign(self)

    x = torch.randn(8, 128)
    with substitute("strict"):
        torch.sign(x)  # learned: no kernel binds aten::sign
        k = tk.register_jax(imp_sign, op="aten::sign", signatures=["f32[8,128]"], priority=10)
        try:
            y = torch.sign(x)
        finally:
            tk.unregister(k.name)
        z = torch.sign(x)  # and gone again after the removal
    torch.testing.assert_close(y, torch.sign(x))
    torch.testing.assert_close(z, torch.sign(x))
    assert report().ops["aten::sign.default"]["kernels"].get("imp_sign", 0) == 1
