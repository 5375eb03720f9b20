"""Kernel libraries: a crate of Rust kernels built as a ``cdylib``, loaded at run time, in the
spirit of ``torch.ops.load_library``. No rebuild of tpu_kernels is needed::

    # lib.rs of a crate with crate-type = ["cdylib", "rlib"]:
    #     #[tpu_kernel(op = "my_kernels::scaled_silu", ...)] pub fn scaled_silu(...) { ... }
    #     tpu_kernels::export_library!();
    lib = tpu_kernels.load_library("target/release/libmy_kernels.so")
    y = torch.ops.my_kernels.scaled_silu(x, scale=0.5)

Loading checks every kernel at every canonical signature before registering any: the library
is built against this very tpu-kernels version and ABI; each platform's module is emitted,
parsed back with the Rust reader, takes the signature's inputs and returns the output rule's
types; the CPU module runs on the PJRT CPU client with random inputs and gives finite outputs;
the TPU module compiles for `topology` with libtpu's compile-only path (where libtpu cannot be
loaded this check is not done, with a ``RuntimeWarning``; with ``TPUK_REQUIRE_RUNTIMES=1`` it
is an error). Then every kernel is registered in one step. Any failure raises
:class:`~tpu_kernels.errors.LibraryError` naming the library, the kernel and what was wrong,
and registers nothing.

The kernels then serve like the built-in ones: an op a kernel defines in its own namespace
(``my_kernels::scaled_silu``) becomes a ``torch.library`` op (schema from the record, a fake
function from its output rule, autograd from its backward pairing), which eager substitution
(strict and fused) and ``torch.compile`` (the ``tpu_kernels`` backend) take like any other;
a kernel bound to an ATen overload competes with the other kernels of that overload.

A loaded library is never unloaded, and its kernels cannot be unregistered. Loading the same
path again is a no-op (``already_loaded`` is then true; a rebuilt file at that path is not
reloaded: restart the process); a second library whose kernel names clash with registered
ones is an error.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _events, _native
from .errors import RuntimeUnavailableError

DEFAULT_TOPOLOGY = "v5e:1x1"

__all__ = ["DEFAULT_TOPOLOGY", "LoadedLibrary", "load_library"]


@dataclass(frozen=True)
class LoadedLibrary:
    """A loaded kernel library: iterating it gives its kernels' names."""

    #: The library's file, resolved.
    path: Path
    #: The crate it was built from.
    crate: str
    #: Every kernel of the library, sorted.
    kernels: list[str]
    #: True when this path was loaded before (nothing was checked or registered this time).
    already_loaded: bool
    #: Kernel -> one entry per canonical signature: ``signature``, ``parsed`` (platforms whose
    #: module was emitted and parsed back), ``outputs``, ``cpu_run``, ``tpu_compile`` and
    #: ``tpu_compile_note`` (why it was not done, when it was not).
    checks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: The ``torch.library`` ops its kernels define (``my_kernels::scaled_silu.default``);
    #: empty without torch.
    ops: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[str]:
        return iter(self.kernels)

    def __contains__(self, name: object) -> bool:
        return name in self.kernels

    def __len__(self) -> int:
        return len(self.kernels)


def _torch_ops(kernels: list[str]) -> list[str]:
    """Defines the torch ops of `kernels` that define new ops; their names."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return []  # no torch: the kernels are reachable through tpu_kernels.call / dispatch
    from .torch._custom_ops import custom_ops

    return sorted(custom_ops(kernels=kernels))


def load_library(path: str | os.PathLike[str], *, topology: str | None = DEFAULT_TOPOLOGY) -> LoadedLibrary:
    """Loads the kernel library at `path` (``target/release/libmy_kernels.so``), checks each of
    its kernels at every canonical signature and registers them all, or none (see the module
    documentation). `topology`: the libtpu topology the TPU modules are compiled for, None to
    skip that check. Returns the :class:`LoadedLibrary`."""
    path = os.fspath(path)
    if topology is not None and not _native.libtpu_available():
        message = (
            f"load_library({path!r}): the TPU compile check is not done: libtpu cannot be loaded "
            "(`scripts/dev setup` installs it; TPUK_LIBTPU names it)"
        )
        if os.environ.get("TPUK_REQUIRE_RUNTIMES") == "1":
            raise RuntimeUnavailableError(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        topology = None
    info = _native.load_library(path, topology=topology)
    loaded = LoadedLibrary(
        path=Path(info["path"]),
        crate=info["crate"],
        kernels=list(info["kernels"]),
        already_loaded=info["already_loaded"],
        checks={k: list(v) for k, v in info["checks"].items()},
        ops=_torch_ops(list(info["kernels"])),
    )
    _events.registry_changed()
    return loaded
