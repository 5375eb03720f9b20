"""Guards: conditions a call must meet for a kernel to apply (the Rust ``Guard`` enum).

Inputs are numbered from 0; dimensions may count from the end (``-1`` is the last)::

    tpu_kernels.register_jax(f, op="mylib::norm", signatures=["f32[B,128]"],
                             guards=[guards.divisible_by(0, 0, 8)])
"""

from __future__ import annotations

Guard = tuple[object, ...]


def rank(input: int, min: int, max: int | None = None) -> Guard:
    """Input `input` has a rank in ``min..=max`` (``max`` defaults to ``min``)."""
    return ("rank", input, min, min if max is None else max)


def divisible_by(input: int, dim: int, by: int) -> Guard:
    """Dimension `dim` of input `input` is a multiple of `by`."""
    return ("divisible_by", input, dim, by)


def dim_eq(input: int, dim: int, size: int) -> Guard:
    """Dimension `dim` of input `input` is exactly `size`."""
    return ("dim_eq", input, dim, size)


def same_dim(a_input: int, a_dim: int, b_input: int, b_dim: int) -> Guard:
    """Two dimensions are equal."""
    return ("same_dim", a_input, a_dim, b_input, b_dim)


def same_dtype() -> Guard:
    """All inputs share the first input's element type."""
    return ("same_dtype",)


def dtype_is(input: int, dtype: str) -> Guard:
    """Input `input` has element type `dtype` (short name: ``f32``, ``bf16``)."""
    return ("dtype_is", input, dtype)


def static_eq(name: str, value: str) -> Guard:
    """Static argument `name` has this value (signature spelling)."""
    return ("static_eq", name, value)
