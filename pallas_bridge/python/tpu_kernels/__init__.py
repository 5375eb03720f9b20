"""tpu_kernels: TPU kernels written in Rust or in Pallas/JAX, registered against ATen ops and
dispatched from PyTorch through PJRT.

- Registry: :func:`kernels`, :func:`kernel`, :func:`select`, :func:`unregister` (one registry per
  process, shared with kernels linked in from Rust).
- Kernel libraries: :func:`load_library` (a crate of Rust kernels built as a cdylib, checked
  and registered at run time, its new ops defined in torch, like ``torch.ops.load_library``).
- Import: :func:`jax_kernel` / :func:`register_jax` (export, validate, register),
  :func:`load_mlir` / :func:`save_mlir` (.mlir files the Rust ``import(...)`` form accepts),
  :func:`pallas_interpret`, :func:`decode_mosaic`.
- Dispatch: :func:`dispatch`, :func:`call`, :class:`Dispatcher`, :func:`stats`,
  :func:`cache_stats`.
- Checks: :func:`emit`, :func:`compile_tpu`, :func:`run_cpu`.
- Errors: :mod:`tpu_kernels.errors`; :func:`error_policy` / :func:`set_error_policy` say
  whether a failure of a kernel or of tpu_kernels' own code raises or falls back (counted).
- Tests: :mod:`tpu_kernels.testing` (``no_fallbacks``: a block fails if anything fell back or
  replayed in PyTorch; ``inject_fault``; the numerics tolerance table).

jax and torch are imported only when needed.
"""

from __future__ import annotations

from typing import Any

from . import _openmp

_openmp.configure()  # before anything can import torch: see _openmp

from . import _events, errors, guards
from ._native import DeviceTensor, Dispatcher
from ._native import __version__ as __version__
from .checks import compile_tpu, emit, run_cpu
from .dispatch import cache_stats, call, default_dispatcher, dispatch, stats
from .errors import (
    CpuRunError,
    ExportError,
    FallbackError,
    InternalError,
    JaxNotInstalledError,
    LibraryError,
    LoweringDeclined,
    ModuleParseError,
    NoKernelError,
    NotJaxError,
    NumericsMismatchError,
    RegistrationError,
    RuntimeUnavailableError,
    SignatureMismatchError,
    SymbolicShapeError,
    TpuCompileError,
    TpuKernelsError,
    error_policy,
    set_error_policy,
)
from .jax_import import (
    ImportedKernel,
    decode_mosaic,
    jax_kernel,
    load_mlir,
    pallas_interpret,
    register_jax,
    save_mlir,
)
from .library import LoadedLibrary, load_library
from .torch import report, substitute  # PyTorch integration; imports torch lazily


def kernels() -> list[dict[str, Any]]:
    """Every registered kernel (linked-in Rust ones and runtime imports), sorted by name."""
    from . import _native

    return _native.list_kernels()


def kernel(name: str) -> dict[str, Any]:
    """One kernel's record; :class:`NoKernelError` if none has that name."""
    from . import _native

    return _native.kernel(name)


def select(
    op: str,
    inputs: str,
    statics: dict[str, Any] | None = None,
    platform: str = "cpu",
    contiguous: list[bool] | None = None,
) -> str:
    """The name of the kernel selected for `op` and a call's inputs (``"f32[8,128]"``), or
    :class:`NoKernelError` with every candidate's reason."""
    from . import _native

    return _native.select(op, inputs, statics, platform, contiguous)


def explain(
    op: str,
    inputs: str,
    statics: dict[str, Any] | None = None,
    platform: str = "cpu",
    contiguous: list[bool] | None = None,
) -> list[tuple[str, str | None]]:
    """Every candidate kernel of `op` for a call's inputs, in the order selection tries them on
    `platform`: ``(name, None)`` where the kernel takes the call, ``(name, reason)`` where it
    refuses it. Names each kernel's reason even when another kernel takes the call."""
    from . import _native

    return _native.explain(op, inputs, statics, platform, contiguous)


def set_force_tiled(force: bool) -> bool:
    """Makes kernel selection try tiled (Mosaic) kernels first on every platform (``True``), or
    on a TPU only (``False``, the default unless ``TPUK_FORCE_TILED=1``). On the CPU a tiled
    kernel runs as its twin, so this runs a tiled kernel end to end without a TPU. Returns the
    previous setting; :func:`tpu_kernels.testing.force_tiled` scopes it to a block."""
    from . import _native

    return _native.set_force_tiled(force)


def unregister(name: str) -> None:
    """Removes a kernel registered at runtime, and the new op it defined, if any."""
    from . import _native
    from .ops import remove_op

    ops = _native.kernel(name)["ops"]
    _native.unregister(name)
    for op in ops:
        remove_op(op)
    _events.registry_changed()


__all__ = [
    "CpuRunError",
    "DeviceTensor",
    "Dispatcher",
    "ExportError",
    "FallbackError",
    "ImportedKernel",
    "InternalError",
    "JaxNotInstalledError",
    "LibraryError",
    "LoadedLibrary",
    "LoweringDeclined",
    "ModuleParseError",
    "NoKernelError",
    "NotJaxError",
    "NumericsMismatchError",
    "RegistrationError",
    "RuntimeUnavailableError",
    "SignatureMismatchError",
    "SymbolicShapeError",
    "TpuCompileError",
    "TpuKernelsError",
    "cache_stats",
    "call",
    "compile_tpu",
    "decode_mosaic",
    "default_dispatcher",
    "dispatch",
    "emit",
    "error_policy",
    "errors",
    "explain",
    "guards",
    "jax_kernel",
    "kernel",
    "kernels",
    "load_library",
    "load_mlir",
    "pallas_interpret",
    "register_jax",
    "run_cpu",
    "save_mlir",
    "select",
    "set_error_policy",
    "set_force_tiled",
    "stats",
    "unregister",
]
