"""Eager substitution: `with tpu_kernels.substitute(mode=...)`.

A `TorchDispatchMode` sees every ATen op (after autograd and CompositeImplicitAutograd
decomposition). An op overload some kernel binds goes to the native dispatcher with its tensors
passed through DLPack (the kernel reads them where they are; its outputs come back as torch
tensors over the PJRT buffers, no copy); every other op runs as usual.

- `strict`: one op at a time, no checks; a call no kernel can take (dtype, shape guard, device,
  non-contiguous or overlapping input) falls back to the original op with the reason recorded
  in `report()`. A failure of a kernel or of this package's code (build, compile, execute, an
  exception in the binding code) is counted as an error (`report().errors()`); it falls back
  too under the default error policy and raises `InternalError` under `"raise"`
  (`tpu_kernels.set_error_policy`, `TPUK_ON_ERROR=raise`). Asynchronous where PJRT allows: on the CPU plugin an
  output's memory can only be handed to torch once the execution that writes it is done, so
  each call returns when its kernel has finished (no extra synchronisation beyond that).
- `debug`: synchronous, and each substituted op's outputs are checked against the op's own
  shape/dtype rule (run on meta tensors) and for NaN/Inf the inputs did not have; any failure
  or fallback of an op that has kernels raises `SubstitutionError` naming the op and kernel.
- `fused`: see `fused.py`.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import _stats as _report
from ._bindings import TABLE, cpu_output_dtype
from ._native import native
from ._output import as_tensor


_Tensor = torch.Tensor


class SubstitutionError(RuntimeError):
    """A substituted op failed a check (debug mode), naming the op and the kernel."""


def _meta_like(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, (list, tuple)):
        return type(x)(_meta_like(v) for v in x)
    return x


def _dtype_agrees(key: str, i: int, out, expected, inputs) -> bool:
    return out.dtype == cpu_output_dtype(key, i, expected.dtype, [t.dtype for t in inputs])


def _outputs_as_list(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return list(out)


def _native_plan(plan):
    """How the native strict handler treats an op: None (no kernel binds it), "python" (every
    call goes to the Python handler: refused kernels, an output mask), or the plan's bindings."""
    if plan is None:
        return None
    if plan.refused or plan.output_mask is not None:
        return "python"
    return (
        plan.key,
        [(v.tensor_slots, v.static_slots, v.absent) for v in plan.variants],
    )


class SubstituteMode(TorchDispatchMode):
    """Strict or debug eager substitution."""

    def __init__(self, mode: str = "strict") -> None:
        super().__init__()
        if mode not in ("strict", "debug"):
            raise ValueError(f"mode must be 'strict', 'debug' or 'fused', not {mode!r}")
        self.mode = mode
        self.debug = mode == "debug"
        self._call = native().call
        TABLE.refresh()
        self._plans = TABLE.plans
        if not self.debug:
            # The hot path in Rust: it takes the calls this handler would send straight to a
            # kernel, and hands every other call to `_learn_and_dispatch`.
            self.__torch_dispatch__ = native().StrictDispatch(self, self._learn_and_dispatch, torch.Tensor)

    def _learn_and_dispatch(self, func, types, args=(), kwargs=None):
        """The native handler's way into this class's: it learns how `func`'s calls go, then
        this call takes the Python path."""
        TABLE.refresh()
        self._plans = TABLE.plans
        plan = self._plans.get(func, False)
        if plan is False:
            plan = TABLE.plan(func)
        self.__dict__["__torch_dispatch__"].learn(func, _native_plan(plan))
        return SubstituteMode.__torch_dispatch__(self, func, types, args, kwargs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # The hot path of every op: keep it to a dict lookup for ops without kernels.
        plan = self._plans.get(func, False)
        if plan is False:
            plan = TABLE.plan(func)
        if plan is None:
            return func(*args, **(kwargs or {}))
        kwargs = kwargs or {}
        if self.debug:
            return self._debug(func, plan, args, kwargs)
        try:
            bound = plan.bind(args, kwargs)
            if type(bound) is str:
                _report.record_fallback(plan.key, "bad_input", f"`{plan.key}` falls back: {bound}")
                return func(*args, **kwargs)
            tensors, statics = bound
            for t in tensors:
                if not t.is_cpu:
                    _report.record_fallback(
                        plan.key, "bad_input", f"`{plan.key}` falls back: a tensor is on device `{t.device}`"
                    )
                    return func(*args, **kwargs)
            if plan.refused:
                return self._refusing(func, plan, tensors, statics, args, kwargs)
            r = self._call(plan.key, tensors, statics, False)
            if type(r) is _Tensor:
                return r
            if type(r) is not tuple:  # a capsule
                return torch.from_dlpack(r)
            if len(r) == 2:
                return plan.mask_outputs(tuple(as_tensor(o) for o in r[1]), args, kwargs)
        except Exception as e:
            # An exception in this package's code is an error, never a silent "no kernel":
            # counted as `internal`, raised under the "raise" policy, else the op runs as usual.
            _report.record_fallback(plan.key, "internal", f"`{plan.key}` falls back: {type(e).__name__}: {e}")
            return func(*args, **kwargs)
        self._native_fallback(plan.key, r)
        return func(*args, **kwargs)

    @staticmethod
    def _native_fallback(key: str, r) -> None:
        """A call the native side answered with `(kernel, category, message)`: the dispatcher
        counted it, except for inputs it never saw (`dlpack`); an error-class one raises under
        the "raise" policy."""
        if r[1] == "dlpack":  # never reached the dispatcher's counters
            _report.record_fallback(key, "bad_input", r[2])
        elif r[1] in _report.ERRORS:
            _report.raise_if_policy(r[2])

    def _refusing(self, func, plan, tensors, statics, args, kwargs):
        """A call of an op some of whose kernels were refused: a refused kernel's result is
        discarded and the op runs in PyTorch."""
        r = self._call(plan.key, tensors, statics, True)
        if len(r) == 2:
            if r[0] not in plan.refused:
                outs = plan.mask_outputs(tuple(as_tensor(o) for o in r[1]), args, kwargs)
                return outs[0] if len(outs) == 1 else outs
            _report.record_fallback(plan.key, "schema_refused", plan.refused[r[0]])
        else:
            self._native_fallback(plan.key, r)
        return func(*args, **kwargs)

    def _debug(self, func, plan, args, kwargs):
        key = plan.key
        bound = plan.bind(args, kwargs)
        if type(bound) is str:
            raise SubstitutionError(f"{key} (kernels {', '.join(plan.kernels)}): {bound}")
        tensors, statics = bound
        for i, t in enumerate(tensors):
            if t.device.type != "cpu":
                raise SubstitutionError(
                    f"{key} (kernels {', '.join(plan.kernels)}): input {i} is on device `{t.device}`; "
                    "kernels run on the PJRT CPU client and take CPU tensors"
                )
        r = self._call(key, tensors, statics, True)
        if len(r) == 3:
            kernel, category, message = r
            raise SubstitutionError(f"{key} (kernel {kernel or ' / '.join(plan.kernels)}): {category}: {message}")
        kernel = r[0]
        if kernel in plan.refused:
            raise SubstitutionError(f"{key} (kernel {kernel}): refused: {plan.refused[kernel]}")
        outs = list(plan.mask_outputs(tuple(as_tensor(c) for c in r[1]), args, kwargs))
        expected = _outputs_as_list(func(*_meta_like(args), **_meta_like(kwargs)))
        if len(expected) != len(outs):
            raise SubstitutionError(f"{key} (kernel {kernel}): {len(outs)} outputs, the op has {len(expected)}")
        for i, (o, e) in enumerate(zip(outs, expected)):
            if o is None or e is None:
                if (o is None) != (e is None):
                    raise SubstitutionError(f"{key} (kernel {kernel}): output {i} is {o}, the op gives {e}")
                continue
            if o.shape != e.shape or not _dtype_agrees(key, i, o, e, tensors):
                raise SubstitutionError(
                    f"{key} (kernel {kernel}): output {i} is {o.dtype}{list(o.shape)}, the op gives {e.dtype}{list(e.shape)}"
                )
        inputs_finite = all(not t.is_floating_point() or bool(torch.isfinite(t).all()) for t in tensors)
        if inputs_finite:
            for i, o in enumerate(outs):
                if o is not None and o.is_floating_point() and not bool(torch.isfinite(o).all()):
                    n_nan = int(torch.isnan(o).sum())
                    n_inf = int(torch.isinf(o).sum())
                    raise SubstitutionError(
                        f"{key} (kernel {kernel}): output {i} has {n_nan} NaN and {n_inf} Inf values from finite inputs"
                    )
        return outs[0] if len(outs) == 1 else tuple(outs)


def substitute(mode: str = "strict"):
    """A context manager that substitutes registered kernels for ATen ops.

    `mode` is `"strict"` (one op at a time, fallbacks recorded), `"debug"` (synchronous, checked,
    errors raised) or `"fused"` (ops recorded and run as one cached StableHLO program at each
    materialisation point).
    """
    if mode == "fused":
        from .fused import FusedMode

        return FusedMode()
    return SubstituteMode(mode)
