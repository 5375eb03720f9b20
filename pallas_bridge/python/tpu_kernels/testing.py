"""Numerics checks for kernels: one tolerance table per dtype, and a comparison against a
float64 reference.

Compare a kernel's output with the same op evaluated in float64 on the (upcast) inputs::

    from tpu_kernels.testing import assert_close_to_reference

    out = tk.call("aten::gelu.default", x, approximate="none")[0]          # x is bf16
    assert_close_to_reference(out, torch.nn.functional.gelu(x.double()))  # dtype from `out`

The reference is first rounded to the tested dtype, so the tolerance measures the kernel's
arithmetic, not the output format: a kernel that is exact up to its final rounding is off by at
most one unit in the last place (ulp) of the rounded reference.

torch is imported when a function is called, not when the module is imported.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TOLERANCES", "assert_close_to_reference", "reference_errors", "tolerance"]

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
