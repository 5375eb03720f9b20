"""Bad input to the importer: each case raises its own exception class, naming the kernel and
the failed check, and leaves the registry unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.experimental import pallas as pl

import tpu_kernels as tk


@pytest.fixture
def unchanged():
    before = [k["name"] for k in tk.kernels()]
    yield
    assert [k["name"] for k in tk.kernels()] == before


def pallas_double(block):
    def double(x):
        spec = pl.BlockSpec(block, lambda i, j: (i, j))
        return pl.pallas_call(
            lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2.0),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(x.shape[0] // block[0], x.shape[1] // block[1]),
            in_specs=[spec], out_specs=spec,
        )(x)

    return double


def test_not_jax(unchanged):
    with pytest.raises(tk.NotJaxError, match="not callable"):
        tk.register_jax(42, name="bad_int", op="bad::x", signatures=["f32[8,128]"])
    with pytest.raises(tk.NotJaxError, match="(?s)kernel `bad_numpy`.*not JAX code"):
        tk.register_jax(lambda x: np.sin(x), name="bad_numpy", op="bad::x", signatures=["f32[8,128]"])
    with pytest.raises(tk.NotJaxError, match="kernel `bad_torch`"):
        tk.register_jax(lambda x: torch.relu(x), name="bad_torch", op="bad::x", signatures=["f32[8,128]"])
    assert issubclass(tk.NotJaxError, TypeError)


def test_tiling_rejected_by_jax(unchanged):
    with pytest.raises(tk.TpuCompileError, match="kernel `bad_tiling`: tpu compile check failed"):
        tk.register_jax(pallas_double((7, 100)), name="bad_tiling", op="bad::x", signatures=["f32[14,200]"])


def test_tiling_rejected_by_libtpu_surfaces_e2002(unchanged, monkeypatch):
    # jax checks block shapes itself; switch that off so the kernel reaches libtpu's Mosaic
    # compiler, whose own error is the one to surface.
    from jax._src.pallas.mosaic import lowering

    monkeypatch.setattr(lowering, "_check_block_mappings", lambda *a, **k: None)
    with pytest.raises(tk.TpuCompileError, match=r"(?s)kernel `bad_mosaic`: tpu compile check failed \(v5e:1x1.*E2002"):
        tk.register_jax(pallas_double((7, 100)), name="bad_mosaic", op="bad::x", signatures=["f32[14,200]"])
    assert issubclass(tk.TpuCompileError, RuntimeError)


def test_binding_mismatch(unchanged):
    with pytest.raises(tk.SignatureMismatchError, match="kernel `bad_gelu`: binding check failed: `aten::gelu` takes 1"):
        tk.register_jax(lambda x, w: x * w, name="bad_gelu", op="aten::gelu", signatures=["f32[8,128], f32[8,128]"])
    with pytest.raises(tk.SignatureMismatchError, match="static `alpha` is not an argument"):
        tk.register_jax(lambda x, *, alpha: x * alpha, name="bad_static", op="aten::gelu",
                        signatures=["f32[8,128]"], statics={"alpha": 1.0})
    with pytest.raises(tk.SignatureMismatchError, match="kernel `bad_arity`: signature check failed: the example signatures have 2 tensors, the function takes 1"):
        tk.register_jax(lambda x: x, name="bad_arity", op="bad::x", signatures=["f32[8,128], f32[8,128]"])


def test_loaded_module_with_the_wrong_signature(unchanged, tmp_path):
    path = tmp_path / "k.cpu.mlir"
    path.write_text("module {\n  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
                    "    %0 = stablehlo.add %a, %a : tensor<4xf32>\n    return %0 : tensor<4xf32>\n  }\n}\n")
    with pytest.raises(tk.SignatureMismatchError, match=r"kernel `bad_sig`: signature check failed for the cpu variant.*tensor<4xf32>.*tensor<8xf32>"):
        tk.load_mlir(name="bad_sig", op="bad::x", signature="f32[8]", cpu=path)
    path.write_text("module {\n  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n    %0 = stablehlo.bogus %a\n  }\n}\n")
    with pytest.raises(tk.ModuleParseError, match="kernel `bad_parse`.*jaxlib parse check failed"):
        tk.load_mlir(name="bad_parse", op="bad::x", signature="f32[4]", cpu=path)
    with pytest.raises(tk.ModuleParseError, match="kernel `bad_file`: cannot read"):
        tk.load_mlir(name="bad_file", op="bad::x", signature="f32[4]", cpu=tmp_path / "missing.mlir")


def test_numerics_mismatch(unchanged):
    with pytest.raises(tk.NumericsMismatchError, match="kernel `bad_numerics`: cpu numerics check failed"):
        tk.register_jax(lambda x: x * 2.0, name="bad_numerics", op="bad::x", signatures=["f32[8,128]"],
                        reference=lambda x: x * 3.0)
    with pytest.raises(tk.NumericsMismatchError, match="differs from the JAX function"):
        tk.register_jax(lambda x: x * 2.0, name="bad_cpu_fn", op="bad::x", signatures=["f32[8,128]"],
                        cpu_fn=lambda x: x * 2.5)


def head(x):
    # `min` compares the symbol with 64: jax cannot decide that without a constraint.
    return x[: min(x.shape[0], 64)] * 2.0


def test_symbolic_dims_without_constraints(unchanged):
    with pytest.raises(tk.SymbolicShapeError, match="(?s)kernel `bad_head`.*constraints="):
        tk.register_jax(head, name="bad_head", op="bad::head", signatures=["f32[B,128]"])
    assert issubclass(tk.SymbolicShapeError, ValueError)


def test_symbolic_dims_with_constraints_register():
    k = tk.register_jax(head, name="ok_head", op="ok::head", signatures=["f32[B,128]"],
                        constraints=["B >= 128"])
    try:
        x = torch.randn(160, 128)
        torch.testing.assert_close(torch.ops.ok.head(x), x[:64] * 2.0)
    finally:
        tk.unregister(k.name)


def test_jax_not_installed():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["jax"] = None  # `import jax` now raises ImportError
        import tpu_kernels as tk
        before = len(tk.kernels())
        try:
            tk.register_jax(lambda x: x, name="k", op="bad::x", signatures=["f32[8]"])
        except tk.JaxNotInstalledError as e:
            assert isinstance(e, ImportError) and isinstance(e, RuntimeError)
            assert len(tk.kernels()) == before
            print(e)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "jax is needed to import kernels" in out.stdout and "pip install 'jax==" in out.stdout
