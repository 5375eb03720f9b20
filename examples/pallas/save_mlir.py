"""Writes the example kernels' modules as .mlir files under examples/pallas/mlir/, the files
the Rust crate in this folder imports with `#[tpu_kernel(import(tpu = ..., cpu = ...))]`.

    python examples/pallas/save_mlir.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax._src.interpreters import mlir as jax_mlir  # noqa: E402
from jaxlib.mlir import ir  # noqa: E402

import tpu_kernels as tk  # noqa: E402
from kernels import register_all  # noqa: E402

# The kernels the Rust crate imports (static shapes: the macro checks them at compile time).
SHIPPED = ("pallas_silu_mul", "pallas_matmul")


def rms_norm_rows(x, w):
    """RMS norm of each row of `x` (any number of rows of 512), scaled by `w`."""
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(ms + 1e-6) * w


def save_symbolic() -> None:
    """`rms_norm_rows` exported once with a symbolic row count `b`: the Rust crate imports it
    and the registry refines the module to each call's row count, with no Python in the
    process."""
    b = jax.export.symbolic_shape("b")[0]
    args = (jax.ShapeDtypeStruct((b, 512), jnp.float32), jax.ShapeDtypeStruct((512,), jnp.float32))
    for platform in ("cpu", "tpu"):
        exported = jax.export.export(jax.jit(rms_norm_rows), platforms=[platform])(*args)
        path = HERE / "mlir" / f"rms_norm_rows.{platform}.mlir"
        with jax_mlir.make_ir_context():
            # Printed without locations: they would name this machine's paths.
            text = ir.Module.parse(exported.mlir_module()).operation.get_asm(enable_debug_info=False)
        path.write_text(text)
        print(path.relative_to(HERE))


def main() -> None:
    register_all()
    for name in SHIPPED:
        for path in tk.save_mlir(name, HERE / "mlir").values():
            print(path.relative_to(HERE))
    save_symbolic()


if __name__ == "__main__":
    main()
