"""The kernel table as PyTorch sees it: which op overloads have kernels, how their arguments
bind, and the check of every ATen binding against the live torch schema.

A plan is built once per `OpOverload` (memoised) and maps a call's `(args, kwargs)` to the
kernel's tensor inputs and static values.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field

import torch

from ._native import native

_TENSOR_KINDS = ("Tensor",)
# Static kinds of a kernel vs torch schema argument types they accept.
_STATIC_TYPES = {
    "int": ("int", "SymInt"),
    "float": ("float", "Scalar", "SymFloat"),
    "bool": ("bool",),
    "str": ("str",),
}


class SchemaMismatchError(TypeError):
    """A kernel's binding disagrees with the live torch schema of the op it replaces."""


def op_key(func) -> str:
    """`aten::mm.default`: the schema name, a dot, the overload name (`default` when empty)."""
    schema = func._schema
    return f"{schema.name}.{schema.overload_name or 'default'}"


def resolve_overload(key: str):
    """The torch `OpOverload` of `ns::name.overload`, or None."""
    ns, rest = key.split("::", 1)
    name, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        return None


def _type_name(arg) -> str:
    t = arg.type
    inner = getattr(t, "getElementType", None)
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    del inner
    return str(t)


def _kernel_schema_text(info: dict) -> str:
    statics = {s[0]: s for s in info["statics"]}
    parts = []
    names = info["schema"] or list(info["inputs"]) + [s[0] for s in info["statics"]]
    for name in names:
        if name in info["inputs"]:
            parts.append(f"Tensor {name}")
        elif name in statics:
            kind, default = statics[name][1], statics[name][2]
            parts.append(f"{kind} {name}" + (f"={default}" if default is not None else ""))
        else:
            parts.append(f"(unbound) {name}")
    return f"{info['name']}({', '.join(parts)})"


def check_kernel_schema(info: dict, op: str) -> str | None:
    """None when kernel `info` binds `op` consistently with torch's live schema, else a message
    naming both schemas and the first disagreement."""
    func = resolve_overload(op)
    if func is None:
        return f"kernel `{info['name']}` binds `{op}`, which torch does not have"
    schema = func._schema
    args = list(schema.arguments)
    theirs = f"{op}: {schema}"
    mine = f"kernel {_kernel_schema_text(info)}"

    def refuse(why: str) -> str:
        return f"kernel `{info['name']}` does not match torch's `{op}`: {why}\n  kernel: {mine}\n  torch:  {theirs}"

    positional = [a.name for a in args]
    if info["schema"] and positional[: len(info["schema"])] != list(info["schema"]):
        return refuse(f"argument names {list(info['schema'])} vs torch's {positional[: len(info['schema'])]}")
    bindings = info["bindings"] or _bindings_by_name(info, args)
    if isinstance(bindings, str):
        return refuse(bindings)
    n_tensor = sum(1 for b in bindings if b[2] == "tensor")
    if n_tensor != len(info["inputs"]):
        return refuse(f"{len(info['inputs'])} tensor inputs but {n_tensor} bound")
    for name, position, kind, index in bindings:
        if position >= len(args) or args[position].name != name:
            got = args[position].name if position < len(args) else "nothing"
            return refuse(f"`{name}` is bound at position {position}, where torch has {got}")
        tname = _type_name(args[position])
        if kind == "tensor":
            if tname not in _TENSOR_KINDS:
                return refuse(f"`{name}` is a tensor input, torch's is `{tname}`")
        else:
            skind = info["statics"][index][1]
            if tname not in _STATIC_TYPES.get(skind, ()):
                return refuse(f"static `{name}` is a {skind}, torch's is `{tname}`")
    # Every required torch argument the kernel does not bind must be one it can do without:
    # only shape-like arguments (int lists) may stay unbound.
    bound = {b[0] for b in bindings}
    for a in args:
        if a.name in bound or a.has_default_value() or a.kwarg_only:
            continue
        if _type_name(a) in ("SymInt[]", "int[]", "List[int]"):
            continue
        return refuse(f"torch's required argument `{a.name}: {_type_name(a)}` is not bound")
    return None


def _bindings_by_name(info: dict, args) -> list | str:
    names = [a.name for a in args]
    out = []
    for i, name in enumerate(info["inputs"]):
        if name not in names:
            return f"tensor input `{name}` is not an argument of torch's schema"
        out.append((name, names.index(name), "tensor", i))
    for i, s in enumerate(info["statics"]):
        if s[0] not in names:
            return f"static `{s[0]}` is not an argument of torch's schema"
        out.append((s[0], names.index(s[0]), "static", i))
    return out


@dataclass
class Plan:
    """How calls of one op overload reach its kernels."""

    key: str
    kernels: list[str]
    # Kernels bound to this op whose binding was refused (schema mismatch): never run here.
    refused: dict[str, str] = field(default_factory=dict)
    # (name, position, kind, index, torch default) per binding, from the first kernel.
    tensor_slots: list[tuple[str, int]] = field(default_factory=list)
    static_slots: list[tuple[str, int, object]] = field(default_factory=list)

    def bind(self, args: tuple, kwargs: dict):
        """(tensors, statics) for the native call, or a reason string when the call cannot go
        to a kernel."""
        if not self.static_slots and not kwargs and len(self.tensor_slots) == 1:
            # The common unary case (`silu(self)`): no loops.
            pos = self.tensor_slots[0][1]
            if pos < len(args):
                t = args[pos]
                if isinstance(t, torch.Tensor):
                    return [t], []
        tensors = []
        n = len(args)
        for name, pos in self.tensor_slots:
            t = args[pos] if pos < n else kwargs.get(name)
            if not isinstance(t, torch.Tensor):
                return f"argument `{name}` is {type(t).__name__}, not a tensor"
            tensors.append(t)
        statics = []
        for name, pos, default in self.static_slots:
            if pos < n:
                v = args[pos]
            elif name in kwargs:
                v = kwargs[name]
            else:
                v = default
            if v is None:
                continue
            statics.append((name, v))
        return tensors, statics


class Table:
    """Kernels by op, plans per OpOverload, schema refusals."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.infos: list[dict] = []
        self.by_op: dict[str, list[dict]] = {}
        self.refused: dict[str, str] = {}
        self.plans: dict[object, Plan | None] = {}
        self.loaded = False
        self.generation = None

    def refresh(self) -> None:
        """Rereads the kernel table when the registry changed (a runtime registration or
        removal) since it was read."""
        if self.loaded and native().registry_generation() != self.generation:
            with self.lock:
                self.loaded = False
                self.plans.clear()
                self.refused.clear()
        self.load()

    def load(self) -> None:
        with self.lock:
            if self.loaded:
                return
            self.generation = native().registry_generation()
            self.infos = list(native().kernels())
            by_op: dict[str, list[dict]] = {}
            for info in self.infos:
                for op in info["ops"]:
                    if op.startswith("aten::"):
                        err = check_kernel_schema(info, op)
                        if err is not None:
                            self.refused[info["name"]] = err
                            warnings.warn(err, stacklevel=2)
                            continue
                    by_op.setdefault(op, []).append(info)
            self.by_op = by_op
            self.loaded = True

    def plan(self, func) -> Plan | None:
        """The plan for `func` (an OpOverload), memoised; None when no kernel binds it."""
        try:
            return self.plans[func]
        except KeyError:
            pass
        self.load()
        key = op_key(func)
        infos = self.by_op.get(key)
        refused = {
            info["name"]: self.refused[info["name"]]
            for info in self.infos
            if key in info["ops"] and info["name"] in self.refused
        }
        plan = None
        if infos:
            info = infos[0]
            args = list(func._schema.arguments)
            bindings = info["bindings"] or _bindings_by_name(info, args)
            if not isinstance(bindings, str):
                plan = Plan(key=key, kernels=[i["name"] for i in infos], refused=refused)
                for name, pos, kind, index in sorted(bindings, key=lambda b: (b[2] != "tensor", b[3])):
                    if kind == "tensor":
                        plan.tensor_slots.append((name, pos))
                    else:
                        a = args[pos] if pos < len(args) else None
                        default = a.default_value if a is not None and a.has_default_value() else None
                        plan.static_slots.append((name, pos, default))
        self.plans[func] = plan
        return plan


TABLE = Table()


def refused_kernels() -> list[str]:
    """Names of the kernels whose ATen binding was refused."""
    TABLE.refresh()
    return sorted(TABLE.refused)


def check_schemas() -> dict[str, str]:
    """Kernel name -> refusal message for every ATen binding that disagrees with torch."""
    TABLE.refresh()
    return dict(TABLE.refused)
