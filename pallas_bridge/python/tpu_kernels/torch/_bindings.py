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
    "float": ("float", "Scalar", "number", "SymFloat"),
    "bool": ("bool",),
    "str": ("str", "ScalarType"),
}
# Unbound argument types a kernel can do without: shape-like int lists (implied by the tensors'
# shapes), and output masks (`bool[3] output_mask`: the outputs not asked for become None).
_UNBOUND_OK = ("SymInt[]", "int[]", "List[int]", "List[bool]")
# Ops whose strided inputs are copied to contiguous ones for the kernel instead of falling back:
# attention's query/key/value reach it as head-transposed views in practically every model, and
# the gradients autograd hands backward ops are often views (of a transpose or an expand); the
# copy is small next to the op itself. Every other op falls back on a non-contiguous input.
COPY_STRIDED_OPS = frozenset(
    {
        "aten::_scaled_dot_product_flash_attention_for_cpu.default",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward.default",
        "aten::native_layer_norm_backward.default",
        "aten::_softmax_backward_data.default",
        "aten::_log_softmax_backward_data.default",
    }
)


# Outputs whose dtype on PyTorch's CPU kernel differs from the op's meta function, which the
# kernels follow (the CPU kernel is what a program without substitution gets): `(op, output)`.
# `native_layer_norm` whose tensors are all of one 16-bit type keeps mean and rstd in that type
# on CPU, where its meta function says f32 (mixed types, e.g. f32 weights, give f32 on CPU too).
CPU_KEEPS_INPUT_DTYPE = frozenset(
    {("aten::native_layer_norm.default", 1), ("aten::native_layer_norm.default", 2)}
)


def cpu_output_dtype(key: str, i: int, meta_dtype, input_dtypes):
    """The dtype PyTorch's CPU kernel gives output `i` of op `key`, from its meta function's
    dtype and the dtypes of the call's tensors."""
    if (key, i) in CPU_KEEPS_INPUT_DTYPE and input_dtypes:
        first = input_dtypes[0]
        if first in (torch.bfloat16, torch.float16) and all(d == first for d in input_dtypes):
            return first
    return meta_dtype


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
    """The argument's type without `Optional`; `ScalarType` for a dtype (which the JIT schema
    types as `int`)."""
    if str(arg.real_type) == "ScalarType":
        return "ScalarType"
    t = arg.type
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
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
        if _type_name(a) in _UNBOUND_OK:
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


def _dtype_name(v) -> object:
    """A `ScalarType` static as kernels read it: torch's name without `torch.` (`float32`)."""
    return str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v


@dataclass
class Variant:
    """How a call binds to the kernels of one op that share one binding."""

    kernels: list[str]
    tensor_slots: list[tuple[str, int]] = field(default_factory=list)
    # (name, position, torch default, is a dtype)
    static_slots: list[tuple[str, int, object, bool]] = field(default_factory=list)
    # Tensor arguments of torch's schema these kernels do not take: a call must leave them None.
    absent: list[tuple[str, int]] = field(default_factory=list)
    # Strided tensor inputs are copied to contiguous ones (see COPY_STRIDED_OPS).
    copy_strided: bool = False

    def bind(self, args: tuple, kwargs: dict):
        n = len(args)
        for name, pos in self.absent:
            v = args[pos] if pos < n else kwargs.get(name)
            if v is not None:
                return f"argument `{name}` is given; kernel {' / '.join(self.kernels)} does not take it"
        tensors = []
        for name, pos in self.tensor_slots:
            t = args[pos] if pos < n else kwargs.get(name)
            if not isinstance(t, torch.Tensor):
                return f"argument `{name}` is {type(t).__name__}, not a tensor"
            if self.copy_strided and not t.is_contiguous():
                t = t.contiguous()
            tensors.append(t)
        statics = []
        for name, pos, default, is_dtype in self.static_slots:
            if pos < n:
                v = args[pos]
            elif name in kwargs:
                v = kwargs[name]
            else:
                v = default
            if v is None:
                continue
            statics.append((name, _dtype_name(v) if is_dtype else v))
        return tensors, statics


@dataclass
class Plan:
    """How calls of one op overload reach its kernels: one variant per distinct binding (an op
    with an optional tensor, such as SDPA's `attn_mask`, has a kernel with it and one without);
    a call takes the first variant it binds to, and the dispatcher selects among the op's
    kernels by their guards."""

    key: str
    kernels: list[str]
    # Kernels bound to this op whose binding was refused (schema mismatch): never run here.
    refused: dict[str, str] = field(default_factory=dict)
    variants: list[Variant] = field(default_factory=list)
    # The one tensor position of a single-variant unary op (`silu(self)`), for the fast path.
    unary: int | None = None
    # An unbound `bool[]` output mask (`native_layer_norm_backward`'s): the kernels compute
    # every output, and those the call did not ask for are returned as None, as PyTorch does.
    output_mask: tuple[str, int] | None = None

    def mask_outputs(self, outs: tuple, args: tuple, kwargs: dict) -> tuple:
        """`outs` with None where the call's output mask leaves an output out."""
        if self.output_mask is None:
            return outs
        name, pos = self.output_mask
        mask = args[pos] if pos < len(args) else kwargs.get(name)
        if mask is None or all(mask):
            return outs
        return tuple(o if keep else None for o, keep in zip(outs, mask))

    def bind(self, args: tuple, kwargs: dict):
        """(tensors, statics) for the native call, or a reason string when the call cannot go
        to a kernel."""
        pos = self.unary
        if pos is not None and not kwargs and pos < len(args):
            t = args[pos]
            if isinstance(t, torch.Tensor):
                return [t], []
        reasons = []
        for v in self.variants:
            r = v.bind(args, kwargs)
            if type(r) is not str:
                return r
            reasons.append(r)
        return "; ".join(dict.fromkeys(reasons))


def _variant(info: dict, args) -> Variant | str:
    bindings = info["bindings"] or _bindings_by_name(info, args)
    if isinstance(bindings, str):
        return bindings
    v = Variant(kernels=[info["name"]])
    bound = set()
    for name, pos, kind, index in sorted(bindings, key=lambda b: (b[2] != "tensor", b[3])):
        bound.add(name)
        if kind == "tensor":
            v.tensor_slots.append((name, pos))
        else:
            a = args[pos] if pos < len(args) else None
            default = a.default_value if a is not None and a.has_default_value() else None
            is_dtype = a is not None and _type_name(a) == "ScalarType"
            v.static_slots.append((name, pos, default, is_dtype))
    for pos, a in enumerate(args):
        if a.name in bound:
            continue
        if _type_name(a) == "Tensor":
            v.absent.append((a.name, pos))
    return v


def _plan(key: str, infos: list[dict], refused: dict[str, str], args) -> Plan | None:
    variants: dict[tuple, Variant] = {}
    for info in infos:
        v = _variant(info, args)
        if isinstance(v, str):
            continue
        shape = (tuple(v.tensor_slots), tuple(v.static_slots), tuple(v.absent))
        if shape in variants:
            variants[shape].kernels.append(info["name"])
        else:
            variants[shape] = v
    if not variants:
        return None
    for v in variants.values():
        v.copy_strided = key in COPY_STRIDED_OPS
    plan = Plan(key=key, kernels=[i["name"] for i in infos], refused=refused, variants=list(variants.values()))
    bound = {b for v in plan.variants for b, _ in v.tensor_slots} | {s[0] for v in plan.variants for s in v.static_slots}
    masks = [(a.name, pos) for pos, a in enumerate(args) if a.name not in bound and _type_name(a) == "List[bool]"]
    plan.output_mask = masks[0] if masks else None
    if len(plan.variants) == 1:
        only = plan.variants[0]
        if len(only.tensor_slots) == 1 and not (only.static_slots or only.absent) and not masks:
            plan.unary = only.tensor_slots[0][1]
    return plan


class Table:
    """Kernels by op, plans per OpOverload, schema refusals."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.infos: list[dict] = []
        self.by_op: dict[str, list[dict]] = {}
        self.refused: dict[str, str] = {}
        self.plans: dict[object, Plan | None] = {}
        self.in_place_plans: dict[object, Plan | None] = {}
        self.loaded = False
        self.generation = None

    def refresh(self) -> None:
        """Rereads the kernel table when the registry changed (a runtime registration or
        removal) since it was read."""
        if self.loaded and native().registry_generation() != self.generation:
            with self.lock:
                self.loaded = False
                self.plans.clear()
                self.in_place_plans.clear()
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

    def plan(self, func, mutable: bool = False) -> Plan | None:
        """The plan for `func` (an OpOverload), memoised; None when no kernel binds it. An op
        that updates its arguments (`tpuk::adamw_step`) has a plan only for callers that run
        it in place (`mutable`): the eager modes run it as itself, whose implementation
        writes its arguments; a plan would run it as a pure function."""
        # The eager modes read `plans` directly: it holds None for an in-place op.
        memo = self.plans
        if func._schema.is_mutable:
            if not mutable:
                self.plans[func] = None
                return None
            memo = self.in_place_plans
        try:
            return memo[func]
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
        plan = _plan(key, infos, refused, list(func._schema.arguments)) if infos else None
        memo[func] = plan
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
