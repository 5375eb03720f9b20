"""Fused eager mode: `with tpu_kernels.substitute(mode="fused")`.

Ops that a graph can lower (an op with a registered kernel, or one of the default ATen
lowerings) are not run: each is recorded as a node of the registry's graph JSON and its outputs
are placeholder tensors (allocated, not yet written). At a materialisation point, everything
recorded becomes one StableHLO program (kernels inlined), compiled once per graph fingerprint
and run on PJRT; its results are written into the placeholders that are still alive.

Materialisation points: any op that is not recorded (reads such as `.item()` /
`_local_scalar_dense`, Python control flow on values, printing, ops without a lowering),
`.cpu()`, `.numpy()`, `.tolist()`, `repr`, and leaving the mode. An in-place op on a pending
placeholder that nothing views (`y.add_(eps)` inside `F.rms_norm`, `x += r`) is recorded as its
functional op, the placeholder standing for the result; any other in-place op materialises. View ops on
placeholders run at once (they only touch metadata); the placeholder they view is kept as a
program output.

If a recorded graph cannot be lowered, compiled or run, its ops are replayed one by one in
PyTorch, so values are always right. The replay is counted in `report()` under the op
`"fused"`: as `unlowerable` when a recorded node is one no kernel takes and the default
lowering does not cover (declined, like a call no kernel takes), else as `replay`, an error,
raised as `InternalError` under the "raise" error policy (`tpu_kernels.set_error_policy`). A
failure while recording is counted as `internal`.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from ..errors import InternalError, LoweringDeclined
from . import _stats
from ._bindings import TABLE, cpu_output_dtype, op_key, resolve_overload
from ._native import native
from ._output import as_tensor
from .graph import DTYPES, Unencodable, dumps, encode_arg

_PATCHED = ("cpu", "numpy", "tolist", "__repr__", "__str__", "__format__", "__array__", "data_ptr")


class _Input:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class _Ref:
    __slots__ = ("node", "out")

    def __init__(self, node: int, out: int) -> None:
        self.node = node
        self.out = out


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


class FusedMode(TorchDispatchMode):
    """Records lowerable ops and runs them as one program per materialisation point."""

    def __init__(self) -> None:
        super().__init__()
        TABLE.refresh()
        self.refused = sorted(TABLE.refused)
        self.supported = frozenset(native().supported_ops())
        self.recordable: dict[object, bool] = {}
        self.functional: dict[object, object] = {}
        self._reset()
        self._saved: dict[str, object] = {}
        self._flushing = False

    def _reset(self) -> None:
        # Per node: (func, args, kwargs with _Ref for recorded tensors, [weakref to output]).
        self.nodes: list[tuple] = []
        self.inputs: list[torch.Tensor] = []
        self.input_ids: dict[int, int] = {}
        self.produced: dict[int, tuple[int, int, weakref.ref]] = {}
        self.pinned: dict[int, torch.Tensor] = {}
        self.pending_storages: set[int] = set()

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

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            return self._dispatch(func, args, kwargs)
        except _UserError as e:
            raise e.error from None
        except InternalError:  # a materialisation's error under the "raise" policy
            raise
        except Exception as e:  # a recording failure is an error: counted, raised under "raise"
            _stats.record_fallback("fused", "internal", f"recording `{op_key(func)}` failed: {type(e).__name__}: {e}")
            if self.nodes:
                self.flush("internal error")
            return func(*args, **kwargs)

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

    def _record_in_place(self, func, args, kwargs):
        """An in-place op on a pending placeholder that nothing views: recorded as its functional
        op, whose result the placeholder then stands for (as functionalization does). None when
        that does not apply (the op then materialises)."""
        f = self._functional_of(func)
        if f is None or not args or not isinstance(args[0], torch.Tensor) or kwargs.get("out") is not None:
            return None
        target = args[0]
        hit = self.produced.get(id(target))
        if hit is None or hit[2]() is not target or id(target) in self.pinned:
            return None
        old_refs = self.nodes[hit[0]][3]
        if old_refs[hit[1]] is None:  # a recorded view: writing it must reach its base
            return None
        try:
            meta = f(*_map(args, _meta), **_map(kwargs, _meta))
        except Exception:
            return None
        if not isinstance(meta, torch.Tensor) or meta.shape != target.shape or meta.dtype != target.dtype:
            return None
        # The placeholder's old value is no program output any more; the new node's output is.
        old_refs[hit[1]] = None
        self._record(f, args, kwargs, [target], alias=False, metas=[meta])
        return target

    def _dispatch(self, func, args, kwargs):
        tensors = _tensors((args, kwargs), [])
        device = _one_device(tensors)
        if func._schema.is_mutable and device is not None:
            done = self._record_in_place(func, args, kwargs)
            if done is not None:
                return done
        if not self._is_recordable(func) or device is None:
            returns_alias = any(r.alias_info is not None for r in func._schema.returns)
            if returns_alias and not func._schema.is_mutable:
                # A view: metadata only, run at once. The viewed placeholders become program
                # outputs; when the view op lowers, it is also recorded (as an alias that is
                # never a program output itself) so later ops on the view keep fusing.
                pending = [t for t in tensors if self._ref_of(t) is not None]
                for t in pending:
                    self.pinned[id(t)] = t
                out = _run(func, args, kwargs)
                if pending and op_key(func) in self.supported:
                    outs = [out] if isinstance(out, torch.Tensor) else list(out)
                    if outs and all(isinstance(o, torch.Tensor) and o.dtype in DTYPES for o in outs):
                        self._record(func, args, kwargs, outs, alias=True)
                return out
            if self.nodes:
                self.flush(op_key(func))
            return _run(func, args, kwargs)
        # Inputs that alias a pending placeholder without being one (views of it): materialise.
        for t in tensors:
            if self._ref_of(t) is None and self.pending_storages and _storage(t) in self.pending_storages:
                self.flush(f"{op_key(func)} on a view of a pending tensor")
                break
        try:
            out_meta = func(*_map(args, _meta), **_map(kwargs, _meta))
        except Exception:
            if self.nodes:
                self.flush(op_key(func))
            return _run(func, args, kwargs)
        metas = [out_meta] if isinstance(out_meta, torch.Tensor) else list(out_meta)
        if not all(isinstance(m, torch.Tensor) and m.dtype in DTYPES for m in metas):
            if self.nodes:
                self.flush(op_key(func))
            return _run(func, args, kwargs)
        # Placeholders take the dtype PyTorch's CPU kernel gives, where its meta function differs.
        key, dtypes = op_key(func), [t.dtype for t in tensors]
        metas = [
            m if (d := cpu_output_dtype(key, i, m.dtype, dtypes)) == m.dtype else m.to(d)
            for i, m in enumerate(metas)
        ]
        if not tensors and isinstance(kwargs.get("device"), (str, torch.device)):
            device = torch.device(kwargs["device"]).type  # a factory op: where it was asked for
        outs = [torch.empty(m.shape, dtype=m.dtype, device=device) for m in metas]
        self._record(func, args, kwargs, outs, alias=False, metas=metas)
        return outs[0] if isinstance(out_meta, torch.Tensor) else tuple(outs)

    def _record(self, func, args, kwargs, outs, alias: bool, metas=None) -> None:
        index = len(self.nodes)
        metas = metas if metas is not None else outs

        def to_ref(x):
            if isinstance(x, torch.Tensor):
                r = self._ref_of(x)
                if r is not None:
                    return r
                k = self.input_ids.get(id(x))
                if k is None or self.inputs[k] is not x:
                    k = len(self.inputs)
                    self.inputs.append(x)
                    self.input_ids[id(x)] = k
                return _Input(k)
            return x

        rargs = _map(args, to_ref)
        rkwargs = _map(kwargs, to_ref)
        refs = []
        for i, o in enumerate(outs):
            self.produced[id(o)] = (index, i, weakref.ref(o))
            # An alias shares its base's storage: never a program output of its own.
            refs.append(None if alias else weakref.ref(o))
            s = _storage(o)
            if s and not alias:
                self.pending_storages.add(s)
        self.nodes.append((func, rargs, rkwargs, refs, [str(m.dtype) for m in metas], [_meta(m) for m in metas]))

    # ----- materialising -----

    def _graph(self, live: list[tuple[int, int, torch.Tensor]]) -> dict:
        inputs = []
        for k, t in enumerate(self.inputs):
            inputs.append({"name": f"in{k}", "type": _short(t)})

        def ref(x):
            if isinstance(x, _Ref):
                return {"node": f"n{x.node}", **({"output": x.out} if x.out else {})}
            if isinstance(x, _Input):
                return {"node": f"in{x.index}"}
            return None

        nodes = []
        for i, (func, rargs, rkwargs, _refs, _d, metas) in enumerate(self.nodes):
            node = {
                "name": f"n{i}",
                "op": op_key(func),
                "args": [encode_arg(a, ref) for a in rargs],
                "arg_names": [a.name for a in func._schema.arguments],
                "outputs": [_short(m) for m in metas],
            }
            if rkwargs:
                node["kwargs"] = {k: encode_arg(v, ref) for k, v in sorted(rkwargs.items())}
            nodes.append(node)
        outputs = [{"node": f"n{n}", **({"output": o} if o else {})} for n, o, _ in live]
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
                    t = w() if w is not None else None
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
                _stats.record_fused_flush(n_ops, reason.split(" ")[0])
            finally:
                self._reset()

    def _run_program(self, live) -> None:
        program = native().compile_graph(dumps(self._graph(live)), self.refused)
        inputs = [t.detach() if t.is_contiguous() else t.detach().contiguous() for t in self.inputs]
        caps = program.run(inputs)
        for (_, _, t), cap in zip(live, caps):
            _fill(t, as_tensor(cap), aliased=id(t) in self.pinned)

    def _replay(self, live) -> None:
        values: dict[tuple[int, int], torch.Tensor] = {}

        def real(x):
            if isinstance(x, _Ref):
                return values[(x.node, x.out)]
            if isinstance(x, _Input):
                return self.inputs[x.index]
            return x

        for i, (func, rargs, rkwargs, _refs, _d, _m) in enumerate(self.nodes):
            out = func(*_map(rargs, real), **_map(rkwargs, real))
            outs = [out] if isinstance(out, torch.Tensor) else list(out)
            for j, o in enumerate(outs):
                values[(i, j)] = o
        for i, j, t in live:
            t.data.copy_(values[(i, j)])
        # Aliases (recorded views) already see their bases' storage.


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


def _one_device(tensors) -> str | None:
    """The device a recorded op's tensors share, when programs can read it in place: "cpu", or
    "tpu" (the tpu device's memory is host memory); None otherwise (mixed, meta, ...)."""
    devices = {t.device.type for t in tensors}
    if not devices:
        return "cpu"
    if len(devices) == 1 and devices <= {"cpu", "tpu"}:
        return devices.pop()
    return None


def _fill(t: torch.Tensor, value: torch.Tensor, aliased: bool) -> None:
    """Makes placeholder `t` hold `value`: by adopting its storage (no copy: the PJRT buffer
    becomes the tensor's memory) unless a view aliases the placeholder's own storage, in which
    case the bytes are copied. The autograd version counter is left as it was, so tensors saved
    for backward stay valid."""
    if aliased or value.dtype != t.dtype or value.shape != t.shape or value.device != t.device:
        t.data.copy_(value)
        return
    version = t._version
    with torch.no_grad():
        t.set_(value)
    torch._C._autograd._unsafe_set_version_counter((t,), (version,))


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:
        return 0


def _short(t: torch.Tensor) -> str:
    dtype = DTYPES.get(t.dtype)
    if dtype is None:
        raise Unencodable(f"dtype {t.dtype}")
    return f"{dtype}[{','.join(str(int(d)) for d in t.shape)}]"
