"""Eager dispatch of op calls on torch tensors to registered kernels.

Tensors go into Rust through DLPack without a copy; kernel outputs come back as torch tensors
that alias the PJRT output buffers (DLPack again, no copy). A call that runs no kernel falls back
to the original op (an ATen op) or to the JAX function (a new op defined by an imported kernel),
and the fallback is counted with its reason (`stats()`); a kernel's build, compile or execute
failure raises `InternalError` instead under the "raise" error policy.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from . import _native
from .errors import FallbackError, InternalError, error_policy

# Fallback categories that are a kernel's failure, not "no kernel takes this call" (the same
# classes as `tpu_kernels.torch.report()`).
_ERRORS = frozenset({"build", "compile", "execute"})

_fallbacks: dict[str, Callable[..., Any]] = {}
_lock = threading.Lock()


def set_fallback(op: str, fn: Callable[..., Any] | None) -> None:
    """What a non-ATen op runs when no kernel does (set by imported kernels' new ops)."""
    with _lock:
        if fn is None:
            _fallbacks.pop(_native_normalize(op), None)
        else:
            _fallbacks[_native_normalize(op)] = fn


def _native_normalize(op: str) -> str:
    name = op.rsplit("::", 1)[-1]
    return op if "." in name else f"{op}.default"


@functools.cache
def default_dispatcher() -> _native.Dispatcher:
    """The process's dispatcher (PJRT CPU client, shared compile cache)."""
    return _native.Dispatcher()


def call(op: str, *tensors: Any, dispatcher: _native.Dispatcher | None = None, **statics: Any) -> list[Any]:
    """Runs `op` through its selected kernel; returns torch tensors (aliasing the outputs).
    Raises :class:`FallbackError` when no kernel ran."""
    import torch

    d = dispatcher or default_dispatcher()
    outs = d.call(op, list(tensors), statics or None)
    return [torch.from_dlpack(o) for o in outs]


def dispatch(op: str, *tensors: Any, dispatcher: _native.Dispatcher | None = None, **statics: Any) -> Any:
    """Runs `op` through its kernel, or falls back: the original ATen op, or the JAX function of
    a new op. Returns a tensor (a tuple for several outputs)."""
    try:
        outs = call(op, *tensors, dispatcher=dispatcher, **statics)
    except FallbackError as e:
        if dispatcher is not None and dispatcher.no_fallback:
            raise
        if e.category in _ERRORS and error_policy() == "raise":
            raise InternalError(str(e)) from e
        return _fall_back(e.op or _native_normalize(op), tensors, statics)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _fall_back(op: str, tensors: tuple[Any, ...], statics: dict[str, Any]) -> Any:
    import torch

    with _lock:
        fn = _fallbacks.get(op)
    if fn is not None:
        return fn(*tensors, **statics)
    ns, _, rest = op.partition("::")
    base, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, ns), base)
    return getattr(packet, overload or "default")(*tensors, **statics)


def stats(dispatcher: _native.Dispatcher | None = None) -> dict[str, Any]:
    """The dispatcher's counters (calls, substitutions, fallbacks by reason, times)."""
    return (dispatcher or default_dispatcher()).stats()


def cache_stats() -> dict[str, Any]:
    """The compile cache's counters."""
    return _native.cache_stats()
