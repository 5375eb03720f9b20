"""Fused eager mode: `with tpu_kernels.substitute(mode="fused")`.

Ops that a graph can lower (an op with a registered kernel, or one of the default ATen
lowerings) are not run: each is recorded as a node of a trace and its outputs are placeholder
tensors (allocated, not yet written). At a materialisation point, everything recorded becomes
one StableHLO program (kernels inlined) and runs on PJRT; its results are written into the
placeholders that are still alive.

The trace cache. While ops are recorded, a hash of the trace grows with each one (the op, its
static arguments, the types of its inputs, which recorded values or inputs it reads); at a
materialisation point the hash and the set of live outputs find the trace's compiled program
without building graph JSON, lowering or compiling: only the tensors bound to it change. A
trace that misses is compiled once and kept (at most `TRACE_CACHE_SIZE` of them, process-wide),
and `report().fused["trace_cache"]` counts hits and misses and says why each miss missed (a new
trace, or what differs from the closest earlier one). A float argument seen with two values in
otherwise identical traces (a learning rate under a scheduler, an optimizer's bias correction)
is lifted: from the next trace on it is a zero-dim program input, so a new value is no new
program. An entry whose program fails to run is evicted, with its reason, and never served
again.

Materialisation points: an op that is not recorded and reads or writes a pending value (reads
such as `.item()` / `_local_scalar_dense` of a pending tensor, Python control flow on pending
values, ops without a lowering on them), an op that draws random numbers, `.cpu()`, `.numpy()`,
`.tolist()`, `repr`, `data_ptr`, `tpu_kernels.torch.sync()` / `torch.tpu.synchronize()`, and
leaving the mode. An op that touches no pending value (bookkeeping on zero-dim tensors such as
an optimizer's step count, a profiler range) runs at once without ending the trace, and so does
an op that reads only metadata (`_fused_sdp_choice`: placeholders have the right shapes), and
an op with zero-dim results of values that hold their memory (`attention_mask.all()`, whose
`.item()` follows).

In-place ops (`y.add_(eps)` inside `F.rms_norm`, `x += r`, an optimizer's `param.addcdiv_`) are
recorded as their functional op, as functionalization does: the tensor then stands for the
result, and at the materialisation point a placeholder adopts the program's buffer while a
tensor that held memory before the trace (a parameter, an optimizer's state) gets the new value
copied into that memory, so its identity, storage and views stay as they were. An in-place op on
a tensor a pending view aliases materialises first. View ops on placeholders run at once (they
only touch metadata); the placeholder they view is kept as a program output.

If a recorded trace cannot be lowered, compiled or run, its ops are replayed one by one in
PyTorch, so values are always right. The replay is counted in `report()` under the op
`"fused"`: as `unlowerable` when a recorded node is one no kernel takes and the default
lowering does not cover (declined, like a call no kernel takes), else as `replay`, an error,
raised as `InternalError` under the "raise" error policy (`tpu_kernels.set_error_policy`). A
failure while recording is counted as `internal`.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections import OrderedDict, defaultdict, deque

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from .. import _events
from ..errors import InternalError, LoweringDeclined
from . import _stats
from ._bindings import TABLE, cpu_output_dtype, resolve_overload
from ._bindings import op_key as _schema_op_key
from ._native import native
from ._output import as_tensor
from .graph import DTYPES, Unencodable, dumps, encode_arg, fill_masked

_PATCHED = ("cpu", "numpy", "tolist", "__repr__", "__str__", "__format__", "__array__", "data_ptr")

# Compiled traces kept process-wide (least recently used evicted first).
TRACE_CACHE_SIZE = 512
# Output types kept by op and argument types (cleared when full).
_META_CACHE_SIZE = 65536


_OP_KEYS: dict = {}


def op_key(func) -> str:
    """`aten::mm.default` of `func`, computed once per op overload."""
    key = _OP_KEYS.get(func)
    if key is None:
        key = _OP_KEYS[func] = _schema_op_key(func)
    return key


# A program input (`.index`) and a recorded value (`.node`, `.out`), as the native handler
# records them too.
_Input = native().FusedInput
_Ref = native().FusedRef


class _Lifted:
    """A float argument lifted into a zero-dim program input (the trace's `index`-th lifted
    one), of its op's floating result type; `pos` is (op key, argument position or name)."""

    __slots__ = ("index", "value", "dtype", "pos")

    def __init__(self, index: int, value: float, dtype: str, pos: tuple[str, object]) -> None:
        self.index = index
        self.value = value
        self.dtype = dtype
        self.pos = pos


def _map(x, f):
    if isinstance(x, (list, tuple)):
        return type(x)(_map(v, f) for v in x)
    if isinstance(x, dict):
        return {k: _map(v, f) for k, v in x.items()}
    return f(x)


def _tensors(x, out):
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _tensors(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            _tensors(v, out)
    return out


def _meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


_LIFTED_KEY = "lifted float"


def _lifted_at(op: str, pos, x) -> bool:
    """Whether `x`, at argument `pos` of `op`, is a float the trace lifts into a program input."""
    return isinstance(x, float) and (op, pos) in TRACES.lifted and (op, pos) not in TRACES.not_liftable


class _Unkeyable(Exception):
    """An argument the trace key cannot describe: the trace is not cached."""


def _float_key(x: float):
    # -0.0 == 0.0 and nan != nan: spell those so that equal keys mean the same program.
    return x if x == x and x != 0.0 else ("f", x.hex())


def _static_key(x):
    """The key of a static (non-tensor) argument: equal keys lower to the same program."""
    if isinstance(x, bool):
        return ("b", x)
    if isinstance(x, float):
        return _float_key(x)
    if x is None or isinstance(x, (int, str, torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return x
    if isinstance(x, (list, tuple)):
        return tuple(_static_key(v) for v in x)
    raise _Unkeyable(type(x).__name__)


def _meta_key(x):
    """The key of an argument for the output-type cache: tensors by dtype and shape."""
    if isinstance(x, torch.Tensor):
        return ("t", x.dtype, tuple(x.shape))
    if isinstance(x, (list, tuple)):
        return tuple(_meta_key(v) for v in x)
    return _static_key(x)


class _Entry:
    __slots__ = ("program", "nodes", "inputs", "live")

    def __init__(self, program, nodes, inputs, live) -> None:
        self.program = program
        self.nodes = nodes
        self.inputs = inputs
        self.live = live


class _TraceCache:
    """Compiled traces by hash, shared by every fused mode of the process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: OrderedDict[int, _Entry] = OrderedDict()
        self.evicted: dict[int, str] = {}
        self.recent: deque = deque(maxlen=32)  # (nodes, inputs, live) of recent misses
        self.hits = 0
        self.misses = 0
        self.miss_reasons: dict[str, int] = defaultdict(int)
        self.last_miss = ""
        self.evictions = 0
        self.last_eviction = ""
        # (op key, argument position or name) -> lifted float arguments; refused where a
        # lowering would not take a tensor there.
        self.lifted: set[tuple[str, object]] = set()
        self.lifted_ops: set[str] = set()
        self.not_liftable: set[tuple[str, object]] = set()
        # Output types by (op, argument types and statics): recording needs no meta kernel.
        self.metas: dict[tuple, tuple] = {}
        # How often recording ran an op's meta kernel (a miss of `metas`).
        self.meta_runs = 0
        # Scalars Python read from a pending value, computed by replaying in PyTorch the few
        # integer and boolean ops they depend on, without ending the trace.
        self.scalar_reads = 0
        self.scalar_read_ops = 0

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.evicted.clear()
            self.recent.clear()
            self.metas.clear()

    def stats(self) -> dict:
        with self.lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "miss_reasons": dict(self.miss_reasons),
                "last_miss": self.last_miss,
                "entries": len(self.entries),
                "evicted": self.evictions,
                "last_eviction": self.last_eviction,
                "lifted": sorted(f"{op}:{arg}" for op, arg in self.lifted - self.not_liftable),
                "kept_constant": sorted(f"{op}:{arg}" for op, arg in self.not_liftable),
                "output_type_runs": self.meta_runs,
                "scalar_reads_replayed": self.scalar_reads,
                "scalar_read_ops_replayed": self.scalar_read_ops,
            }


TRACES = _TraceCache()
# A kernel registered or removed changes what traces lower to.
_events.on_registry_change(TRACES.clear)


def trace_cache_stats() -> dict:
    return TRACES.stats()


def _diff(nodes, inputs, live, other) -> tuple[str, str, list]:
    """Why trace (`nodes`, `inputs`, `live`) differs from `other` (a category, a message, and
    the float arguments that alone differ, to lift)."""
    o_nodes, o_inputs, o_live = other
    if len(nodes) != len(o_nodes):
        return "ops", f"{len(nodes)} ops recorded where the closest earlier trace had {len(o_nodes)}", []
    floats: list[tuple[str, object]] = []
    first = None
    for i, (a, b) in enumerate(zip(nodes, o_nodes)):
        if a == b:
            continue
        if a[0] is not b[0]:
            return "ops", f"op {i} is {op_key(a[0])} where the closest earlier trace had {op_key(b[0])}", []
        diffs = _float_diffs(a, b)
        if diffs is None:
            return "static_args", f"op {i} ({op_key(a[0])}) has other arguments: {a[1:]} against {b[1:]}", []
        floats.extend((op_key(a[0]), d) for d in diffs)
        first = first if first is not None else (i, a)
    if first is not None:
        i, a = first
        names = sorted({f"{op}:{arg}" for op, arg in floats})
        return "float_args", f"float arguments changed from op {i} ({op_key(a[0])}) on: {', '.join(names)}", floats
    if inputs != o_inputs:
        k = next(j for j, (x, y) in enumerate(zip(inputs, o_inputs)) if x != y) if len(inputs) == len(o_inputs) else None
        what = f"input {k} is {inputs[k]} where it was {o_inputs[k]}" if k is not None else "another number of inputs"
        return "input_types", what, []
    if live != o_live:
        if len(live) != len(o_live):
            return "live_outputs", f"{len(live)} live outputs where the closest earlier trace had {len(o_live)}", []
        k = next(j for j, (x, y) in enumerate(zip(live, o_live)) if x != y)
        return "live_outputs", f"live output {k} is (op, output, written into) {live[k]} where it was {o_live[k]}", []
    return "context", "the registry or the injected faults changed", []


def _float_diffs(a, b):
    """Positions whose float arguments alone differ between node keys `a` and `b`, or None when
    anything else differs."""
    out = []
    for part in (1, 2):  # positional, keyword
        xs, ys = a[part], b[part]
        if len(xs) != len(ys):
            return None
        for j, (x, y) in enumerate(zip(xs, ys)):
            if x == y:
                continue
            pos = j if part == 1 else x[0]
            xv, yv = (x, y) if part == 1 else (x[1], y[1])
            if part == 2 and x[0] != y[0]:
                return None
            if (_is_float_key(xv) or xv == ("lifted",)) and (_is_float_key(yv) or yv == ("lifted",)):
                out.append(pos)
            else:
                return None
    return out


def _is_float_key(k) -> bool:
    return isinstance(k, float) or (isinstance(k, tuple) and len(k) == 2 and k[0] == "f")


class FusedMode(TorchDispatchMode):
    """Records lowerable ops and runs them as one program per materialisation point."""

    def __init__(self, native_handler: bool = True) -> None:
        super().__init__()
        TABLE.refresh()
        self.refused = sorted(TABLE.refused)
        self.supported = frozenset(native().supported_ops())
        self.recordable: dict[object, bool] = {}
        self.functional: dict[object, object] = {}
        self.infos: dict[object, tuple] = {}
        self._reset()
        self._saved: dict[str, object] = {}
        self._flushing = False
        self._handler = None
        if native_handler:
            # The hot path in Rust: it records the plain calls (a lowerable functional op on CPU
            # tensors, its output types known) as `_dispatch` would, and hands every other call
            # to `__torch_dispatch__`.
            kit = (
                torch.Tensor,
                torch.dtype,
                torch.layout,
                torch.memory_format,
                torch.device,
                torch.empty,
                torch._C.TensorBase.data_ptr,
                TRACES,
                DTYPES,
                _Lifted,
                _LIFTABLE_DTYPES,
            )
            # (the functions unbound: the handler holds the mode weakly, so no cycle keeps it)
            self._handler = native().FusedDispatch(self, FusedMode._native_plan, FusedMode.__torch_dispatch__, kit)
            self.__torch_dispatch__ = self._handler

    def _native_plan(self, func):
        """How the native handler takes calls of `func` (asked once per op overload): None (it
        hands them to `__torch_dispatch__`), ("plain", key) for a functional op programs lower,
        ("in_place", functional key, functional op), ("view", key, lowered), or ("run",
        metadata only) for an op that runs at once unless it reads a pending value."""
        key, mutable, recordable, returns_alias, random = self._info(func)
        plan = None
        if key in _METADATA_ONLY:
            plan = ("run", True)
        elif random or key in _MUTATING:
            pass
        elif mutable:
            f = self._functional_of(func)
            if f is not None:
                plan = ("in_place", op_key(f), f)
        elif returns_alias:
            plan = ("view", key, key in self.supported)
        elif recordable:
            plan = ("plain", key)
        else:
            plan = ("run", False)
        return plan

    def _reset(self) -> None:
        # Per node: (func, args, kwargs with _Ref/_Input/_Lifted, [weakref to output], output types).
        self.nodes: list[tuple] = []
        self.inputs: list[torch.Tensor] = []
        # id -> (input index, the tensor), and (memory, geometry) -> input index.
        self.input_ids: dict[int, tuple[int, torch.Tensor]] = {}
        self.input_aliases: dict[tuple, int] = {}
        self.input_storages: set[int] = set()
        self.produced: dict[int, tuple[int, int, weakref.ref]] = {}
        # Viewed recorded values, held weakly: id -> (weakref, root), the root being the
        # (node, output) whose memory the view shares. Views of each root, weakly, and the root's
        # geometry: a root nothing refers to but a view is still written at the flush (through
        # the view's storage); one nothing refers to is not, so a trace keeps no more memory
        # alive than the same ops in strict mode.
        self.pinned: dict[int, tuple[weakref.ref, tuple[int, int]]] = {}
        self.views: dict[tuple[int, int], list[weakref.ref]] = {}
        self.view_roots: dict[int, tuple[weakref.ref, tuple[int, int]]] = {}
        self.geometry: dict[tuple[int, int], tuple] = {}
        self.orphans: set[int] = set()
        # Storage address -> (the pending tensor that owns it, its root). A dead owner's address
        # is pending while a view of it lives; with none, it may have been reused.
        self.pending_storages: dict[int, weakref.ref] = {}
        # Tensors that held memory before the trace and were written in place: the flush copies
        # their new value into that memory.
        self.write_back: dict[int, torch.Tensor] = {}
        self.lifted: list[_Lifted] = []
        # The trace key, grown op by op: a running hash and the keys themselves.
        self.hash = 0
        self.node_keys: list[tuple] = []
        self.input_keys: list[tuple] = []
        self.keyable = True

    # ----- entering and leaving -----

    def __enter__(self):
        mode = self
        for name in _PATCHED:
            orig = getattr(torch.Tensor, name)
            self._saved[name] = orig

            def patched(t, *a, __orig=orig, __name=name, **k):
                mode.flush(f"Tensor.{__name}")
                return __orig(t, *a, **k)

            setattr(torch.Tensor, name, patched)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            self.flush("leaving the mode")
        finally:
            for name, orig in self._saved.items():
                setattr(torch.Tensor, name, orig)
            self._saved.clear()
            # Always pop the mode, even when materialising raised.
            super().__exit__(*exc)
        return None

    # ----- recording -----

    def _is_recordable(self, func) -> bool:
        r = self.recordable.get(func)
        if r is None:
            schema = func._schema
            r = (
                op_key(func) in self.supported
                and not schema.is_mutable
                and all(ret.alias_info is None for ret in schema.returns)
                and len(schema.returns) > 0
            )
            self.recordable[func] = r
        return r

    def _ref_of(self, t: torch.Tensor):
        hit = self.produced.get(id(t))
        if hit is not None and hit[2]() is t:
            return _Ref(hit[0], hit[1])
        return None

    def _pending_storage(self, t: torch.Tensor) -> bool:
        """Whether `t`'s memory is that of a pending tensor still alive, or of a dead one whose
        view still is."""
        hit = self.pending_storages.get(_storage(t))
        return hit is not None and (hit[0]() is not None or self._live_view(hit[1]) is not None)

    def _exact_scalar(self, t: torch.Tensor) -> torch.Tensor | None:
        """The value of pending zero-dim `t` (what `.item()` reads) from a replay in PyTorch of
        the recorded ops it depends on, when there are at most `_SCALAR_READ_OPS` and each has
        integer or boolean outputs only: their values are exact in PyTorch as in the program,
        so the trace goes on and later computes the same value. A mask's `.all()` driving
        Python control flow (transformers' attention masks) then ends no trace. None otherwise;
        the read then materialises the trace. Counted in `report().fused["trace_cache"]`."""
        r = self._ref_of(t)
        if r is None or t.dim() != 0:
            return None
        need: set[int] = set()
        stack = [r.node]
        while stack:
            i = stack.pop()
            if i in need:
                continue
            need.add(i)
            if len(need) > _SCALAR_READ_OPS:
                return None
            _func, rargs, rkwargs, _refs, short, _alias = self.nodes[i]
            if not all(s.split("[")[0] in _EXACT_DTYPES for s in short):
                return None
            found: list = []
            _map((rargs, rkwargs), lambda x: found.append(x) or x)
            for x in found:
                if isinstance(x, _Lifted):
                    return None
                if isinstance(x, _Ref):
                    stack.append(x.node)
        values = self._run_nodes(sorted(need))
        with TRACES.lock:
            TRACES.scalar_reads += 1
            TRACES.scalar_read_ops += len(need)
        return values[(r.node, r.out)]

    def _root(self, t: torch.Tensor) -> tuple[int, int] | None:
        """The recorded (node, output) whose memory `t` is: its own, or its view's base's."""
        hit = self.view_roots.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        hit = self.produced.get(id(t))
        if hit is not None and hit[2]() is t and not self.nodes[hit[0]][5]:
            return (hit[0], hit[1])
        return None

    def _is_pinned(self, t: torch.Tensor) -> bool:
        hit = self.pinned.get(id(t))
        return hit is not None and hit[0]() is t

    def _live_view(self, root: tuple[int, int]) -> torch.Tensor | None:
        for w in self.views.get(root, ()):
            v = w()
            if v is not None:
                return v
        return None

    def _touches_pending(self, tensors) -> bool:
        """Whether any of `tensors` is a pending value or shares memory with one."""
        for t in tensors:
            if self._ref_of(t) is not None:
                return True
        if self.pending_storages:
            for t in tensors:
                if self._pending_storage(t):
                    return True
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            return self._dispatch(func, args, kwargs)
        except _UserError as e:
            raise e.error from None
        except InternalError:  # a materialisation's error under the "raise" policy
            raise
        except Exception as e:  # a recording failure is an error: counted, raised under "raise"
            return self._recording_failed(func, args, kwargs, e)

    def _recording_failed(self, func, args, kwargs, e: BaseException):
        """Recording `func` failed (here or in the native handler): counted (raised as
        `InternalError` under the "raise" policy), what was recorded runs, then the op."""
        _stats.record_fallback("fused", "internal", f"recording `{op_key(func)}` failed: {type(e).__name__}: {e}")
        if self.nodes:
            self.flush("internal error")
        return func(*args, **kwargs)

    def _types_like(self, f, args, kwargs, target: torch.Tensor):
        """The output types of `f` on these arguments when it has one output, of `target`'s
        shape and dtype (its functional form can write into `target`), else None."""
        types = self._output_types(f, args, kwargs)
        if types is None or len(types[0]) != 1 or not types[3][0]:
            return None
        (shape, dtype), = types[0]
        if shape != tuple(target.shape) or dtype != target.dtype:
            return None
        return types

    def _functional_of(self, func):
        """The functional overload of in-place op `func` (`add_.Scalar` -> `add.Scalar`) when a
        graph lowers it, else None."""
        r = self.functional.get(func, False)
        if r is False:
            r = None
            name = func._schema.name
            if name.endswith("_") and not name.endswith("__"):
                f = resolve_overload(f"{name[:-1]}.{func._schema.overload_name or 'default'}")
                if f is not None and self._is_recordable(f):
                    r = f
            self.functional[func] = r
        return r

    def _record_mutating(self, func, args, kwargs):
        """An op that updates some arguments besides returning results (`native_batch_norm`'s
        running statistics), recorded as its functional op (`_MUTATING`): the updated arguments
        stand for the functional op's extra outputs, written back as in-place ops are. None when
        that does not apply."""
        spec = _MUTATING.get(op_key(func))
        if spec is None or kwargs.get("out") is not None:
            return None
        name, updated, own = spec
        f = resolve_overload(name)
        if f is None or not self._is_recordable(f):
            return None
        targets = []
        for arg, out in updated.items():
            t = args[arg] if arg < len(args) else None
            if not isinstance(t, torch.Tensor) or not self._writable(t):
                return None
            targets.append((out, t))
        types = self._output_types(f, args, kwargs)
        if types is None or len(types[0]) != own + len(targets) or not all(types[3]):
            return None
        for out, t in targets:
            if types[0][out] != (tuple(t.shape), t.dtype):
                return None
        outs = [torch.empty(shape, dtype=dtype, device=args[0].device) for shape, dtype in types[0][:own]]
        outs += [t for _, t in sorted(targets, key=lambda p: p[0])]
        for _, t in targets:
            self._retire(t)
        self._record(f, args, kwargs, outs, alias=False, short=types[1])
        return tuple(outs[:own])

    def _record_view_write(self, func, args, kwargs):
        """An in-place op on a viewed pending value, or on a slice or select of one
        (`shifted[..., 1:] = x`), recorded as functionalization does it: the op's functional form,
        written into the base (`slice_scatter`; a select as its one-wide slice), and the base
        tensor stands for the result. Every live view of the base is then recorded again on the
        new value. Returns None when that does not apply: a view op other than slice and select,
        a view of a view, or a view not recorded. The op then ends the trace first."""
        f = self._functional_of(func)
        if f is None or not args or not isinstance(args[0], torch.Tensor) or kwargs.get("out") is not None:
            return None
        target = args[0]
        hit = self.produced.get(id(target))
        if hit is None or hit[2]() is not target:
            return None
        node = self.nodes[hit[0]]
        if node[5]:  # a view: its base is the value the write lands in
            view_func, view_args = node[0], node[1]
            if op_key(view_func) not in ("aten::slice.Tensor", "aten::select.int") or node[2]:
                return None
            base_ref = view_args[0]
        else:
            view_func = view_args = None
            base_ref = _Ref(hit[0], hit[1])
        if not isinstance(base_ref, _Ref) or self.nodes[base_ref.node][5]:
            return None
        root = (base_ref.node, base_ref.out)
        w = self.nodes[root[0]][3][root[1]]
        base = w() if w is not None else None
        if base is None or not self._is_pinned(base) or id(base) in self.write_back:
            return None
        views = self._direct_views(root)
        if views is None:
            return None
        types = self._types_like(f, args, kwargs, target)
        if types is None:
            return None
        if view_func is None:
            self._retire(base)
            self._record(f, args, kwargs, [base], alias=False, short=types[1])
        else:
            b = self._scatter_args(view_func, view_args, base)
            if b is None:
                return None
            dim, start, end, step, select = b
            value = torch.empty(target.shape, dtype=target.dtype, device=target.device)
            self._record(f, args, kwargs, [value], alias=False, short=types[1])
            if select:
                value = self._record_view(torch.ops.aten.unsqueeze.default, (value, dim))
            self._retire(base)
            scatter = torch.ops.aten.slice_scatter.default
            self._record(scatter, (base, value, dim, start, end, step), {}, [base], alias=False,
                         short=(_short(base),))
        self._rebase(root, base, views)
        return target

    def _direct_views(self, root):
        """The live views of recorded value `root` with their view nodes, when each is a
        recorded view of it taking nothing but statics besides it; None otherwise."""
        out = []
        for w in self.views.get(root, ()):
            v = w()
            if v is None:
                continue
            hit = self.produced.get(id(v))
            if hit is None or hit[2]() is not v:
                return None
            node = self.nodes[hit[0]]
            base = node[1][0] if node[1] else None
            if not node[5] or not isinstance(base, _Ref) or (base.node, base.out) != root:
                return None
            rest = list(node[1][1:]) + list(node[2].values())
            if any(isinstance(a, (_Ref, _Input, _Lifted, torch.Tensor)) for a in rest):
                return None
            out.append((v, node))
        return out

    def _scatter_args(self, view_func, view_args, base):
        """(dim, start, end, step, is a select) of the slice or select `view_args` of `base`."""
        rank = base.dim()
        if op_key(view_func) == "aten::slice.Tensor":
            dim, start, end, step = (list(view_args[1:]) + [0, None, None, 1][len(view_args) - 1:])[:4]
            return (dim % rank if rank else 0), start, end, step, False
        _, dim, index = view_args
        dim = dim % rank
        size = base.shape[dim]
        if not -size <= index < size:
            return None
        index %= size
        return dim, index, index + 1, 1, True

    def _record_view(self, view_func, args):
        """Runs view op `view_func` on a recorded value and records it as an alias."""
        out = view_func(*args)
        self._record(view_func, args, {}, [out], alias=True, short=(_short(out),))
        return out

    def _rebase(self, old_root, base, views) -> None:
        """Moves `base`'s views from its old value `old_root` to the value it now stands for,
        recording each again on it."""
        hit = self.produced[id(base)]
        new_root = (hit[0], hit[1])
        self.geometry[new_root] = self.geometry.pop(old_root)
        self.views[new_root] = self.views.pop(old_root, [])
        self.pinned[id(base)] = (weakref.ref(base), new_root)
        for v, node in views:
            self._record(node[0], (base, *node[1][1:]), dict(node[2]), [v], alias=True, short=node[4])
            self.view_roots[id(v)] = (weakref.ref(v), new_root)
            if self._is_pinned(v):
                self.pinned[id(v)] = (weakref.ref(v), new_root)

    def _writable(self, t: torch.Tensor) -> bool:
        """Whether a recorded op may stand for `t`'s new value: a pending placeholder that
        nothing views, or a dense tensor with memory of its own that no pending value aliases."""
        hit = self.produced.get(id(t))
        if hit is not None and hit[2]() is t:
            return not self._is_pinned(t) and self.nodes[hit[0]][3][hit[1]] is not None
        if t.dtype not in DTYPES or t.device.type not in ("cpu", "tpu") or not t.is_contiguous():
            return False
        return not (self.pending_storages and self._pending_storage(t))

    def _retire(self, t: torch.Tensor) -> None:
        """`t` is about to stand for a new node's output: its old value is no program output any
        more, or (a tensor with memory) its new value is written back at the flush."""
        hit = self.produced.get(id(t))
        if hit is not None and hit[2]() is t:
            self.nodes[hit[0]][3][hit[1]] = None
        else:
            self.write_back[id(t)] = t

    def _record_in_place(self, func, args, kwargs):
        """An in-place op recorded as its functional op, whose result the tensor then stands for
        (as functionalization does): a pending placeholder that nothing views, or a tensor that
        held memory before the trace (written back at the flush). None when that does not apply
        (the op then runs in PyTorch, after a materialisation if it touches pending values)."""
        f = self._functional_of(func)
        if f is None or not args or not isinstance(args[0], torch.Tensor) or kwargs.get("out") is not None:
            return None
        target = args[0]
        if not self._writable(target):
            return None
        types = self._types_like(f, args, kwargs, target)
        if types is None:
            return None
        self._retire(target)
        self._record(f, args, kwargs, [target], alias=False, short=types[1])
        return target

    def _output_types(self, func, args, kwargs):
        """((shape, dtype) per output, their short spellings, a single-tensor result) of `func`
        on these arguments, from the meta kernel once per argument types and statics; None
        when the meta kernel fails or an output is not a tensor of a dtype programs take."""
        try:
            kargs, kkwargs = args, kwargs
            if TRACES.lifted:
                kop = op_key(func)
                if kop in TRACES.lifted_ops:
                    # A lifted float is a program input: the types the program computes cannot
                    # depend on its value, so neither does this key (an optimizer's changing
                    # bias corrections would otherwise run the meta kernel on every step).
                    kargs = tuple(_LIFTED_KEY if _lifted_at(kop, i, a) else a for i, a in enumerate(args))
                    kkwargs = {k: _LIFTED_KEY if _lifted_at(kop, k, v) else v for k, v in kwargs.items()}
            key = (func, _meta_key(kargs), _meta_key(tuple(sorted(kkwargs.items()))) if kkwargs else ())
        except _Unkeyable:
            key = None
        if key is not None:
            hit = TRACES.metas.get(key)
            if hit is not None:
                return hit
        TRACES.meta_runs += 1
        meta_kwargs = _map(kwargs, _meta)
        if "device" in meta_kwargs:
            meta_kwargs["device"] = "meta"
        try:
            out_meta = func(*_map(args, _meta), **meta_kwargs)
        except Exception:
            return None
        metas = [out_meta] if isinstance(out_meta, torch.Tensor) else list(out_meta)
        # Outputs an output mask left out (None) are typed from their arguments for the program
        # and stay None for the caller.
        present = tuple(m is not None for m in metas)
        if not all(present):
            metas = fill_masked(func, args, kwargs, metas, lambda a: a)
        if not all(isinstance(m, torch.Tensor) and m.dtype in DTYPES for m in metas):
            return None
        # Placeholders take the dtype PyTorch's CPU kernel gives, where its meta function differs.
        k, dtypes = op_key(func), [t.dtype for t in _tensors((args, kwargs), [])]
        types = tuple((tuple(m.shape), cpu_output_dtype(k, i, m.dtype, dtypes)) for i, m in enumerate(metas))
        out = (types, tuple(_short_of(sh, dt) for sh, dt in types), isinstance(out_meta, torch.Tensor), present)
        if key is not None:
            if len(TRACES.metas) >= _META_CACHE_SIZE:
                TRACES.metas.clear()
            TRACES.metas[key] = out
        return out

    def _needs_flush(self, func, tensors) -> bool:
        """Whether an op run in PyTorch must wait for the trace: it reads or writes a pending
        value, writes memory a recorded op reads, or draws random numbers."""
        # An op that draws from a generator keeps its place among recorded ops.
        if self._touches_pending(tensors) or self._info(func)[4]:
            return True
        if func._schema.is_mutable and self.input_storages:
            return any(_storage(t) in self.input_storages for t in tensors)
        return False

    def _info(self, func) -> tuple:
        """(op key, mutable, recordable, returns an alias, draws from a generator) of `func`, read
        from its schema once."""
        info = self.infos.get(func)
        if info is None:
            schema = func._schema
            info = (
                op_key(func),
                schema.is_mutable,
                self._is_recordable(func),
                any(r.alias_info is not None for r in schema.returns),
                any("Generator" in str(a.type) for a in schema.arguments),
            )
            self.infos[func] = info
        return info

    def _dispatch(self, func, args, kwargs):
        tensors = _tensors((args, kwargs), []) if kwargs else _tensors(args, [])
        key, mutable, recordable, returns_alias, _random = self._info(func)
        device = _one_device(tensors, key)
        if key in _METADATA_ONLY:
            return _run(func, args, kwargs)
        # The recorded value each tensor is (None: not one), looked up once for the whole call.
        refs = [self._ref_of(t) for t in tensors] if self.produced else None
        pending = refs is not None and any(r is not None for r in refs)
        # Bookkeeping on zero-dim tensors that hold their values (an optimizer's step count)
        # runs at once: recording it would end the trace at the `.item()` that follows.
        scalars_only = (
            bool(tensors) and not pending and all(t.dim() == 0 for t in tensors) and not self._touches_pending(tensors)
        )
        if (mutable or key in _MUTATING) and device is not None and not scalars_only:
            # (`native_batch_norm`'s schema does not mark the running statistics it updates.)
            done = self._record_mutating(func, args, kwargs) if key in _MUTATING else None
            if done is None and mutable:
                done = self._record_in_place(func, args, kwargs)
            if done is None and mutable:
                done = self._record_view_write(func, args, kwargs)
            if done is not None:
                return done
        if not recordable or device is None or scalars_only:
            if returns_alias and not mutable:
                # A view: metadata only, run at once. The viewed placeholders become program
                # outputs; when the view op lowers, it is also recorded (as an alias that is
                # never a program output itself) so later ops on the view keep fusing.
                viewed = [t for t in tensors if self._ref_of(t) is not None]
                root = None
                for t in viewed:
                    r = self._root(t)
                    if r is None:
                        continue
                    root = root or r
                    self.pinned[id(t)] = (weakref.ref(t), r)
                    if r not in self.geometry:  # `t` is the root itself: its first view
                        self.geometry[r] = (tuple(t.shape), t.stride(), t.storage_offset())
                out = _run(func, args, kwargs)
                if root is not None:
                    for o in [out] if isinstance(out, torch.Tensor) else out:
                        if isinstance(o, torch.Tensor):
                            w = weakref.ref(o)
                            self.views.setdefault(root, []).append(w)
                            self.view_roots[id(o)] = (w, root)
                if viewed and key in self.supported:
                    outs = [out] if isinstance(out, torch.Tensor) else list(out)
                    if outs and all(isinstance(o, torch.Tensor) and o.dtype in DTYPES for o in outs):
                        short = tuple(_short_of(tuple(o.shape), o.dtype) for o in outs)
                        self._record(func, args, kwargs, outs, alias=True, short=short)
                return out
            if key == "aten::_local_scalar_dense.default" and len(tensors) == 1:
                value = self._exact_scalar(tensors[0])
                if value is not None:
                    return _run(func, (value,), {})
            if self.nodes and self._needs_flush(func, tensors):
                self.flush(key)
            return _run(func, args, kwargs)
        if tensors and "device" in kwargs and kwargs["device"] is not None:
            if torch.device(kwargs["device"]).type != device:  # a copy to another device
                if self.nodes and self._needs_flush(func, tensors):
                    self.flush(key)
                return _run(func, args, kwargs)
        # Inputs that alias a pending placeholder without being one (views of it): materialise.
        if self.pending_storages:
            for i, t in enumerate(tensors):
                if (refs is None or refs[i] is None) and self._pending_storage(t):
                    self.flush(f"{key} on a view of a pending tensor")
                    refs = None  # the flush ended the trace: nothing is recorded any more
                    break
        types = self._output_types(func, args, kwargs)
        if types is None:
            if self.nodes:
                self.flush(key)
            return _run(func, args, kwargs)
        if (
            tensors
            and all(not shape for shape, _ in types[0])
            and not (refs and any(r is not None for r in refs))
            and not self._touches_pending(tensors)
        ):
            # A scalar computed from values that hold their memory (`attention_mask.all()`)
            # is mostly read at once by Python control flow: run it now, and the read that
            # follows ends no trace.
            return _run(func, args, kwargs)
        if not tensors and isinstance(kwargs.get("device"), (str, torch.device)):
            device = torch.device(kwargs["device"]).type  # a factory op: where it was asked for
        outs = [
            torch.empty(shape, dtype=dtype, device=device) if here else None
            for (shape, dtype), here in zip(types[0], types[3])
        ]
        known = {id(t): r for t, r in zip(tensors, refs) if r is not None} if refs is not None else None
        self._record(func, args, kwargs, outs, alias=False, short=types[1], known=known)
        return outs[0] if types[2] else tuple(outs)

    def _record(self, func, args, kwargs, outs, alias: bool, short, known=None) -> None:
        """Records `func` with outputs `outs`; `known` maps the ids of the call's tensors that
        are recorded values to their refs, when the caller looked them up already (any other
        tensor of the call is then no recorded value)."""
        index = len(self.nodes)

        def to_ref(x):
            if isinstance(x, torch.Tensor):
                r = self._ref_of(x) if known is None else known.get(id(x))
                if r is not None:
                    return r
                return self._input_ref(x)
            return x

        rargs = tuple(_map(a, to_ref) for a in args)
        rkwargs = {k: _map(v, to_ref) for k, v in kwargs.items()}
        if TRACES.lifted and op_key(func) in TRACES.lifted_ops:
            rargs, rkwargs = self._lift(func, rargs, rkwargs, short)
        refs = []
        for i, o in enumerate(outs):
            if o is None:  # an output the call did not ask for
                refs.append(None)
                continue
            w = weakref.ref(o)
            self.produced[id(o)] = (index, i, w)
            # An alias shares its base's storage: never a program output of its own.
            refs.append(None if alias else w)
            if not alias:
                s = _storage(o)
                if s:
                    self.pending_storages[s] = (w, (index, i))
        node = (func, rargs, rkwargs, refs, short, alias)
        self.nodes.append(node)
        if self.keyable:
            try:
                node_key = _key_of(node)
            except _Unkeyable:
                self.keyable = False
            else:
                self.node_keys.append(node_key)
                self.hash = hash((self.hash, node_key))

    def _input_ref(self, x: torch.Tensor):
        """`x` as a program input (a tensor that is no recorded value), registered on first use."""
        hit = self.input_ids.get(id(x))
        if hit is not None and hit[1] is x:
            return _Input(hit[0])
        # Another tensor over the same memory and geometry (autograd's saved parameter, a
        # `detach()`) is the same input: one program input, whose memory an in-place update of
        # either may then take (`_lending`).
        storage = _storage(x)
        same = (storage, x.storage_offset(), tuple(x.shape), x.stride(), x.dtype, x.device)
        k = self.input_aliases.get(same) if storage else None
        if k is None:
            k = len(self.inputs)
            self.inputs.append(x)
            self.input_storages.add(storage)
            self.input_keys.append((x.dtype, tuple(x.shape), x.device.type, _dense_order(x)))
            if storage:
                self.input_aliases[same] = k
        # (input index, the tensor, its memory's address: the native handler's check that no
        # pending value shares it)
        self.input_ids[id(x)] = (k, x, storage)
        return _Input(k)

    def _lift(self, func, rargs, rkwargs, short):
        """The arguments with each float at a lifted position (of an op with a floating result)
        replaced by a `_Lifted` program input."""
        out_dtype = short[0].split("[")[0] if short else None
        if out_dtype not in _LIFTABLE_DTYPES:
            return rargs, rkwargs
        key_op = op_key(func)

        def lift(pos, x):
            if (
                isinstance(x, float)
                and (key_op, pos) in TRACES.lifted
                and (key_op, pos) not in TRACES.not_liftable
            ):
                lifted = _Lifted(len(self.lifted), x, out_dtype, (key_op, pos))
                self.lifted.append(lifted)
                return lifted
            return x

        return tuple(lift(i, a) for i, a in enumerate(rargs)), {k: lift(k, v) for k, v in rkwargs.items()}

    def _relift(self) -> None:
        """Lifts, in the trace recorded so far, the floats of positions lifted since they were
        recorded, and recomputes the trace's key."""
        self.lifted = []
        nodes = []
        for func, rargs, rkwargs, refs, short, alias in self.nodes:
            rargs = tuple(x.value if isinstance(x, _Lifted) else x for x in rargs)
            rkwargs = {k: v.value if isinstance(v, _Lifted) else v for k, v in rkwargs.items()}
            rargs, rkwargs = self._lift(func, rargs, rkwargs, short)
            nodes.append((func, rargs, rkwargs, refs, short, alias))
        self.nodes = nodes
        self.node_keys = [_key_of(n) for n in nodes]
        h = 0
        for k in self.node_keys:
            h = hash((h, k))
        self.hash = h

    # ----- materialising -----

    def _lending(self, live) -> tuple:
        """Where the program writes each live output, so that no output needs memory of its own
        beside its tensor's (issue 17's memory target: a fused step keeps no more live memory
        than strict): the index of the input it updates (a tensor with memory of its own written
        in place, donated to its new value), -1 for its tensor's memory lent as an extra
        parameter (a placeholder), None for a fresh buffer (a tensor the output cannot alias)."""
        plan = []
        for i, j, t in live:
            try:
                fits = t.is_contiguous() and _short(t) == self.nodes[i][4][j]
            except Unencodable:
                fits = False
            if not fits:
                plan.append(None)
            elif id(t) in self.write_back:
                hit = self.input_ids.get(id(t))
                plan.append(hit[0] if hit is not None and hit[1] is t else -1)
            else:
                plan.append(-1)
        return tuple(plan)

    def _donations(self, live, plan) -> list[tuple[int, int]]:
        """`(program input, output)` pairs of `plan`: the lent parameters follow the inputs and
        lifted floats, in the order of their outputs."""
        first = len(self.inputs) + len(self.lifted)
        pairs, lent = [], 0
        for out, k in enumerate(plan):
            if k == -1:
                pairs.append((first + lent, out))
                lent += 1
            elif k is not None:
                pairs.append((k, out))
        return pairs

    def _graph(self, live: list[tuple[int, int, torch.Tensor]], plan) -> dict:
        # An input laid out densely in another dim order (a transposed weight) crosses in that
        # order, read in place, and a permute node gives it its shape back.
        orders = [key[3] for key in self.input_keys]
        inputs = [
            {"name": f"in{k}", "type": _short(t) if o is None else _short_of([t.shape[d] for d in o], t.dtype)}
            for k, (t, o) in enumerate(zip(self.inputs, orders))
        ]
        n = len(self.inputs)
        inputs += [{"name": f"in{n + j.index}", "type": f"{j.dtype}[]"} for j in self.lifted]
        first = n + len(self.lifted)
        lent = [self.nodes[i][4][j] for (i, j, _), k in zip(live, plan) if k == -1]
        inputs += [{"name": f"in{first + e}", "type": ty} for e, ty in enumerate(lent)]

        def ref(x):
            if isinstance(x, _Ref):
                return {"node": f"n{x.node}", **({"output": x.out} if x.out else {})}
            if isinstance(x, _Input):
                return {"node": f"in{x.index}" if orders[x.index] is None else f"permuted{x.index}"}
            if isinstance(x, _Lifted):
                return {"node": f"in{n + x.index}"}
            return None

        nodes = []
        for k, o in enumerate(orders):
            if o is not None:
                back = [o.index(d) for d in range(len(o))]
                nodes.append({
                    "name": f"permuted{k}",
                    "op": "aten::permute.default",
                    "args": [{"tensor": {"node": f"in{k}"}}, {"int_list": back}],
                    "arg_names": ["self", "dims"],
                    "outputs": [_short(self.inputs[k])],
                })
        for i, (func, rargs, rkwargs, _refs, short, _alias) in enumerate(self.nodes):
            node = {
                "name": f"n{i}",
                "op": op_key(func),
                "args": [encode_arg(a, ref) for a in rargs],
                "arg_names": [a.name for a in func._schema.arguments],
                "outputs": list(short),
            }
            if rkwargs:
                node["kwargs"] = {k: encode_arg(v, ref) for k, v in sorted(rkwargs.items())}
            nodes.append(node)
        outputs = [{"node": f"n{n_}", **({"output": o} if o else {})} for n_, o, _ in live]
        return {"version": 1, "name": "fused", "inputs": inputs, "nodes": nodes, "outputs": outputs}

    def flush(self, reason: str = "materialisation") -> None:
        """Runs everything recorded as one program and fills the live placeholders."""
        if not self.nodes or self._flushing:
            return
        self._flushing = True
        try:
            self._flush(reason)
        finally:
            self._flushing = False

    def _flush(self, reason: str) -> None:
        with _disable_current_modes():
            # Program outputs: the placeholders still referenced (by the user, by autograd, or
            # through a view); dead intermediates are never materialised.
            live = []
            for i, node in enumerate(self.nodes):
                for j, w in enumerate(node[3]):
                    if w is None:
                        continue
                    t = w()
                    if t is None and (i, j) in self.views:
                        # Only a view holds this value's memory: write it there, in the
                        # geometry the value had.
                        v = self._live_view((i, j))
                        if v is not None:
                            t = v.as_strided(*self.geometry[(i, j)])
                            self.orphans.add(id(t))
                    if t is not None:
                        live.append((i, j, t))
            n_ops = len(self.nodes)
            try:
                try:
                    if live:
                        self._run_program(live)
                except LoweringDeclined as e:  # a recorded op no kernel or lowering takes
                    _stats.record_fallback(
                        "fused", "unlowerable", f"fused program replayed in PyTorch: {str(e)[:500]}"
                    )
                    self._replay(live)
                except Exception as e:  # lowering, compile or execute failed: replay in PyTorch
                    _stats.record_fallback(
                        "fused", "replay", f"fused program replayed in PyTorch: {type(e).__name__}: {str(e)[:500]}"
                    )
                    self._replay(live)
                native_ops = self._handler.take_counts()[0] if self._handler is not None else 0
                _stats.record_fused_flush(n_ops, reason.split(" ")[0], native_ops)
            finally:
                self._reset()

    def _trace_key(self, live, plan):
        if not self.keyable:
            return None
        n = native()
        live_key = tuple((i, j, k) for (i, j, _), k in zip(live, plan))
        context = (n.registry_generation(), n.fault_generation(), tuple(self.refused))
        return hash((self.hash, live_key, context, tuple(self.input_keys))), live_key

    def _run_program(self, live) -> None:
        inputs = [
            t.detach() if key[3] is None else t.detach().permute(key[3])
            for t, key in zip(self.inputs, self.input_keys)
        ]
        plan = self._lending(live)
        keyed = self._trace_key(live, plan)
        entry = None
        if keyed is not None:
            with TRACES.lock:
                evicted = TRACES.evicted.get(keyed[0])
                entry = self._lookup(keyed)
            if evicted is not None:
                raise RuntimeError(f"this trace's program was evicted from the trace cache: {evicted}")
        if entry is not None:
            program = entry.program
        else:
            program, keyed = self._compile(live, keyed, plan)
        # Lifted floats as zero-dim inputs (after the compile, which may have lifted more or
        # put them back), then the memory lent to outputs.
        inputs += [torch.tensor(j.value, dtype=_DTYPE_OF[j.dtype]) for j in self.lifted]
        inputs += [t.detach() for (_, _, t), k in zip(live, plan) if k == -1]
        try:
            caps = program.run(inputs)
        except Exception as e:
            if keyed is not None:
                with TRACES.lock:
                    if TRACES.entries.pop(keyed[0], None) is not None:
                        reason = f"{type(e).__name__}: {str(e)[:300]}"
                        TRACES.evicted[keyed[0]] = reason
                        TRACES.evictions += 1
                        TRACES.last_eviction = reason
            raise
        for (_, _, t), cap in zip(live, caps):
            if cap is not None:  # None: written into the tensor's own memory
                shared = self._is_pinned(t) or id(t) in self.orphans or id(t) in self.write_back
                _fill(t, as_tensor(cap), copy=shared)

    def _lookup(self, keyed):
        """The cache entry of this trace (the lock held), counted as a hit; None on a miss."""
        key, live_key = keyed
        entry = TRACES.entries.get(key)
        if entry is None:
            return None
        if entry.live != live_key or entry.inputs != tuple(self.input_keys) or entry.nodes != tuple(self.node_keys):
            return None  # a hash collision: compiled afresh, the entry kept
        TRACES.entries.move_to_end(key)
        TRACES.hits += 1
        return entry

    def _compile(self, live, keyed, plan):
        """Compiles the trace (a cache miss) and keeps it, with why it missed; returns the
        program and the trace's key as compiled. Floats that alone differ from the closest
        earlier trace are lifted first, so this program already takes them as inputs."""
        category, message = "unkeyable", "an argument the trace key cannot describe"
        if keyed is not None:
            nodes, input_keys = tuple(self.node_keys), tuple(self.input_keys)
            with TRACES.lock:
                closest = None
                for other in TRACES.recent:
                    if len(other[0]) == len(nodes):
                        closest = other
                if closest is None:
                    category, message, floats = "new", f"a new trace of {len(nodes)} ops", []
                else:
                    category, message, floats = _diff(nodes, input_keys, keyed[1], closest)
                fresh = {p for p in floats if p not in TRACES.not_liftable and p not in TRACES.lifted}
                TRACES.lifted.update(fresh)
                TRACES.lifted_ops.update(op for op, _ in fresh)
            if fresh:
                self._relift()
                keyed = self._trace_key(live, plan)
        try:
            program = self._compile_lending(live, plan)
        except Exception:
            if not self.lifted:
                raise
            # A lowering that does not take a lifted argument as a tensor: those arguments stay
            # constants from now on, and this trace compiles with them as constants.
            for j in self.lifted:
                TRACES.not_liftable.add(j.pos)
            self.lifted = []
            self._unlift()
            keyed = None
            program = self._compile_lending(live, plan)
        with TRACES.lock:
            TRACES.misses += 1
            TRACES.miss_reasons[category] += 1
            TRACES.last_miss = message
            if keyed is not None:
                entry = _Entry(program, tuple(self.node_keys), tuple(self.input_keys), keyed[1])
                TRACES.recent.append((entry.nodes, entry.inputs, entry.live))
                TRACES.entries[keyed[0]] = entry
                while len(TRACES.entries) > TRACE_CACHE_SIZE:
                    TRACES.entries.popitem(last=False)
        return program, keyed

    def _compile_lending(self, live, plan):
        """The trace's program, its outputs written where `plan` says; where the program's type
        of an output differs from its tensor's (a lowering that widens), compiled without the
        loans: those outputs then come back in fresh buffers and are copied."""
        graph = dumps(self._graph(live, plan))
        try:
            return native().compile_graph(graph, self.refused, self._donations(live, plan))
        except ValueError as e:
            if "donation of input" not in str(e):
                raise
            return native().compile_graph(graph, self.refused)

    def _unlift(self) -> None:
        """Puts lifted arguments back as constants (their lowering took no tensor); the trace
        is then not cached under its key, which counted them as inputs."""

        def back(x):
            return x.value if isinstance(x, _Lifted) else x

        self.nodes = [
            (func, tuple(back(a) for a in rargs), {k: back(v) for k, v in rkwargs.items()}, refs, short, alias)
            for func, rargs, rkwargs, refs, short, alias in self.nodes
        ]
        self.keyable = False

    def _run_nodes(self, indices) -> dict[tuple[int, int], torch.Tensor]:
        """Runs the recorded nodes `indices` (in trace order, each node's recorded inputs among
        them) in PyTorch on the trace's inputs; their outputs by (node, output)."""
        values: dict[tuple[int, int], torch.Tensor] = {}

        def real(x):
            if isinstance(x, _Ref):
                return values[(x.node, x.out)]
            if isinstance(x, _Input):
                return self.inputs[x.index]
            if isinstance(x, _Lifted):
                return x.value
            return x

        for i in indices:
            func, rargs, rkwargs = self.nodes[i][:3]
            out = func(*_map(rargs, real), **_map(rkwargs, real))
            for j, o in enumerate([out] if isinstance(out, torch.Tensor) else list(out)):
                values[(i, j)] = o
        return values

    def _replay(self, live) -> None:
        values = self._run_nodes(range(len(self.nodes)))
        for i, j, t in live:
            t.data.copy_(values[(i, j)])
        # Aliases (recorded views) already see their bases' storage.


def sync() -> None:
    """Runs what the fused modes active on this thread have recorded (PyTorch/XLA's
    `mark_step`): the end of a training step, a point to time, or before reading results from
    another thread; and what the device's native recorder holds. Nothing happens outside fused
    mode."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    for mode in _get_current_dispatch_mode_stack():
        if isinstance(mode, FusedMode):
            mode.flush("sync")
    dev = sys.modules.get("tpu_kernels.device")
    if dev is not None and dev.is_installed():
        dev.flush("sync")


def _key_of(node) -> tuple:
    """A recorded node's part of the trace key: the op, its arguments (recorded values and
    inputs by position, statics by value, lifted floats by position only), whether it is a view."""
    func, rargs, rkwargs, _refs, _short, alias = node
    return (
        func,
        tuple([_node_key(a) for a in rargs]),
        tuple(sorted([(k, _node_key(v)) for k, v in rkwargs.items()])) if rkwargs else (),
        alias,
    )


def _node_key(x):
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return x if isinstance(x, int) else _float_key(x)
    if isinstance(x, _Ref):
        return ("r", x.node, x.out)
    if isinstance(x, _Input):
        return ("i", x.index)
    if isinstance(x, _Lifted):
        return ("lifted",)
    if isinstance(x, (list, tuple)):
        return tuple(_node_key(v) for v in x)
    return _static_key(x)


_DTYPE_OF = {v: k for k, v in DTYPES.items()}
# Ops that update arguments besides returning results: (their functional op, {updated argument
# position: functional output index}, how many leading outputs are the op's own results).
_MUTATING = {
    "aten::native_batch_norm.default": ("aten::_native_batch_norm_legit_functional.default", {3: 3, 4: 4}, 3),
}
# Ops that read only their tensors' metadata (shapes, dtypes, devices), never their values: they
# run at once on placeholders, which carry the right metadata, and end no trace (SDPA asks the
# device which fused attention it takes before every attention).
_METADATA_ONLY = frozenset(
    {
        "aten::_fused_sdp_choice.default",
        "aten::is_same_size.default",
        "aten::_has_compatible_shallow_copy_type.default",
    }
)
# Result types a float argument is lifted for (its zero-dim input takes that type, which is the
# type the lowering rounds a constant to).
_LIFTABLE_DTYPES = frozenset({"f32", "f64", "bf16", "f16"})


class _UserError(Exception):
    """An error raised by the op itself (the user's), re-raised unchanged."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _run(func, args, kwargs):
    try:
        return func(*args, **kwargs)
    except Exception as e:
        raise _UserError(e) from e


# Ops whose CPU index tensors may meet tpu tensors (as the device's fallback allows them).
_CPU_INDICES = frozenset({"aten::index.Tensor", "aten::index_put.default", "aten::_index_put_impl.default"})


def _one_device(tensors, key: str) -> str | None:
    """The device a recorded op's tensors share, when programs can read it in place: "cpu", or
    "tpu" (the tpu device's memory is host memory), which CPU tensors may join where PyTorch lets
    them (zero-dim ones, as scalars; index tensors of the index ops); None otherwise (mixed,
    meta, ...)."""
    if all(t.is_cpu for t in tensors):
        return "cpu"
    devices = {t.device.type for t in tensors}
    if len(devices) == 1 and devices <= {"cpu", "tpu"}:
        return devices.pop()
    if devices == {"cpu", "tpu"}:
        indices = key in _CPU_INDICES
        if all(t.dim() == 0 or (indices and not t.is_floating_point()) for t in tensors if t.is_cpu):
            return "tpu"
    return None


def _fill(t: torch.Tensor, value: torch.Tensor, copy: bool) -> None:
    """Makes `t` hold `value`: a placeholder adopts its storage (no copy: the PJRT buffer becomes
    the tensor's memory); with `copy` (a view aliases the placeholder's own storage, or `t` held
    memory before the trace and was written in place) the bytes are copied into `t`'s memory.
    The autograd version counter is left as it was, so tensors saved for backward stay valid."""
    if copy or value.dtype != t.dtype or value.shape != t.shape or value.device != t.device:
        t.data.copy_(value)
        return
    version = t._version
    with torch.no_grad():
        t.set_(value)
    torch._C._autograd._unsafe_set_version_counter((t,), (version,))


# A scalar read answered by a replay (`FusedMode._exact_scalar`): at most this many ops, each
# with outputs of these types only.
_SCALAR_READ_OPS = 16
_EXACT_DTYPES = frozenset({"bool", "i8", "i16", "i32", "i64", "u8", "u32"})


def _dense_order(t: torch.Tensor) -> tuple[int, ...] | None:
    """The dim order, outermost first, in which a tensor that is not contiguous is laid out
    densely (a transpose or permutation of a contiguous tensor); None for a contiguous tensor
    or one that no order makes dense (the program then reads a gathered copy)."""
    if t.dim() < 2 or t.is_contiguous():
        return None
    order = tuple(sorted(range(t.dim()), key=lambda d: (-t.stride(d), d)))
    return order if t.permute(order).is_contiguous() else None


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:
        return 0


def _short(t: torch.Tensor) -> str:
    return _short_of(t.shape, t.dtype)


def _short_of(shape, dtype) -> str:
    name = DTYPES.get(dtype)
    if name is None:
        raise Unencodable(f"dtype {dtype}")
    return f"{name}[{','.join(str(int(d)) for d in shape)}]"
