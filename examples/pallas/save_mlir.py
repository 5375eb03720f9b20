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

import tpu_kernels as tk  # noqa: E402
from kernels import register_all  # noqa: E402

# The kernels the Rust crate imports (static shapes: the macro checks them at compile time).
SHIPPED = ("pallas_silu_mul", "pallas_matmul")


def main() -> None:
    register_all()
    for name in SHIPPED:
        for path in tk.save_mlir(name, HERE / "mlir").values():
            print(path.relative_to(HERE))


if __name__ == "__main__":
    main()
