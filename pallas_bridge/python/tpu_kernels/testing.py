"""Test helpers: proof that a kernel or a program really ran, fault injection, and numerics
checks against a float64 reference.

A value check alone cannot tell a kernel's result from PyTorch's: every path here falls back to
PyTorch when something goes wrong. A test that claims a kernel or a program ran wraps the work
in :func:`no_fallbacks`, which fails if anything fell back, replayed or ran in PyTorch inside
the block, and can demand that named kernels ran (counted when they run, eagerly or inside a
fused or compiled program)::

    from tpu_kernels.testing import no_fallbacks

    with no_fallbacks(kernels=["silu"], programs=1):
        with tpu_kernels.substitute("fused"):
            y = F.silu(x) * 2

:func:`inject_fault` makes a named kernel compute wrong values (NaN, or off by one), graph
lowering fail, or a program fail at run time, so a test suite can show its tests fail when their
subject breaks. ``TPUK_TEST_FAULT`` (comma-separated, read by :func:`apply_fault_env`, which the
project's conftest calls) sets faults for a whole pytest run.

Compare a kernel's output with the same op evaluated in float64 on the (upcast) inputs::

    from tpu_kernels.testing import assert_close_to_reference

    out = tk.call("aten::gelu.default", x, approximate="none")[0]          # x is bf16
    assert_close_to_reference(out, torch.nn.functional.gelu(x.double()))  # dtype from `out`

The reference is first rounded to the tested dtype, so the tolerance measures the kernel's
arithmetic, not the output format: a kernel that is exact up to its final rounding is off by at
most one unit in the last place (ulp) of the rounded reference.

The rule is per element and has no escape: a case passes when every element is within
``atol + rtol * |round(reference)|`` of the float64 reference rounded to the dtype; a NaN or an
infinity the reference does not have is an error of infinite size. PyTorch eager's own error
in the low-precision dtype is never used to excuse a kernel's (for several kernels eager is the
reference formula itself run in bf16/f16: not an independent check).

torch is imported when a function is called, not when the module is imported.
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "TOLERANCES",
    "Ran",
    "apply_fault_env",
    "assert_close_to_reference",
    "error_policy",
    "inject_fault",
    "no_fallbacks",
    "reference_errors",
    "tolerance",
]


# (rtol, atol) per dtype, applied as |actual - round(reference)| <= atol + rtol * |round(reference)|.
#
# rtol. Every standard kernel computes in f32 (16-bit inputs are upcast) and rounds once at the
# end, reductions included. Against a reference rounded to the same 16-bit dtype, the f32
# arithmetic error is far below a 16-bit ulp, so the output is off by 0 or 1 ulp (1 when the f32
# and the f64 values straddle a rounding boundary). One ulp of a normal x is at most eps * |x|:
# the 16-bit rtol is exactly eps (bf16 2**-7, f16 2**-10), the bound for one ulp, no slack.
# f32 outputs are not rounded further, so the f32 rtol is the kernel's own arithmetic error:
# XLA's CPU exp/erf/tanh/rsqrt are within a few f32 ulps, and formulas that cancel (the RMSNorm
# gradient `r*gw - x*r^3*mean(gw*x)`) multiply that: 8 ulps (~9.5e-7).
#
# atol. Near zero a relative bound means nothing: results of sums that cancel (matmul, layer
# norm's `centered * rstd * w + b`, the gradients) and of GELU's erf tails carry the absolute f32
# error of their O(1)..O(100) intermediates, a few 1e-7 up to ~2e-6, whatever the dtype of the
# output (it is the same f32 computation). 4e-6, for all three dtypes.
#
# Measured (python/tests/test_numerics.py's cases, 25 seeds): the largest |error| / tolerance is
# 0.91 in f32 (rms_norm_backward, last dim 1), 0.97 in f16 and 0.80 in bf16 (single-ulp cases);
# `python python/tests/test_numerics.py` prints the table per kernel for the default seeds.
_F32_EPS = 2.0**-23
_BF16_EPS = 2.0**-7
_F16_EPS = 2.0**-10

_TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (8 * _F32_EPS, 4e-6),
    "bfloat16": (_BF16_EPS, 4e-6),
    "float16": (_F16_EPS, 4e-6),
}


def _table() -> dict[Any, tuple[float, float]]:
    import torch

    return {getattr(torch, name): tol for name, tol in _TOLERANCES.items()}


def __getattr__(name: str) -> Any:
    # `TOLERANCES` is keyed by torch dtypes; built on first access so importing this module does
    # not import torch.
    if name == "TOLERANCES":
        return _table()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tolerance(dtype: Any) -> tuple[float, float]:
    """`(rtol, atol)` for outputs of `dtype` (a torch dtype); `KeyError` naming the known ones."""
    table = _table()
    if dtype not in table:
        raise KeyError(f"no tolerance for dtype {dtype}; known: {sorted(map(str, table))}")
    return table[dtype]


def _diff(act: Any, ref: Any) -> Any:
    """|act - ref|, 0 where both are the same infinity or both NaN, inf where only one is NaN
    (a NaN or an inf the reference does not have is an error of infinite size)."""
    import torch

    diff = torch.where((act == ref) | (act.isnan() & ref.isnan()), 0.0, (act - ref).abs())
    return diff.nan_to_num(nan=float("inf"))


def reference_errors(actual: Any, reference_f64: Any, dtype: Any = None) -> dict[str, float]:
    """How far `actual` is from `reference_f64` rounded to `dtype` (default: `actual`'s dtype).

    Returns ``max_abs`` (largest absolute difference), ``max_rel`` (largest difference relative
    to the rounded reference, over elements whose reference is nonzero) and ``ratio``, the largest
    ``|difference| / (atol + rtol * |reference|)`` under :data:`TOLERANCES`: the check passes
    when ``ratio <= 1``.
    """
    import torch

    dtype = dtype or actual.dtype
    rtol, atol = tolerance(dtype)
    ref = reference_f64.detach().to(torch.float64).to(dtype).to(torch.float64)
    act = actual.detach().to(torch.float64)
    if act.shape != ref.shape:
        raise AssertionError(f"shape {tuple(act.shape)} != reference shape {tuple(ref.shape)}")
    if act.numel() == 0:
        return {"max_abs": 0.0, "max_rel": 0.0, "ratio": 0.0}
    diff = _diff(act, ref)
    nonzero = ref != 0
    rel = diff[nonzero] / ref[nonzero].abs()
    return {
        "max_abs": float(diff.max()),
        "max_rel": float(rel.max()) if rel.numel() else 0.0,
        "ratio": float((diff / (atol + rtol * ref.abs().nan_to_num(nan=0.0, posinf=0.0))).max()),
    }


def assert_close_to_reference(actual: Any, reference_f64: Any, dtype: Any = None, msg: str = "") -> dict[str, float]:
    """Asserts `actual` matches `reference_f64` (float64, computed from the same, upcast inputs)
    once the reference is rounded to `dtype` (default: `actual`'s dtype), within that dtype's
    entry in :data:`TOLERANCES`. Returns :func:`reference_errors`; the `AssertionError` names the
    worst element, both values and the tolerance."""
    import torch

    dtype = dtype or actual.dtype
    if actual.dtype != dtype:
        raise AssertionError(f"{msg}dtype {actual.dtype} != expected {dtype}")
    errors = reference_errors(actual, reference_f64, dtype)
    if errors["ratio"] <= 1.0:
        return errors
    rtol, atol = tolerance(dtype)
    ref = reference_f64.detach().to(torch.float64).to(dtype).to(torch.float64)
    act = actual.detach().to(torch.float64)
    excess = _diff(act, ref) / (atol + rtol * ref.abs().nan_to_num(nan=0.0, posinf=0.0))
    worst = int(excess.flatten().argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), act.shape)) if act.dim() else ()
    bad = int((excess > 1).sum())
    raise AssertionError(
        f"{msg}{bad} of {act.numel()} elements of {dtype} {tuple(act.shape)} exceed "
        f"rtol={rtol:.3g}, atol={atol:.3g} against the f64 reference rounded to {dtype}; worst at "
        f"{index}: actual {act.flatten()[worst].item()!r}, reference {reference_f64.flatten()[worst].item()!r} "
        f"(rounded {ref.flatten()[worst].item()!r}); max_abs {errors['max_abs']:.3g}, "
        f"max_rel {errors['max_rel']:.3g}, {errors['ratio']:.3g}x the tolerance"
    )


# ---------------------------------------------------------------------------------------------
# Proof that kernels and programs ran
# ---------------------------------------------------------------------------------------------


@dataclass
class Ran:
    """What ran inside a :func:`no_fallbacks` block (filled in when the block exits)."""

    #: Kernel name -> times it ran: eager calls, and each inlined call of each program run.
    kernels: dict[str, int] = field(default_factory=dict)
    #: Graph program runs (fused flushes and compiled graphs).
    programs: int = 0
    #: `(op, category)` -> fallbacks recorded in the block, allowed ones included.
    fallbacks: dict[tuple[str, str], int] = field(default_factory=dict)
    #: Op -> ``torch.compile`` graph nodes of that op run in PyTorch, allowed ones included.
    pytorch_nodes: dict[str, int] = field(default_factory=dict)


def _normalize(op: str) -> str:
    name = op.rsplit("::", 1)[-1]
    return op if "." in name or "::" not in op else f"{op}.default"


def _snapshot() -> dict[str, Any]:
    from . import stats as dispatcher_stats
    from .torch import report

    r = report()
    fallbacks: dict[tuple[str, str], int] = defaultdict(int)
    last: dict[str, str] = {}
    kernels: dict[str, int] = defaultdict(int)
    # The torch integration's counters (eager modes, fused, compiled, `torch.ops.tpuk.*`), then
    # the dispatch API's (`tpu_kernels.dispatch`: ops defined by imported kernels).
    for ops in (r.ops, dispatcher_stats()["ops"]):
        for op, o in ops.items():
            for c, n in o["fallbacks"].items():
                fallbacks[(op, c)] += n
            if o.get("last_fallback"):
                last[op] = o["last_fallback"]
            for k, n in o["kernels"].items():
                kernels[k] += n
    for k, n in r.graphs.get("kernels_run", {}).items():
        kernels[k] += n
    return {
        "fallbacks": fallbacks,
        "last": last,
        "kernels": kernels,
        "programs": r.graphs.get("runs", 0),
        "eager_nodes": dict(r.compiled["eager_nodes"]),
        "eager_reasons": dict(r.compiled["eager_reasons"]),
    }


@contextlib.contextmanager
def no_fallbacks(
    *,
    kernels: Sequence[str] = (),
    programs: int = 0,
    ops: Sequence[str] | None = None,
    allow: Mapping[str, str] | None = None,
) -> Iterator[Ran]:
    """Fails the block (``AssertionError`` on exit) unless what it claims ran, ran:

    - no op fell back to PyTorch (only the ops in `ops`, when given), whatever the reason;
    - no error was recorded: a kernel's build, compile or execute failure, an exception in the
      binding code, a fused program replayed in PyTorch, a compiled graph run in PyTorch
      instead of its program, a graph lowering failure (these count whatever `ops` says);
    - no node of a ``torch.compile`` graph ran in PyTorch;
    - each kernel in `kernels` ran at least once (eagerly, or inside a program run);
    - at least `programs` graph programs ran.

    `allow` maps an op (``"aten::cumsum.default"``) to why its fallbacks or PyTorch nodes are
    expected in this block; they are then not failures. Yields a :class:`Ran`, filled in on
    exit. An exception raised inside the block propagates unchanged.
    """
    from .torch._stats import ERRORS

    allowed = {_normalize(k) for k in (allow or {})}
    only = None if ops is None else {_normalize(o) for o in ops}
    ran = Ran()
    before = _snapshot()
    yield ran
    after = _snapshot()
    problems: list[str] = []
    for key, n in sorted(after["fallbacks"].items()):
        delta = n - before["fallbacks"].get(key, 0)
        if delta <= 0:
            continue
        op, category = key
        ran.fallbacks[key] = delta
        if op in allowed:
            continue
        if category not in ERRORS and only is not None and op not in only:
            continue
        kind = "error" if category in ERRORS else "fallback"
        problems.append(f"{op}: {delta} {kind}{'s' if delta > 1 else ''} ({category}); last: {after['last'].get(op, '?')}")
    for op, n in sorted(after["eager_nodes"].items()):
        delta = n - before["eager_nodes"].get(op, 0)
        if delta > 0:
            ran.pytorch_nodes[op] = delta
        if delta > 0 and op not in allowed:
            problems.append(f"{op}: {delta} torch.compile node(s) ran in PyTorch: {after['eager_reasons'].get(op, '?')}")
    ran.kernels = {
        k: n - before["kernels"].get(k, 0) for k, n in after["kernels"].items() if n > before["kernels"].get(k, 0)
    }
    ran.programs = after["programs"] - before["programs"]
    missing = [k for k in kernels if ran.kernels.get(k, 0) == 0]
    if missing:
        problems.append(
            f"kernels that never ran in the block: {', '.join(missing)} "
            f"(ran: {', '.join(f'{k}x{n}' for k, n in sorted(ran.kernels.items())) or 'none'})"
        )
    if ran.programs < programs:
        problems.append(f"{ran.programs} graph program run(s) in the block, expected at least {programs}")
    if problems:
        raise AssertionError("work that should have run on tpu_kernels did not:\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------------------------------------
# Faults and the error policy
# ---------------------------------------------------------------------------------------------

FAULT_ENV = "TPUK_TEST_FAULT"


def _bridge():
    from ._native import torch_bridge

    return torch_bridge


@contextlib.contextmanager
def inject_fault(*faults: str) -> Iterator[None]:
    """Injects faults for the block, then restores the previous ones. Each fault is
    ``"nan:KERNEL"`` / ``"offset:KERNEL"`` (every floating-point output of the kernel is NaN,
    or off by one: the kernel's module is rewritten, so PJRT computes the wrong values eagerly
    and inside programs), ``"lower"`` (graph lowering fails), ``"run"`` / ``"run:KERNEL"``
    (every kernel call and program run fails at run time, or those of the kernel).
    Programs compiled before the block keep their code; run faults reach every run."""
    bridge = _bridge()
    previous = bridge.faults()
    bridge.set_faults(list(faults))
    try:
        yield
    finally:
        bridge.set_faults(previous)


def apply_fault_env() -> list[str]:
    """Injects the faults named in ``TPUK_TEST_FAULT`` (comma-separated) for the rest of the
    process; returns them. For a whole test run: the project's conftest calls this."""
    text = os.environ.get(FAULT_ENV, "").strip()
    if not text:
        return []
    faults = [f.strip() for f in text.split(",") if f.strip()]
    _bridge().set_faults(faults)
    return faults


@contextlib.contextmanager
def force_tiled(force: bool = True) -> Iterator[None]:
    """Selects tiled (Mosaic) kernels first on every platform for the block (see
    :func:`tpu_kernels.set_force_tiled`), then restores the previous setting."""
    from . import set_force_tiled

    previous = set_force_tiled(force)
    try:
        yield
    finally:
        set_force_tiled(previous)


@contextlib.contextmanager
def error_policy(policy: str) -> Iterator[None]:
    """Sets the error policy (``"fallback"`` or ``"raise"``, see
    :func:`tpu_kernels.set_error_policy`) for the block."""
    from .errors import set_error_policy

    previous = set_error_policy(policy)
    try:
        yield
    finally:
        set_error_policy(previous)
