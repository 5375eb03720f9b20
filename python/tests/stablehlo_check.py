"""The outside StableHLO check: jaxlib's MLIR parser with the stablehlo and chlo dialects.

Parsing verifies the module (op verifiers included); a failure carries the parser's own
line-numbered diagnostic.
"""

from __future__ import annotations

from jaxlib.mlir import ir

from tpu_kernels._mlir import new_context

__all__ = ["new_context", "parse"]


def parse(text: str, ctx: ir.Context | None = None) -> ir.Module:
    """Parses and verifies `text`; raises `ValueError` with the parser's diagnostics."""
    ctx = ctx or new_context()
    with ctx:
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as e:  # carries the diagnostics with line:column
            raise ValueError(str(e)) from None
        if not module.operation.verify():
            raise ValueError("module does not verify")
        return module


def snapshot_body(path) -> str:
    """The content of an insta `.snap` file (after its YAML header)."""
    text = path.read_text()
    if text.startswith("---\n"):
        end = text.index("\n---\n", 4)
        text = text[end + 5 :]
    return text
