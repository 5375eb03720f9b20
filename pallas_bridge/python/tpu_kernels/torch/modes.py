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
- `debug`: synchronous, and every op's outputs (a kernel's, or PyTorch's when no kernel takes
  the call) are checked against the op's own shape/dtype rule (run on meta tensors) and for
  NaN/Inf that finite inputs did not have. A failed check, or a failure of a kernel or of this
  package (build, compile, execute), raises `SubstitutionError` naming the op, the kernel and
  the user's line; a call no kernel takes falls back as in strict mode (counted, with its
  reason).
- `fused`: see `fused.py`.
"""

from __future__ import annotations

import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import _stats as _report
from ._bindings import TABLE, cpu_output_dtype, op_key
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
        if self.debug:
            return self._debug(func, plan, args, kwargs or {})
        if plan is None:
            return func(*args, **(kwargs or {}))
        kwargs = kwargs or {}
        try:
            bound = plan.bind(args, kwargs)
            if type(bound) is str:
                _report.record_fallback(plan.key, "bad_input", f"`{plan.key}` falls back: {bound}")
                return func(*args, **kwargs)
            tensors, statics = bound
            for t in tensors:
                # Kernels read host memory in place: CPU tensors and the tpu device's.
                if not t.is_cpu and t.device.type != "tpu":
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
        """One op, checked: the kernel's outputs, or the op's own when no kernel takes the call
        (counted with the reason, as in strict mode), against the op's meta function and for
        NaN/Inf that finite inputs did not have. A failure of a kernel or of this package
        raises, naming the op, the kernel and the user's line."""
        key = op_key(func) if plan is None else plan.key
        inputs_finite = _all_finite(args, kwargs)
        expected = _meta_outputs(func, args, kwargs)
        kernel = None
        tensors: list = []
        if plan is None:
            out = func(*args, **kwargs)
        else:
            bound = plan.bind(args, kwargs)
            if type(bound) is str:
                _report.record_fallback(key, "bad_input", f"`{key}` falls back: {bound}")
                out = func(*args, **kwargs)
            else:
                tensors, statics = bound
                r = self._call(key, tensors, statics, True)
                if len(r) == 3:
                    who, category, message = r
                    if category in _report.ERRORS:
                        raise SubstitutionError(
                            f"{key} (kernel {who or ' / '.join(plan.kernels)}): {category}: {message}{_at_user_line()}"
                        )
                    if category == "dlpack":  # never reached the dispatcher's counters
                        _report.record_fallback(key, "bad_input", message)
                    out = func(*args, **kwargs)
                elif r[0] in plan.refused:
                    _report.record_fallback(key, "schema_refused", plan.refused[r[0]])
                    out = func(*args, **kwargs)
                else:
                    kernel = r[0]
                    outs = plan.mask_outputs(tuple(as_tensor(c) for c in r[1]), args, kwargs)
                    out = outs[0] if len(outs) == 1 else tuple(outs)
        _check_outputs(key, kernel, out, expected, inputs_finite, tensors)
        return out


def _user_line() -> str | None:
    """`file:line` of the innermost frame outside torch and tpu_kernels (the user's code)."""
    import sys

    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not any(part in name for part in _INTERNAL_PATHS):
            return f"{name}:{f.f_lineno}"
        f = f.f_back
    return None


def _at_user_line() -> str:
    line = _user_line()
    return f" (at {line})" if line else ""


def _internal_paths() -> tuple[str, ...]:
    import os

    import tpu_kernels

    return (
        os.path.dirname(torch.__file__) + os.sep,
        os.path.dirname(tpu_kernels.__file__) + os.sep,
        f"{os.sep}contextlib.py",
        "<frozen ",
    )


_INTERNAL_PATHS = _internal_paths()


def _finite_values(x) -> bool:
    if isinstance(x, torch.Tensor):
        if not (x.is_floating_point() or x.is_complex()) or x.device.type not in ("cpu", "tpu"):
            return True
        return bool(torch.isfinite(x).all())
    if isinstance(x, float):
        return x == x and x not in (float("inf"), float("-inf"))
    if isinstance(x, (list, tuple)):
        return all(_finite_values(v) for v in x)
    return True


def _all_finite(args, kwargs) -> bool:
    """Whether every floating tensor and float among the arguments is finite."""
    return _finite_values(args) and _finite_values(list((kwargs or {}).values()))


def _meta_outputs(func, args, kwargs):
    """The op's outputs computed by its meta function (None when it has none)."""
    try:
        return _outputs_as_list(func(*_meta_like(args), **_meta_like(kwargs or {})))
    except Exception:
        return None


# Ops whose outputs are uninitialised memory (which may hold anything, NaN included).
_UNINITIALISED = ("aten::empty", "aten::new_empty", "aten::_empty", "aten::resize", "aten::set_")


def _check_outputs(key: str, kernel: str | None, out, expected, inputs_finite: bool, tensors) -> None:
    """Debug mode's check of one op's outputs (from `kernel`, or the op's own when None).

    - Shapes and dtypes against the op's meta function. Not compared: a new op's outputs when
      its kernel did not run (its meta function is the kernel's own output rule, which the call
      it declined may not satisfy), and PyTorch's outputs that its CPU kernel or its meta
      function leaves empty (unused auxiliaries, such as `_embedding_bag`'s `offset2bag` and
      `max_indices`, on which the two disagree).
    - NaN from finite inputs raises. Inf from finite inputs is often meant (T5 takes the log of
      a zero distance): it is reported once per op and line as a `RuntimeWarning`.
    """
    who = f"{key} (kernel {kernel})" if kernel else f"{key} (no kernel: PyTorch's)"
    if out is None or not isinstance(out, (torch.Tensor, tuple, list)):
        return
    outs = _outputs_as_list(out)
    compare = expected is not None and (kernel is not None or key.startswith("aten::"))
    if compare:
        if len(expected) != len(outs):
            raise SubstitutionError(f"{who}: {len(outs)} outputs, the op gives {len(expected)}{_at_user_line()}")
        for i, (o, e) in enumerate(zip(outs, expected)):
            if not isinstance(o, torch.Tensor) or not isinstance(e, torch.Tensor):
                if (o is None) != (e is None):
                    raise SubstitutionError(f"{who}: output {i} is {o}, the op gives {e}{_at_user_line()}")
                continue
            if kernel is None and (o.numel() == 0 or e.numel() == 0):
                continue
            same_dtype = _dtype_agrees(key, i, o, e, tensors) if kernel else o.dtype == e.dtype
            if o.shape != e.shape or not same_dtype:
                raise SubstitutionError(
                    f"{who}: output {i} is {o.dtype}{list(o.shape)}, the op gives "
                    f"{e.dtype}{list(e.shape)}{_at_user_line()}"
                )
    if inputs_finite and not key.startswith(_UNINITIALISED):
        for i, o in enumerate(outs):
            if isinstance(o, torch.Tensor) and not _finite_values(o):
                n_nan = int(torch.isnan(o).sum())
                n_inf = int(torch.isinf(o).sum())
                if n_nan:
                    raise SubstitutionError(
                        f"{who}: output {i} has {n_nan} NaN and {n_inf} Inf values from finite inputs{_at_user_line()}"
                    )
                line = _user_line()
                if (key, line) not in _WARNED_INF:
                    _WARNED_INF.add((key, line))
                    warnings.warn(
                        f"{who}: output {i} has {n_inf} Inf values from finite inputs"
                        + (f" (at {line})" if line else "")
                        + "; debug mode reports this once per op and line",
                        RuntimeWarning,
                        stacklevel=2,
                    )


# (op, user line) pairs whose Inf from finite inputs was reported.
_WARNED_INF: set = set()


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
