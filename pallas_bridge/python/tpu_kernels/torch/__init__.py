"""PyTorch integration of tpu-kernels (torch is imported on first use, not at import).

- `substitute(mode="strict" | "debug" | "fused")`: eager substitution of registered kernels
  for ATen ops (a `TorchDispatchMode`); see `modes.py` and `fused.py`.
- `tpu_kernels_backend`: the `torch.compile` backend, registered as `"tpu_kernels"` (an entry
  point of the installed package; importing `tpu_kernels.torch.backend` registers it too).
- `sync()`: runs what fused mode has recorded on this thread (a step boundary, PyTorch/XLA's
  `mark_step`).
- `report()`: per-op substitution counts, fallbacks with reasons, cache hits, time in kernels,
  fused programs, `torch.compile` graphs and the nodes left to PyTorch.
- `custom_ops()`: kernels that define new ops (`tpuk::rms_norm`) as `torch.library` ops.
- `check_schemas()`: every ATen binding checked against the live torch schema.
"""

from __future__ import annotations

from ._stats import Report, report

__all__ = [
    "Report",
    "SchemaMismatchError",
    "SubstitutionError",
    "check_kernel_schema",
    "check_schemas",
    "custom_ops",
    "report",
    "substitute",
    "sync",
    "tpu_kernels_backend",
]


def substitute(mode: str = "strict"):
    """A context manager that substitutes registered kernels for ATen ops.

    `mode` is `"strict"` (one op at a time, fallbacks recorded), `"debug"` (synchronous, checked,
    errors raised) or `"fused"` (ops recorded and run as one cached StableHLO program at each
    materialisation point).
    """
    from .modes import substitute as make

    return make(mode)


_LAZY = {
    "SchemaMismatchError": "._bindings",
    "check_kernel_schema": "._bindings",
    "check_schemas": "._bindings",
    "SubstitutionError": ".modes",
    "tpu_kernels_backend": ".backend",
    "custom_ops": "._custom_ops",
    "sync": ".fused",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tpu_kernels.torch' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
