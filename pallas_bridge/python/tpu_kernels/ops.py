"""New ops (``mylib::op``) defined by imported kernels, as ``torch.library`` ops.

The op's implementation dispatches to the kernel; when no kernel runs it falls back to the JAX
function on the CPU (tensors cross through DLPack). Its fake (meta) implementation, which
torch.compile traces with, gives the kernel's output types at the call's signature (the result
types of the export specialised to it), as every op a kernel defines does. Removing the kernel
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


def _jax_output_types(fn: Callable[..., Any], tensors: Sequence[Any], statics: Mapping[str, Any]) -> list[Any]:
    """The JAX function's outputs at the tensors' shapes and dtypes (``jax.eval_shape``: traced,
    never run), as empty tensors on their device."""
    import jax
    import jax.numpy as jnp
    import torch

    from ._types import TensorSpec
    from .jax_import import _x64

    structs = [
        jax.ShapeDtypeStruct(tuple(int(d) for d in t.shape), jnp.dtype(str(t.dtype).removeprefix("torch.")))
        for t in tensors
    ]
    with _x64([[TensorSpec.of(s) for s in structs]]):
        out = jax.eval_shape(lambda *xs: fn(*xs, **statics), *structs)
    outs = out if isinstance(out, (tuple, list)) else [out]
    device = tensors[0].device if tensors else None
    return [
        torch.empty(o.shape, dtype=getattr(torch, jnp.dtype(o.dtype).name), device=device) for o in outs
    ]


def define_new_op(
    op: str,
    kernel: str,
    inputs: Sequence[str],
    statics: Mapping[str, Any],
    fn: Callable[..., Any],
    cpu_fn: Callable[..., Any],
    n_outputs: int = 1,
    mutates: Sequence[str] = (),
) -> None:
    """Defines `op` (``ns::name``) in torch, running kernel `kernel` (falling back to `fn`), with
    `n_outputs` tensor results. The inputs in `mutates` (in argument order) are updated in
    place: they are ``Tensor(a!)`` in the schema, and the first ``len(mutates)`` results are
    their new values, written into their memory and not returned."""
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
    mutates = list(mutates)
    lent = [list(inputs).index(n) for n in mutates]
    args = [
        f"Tensor({chr(ord('a') + mutates.index(n))}!) {n}" if n in mutates else f"Tensor {n}" for n in inputs
    ]
    kw = [f"{_SCHEMA_TYPES[static_kind(v)]} {k}={v!r}" for k, v in statics.items()]
    n_ret = n_outputs - len(mutates)
    rets = "()" if n_ret == 0 else "Tensor" if n_ret == 1 else "(" + ", ".join(["Tensor"] * n_ret) + ")"
    schema = f"({', '.join(args + (['*'] + kw if kw else []))}) -> {rets}"
    key = f"{ns}::{base}.default"
    with _lock:
        if key in _libraries:
            raise RegistrationError(f"kernel `{kernel}`: op `{op}` is already defined by another kernel")
        lib = torch.library.Library(ns, "FRAGMENT")
        try:
            lib.define(f"{base}{schema}")

            def impl(*tensors: Any, **kwargs: Any) -> Any:
                return dispatch(op, *tensors, **kwargs)

            if mutates:
                from .torch._custom_ops import bump_versions, run_in_place

                fallback = _jax_fallback(cpu_fn if cpu_fn is not None else fn)

                def impl(*tensors: Any, **kwargs: Any) -> Any:  # noqa: F811
                    values = [(k, kwargs.get(k, v)) for k, v in statics.items()]
                    outs = run_in_place(key, f"{ns}::{base}", list(tensors), values, lent, fallback)
                    return None if n_ret == 0 else outs[0] if n_ret == 1 else tuple(outs)

                lib.impl(base, bump_versions(f"{ns}::{base}", list(inputs), mutates), "ADInplaceOrView")

            lib.impl(base, impl, "CompositeExplicitAutograd")

            def fake(*tensors: Any, **kwargs: Any) -> Any:
                # Under torch.compile (FakeTensors): the kernel's output types, as for every op
                # a kernel defines; the kernel itself never runs here.
                from .torch._custom_ops import fake_outputs

                values = [(k, kwargs.get(k, v)) for k, v in statics.items()]
                try:
                    outs = fake_outputs(kernel, f"{ns}::{base}", list(tensors), values)
                except ValueError:
                    # No variant of the kernel fits the call (a shape its guards refuse): the op
                    # runs the JAX function there, and these are its types.
                    outs = _jax_output_types(cpu_fn if cpu_fn is not None else fn, tensors, dict(values))
                if len(outs) != n_outputs:
                    raise RegistrationError(
                        f"kernel `{kernel}`: op `{op}` returns {n_outputs} tensor(s), the kernel {len(outs)}"
                    )
                outs = outs[len(mutates) :]
                return None if n_ret == 0 else outs[0] if n_ret == 1 else tuple(outs)

            torch.library.register_fake(f"{ns}::{base}", fake, lib=lib)
        except Exception as e:
            lib._destroy()
            raise RegistrationError(f"kernel `{kernel}`: cannot define op `{op}` in torch: {e}") from e
        _libraries[key] = lib


def define_autograd(op: str, backward_op: str, n_tensors: int, statics: Mapping[str, Any]) -> None:
    """Gives `op` (defined by :func:`define_new_op`) the gradient `backward_op` computes: called
    as ``backward_op(grad, *tensor_inputs, **statics)``, one gradient per tensor input."""
    import torch

    ns, _, rest = op.partition("::")
    base = rest.partition(".")[0]
    with _lock:
        lib = _libraries.get(f"{ns}::{base}.default")
    if lib is None:
        raise RegistrationError(f"op `{op}` is not defined by an imported kernel")
    bns, _, brest = backward_op.partition("::")
    names = list(statics)

    # The schema takes the tensors positionally and the statics keyword-only: torch hands the
    # statics to `setup_context` apart and wants gradients for the tensors alone.
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any, keyword_only_inputs: Any = None) -> None:
        ctx.save_for_backward(*inputs[:n_tensors])
        given = dict(keyword_only_inputs or {})
        ctx.statics = {k: given.get(k, v) for k, v in statics.items()}

    def backward(ctx: Any, grad: Any) -> Any:
        bwd = getattr(getattr(torch.ops, bns), brest.partition(".")[0])
        grads = bwd(grad.contiguous(), *ctx.saved_tensors, **ctx.statics)
        return tuple(grads) if isinstance(grads, (tuple, list)) else grads

    if names:
        def setup(ctx: Any, inputs: tuple[Any, ...], keyword_only_inputs: Any, output: Any) -> None:
            setup_context(ctx, inputs, output, keyword_only_inputs)
    else:
        def setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            setup_context(ctx, inputs, output)

    torch.library.register_autograd(f"{ns}::{base}", backward, setup_context=setup, lib=lib)


def remove_op(op: str) -> None:
    """Removes a new op defined by :func:`define_new_op` (no-op for others)."""
    from .dispatch import set_fallback

    set_fallback(op, None)
    name = op.rsplit("::", 1)[-1]
    with _lock:
        lib = _libraries.pop(op if "." in name else f"{op}.default", None)
    if lib is not None:
        lib._destroy()
