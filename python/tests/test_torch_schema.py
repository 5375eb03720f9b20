"""Every ATen binding is checked against the live torch schema at load."""

import pytest

pytest.importorskip("torch")
from tpu_kernels.torch import check_kernel_schema, check_schemas  # noqa: E402


def test_standard_kernels_match_torch():
    assert check_schemas() == {}


def _gelu(**over):
    info = {
        "name": "my_gelu",
        "ops": ["aten::gelu.default"],
        "inputs": ["self"],
        "statics": [("approximate", "str", "none")],
        "schema": ["self", "approximate"],
        "bindings": [("self", 0, "tensor", 0), ("approximate", 1, "static", 0)],
    }
    info.update(over)
    return info


def test_matching_binding_passes():
    assert check_kernel_schema(_gelu(), "aten::gelu.default") is None


@pytest.mark.parametrize(
    "over,needle",
    [
        ({"schema": ["input", "approximate"], "bindings": [("input", 0, "tensor", 0), ("approximate", 1, "static", 0)]}, "argument names"),
        ({"statics": [("approximate", "float", None)]}, "static `approximate` is a float"),
        ({"inputs": ["self", "other"], "schema": [], "bindings": []}, "tensor input `other`"),
        ({"bindings": [("self", 0, "tensor", 0), ("approximate", 2, "static", 0)]}, "position 2"),
    ],
)
def test_mismatch_is_refused_naming_both_schemas(over, needle):
    msg = check_kernel_schema(_gelu(**over), "aten::gelu.default")
    assert msg is not None and needle in msg
    assert "kernel: kernel my_gelu(" in msg
    assert "torch:  aten::gelu.default: aten::gelu(Tensor self, *, str approximate=" in msg


def test_unknown_overload_is_refused():
    msg = check_kernel_schema(_gelu(), "aten::gelu.nonexistent")
    assert msg is not None and "does not have" in msg


def test_missing_required_argument_is_refused():
    info = {
        "name": "my_add",
        "inputs": ["self"],
        "statics": [],
        "schema": ["self"],
        "bindings": [("self", 0, "tensor", 0)],
    }
    msg = check_kernel_schema(info, "aten::add.Tensor")
    assert msg is not None and "`other: Tensor` is not bound" in msg


def test_runtime_kernel_with_mismatched_names_never_runs():
    jax = pytest.importorskip("jax")
    import torch
    import torch.nn.functional as F

    import tpu_kernels as tk
    from tpu_kernels.torch import report, substitute

    x = torch.randn(8, 128)
    with substitute("strict"):
        F.silu(x)  # the table is read before the registration below
    # Warned once the table is read again: at the registration when the tpu device is installed
    # (it binds the new kernel's op at once), else at the next use.
    with pytest.warns(UserWarning, match="imp_silu_x"):
        k = tk.register_jax(jax.nn.silu, name="imp_silu_x", op="aten::silu", signatures=["f32[8,128]"], priority=10)
        msg = check_schemas().get("imp_silu_x")
    try:
        assert msg is not None
        assert "tensor input `x`" in msg and "aten::silu(Tensor self) -> Tensor" in msg
        with substitute("strict"):
            y = F.silu(x)
        torch.testing.assert_close(y, F.silu(x))
        r = report().ops["aten::silu.default"]
        assert r["fallbacks"].get("schema_refused", 0) >= 1 and "imp_silu_x" in r["last_fallback"]
        # Debug mode falls back the same way (a refused binding is no kernel failure).
        n = report().ops["aten::silu.default"]["fallbacks"]["schema_refused"]
        with substitute("debug"):
            torch.testing.assert_close(F.silu(x), y)
        assert report().ops["aten::silu.default"]["fallbacks"]["schema_refused"] == n + 1
    finally:
        tk.unregister(k.name)
    assert "imp_silu_x" not in check_schemas()


def test_runtime_kernel_with_torch_names_is_used():
    jax = pytest.importorskip("jax")
    import torch
    import torch.nn.functional as F

    import tpu_kernels as tk
    from tpu_kernels.torch import report, substitute

    def imp_silu_self(self):
        return jax.nn.silu(self)

    k = tk.register_jax(imp_silu_self, op="aten::silu", signatures=["f32[8,128]"], priority=10)
    try:
        assert "imp_silu_self" not in check_schemas()
        x = torch.randn(8, 128)
        with substitute("strict"):
            y = F.silu(x)
        torch.testing.assert_close(y, F.silu(x), rtol=1e-5, atol=1e-5)
        assert report().ops["aten::silu.default"]["kernels"].get("imp_silu_self", 0) >= 1
    finally:
        tk.unregister(k.name)
