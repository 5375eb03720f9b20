"""FX graphs of ATen ops -> the registry's graph JSON format (`registry/src/graph/mod.rs`)."""

from __future__ import annotations

import json
import math
import operator

import torch

from ._bindings import op_key

FORMAT_VERSION = 1

DTYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.uint32: "u32",
    torch.bool: "bool",
    torch.float8_e4m3fn: "f8e4m3fn",
    torch.float8_e5m2: "f8e5m2",
}


class Unencodable(TypeError):
    """A node or value the JSON format cannot describe."""


def short_type(val) -> str:
    if not isinstance(val, torch.Tensor):
        raise Unencodable(f"expected a tensor, got {type(val).__name__}")
    dtype = DTYPES.get(val.dtype)
    if dtype is None:
        raise Unencodable(f"dtype {val.dtype} has no tpu-kernels spelling")
    dims = []
    for d in val.shape:
        if not isinstance(d, int):
            raise Unencodable(f"symbolic dimension {d}")
        dims.append(str(d))
    return f"{dtype}[{','.join(dims)}]"


def json_float(x: float):
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def encode_arg(a, ref):
    """One argument; `ref(x)` maps a tensor-valued thing (FX node, or a recorded tensor) to a
    reference dict, or None when `a` is not one."""
    r = ref(a)
    if r is not None:
        return {"tensor": r}
    if a is None:
        return "none"
    if isinstance(a, bool):
        return {"bool": a}
    if isinstance(a, int):
        return {"int": a}
    if isinstance(a, float):
        return {"float": json_float(a)}
    if isinstance(a, str):
        return {"string": a}
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).removeprefix("torch.")}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    if isinstance(a, torch.layout):
        return {"layout": str(a).removeprefix("torch.")}
    if isinstance(a, torch.memory_format):
        return {"memory_format": str(a).removeprefix("torch.")}
    if isinstance(a, (list, tuple)):
        if a and all(isinstance(x, bool) for x in a):
            return {"bool_list": list(a)}
        if all(isinstance(x, int) and not isinstance(x, bool) for x in a):
            return {"int_list": list(a)}
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in a):
            return {"float_list": [json_float(float(x)) for x in a]}
        refs = [None if x is None else ref(x) for x in a]
        if all(r is not None or x is None for r, x in zip(refs, a)):
            return {"tensor_list": refs}
    raise Unencodable(f"cannot encode argument {a!r} ({type(a).__name__})")


# Ops with an output mask whose outputs left out are None in FX: the argument each output's type
# follows (a tensor, or a list of sizes in the dtype of the op's first tensor argument), so the
# node still declares every output (the lowerings fill the ones left out with zeros, which the
# graph never reads and XLA drops).
_MASKED_OUTPUT_LIKE = {
    "aten::native_layer_norm_backward.default": ("input", "weight", "bias"),
    "aten::convolution_backward.default": ("input", "weight", "bias_sizes"),
    "aten::native_batch_norm_backward.default": ("input", "weight", "weight"),
    "aten::native_group_norm_backward.default": ("input", "weight", "weight"),
}


def fill_masked_outputs(node, vals: list) -> list:
    """`vals` (a node's output values) with the outputs an output mask left out (None) filled
    in from the arguments their types follow, for the ops `_MASKED_OUTPUT_LIKE` names."""
    return fill_masked(
        node.target, node.args, node.kwargs, vals, lambda a: a.meta.get("val") if isinstance(a, torch.fx.Node) else a
    )


def fill_masked(func, args, kwargs, vals: list, value_of) -> list:
    """`fill_masked_outputs` for a call of `func`; `value_of(arg)` is an argument's tensor value
    (an FX node's recorded value, or the tensor itself)."""
    like = _MASKED_OUTPUT_LIKE.get(op_key(func))
    if like is None or all(v is not None for v in vals) or len(vals) != len(like):
        return vals

    names = [a.name for a in func._schema.arguments]

    def arg(name):
        i = names.index(name)
        return kwargs.get(name, args[i] if i < len(args) else None)

    first = next(v for v in map(value_of, args) if isinstance(v, torch.Tensor))
    dtype = first.dtype
    out = []
    for v, name in zip(vals, like):
        if v is None:
            a = value_of(arg(name))
            if isinstance(a, torch.Tensor):
                v = a
            elif isinstance(a, (list, tuple)):
                v = torch.empty([int(n) for n in a], dtype=dtype, device="meta")
            else:
                # Nothing gives the size (a convolution without bias): an empty placeholder.
                v = torch.empty([0], dtype=dtype, device="meta")
        out.append(v)
    return out


def _auto_functionalized():
    return getattr(torch.ops.higher_order, "auto_functionalized_v2", None)


def is_in_place_call(node) -> bool:
    """Whether `node` is functionalization's form of a call of an op whose kernels update its
    arguments in place (`auto_functionalized_v2(tpuk.adamw_step.default, ...)`), with each
    updated argument a whole base (not a view of one) and the op returning nothing else."""
    from ._bindings import TABLE

    hop = _auto_functionalized()
    if hop is None or node.target is not hop or not node.args:
        return False
    op = node.args[0]
    if not isinstance(op, torch._ops.OpOverload) or op._schema.returns:
        return False
    TABLE.refresh()
    if not any(info.get("mutates") for info in TABLE.by_op.get(op_key(op), ())):
        return False
    try:
        in_place_call(node)
    except Unencodable:
        return False
    return True


def in_place_call(node):
    """(op, kwargs by argument name with each updated argument's base, the updated arguments in
    the kernels' output order) of an `auto_functionalized_v2` node."""
    from ._bindings import TABLE

    op = node.args[0]
    kwargs = dict(node.kwargs)
    bases = list(kwargs.pop("_all_bases", []))
    written = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    for n in written:
        index = kwargs.pop(f"_{n}_base_index", None)
        if index is None or index >= len(bases):
            raise Unencodable(f"`{n}` is not a whole base")
        kwargs[n] = bases[index]
    if any(k.startswith("_") for k in kwargs):
        # `_<name>_size`, `_<name>_stride`, ...: an updated argument is a view of its base.
        raise Unencodable("an updated argument is a view")
    infos = TABLE.by_op.get(op_key(op), ())
    order = list(next((i["mutates"] for i in infos if i.get("mutates")), written))
    if sorted(order) != sorted(written):
        raise Unencodable(f"the kernels update {order}, the op writes {written}")
    return op, kwargs, order


def node_json(name: str, func, args, kwargs, outputs: list[str], ref) -> dict:
    schema = func._schema
    node = {
        "name": name,
        "op": op_key(func),
        "args": [encode_arg(a, ref) for a in args],
        "arg_names": [a.name for a in schema.arguments],
        "outputs": outputs,
    }
    if kwargs:
        node["kwargs"] = {k: encode_arg(v, ref) for k, v in sorted(kwargs.items())}
    return node


def graph_constant(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.Tensor:
    """The tensor a `get_attr` node reads from the graph module."""
    value = gm
    for part in str(node.target).split("."):
        value = getattr(value, part, None)
    if not isinstance(value, torch.Tensor):
        raise Unencodable(f"node `{node.name}`: attribute `{node.target}` is not a tensor")
    return value


def graph_constants(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """The tensors of the graph's `get_attr` nodes, in the order `fx_to_json` makes them graph
    inputs (after the placeholders), detached and contiguous."""
    return [
        graph_constant(gm, n).detach().contiguous() for n in gm.graph.nodes if n.op == "get_attr"
    ]


def fx_to_json(gm: torch.fx.GraphModule, name: str) -> dict:
    """The JSON of an ATen FX graph whose nodes carry `meta['val']` (what aot_autograd gives)."""
    refs: dict[torch.fx.Node, dict] = {}

    def ref(x):
        if isinstance(x, torch.fx.Node):
            if x not in refs:
                raise Unencodable(f"node `{x.name}` has no tensor value here")
            return refs[x]
        return None

    inputs, constants, nodes, outputs = [], [], [], []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            inputs.append({"name": node.name, "type": short_type(node.meta.get("val"))})
            refs[node] = {"node": node.name}
        elif node.op == "get_attr":
            # A tensor the graph module holds (a constant Dynamo lifted): one more graph input,
            # which the program's caller passes after the placeholders (`graph_constants`).
            value = graph_constant(gm, node)
            constants.append({"name": node.name, "type": short_type(value)})
            refs[node] = {"node": node.name}
        elif node.op == "call_function" and node.target is operator.getitem:
            src, index = node.args
            base = ref(src)
            if "outputs_by_index" in base:
                # An in-place op's functional form: result `index` is a new base (see below).
                index = base["outputs_by_index"].get(index)
                if index is None:
                    raise Unencodable(f"node `{node.name}`: result {node.args[1]} of `{src.name}` is not a tensor")
            refs[node] = {"node": base["node"], **({"output": index} if index else {})}
        elif node.op == "call_function" and is_in_place_call(node):
            # `auto_functionalized_v2(op, ...)`: the op a kernel updates arguments of, as the
            # pure function the kernel is (its outputs are the updated arguments' new values).
            op, kwargs, order = in_place_call(node)
            try:
                out_types = [short_type(kwargs[n].meta.get("val")) for n in order]
                nodes.append(node_json(node.name, op, (), kwargs, out_types, ref))
            except Unencodable as e:
                raise Unencodable(f"node `{node.name}` ({op_key(op)}): {e}") from None
            # Result 1 + b of the call is the new value of base b: the kernel's output for the
            # argument whose base that is.
            bases = node.kwargs["_all_bases"]
            by_index = {1 + bases.index(kwargs[n]): k for k, n in enumerate(order)}
            refs[node] = {"node": node.name, "outputs_by_index": by_index}
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            val = node.meta.get("val")
            vals = list(val) if isinstance(val, (tuple, list)) else [val]
            try:
                out_types = [short_type(v) for v in fill_masked_outputs(node, vals)]
            except Unencodable as e:
                raise Unencodable(f"node `{node.name}` ({op_key(node.target)}): {e}") from None
            try:
                nodes.append(node_json(node.name, node.target, node.args, node.kwargs, out_types, ref))
            except Unencodable as e:
                raise Unencodable(f"node `{node.name}` ({op_key(node.target)}): {e}") from None
            refs[node] = {"node": node.name}
        elif node.op == "output":
            (result,) = node.args
            result = result if isinstance(result, (tuple, list)) else (result,)
            for r in result:
                if r is None:
                    outputs.append(None)
                elif isinstance(r, torch.fx.Node):
                    outputs.append(ref(r))
                else:
                    raise Unencodable(f"graph output {r!r} is not a tensor")
        else:
            raise Unencodable(f"node `{node.name}`: unsupported FX node {node.op} {node.target}")
    return {"version": FORMAT_VERSION, "name": name, "inputs": inputs + constants, "nodes": nodes, "outputs": outputs}


def dumps(graph: dict) -> str:
    return json.dumps(graph, separators=(",", ":"), sort_keys=True)
