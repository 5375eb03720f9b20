"""New ops (``mylib::op``) defined by imported kernels, as ``torch.library`` ops.

The op's implementation dispatches to the kernel; when no kernel runs it falls back to the JAX
function on the CPU (tensors cross through DLPack). Removing the kernel
(:func:`tpu_kernels.unregister`) removes the op.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._types import static_kind
from .errors import RegistrationError

_libraries: dict[str, Any] = {}
_lock = threading.Lock()
_SCHEMA_TYPES = {"int": "int", "float": "float", "bool": "bool", "str": "str"}


def _jax_fallback(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*tensors: Any, **statics: Any) -> Any:
        import jax
        import torch

        from ._types import TensorSpec
        from .jax_import import _x64, pallas_interpret

        xs = [jax.dlpack.from_dlpack(t.contiguous()) for t in tensors]

        with pallas_interpret(), _x64([[TensorSpec.of(t) for t in xs]]):
            out = jax.jit(lambda *xs: fn(*xs, **statics))(*xs)
        outs = out if isinstance(out, (tuple, list)) else [out]
        res = [torch.from_dlpack(o) for o in outs]
        return res[0] if len(res) == 1 else tuple(res)

    return run


def define_new_op(
    op: str,
    kernel: str,
    inputs: Sequence[str],
    statics: Mapping[str, Any],
    fn: Callable[..., Any],
    cpu_fn: Callable[..., Any],
) -> None:
    """Defines `op` (``ns::name``) in torch, running kernel `kernel` (falling back to `fn`)."""
    from .dispatch import dispatch, set_fallback

    set_fallback(op, _jax_fallback(cpu_fn if cpu_fn is not None else fn))
    try:
        import torch
    except ImportError:
        return  # no torch: the op is reachable through tpu_kernels.dispatch only
    ns, _, rest = op.partition("::")
    base, _, overload = rest.partition(".")
    if overload and overload != "default":
        raise RegistrationError(f"kernel `{kernel}`: a new op is defined without an overload, not `{op}`")
    args = [f"Tensor {n}" for n in inputs]
    kw = [f"{_SCHEMA_TYPES[static_kind(v)]} {k}={v!r}" for k, v in statics.items()]
    schema = f"({', '.join(args + (['*'] + kw if kw else []))}) -> Tensor"
    key = f"{ns}::{base}.default"
    with _lock:
        if key in _libraries:
            raise RegistrationError(f"kernel `{kernel}`: op `{op}` is already defined by another kernel")
        lib = torch.library.Library(ns, "FRAGMENT")
        try:
            lib.define(f"{base}{schema}")

            def impl(*tensors: Any, **kwargs: Any) -> Any:
                return dispatch(op, *tensors, **kwargs)

            lib.impl(base, impl, "CompositeExplicitAutograd")
        except Exception as e:
            lib._destroy()
            raise RegistrationError(f"kernel `{kernel}`: cannot define op `{op}` in torch: {e}") from e
        _libraries[key] = lib


def remove_op(op: str) -> None:
    """Removes a new op defined by :func:`define_new_op` (no-op for others)."""
    from .dispatch import set_fallback

    set_fallback(op, None)
    name = op.rsplit("::", 1)[-1]
    with _lock:
        lib = _libraries.pop(op if "." in name else f"{op}.default", None)
    if lib is not None:
        lib._destroy()
