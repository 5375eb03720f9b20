"""Lower ATen graphs with the Rust lowering and run the StableHLO it emits.

- `lower(graph_json, kernels=False)` runs the `lower_graph` example of the registry crate
  (`cargo run -p tpu-kernels-registry --example lower_graph`), which prints the module text;
- `run_reference(text, inputs)` executes a module with the StableHLO reference interpreter that
  ships in jaxlib (`stablehlo.eval_module`: exact, slow, so keep shapes small);
- `run_xla(text, inputs)` compiles and runs it with XLA:CPU through jax's client.

Inputs and outputs are numpy arrays. The PJRT runner of the registry will take over `run_xla`.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python" / "tests"))

import stablehlo_check  # noqa: E402


@functools.cache
def lower_graph_binary() -> Path:
    """Builds the `lower_graph` example once; returns its path."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    cmd = ["cargo", "build", "--quiet", "-p", "tpu-kernels-registry", "--example", "lower_graph"]
    subprocess.run(cmd, cwd=REPO, check=True)
    path = target / "debug" / "examples" / "lower_graph"
    if not path.exists():
        raise FileNotFoundError(f"cargo built no {path}")
    return path


class LoweringError(RuntimeError):
    """The Rust lowering rejected a graph; the message is its error."""


def lower(graph: dict, kernels: bool = False) -> str:
    """The StableHLO text of `graph` (the JSON format of `tpu_kernels_registry::graph`)."""
    cmd = [str(lower_graph_binary())] + (["--kernels"] if kernels else [])
    proc = subprocess.run(cmd, input=json.dumps(graph), capture_output=True, text=True)
    if proc.returncode != 0:
        raise LoweringError(proc.stderr.strip())
    return proc.stdout


_MLIR_TYPES = {
    np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64",
    np.dtype(np.float16): "f16",
    np.dtype(np.int8): "i8",
    np.dtype(np.int16): "i16",
    np.dtype(np.int32): "i32",
    np.dtype(np.int64): "i64",
    np.dtype(np.uint8): "ui8",
    np.dtype(np.bool_): "i1",
}


def _attr(a: np.ndarray):
    """`a` as a dense elements attribute (inside a context and location)."""
    from jaxlib.mlir import ir

    # (`np.ascontiguousarray` would turn a 0-d array into shape [1].)
    a = np.require(a, requirements="C")
    if a.ndim == 0:
        # A one-element buffer would become a splat of shape [1]; spell scalars out instead.
        if a.dtype == np.bool_:
            value = "true" if a else "false"
        elif a.dtype.kind == "f":
            value = "0x" + a.view(f"u{a.itemsize}").tobytes()[::-1].hex().upper()
        else:
            value = str(int(a))
        return ir.Attribute.parse(f"dense<{value}> : tensor<{_MLIR_TYPES[a.dtype]}>")
    if a.dtype == np.bool_:
        return ir.DenseElementsAttr.get(a, type=ir.IntegerType.get_signless(1))
    return ir.DenseElementsAttr.get(a)


@functools.cache
def _register_passes() -> None:
    from jaxlib.mlir.dialects import stablehlo

    stablehlo.register_stablehlo_passes()


def run_reference(text: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Runs `@main` of `text` on `inputs` with the StableHLO reference interpreter.

    The interpreter knows no CHLO (it aborts the process on `chlo.erf`), so CHLO ops are first
    legalized to StableHLO, as XLA does.
    """
    from jaxlib.mlir import ir, passmanager
    from jaxlib.mlir.dialects import stablehlo

    ctx = stablehlo_check.new_context()
    with ctx, ir.Location.unknown():
        module = stablehlo_check.parse(text, ctx)
        if "chlo." in text:
            _register_passes()
            pm = passmanager.PassManager.parse("builtin.module(func.func(chlo-legalize-to-stablehlo))")
            pm.run(module.operation)
        results = stablehlo.eval_module(module, [_attr(a) for a in inputs])
        return [np.array(r) for r in results]


def run_xla(text: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Compiles `text` with XLA:CPU (jax's client) and runs it on `inputs`."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_enable_x64", True)
    device = jax.devices("cpu")[0]
    exe = device.client.compile_and_load(text, [device])
    outs = exe.execute([jax.device_put(np.require(a, requirements="C"), device) for a in inputs])
    return [np.asarray(o) for o in outs]
