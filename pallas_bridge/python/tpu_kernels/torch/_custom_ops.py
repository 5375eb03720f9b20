"""Kernels that define new ops (`tpuk::rms_norm`, `tpuk::matmul_bias_act`) as torch.library ops.

Each op gets a schema built from the kernel record (tensor inputs, then statics with their
defaults), a CPU implementation that runs the kernel through the dispatcher (DLPack in and
out), a fake (meta) function from the kernel's output rule (evaluated on the Rust side, which
builds the module and reads `@main`'s result types when the rule says so), and, when the
kernel names a backward kernel, an autograd formula that calls it with
`(grad_output, *inputs, **statics)` and expects one gradient per tensor input.
`torch.library.opcheck` passes for each. A call no kernel takes runs the op's PyTorch reference
(`_references.py`) when it has one, and raises `KernelOpError` with the reason otherwise.
"""

from __future__ import annotations

import json
import threading

import torch

from . import _stats
from ._bindings import resolve_overload
from ._native import native
from ._references import REFERENCES
from ._output import as_tensor

_TORCH_DTYPES = {
    "f32": torch.float32,
    "f64": torch.float64,
    "bf16": torch.bfloat16,
    "f16": torch.float16,
    "i8": torch.int8,
    "i16": torch.int16,
    "i32": torch.int32,
    "i64": torch.int64,
    "u8": torch.uint8,
    "u32": torch.uint32,
    "bool": torch.bool,
}
_SHORT = {v: k for k, v in _TORCH_DTYPES.items()}
_SCHEMA_TYPES = {"int": "int", "float": "float", "bool": "bool", "str": "str"}

_lock = threading.Lock()
_ops: dict[str, object] = {}
_libs: list = []


class KernelOpError(RuntimeError):
    """A custom op's kernel could not run and the op has no PyTorch reference to run instead."""


def _default_text(kind: str, value) -> str:
    if kind == "str":
        return json.dumps(value)
    if kind == "bool":
        return "True" if value else "False"
    return repr(value)


def fake_outputs(kernel: str, qualname: str, tensors, statics) -> list:
    """The fake (meta) implementation of every op a kernel defines, Rust or imported: empty
    tensors of the kernel's output types at the call's signature, on the inputs' device. The
    types come from the kernel's output rule (an imported kernel's: the result types of its
    export specialised to the signature, the module the call would run)."""
    types = []
    for t in tensors:
        if t.dtype not in _SHORT:
            raise TypeError(f"{qualname}: dtype {t.dtype} has no kernel spelling")
        types.append((_SHORT[t.dtype], [int(d) for d in t.shape]))
    device = tensors[0].device if tensors else None
    return [
        torch.empty(dims, dtype=_TORCH_DTYPES[dtype], device=device)
        for dtype, dims in native().output_types(kernel, types, statics)
    ]


def _n_outputs(info: dict) -> int:
    """How many outputs the kernel has, from its output rule at its first canonical signature."""
    for sig in info.get("canonical") or []:
        tensors, _, statics_text = sig.partition(";")
        inputs = []
        for t in tensors.split("],"):
            t = t.strip().rstrip("]")
            dtype, _, dims = t.partition("[")
            inputs.append((dtype.strip(), [int(d) for d in dims.split(",") if d.strip()]))
        statics = []
        kinds = {s[0]: s[1] for s in info["statics"]}
        for part in statics_text.split(","):
            if "=" in part:
                k, v = (x.strip() for x in part.split("=", 1))
                kind = kinds.get(k, "str")
                val = {"int": int, "float": float, "bool": lambda s: s == "true"}.get(kind, str)(v)
                statics.append((k, val))
        return len(native().output_types(info["name"], inputs, statics))
    return 1


def _define(info: dict, op: str):
    ns, rest = op.split("::", 1)
    name = rest.split(".", 1)[0]
    defaults = native().static_defaults(info["name"])
    kinds = {s[0]: s[1] for s in info["statics"]}
    order = info["schema"] or list(info["inputs"]) + [s[0] for s in info["statics"]]
    # Inputs the kernel updates in place: `Tensor(a!)`, not returned (output k is the new
    # value of mutates[k]).
    mutates = list(info.get("mutates") or [])
    params = []
    for p in order:
        if p in info["inputs"]:
            if p in mutates:
                params.append(f"Tensor({chr(ord('a') + mutates.index(p))}!) {p}")
            else:
                params.append(f"Tensor {p}")
        elif p in kinds:
            text = f"{_SCHEMA_TYPES[kinds[p]]} {p}"
            if p in defaults:
                text += "=" + _default_text(kinds[p], defaults[p])
            params.append(text)
    n_out = _n_outputs(info) - len(mutates)
    rets = "()" if n_out == 0 else "Tensor" if n_out == 1 else "(" + ", ".join(["Tensor"] * n_out) + ")"
    lib = torch.library.Library(ns, "FRAGMENT")
    _libs.append(lib)
    lib.define(f"{name}({', '.join(params)}) -> {rets}")
    qualname = f"{ns}::{name}"
    key = f"{qualname}.default"
    tensor_names = [p for p in order if p in info["inputs"]]
    static_names = [p for p in order if p in kinds]
    lent = [tensor_names.index(p) for p in mutates]

    def split(args, kwargs):
        values = dict(zip(order, args))
        values.update(kwargs)
        tensors = [values[n] for n in tensor_names]
        statics = [(n, values[n]) for n in static_names if n in values]
        return tensors, statics

    def result(outs):
        if n_out == 0:
            return None
        return outs[0] if n_out == 1 else tuple(outs)

    def cpu_impl(*args, **kwargs):
        tensors, statics = split(args, kwargs)
        if lent:
            return result(run_in_place(key, qualname, tensors, statics, lent, REFERENCES.get(key)))
        tensors = [t.detach().contiguous() for t in tensors]
        r = native().call(key, tensors, statics, True)
        if len(r) == 3:
            # No kernel took the call (the dispatcher counted the fallback and its reason): the
            # op's PyTorch reference computes it, where the op has one. A kernel's failure
            # raises instead under the "raise" error policy.
            if r[1] in _stats.ERRORS:
                _stats.raise_if_policy(r[2])
            reference = REFERENCES.get(key)
            if reference is None:
                raise KernelOpError(f"{qualname}: {r[2]}")
            return reference(*tensors, **dict(statics))
        return result([as_tensor(c) for c in r[1]])

    def fake_impl(*args, **kwargs):
        tensors, statics = split(args, kwargs)
        outs = fake_outputs(info["name"], qualname, tensors, statics)
        return result(outs[len(lent) :])

    lib.impl(name, cpu_impl, "CPU")
    torch.library.register_fake(qualname, fake_impl, lib=lib)
    if lent:
        lib.impl(name, bump_versions(qualname, order, mutates), "ADInplaceOrView")
    backward = info.get("backward")
    if backward and not mutates:
        _register_autograd(qualname, backward, tensor_names, static_names, order, lib)
    return getattr(getattr(torch.ops, ns), name).default


def run_in_place(key: str, qualname: str, tensors: list, statics: list, lent: list, fallback) -> list:
    """Runs in-place op `key` on CPU tensors: the kernel writes the new values of the tensors
    at positions `lent` into their own memory, and the other outputs are returned. A strided
    tensor is updated through a contiguous copy; a call no kernel takes runs `fallback` (the
    op's PyTorch reference, or its JAX function), whose first outputs are copied into the
    updated tensors."""
    # `detach` shares memory, so the kernel writes the caller's tensors.
    work = [t.detach().contiguous() for t in tensors]
    r = native().call(key, work, statics, True, lent)
    if len(r) == 3:
        if r[1] in _stats.ERRORS:
            _stats.raise_if_policy(r[2])
        if fallback is None:
            raise KernelOpError(f"{qualname}: {r[2]}")
        outs = fallback(*work, **dict(statics))
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        for k, i in enumerate(lent):
            work[i].copy_(outs[k])
        outs = outs[len(lent) :]
    else:
        outs = [as_tensor(c) for c in r[1]]
    for i in lent:
        if work[i].data_ptr() != tensors[i].data_ptr():
            tensors[i].copy_(work[i])
    return outs


def bump_versions(qualname: str, order: list, mutates: list):
    """The op's ADInplaceOrView kernel: runs it, then bumps the version counters of the tensors
    it updated, as PyTorch's in-place ops do, so autograd refuses a backward that would read a
    saved tensor the op overwrote."""
    positions = [order.index(n) for n in mutates]
    ns, name = qualname.split("::", 1)

    def inplace_or_view(*args, **kwargs):
        op = getattr(getattr(torch.ops, ns), name).default
        with torch._C._AutoDispatchBelowADInplaceOrView():
            out = op(*args, **kwargs)
        for pos, n in zip(positions, mutates):
            t = args[pos] if pos < len(args) else kwargs[n]
            torch.autograd.graph.increment_version(t)
        return out

    return inplace_or_view


def _register_autograd(qualname, backward, tensor_names, static_names, order, lib) -> None:
    bwd_info = next((k for k in native().kernels() if k["name"] == backward), None)
    if bwd_info is None:
        return
    bwd_op = bwd_info["ops"][0] if bwd_info["ops"] else None

    def setup_context(ctx, inputs, output):
        values = dict(zip(order, inputs))
        ctx.save_for_backward(*[values[n] for n in tensor_names])
        ctx.statics = [(n, values[n]) for n in static_names if n in values]

    bwd_statics = {s[0] for s in bwd_info.get("statics", [])}

    def grad_fn(ctx, grad):
        saved = [t.contiguous() for t in ctx.saved_tensors]
        statics = {n: v for n, v in ctx.statics if n in bwd_statics}
        # Through the backward kernel's own torch op when it has one: its fake function lets
        # AOT autograd and torch.compile trace the backward (opcheck's aot_dispatch tests).
        op = _ops.get(bwd_op) or resolve_overload(bwd_op)
        if op is not None:
            out = op(grad.contiguous(), *saved, **statics)
            grads = list(out) if isinstance(out, (tuple, list)) else [out]
        else:
            r = native().call(bwd_op, [grad.contiguous(), *saved], list(statics.items()), True)
            if len(r) == 3:
                if r[1] in _stats.ERRORS:
                    _stats.raise_if_policy(r[2])
                reference = REFERENCES.get(bwd_op)
                if reference is None:
                    raise KernelOpError(f"{qualname} backward ({backward}): {r[2]}")
                grads = list(reference(grad.contiguous(), *saved, **statics))
            else:
                grads = [as_tensor(c) for c in r[1]]
        return (*grads, *([None] * len(static_names)))

    if bwd_op is not None:
        torch.library.register_autograd(qualname, grad_fn, setup_context=setup_context, lib=lib)


def custom_ops(kernels=None) -> dict[str, object]:
    """Registers (once per op) and returns `{op name: OpOverload}` for every kernel that defines
    a new op (a namespace other than `aten`); ops torch already has are listed as they are.
    With `kernels` (names), only those kernels' ops."""
    from ._bindings import resolve_overload

    wanted = None if kernels is None else set(kernels)
    with _lock:
        mine: dict[str, object] = {}
        for info in native().kernels():
            if wanted is not None and info["name"] not in wanted:
                continue
            for op in info["ops"]:
                if not op.startswith("aten::"):
                    mine[op] = None
                if op.startswith("aten::") or op in _ops:
                    continue
                existing = resolve_overload(op)
                # An op torch already has (an imported kernel's `register_jax` defines its own):
                # listed, not redefined.
                _ops[op] = existing if existing is not None else _define(info, op)
        if wanted is not None:
            return {op: _ops[op] for op in mine}
        return dict(_ops)
