"""The `torch.compile` backend `"tpu_kernels"`, built on aot_autograd.

aot_autograd hands over functionalized ATen graphs (the forward, and the backward when
training) with shapes and dtypes in `node.meta['val']`. Each graph is written in the registry's
graph JSON and lowered to ONE StableHLO program (registered kernels inlined as private
functions reached by `func.call`), compiled once (cached by fingerprint) and run on the PJRT CPU
client. Nodes the lowering cannot take split the graph: the lowerable runs become programs, the
rest run in PyTorch, and `report()` lists them with the reason.

A program that fails at run time, or a graph whose lowering fails for a reason that names no
node, is an error: counted in `report()` (op `"graph:NAME"`, category `replay` or `lower`) and
the graph runs in PyTorch, or `InternalError` under the "raise" error policy
(`tpu_kernels.set_error_policy`).

Decompositions: the core ATen table minus its three scaled-dot-product entries; with them,
SDPA gradients are silently wrong while training.
"""

from __future__ import annotations

import operator
import re
import time

import torch
from torch._dynamo.backends.common import aot_autograd

from ..errors import InternalError, LoweringDeclined
from . import _stats as _report
from ._bindings import op_key
from ._native import native
from ._output import as_tensor
from .graph import Unencodable, dumps, fill_masked_outputs, fx_to_json, graph_constants, is_in_place_call

_MAX_SPLITS = 8


def core_decompositions() -> dict:
    """Core ATen decompositions minus the scaled-dot-product entries: with them, SDPA gradients
    are silently wrong while training."""
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    for op in (
        torch.ops.aten.scaled_dot_product_attention.default,
        torch.ops.aten._scaled_dot_product_attention_math.default,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    ):
        table.pop(op, None)
    return table


def decompositions() -> dict:
    """:func:`core_decompositions` minus every op a registered kernel binds (so the kernel, not
    its decomposition, reaches the graph)."""
    from ._bindings import TABLE, resolve_overload

    table = core_decompositions()
    TABLE.refresh()
    for key in TABLE.by_op:
        func = resolve_overload(key)
        if func is not None:
            table.pop(func, None)
    return table


def _out_items(gm: torch.fx.GraphModule):
    """(single, [node or None per output]) of a graph's output node."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    (result,) = out.args
    single = not isinstance(result, (tuple, list))
    return single, [result] if single else list(result)


def _out_meta(gm: torch.fx.GraphModule):
    """(single, [meta val or None per output]) of a graph's output node."""
    single, items = _out_items(gm)
    return single, [None if r is None else r.meta.get("val") for r in items]


def _needs_layout(meta) -> bool:
    """Whether a traced output's strides differ from the row-major ones a program returns
    (size-1 dims' strides do not matter)."""
    if not isinstance(meta, torch.Tensor) or meta.dim() < 2:
        return False
    expected = 1
    for n, st in zip(reversed(meta.shape), reversed(meta.stride())):
        if n != 1 and st != expected:
            return True
        expected *= n
    return False


def _restride(t: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    """`t` (a program's row-major output) laid out with the strides the traced graph gave the
    output. A broadcast output (stride 0 on a dim of size > 1, an `expand`) is `t`'s first slice
    along those dims expanded, as the graph's own output is: no tensor with overlapping memory
    can be written by copying into it."""
    broadcast = [d for d, (n, st) in enumerate(zip(meta.shape, meta.stride())) if st == 0 and n > 1]
    if broadcast:
        base = t
        for d in broadcast:
            base = base.narrow(d, 0, 1)
        return base.contiguous().expand(meta.shape)
    return torch.empty_strided(meta.shape, meta.stride(), dtype=t.dtype).copy_(t)


class _Program:
    """Runs one lowered graph; on a runtime failure (an error, counted as `replay`), runs the
    graph in PyTorch instead, or raises under the "raise" error policy."""

    def __init__(self, lowered, gm: torch.fx.GraphModule) -> None:
        self.program, in_perms, out_perms, sources, donated = lowered
        # Program outputs the run wrote into an input's memory (it returns None for them): the
        # input is the output.
        self.donated = donated
        self.gm = gm
        # The program's inputs after the placeholders: read at the first run, since the graph
        # is compiled under a fake tensor mode that real tensors must not enter.
        self.constants: list | None = None
        self.single, metas = _out_meta(gm)
        # Inputs and outputs that cross in their traced physical order (`_boundary`): the
        # native run reads such an input in place and returns such an output as the permuted
        # view of the program's result; None when there are none.
        self.layout = None
        if any(p is not None for p in in_perms) or any(p is not None for p in out_perms):
            self.layout = native().BoundaryLayout(in_perms, out_perms)
        # Per graph output, decided once so that a run only converts: None (the output is
        # None), ("arg", k) (the argument itself), ("view", k, ops) (a view of it made again),
        # ("same", i) (graph output i again), ("view_of", i, ops) (a view of graph output i), or
        # ("out", j, layout) with layout False (program output j as the run returns it) or the
        # traced value whose strides a copy gives (`_restride`: broadcast outputs, views into a
        # larger tensor).
        self.sources = []
        for meta, src in zip(metas, sources):
            if src is not None and src[0] == "out":
                perm = out_perms[src[1]]
                src = ("out", src[1], perm is None and _needs_layout(meta) and meta)
            self.sources.append(src)
        self.plain = all(
            src is not None and src[0] == "out" and src[1] == i and src[2] is False
            for i, src in enumerate(self.sources)
        )

    def __call__(self, *args):
        start = time.perf_counter()
        if len(args) == 1 and isinstance(args[0], list):
            args = tuple(args[0])
        try:
            if self.constants is None:
                self.constants = graph_constants(self.gm)
            # The native run reads each tensor where it is (requiring grad or not), gathering
            # only one laid out otherwise than the program reads it.
            tensors = list(args)
            if self.constants:
                tensors += self.constants
            ran = time.perf_counter()
            caps = self.program.run(tensors, self.layout)
            ran = time.perf_counter() - ran
        except Exception as e:  # a kernel-side failure: run the graph in PyTorch
            _report.record_fallback(
                f"graph:{self.program.name}", "replay", f"graph ran in PyTorch: {type(e).__name__}: {e}"
            )
            return self.gm(*args)
        if self.donated:
            caps = [args[self.donated[j]] if c is None else c for j, c in enumerate(caps)]
        if self.plain:
            outs = [as_tensor(c) for c in caps]
        else:
            results = [as_tensor(c) for c in caps]
            outs = [None] * len(self.sources)
            later = []
            for i, src in enumerate(self.sources):
                if src is None:
                    continue
                kind = src[0]
                if kind == "out":
                    t = results[src[1]]
                    outs[i] = t if src[2] is False else _restride(t, src[2])
                elif kind == "arg":
                    outs[i] = args[src[1]]
                elif kind == "view":
                    outs[i] = _replay(args[src[1]], src[2])
                else:
                    later.append(i)
            for i in later:
                src = self.sources[i]
                outs[i] = outs[src[1]] if src[0] == "same" else _replay(outs[src[1]], src[2])
        _report.record_graph_call(time.perf_counter() - start, ran)
        return outs[0] if self.single else tuple(outs)


def _replay(t: torch.Tensor, ops) -> torch.Tensor:
    """`t` through the view methods of a `_view_chain`."""
    for method, args in ops:
        t = t.view_as(t) if args is None else getattr(t, method)(*args)
    return t


def _dense_perm(t) -> list[int] | None:
    """The permutation `p` for which `t.permute(p)` is row-major, when `t` is laid out densely
    in another order than row-major (a transposed or permuted layout); None otherwise (row-major
    already, broadcast, or a view into a larger tensor)."""
    if not _needs_layout(t):
        return None
    shape, stride = t.shape, t.stride()
    perm = sorted(range(t.dim()), key=lambda d: (-stride[d], d))
    expected = 1
    for d in reversed(perm):
        if shape[d] != 1 and stride[d] != expected:
            return None
        expected *= shape[d]
    return perm


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, d in enumerate(perm):
        inv[d] = i
    return inv


def _view_methods() -> dict:
    """The view ops a boundary output may be made again with, each as the tensor method that
    makes it (a C++ binding: about a microsecond, where the op overload's Python call costs
    several)."""
    aten = torch.ops.aten
    return {
        aten.t.default: "t", aten.permute.default: "permute", aten.transpose.int: "transpose",
        aten.view.default: "view", aten.alias.default: "view_as", aten.unsqueeze.default: "unsqueeze",
        aten.squeeze.dim: "squeeze", aten.squeeze.dims: "squeeze", aten.expand.default: "expand",
        aten.select.int: "select",
    }


# Outputs at least this large that are views of an input or of another output are made again
# as views rather than copied by the program (a copy of 256 KiB costs about what remaking a
# chain of views does).
_REMAKE_VIEW_BYTES = 256 * 1024


def _nbytes(val) -> int:
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def _view_chain(node):
    """(root, [(method, args), ...]): `node` as view ops with constant arguments applied to
    `root`, innermost first, each as its tensor method (an empty chain when `node` is no such
    view)."""
    methods = _view_methods()
    chain = []
    while (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and node.target in methods
        and node.args
        and isinstance(node.args[0], torch.fx.Node)
        and not node.kwargs
        and not any(isinstance(a, torch.fx.Node) for a in node.args[1:])
    ):
        method = methods[node.target]
        # `alias(x)` is `x.view_as(x)`: a new view of the same memory.
        chain.append((method, None if method == "view_as" else tuple(node.args[1:])))
        node = node.args[0]
    return node, list(reversed(chain))


def _boundary(gm: torch.fx.GraphModule):
    """`gm` rewritten for the program boundary, and how each graph output is obtained.

    - An output that is a graph input (AOT's forward returns the parameters it saves for the
      backward) or repeats an earlier output is not a program output: XLA would copy it into a
      fresh buffer. The run hands back the argument itself, or the earlier output.
    - Inputs and outputs traced in a dense permuted layout (a weight's transpose saved for the
      backward, attention's head-major views) cross in that physical order: such an input
      becomes a row-major placeholder permuted back inside the program, such an output is
      permuted to its physical order inside it. XLA folds the permutations into the ops around
      them; without them each crossing is a copy in PyTorch on both sides.

    - An output of 256 KiB or more that is a view of a graph input (a weight's transpose saved
      for the backward) or of another output is that view made again by the run (microseconds),
      not a program output (XLA copies every output that shares another's buffer: a whole
      weight each step).

    Returns (graph, per-input permutation or None, per-program-output permutation or None,
    per-graph-output source): a source is None (the output is None), ("arg", k), ("view", k,
    [(method, args), ...]) (view methods applied to argument k), ("same", i) (graph output i),
    ("view_of", i, ops) (view ops applied to graph output i, itself a program output) or
    ("out", j) (program output j). `gm` itself when nothing changes."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    position = {n: k for k, n in enumerate(placeholders)}
    in_perms = [_dense_perm(n.meta.get("val")) for n in placeholders]
    _, items = _out_items(gm)
    # A graph output that is an input, a view of one, a repeat or a view of another output
    # comes from that; the rest are program outputs, each node once.
    direct = {}
    for i, r in enumerate(items):
        if r is not None and r not in position:
            direct.setdefault(r, i)
    sources: list = []
    out_perms: list = []
    for i, r in enumerate(items):
        if r is None:
            sources.append(None)
            continue
        root, chain = _view_chain(r)
        # Making a view again costs microseconds a view (autograd records each); XLA's copy of a
        # small output costs less, so only large outputs are made again.
        remake = bool(chain) and _nbytes(r.meta.get("val")) >= _REMAKE_VIEW_BYTES
        if r in position:
            sources.append(("arg", position[r]))
        elif direct[r] != i:
            sources.append(("same", direct[r]))
        elif remake and root in position:
            sources.append(("view", position[root], chain))
        elif remake and root in direct and direct[root] != i:
            sources.append(("view_of", direct[root], chain))
        else:
            sources.append(("out", len(out_perms)))
            out_perms.append(_dense_perm(r.meta.get("val")))
    kept = all(src is None or src[0] == "out" for src in sources)
    if kept and all(p is None for p in in_perms) and all(p is None for p in out_perms):
        return gm, in_perms, out_perms, sources
    aten = torch.ops.aten
    work = _copy(gm)
    graph = work.graph
    for ph, perm in zip([n for n in graph.nodes if n.op == "placeholder"], in_perms):
        if perm is None:
            continue
        val = ph.meta["val"]
        with graph.inserting_after(ph):
            back = graph.call_function(aten.permute.default, (ph, _inverse(perm)))
        ph.replace_all_uses_with(back, delete_user_cb=lambda user, back=back: user is not back)
        back.meta["val"] = val
        ph.meta = {**ph.meta, "val": torch.empty([val.shape[d] for d in perm], dtype=val.dtype, device="meta")}
    out_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    (result,) = out_node.args
    single = not isinstance(result, (tuple, list))
    work_items = [result] if single else list(result)
    for i, (r, src) in enumerate(zip(work_items, sources)):
        if src is None:
            continue
        if src[0] != "out":
            work_items[i] = None
            continue
        perm = out_perms[src[1]]
        if perm is None:
            continue
        val = r.meta["val"]
        with graph.inserting_before(out_node):
            phys = graph.call_function(aten.permute.default, (r, perm))
        phys.meta["val"] = torch.empty([val.shape[d] for d in perm], dtype=val.dtype, device="meta")
        work_items[i] = phys
    out_node.args = (work_items[0] if single else type(result)(work_items),)
    work.recompile()
    return work, in_perms, out_perms, sources


def _donor(node):
    """The graph input whose memory may take `node`'s value: `node` is an updated argument's
    new value from an in-place op's call (`auto_functionalized_v2`), whose base is that input,
    directly or through a chain of such calls, and nothing else in the graph reads the input or
    the values in between (an optimizer's state). None otherwise."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is operator.getitem:
        call, index = node.args
        if not is_in_place_call(call) or not isinstance(index, int) or index < 1:
            return None
        base = call.kwargs["_all_bases"][index - 1]
        if not isinstance(base, torch.fx.Node) or set(base.users) != {call}:
            return None
        if base.op == "placeholder":
            return base
        node = base
    return None


def _donations(gm, in_perms, out_perms, sources) -> dict[int, int]:
    """{program output: graph input} for the outputs that may be computed into an input's own
    memory (`_donor`), each input once, both crossing row-major."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    position = {n: k for k, n in enumerate(placeholders)}
    _, items = _out_items(gm)
    out: dict[int, int] = {}
    for r, src in zip(items, sources):
        if src is None or src[0] != "out" or out_perms[src[1]] is not None:
            continue
        donor = _donor(r)
        k = position.get(donor)
        if k is not None and in_perms[k] is None and k not in out.values():
            out[src[1]] = k
    return out


def _lower(gm: torch.fx.GraphModule, name: str, whole: bool = False):
    """Lowers `gm` to a program: (program, in_perms, out_perms, sources, donated). `whole`: `gm`
    is the graph AOT autograd handed over (not a part of it), so an input that an in-place op
    updates and nothing else reads may be donated to its new value (`donated`: {program output:
    input}); the run writes that output into the input's memory."""
    from ._bindings import refused_kernels

    work, in_perms, out_perms, sources = _boundary(gm)
    donated = _donations(gm, in_perms, out_perms, sources) if whole else {}
    program = native().compile_graph(
        dumps(fx_to_json(work, name)), refused_kernels(), sorted((k, j) for j, k in donated.items())
    )
    return program, in_perms, out_perms, sources, donated


_NODE_RE = re.compile(r"node `([^`]+)`")


def _supported_pred(supported: set[str], bad: set[str]):
    def ok(node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node.name in bad:
            return False
        if node.target is operator.getitem:
            src = node.args[0]
            return isinstance(src, torch.fx.Node) and ok(src)
        if is_in_place_call(node):
            return op_key(node.args[0]) in supported
        if not isinstance(node.target, torch._ops.OpOverload) or node.target._schema.is_mutable:
            return False
        val = node.meta.get("val")
        vals = list(val) if isinstance(val, (tuple, list)) else [val]
        if not all(isinstance(v, torch.Tensor) for v in fill_masked_outputs(node, vals)):
            return False
        return op_key(node.target) in supported

    return ok


def _updates_in_place(op) -> bool:
    """Whether `op` is one this package defines whose kernels update arguments in place (a Rust
    kernel's `mutates`, an import's `mutates_args`)."""
    from ._bindings import TABLE

    if not isinstance(op, torch._ops.OpOverload) or not op._schema.is_mutable:
        return False
    TABLE.refresh()
    return any(info.get("mutates") for info in TABLE.by_op.get(op_key(op), ()))


def reinplace(gm: torch.fx.GraphModule, only: set | None = None) -> list:
    """Runs the in-place ops this package defines (`tpuk::adamw_step`) in place in `gm`, as
    eager code does: functionalization turned each call into `auto_functionalized_v2`, which
    clones the updated arguments, runs the op on the clones and returns them for AOT autograd
    to copy back. Where an updated argument is a graph input that nothing else in the graph
    reads (an optimizer's parameters and state), the call runs on the input itself and the
    input is returned as its new value: the kernel writes its memory (donated to the program)
    and the copy back is a copy onto itself, which PyTorch skips. Arguments that are views,
    or that other nodes read or autograd saves, keep the functional form. `only`: the names of
    the calls to consider (all when None). Returns the in-place calls made."""
    hop = getattr(torch.ops.higher_order, "auto_functionalized_v2", None)
    if hop is None:
        return 0
    done = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not hop or not node.args:
            continue
        if only is not None and node.name not in only:
            continue
        op = node.args[0]
        if not _updates_in_place(op):
            continue
        kwargs = dict(node.kwargs)
        bases = list(kwargs.pop("_all_bases", []))
        written = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        call_kwargs = {}
        fits = True
        for a in op._schema.arguments:
            if a.name in written:
                # Keys left over below (`_<name>_size`, ...) describe a view of a base: not this
                # rewrite's.
                index = kwargs.pop(f"_{a.name}_base_index", None)
                if index is None:
                    fits = False
                    break
                base = bases[index]
                # Read by nothing else: its only other users are earlier calls this rewrite
                # made, which update it in graph order.
                if (
                    not isinstance(base, torch.fx.Node)
                    or base.op != "placeholder"
                    or any(u is not node and u not in done for u in base.users)
                ):
                    fits = False
                    break
                call_kwargs[a.name] = base
            elif a.name in kwargs:
                call_kwargs[a.name] = kwargs.pop(a.name)
        outs = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        if not fits or kwargs or len(outs) != len(node.users) or (0 in outs and outs[0].users):
            continue
        with gm.graph.inserting_before(node):
            call = gm.graph.call_function(op, (), call_kwargs)
        call.meta["val"] = None
        for j, base in enumerate(bases):
            if 1 + j in outs:
                outs[1 + j].replace_all_uses_with(base)
        for u in outs.values():
            gm.graph.erase_node(u)
        gm.graph.erase_node(node)
        done.append(call)
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def compile_graph_module(gm: torch.fx.GraphModule, name: str):
    """Lowers `gm` (ATen, static shapes) into one or more programs; returns a callable."""
    supported = set(native().supported_ops())
    bad: set[str] = set()
    reasons: dict[str, str] = {}
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    whole = "graph not lowered"
    for _ in range(_MAX_SPLITS):
        ok = _supported_pred(supported, bad)
        for n in calls:
            if not ok(n) and n.target is not operator.getitem and n.name not in bad:
                bad.add(n.name)
                key = op_key(n.target) if isinstance(n.target, torch._ops.OpOverload) else str(n.target)
                if isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable:
                    why = "updates its arguments in place: runs as itself, writing them where they lie"
                else:
                    why = "no lowering for this op" if key not in supported else "unsupported values"
                reasons.setdefault(key, why)
        if not bad:
            try:
                program = _lower(gm, name, whole=True)
            except (ValueError, Unencodable) as e:
                if not _blame(gm, str(e), bad, reasons):
                    whole = f"graph not lowered: {type(e).__name__}: {str(e)[:300]}"
                    if not isinstance(e, (Unencodable, LoweringDeclined)):
                        # A lowering failure that names no node is no op's to decline: an error.
                        # (Unencodable: the graph has what the format cannot carry, such as
                        # symbolic sizes: declined, its nodes listed as run in PyTorch.)
                        _report.record_fallback(f"graph:{name}", "lower", whole)
                    break
                continue
            _report.record_graph(name, program[0].kernels, len(calls), {})
            return _Program(program, gm)
        result = _split(gm, name, ok, bad, reasons)
        if result is not None:
            return result
    # Nothing lowers: the whole graph runs in PyTorch (in-place calls in place).
    for call in reinplace(gm):
        reasons.setdefault(op_key(call.target), "runs as itself, updating its arguments in place")
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    eager = {op_key(n.target) if isinstance(n.target, torch._ops.OpOverload) else str(n.target): reasons.get(
        op_key(n.target) if isinstance(n.target, torch._ops.OpOverload) else str(n.target), whole)
        for n in calls if n.target is not operator.getitem}
    _report.record_graph(name, [], len(calls), eager)
    return gm


def _blame(gm, message: str, bad: set[str], reasons: dict[str, str]) -> bool:
    """Marks the nodes a lowering error names as not lowerable; False when it names none."""
    names = {n.name: n for n in gm.graph.nodes}
    found = False
    for nm in _NODE_RE.findall(message):
        node = names.get(nm)
        if node is not None and nm not in bad and node.op == "call_function":
            bad.add(nm)
            key = op_key(node.target) if isinstance(node.target, torch._ops.OpOverload) else str(node.target)
            reasons[key] = message.splitlines()[0][:300]
            found = True
    return found


def _split(gm, name, ok, bad, reasons):
    """Partitions `gm` into lowerable runs (programs) and PyTorch nodes; None to retry after
    marking more nodes bad."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    class Support(OperatorSupportBase):
        def is_node_supported(self, submodules, node):
            return ok(node)

    work = _copy(gm)
    # In-place calls left to PyTorch run in place, not as clone-update-copy.
    hop_reason = reasons.get(str(getattr(torch.ops.higher_order, "auto_functionalized_v2", "")), "not lowered")
    for call in reinplace(work, only={n for n in bad if n.startswith("auto_functionalized")}):
        reasons[op_key(call.target)] = f"{hop_reason}; runs as itself, updating its arguments in place"
    partitioner = CapabilityBasedPartitioner(work, Support(), allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    fused = partitioner.fuse_partitions(partitions)
    kernels: list[str] = []
    for child_name, child in list(fused.named_children()):
        if not isinstance(child, torch.fx.GraphModule):
            continue
        for ph in child.graph.nodes:
            if ph.op == "placeholder" and "val" not in ph.meta:
                _fill_placeholder_meta(fused, child_name, child)
                break
        try:
            program = _lower(child, f"{name}_{child_name}")
        except (ValueError, Unencodable) as e:
            if _blame(gm, str(e), bad, reasons):
                return None
            # The error names no node of the original graph: this part runs in PyTorch; a
            # lowering failure (not a graph the format cannot carry) is an error.
            if not isinstance(e, (Unencodable, LoweringDeclined)):
                _report.record_fallback(
                    f"graph:{name}_{child_name}", "lower", f"graph not lowered: {type(e).__name__}: {str(e)[:500]}"
                )
            for n in child.graph.nodes:
                if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
                    reasons.setdefault(op_key(n.target), str(e).splitlines()[0][:300])
                    bad.add(n.name)
            return None
        kernels.extend(program[0].kernels)
        setattr(fused, child_name, _ProgramModule(program, child))
    eager = {}
    for n in fused.graph.nodes:
        if n.op == "call_function" and n.target is not operator.getitem:
            key = op_key(n.target) if isinstance(n.target, torch._ops.OpOverload) else str(n.target)
            eager[key] = reasons.get(key, "not lowerable")
    _report.record_graph(name, kernels, sum(1 for n in gm.graph.nodes if n.op == "call_function"), eager)
    return fused


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of `gm` whose graph can be rewritten (node metadata shared, shallowly)."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return torch.fx.GraphModule(gm, graph)


def _fill_placeholder_meta(parent, child_name, child) -> None:
    call = next(n for n in parent.graph.nodes if n.op == "call_module" and n.target == child_name)
    phs = [n for n in child.graph.nodes if n.op == "placeholder"]
    for ph, arg in zip(phs, call.args):
        if isinstance(arg, torch.fx.Node) and "val" in arg.meta:
            ph.meta["val"] = arg.meta["val"]


class _ProgramModule(torch.nn.Module):
    def __init__(self, program, gm) -> None:
        super().__init__()
        self.run = _Program(program, gm)

    def forward(self, *args):
        return self.run(*args)


def _compiler(kind: str):
    counter = [0]

    def compile_fn(gm: torch.fx.GraphModule, example_inputs):
        from torch._functorch.aot_autograd import make_boxed_func

        counter[0] += 1
        name = f"{kind}_{counter[0]}"
        try:
            compiled = compile_graph_module(gm, name)
        except InternalError:
            raise
        except Exception as e:  # an error: counted; the graph runs in PyTorch unless "raise"
            _report.record_fallback(f"graph:{name}", "lower", f"{type(e).__name__}: {e}")
            compiled = gm

        def run(*args):
            return compiled(*args)

        return make_boxed_func(run)

    return compile_fn


def _transcendental_ops() -> frozenset:
    a, p = torch.ops.aten, torch.ops.prims
    return frozenset({
        a.exp, a.exp2, a.expm1, a.log, a.log1p, a.log2, a.tanh, a.erf, a.sigmoid, a.sin, a.cos,
        a.pow, a.silu, a.gelu, a.rsqrt, a.sqrt, a._softmax, a._log_softmax,
        p.exp, p.log, p.tanh, p.erf, p.sin, p.cos, p.rsqrt, p.sqrt,
    })


# Ops whose value the backward takes saved, never recomputed (see `_partition`).
_SAVED_NOT_RECOMPUTED = _transcendental_ops()


def _partition(joint: torch.fx.GraphModule, joint_inputs, **kwargs):
    """AOT's min-cut partition of the joint forward and backward graph (the one Inductor
    uses: the backward recomputes cheap values from a few saved ones rather than taking every
    intermediate from the forward), with transcendental ops saved, never recomputed. XLA:CPU's
    `exp`, `tanh` or `erf` cost compute where an add costs memory (docs/perf-log.md), so
    redoing them in the backward costs more than saving them; every other pointwise op is
    cheaper to redo than to write out, return through the boundary and read back. A value
    already tagged (activation checkpointing) keeps its tag."""
    from torch._functorch.compile_utils import get_aten_target
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch.utils.checkpoint import CheckpointPolicy

    for n in joint.graph.nodes:
        if n.op != "call_function" or "recompute" in n.meta:
            continue
        if get_aten_target(n) in _SAVED_NOT_RECOMPUTED:
            n.meta["recompute"] = CheckpointPolicy.MUST_SAVE
    return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)


def tpu_kernels_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The `torch.compile` backend: aot_autograd (its graphs split by `_partition`) with
    forward and backward graphs lowered to StableHLO programs run on PJRT."""
    backend = aot_autograd(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        partition_fn=_partition,
        decompositions=decompositions(),
    )
    return backend(gm, example_inputs, **kwargs)


def _register() -> None:
    from torch._dynamo.backends import registry

    registry._lazy_import()
    if "tpu_kernels" not in registry._BACKENDS:
        registry.register_backend(compiler_fn=tpu_kernels_backend, name="tpu_kernels")


_register()
