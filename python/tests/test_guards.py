"""Guards: every guard of every standard kernel rejects what the kernel cannot compute, and the
eager dispatcher falls back.

`CASES` is the table: per case, a kernel, the guard it violates (as `tpu_kernels.kernels()`
spells it, or `"dtypes"` for the kernel's dtype list) and a builder of violating inputs (the op
overload to call, its arguments). Each input violates that guard and meets every guard the
registry checks before it (guards run in order; the first failure is the reason). Per case:

(a) `tpu_kernels.select` on the call's signature (bound by the package's own binder, exactly as
    the dispatch mode binds it) rejects the kernel, with a reason naming the guard's condition;
(b) under `substitute(mode="strict")` the call falls back: the result is plain PyTorch eager's
    (the same value, or the same exception where PyTorch itself rejects the inputs), and
    `report()` counts a fallback for the op with the kernel's reason. A new op (`tpuk::*`)
    falls back to its PyTorch reference (`_references.py`), with or without substitution, so
    the result is the reference's (or the reference's own exception);
(c) under `substitute(mode="debug")` the fallback raises `SubstitutionError` naming the op, the
    kernel and the reason (`modes.py`: "any failure or fallback of an op that has kernels
    raises");
(d) under `substitute(mode="fused")` (ATen ops PyTorch accepts) the values are PyTorch's.

A case whose op has a sibling kernel that takes the call (`gelu` and `gelu_tanh` split
`aten::gelu` by `approximate`) names it in `taken_by`: the call is substituted by the sibling,
and the reason check uses `probe` statics no kernel of the op takes (`select` only names a
kernel's reason when no kernel accepts).

Kernels with long, regular guard lists (the attention family) list their guards against one
valid `Base` call, and `violate` derives each case's inputs by a fixed rule (one input's rank or
dimension off by one, its dtype changed, a static changed); the selection test proves the rule
hit that guard. PyTorch's CPU flash-attention overloads do not validate their inputs (shapes
that disagree corrupt the heap), so those cases never run PyTorch's kernel: strict mode's
hand-back to PyTorch is observed by a stub mode entered below it (`unchecked_by_pytorch`).

`test_every_guard_has_a_case` fails, naming the kernel and guard, when a standard kernel has a
guard (or a dtype list) without a case here. A guard no input can violate (`rank(i, 0, max)`,
from a `[..]` shape) needs no case; `test_unviolable_guards_admit_every_rank` checks it admits
ranks 0 and 5.

`BODY_CASES`: calls every guard admits but the kernel cannot compute, which the kernel's body
rejects at build time (a `build` fallback). Known gaps are strict xfails naming the bug.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import tpu_kernels as tk  # noqa: E402
import tpu_kernels.torch as tkt  # noqa: E402
from tpu_kernels.testing import error_policy  # noqa: E402
from tpu_kernels.torch._bindings import TABLE, op_key  # noqa: E402
from tpu_kernels.torch._custom_ops import KernelOpError  # noqa: E402
from tpu_kernels.torch.graph import DTYPES as SHORT  # noqa: E402
from tpu_kernels.torch.modes import SubstitutionError  # noqa: E402

tkt.custom_ops()  # torch.ops.tpuk.* for the kernels that define new ops

A = torch.ops.aten
F32, F64, BF16, F16, I32, I64 = torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64
USIZE_MAX = 2**64 - 1

# ----- the table -----


def _parse_guard(text: str) -> tuple[str, list[str]]:
    m = re.fullmatch(r"(\w+)\((.*)\)", text)
    assert m, f"guard `{text}` is not `kind(args)`"
    return m.group(1), [a.strip() for a in m.group(2).split(",") if a.strip()]


@dataclass(frozen=True)
class Case:
    kernel: str
    guard: str
    # (tensor factory: (shape, dtype) -> tensor) -> (op overload, args, kwargs)
    build: Callable[[Callable[..., torch.Tensor]], tuple[Any, tuple, dict]]
    taken_by: str | None = None
    probe: dict[str, Any] = field(default_factory=dict)
    # PyTorch's op does not validate these inputs (autograd's internal overloads trust their
    # shapes: the CPU flash-attention ones corrupt the heap on inconsistent shapes): PyTorch's
    # kernel is never run on them here; strict mode's hand-back to PyTorch is observed by a stub
    # mode below it instead.
    unchecked_by_pytorch: bool = False
    # With `taken_by`: the inputs are not a valid call of the op (shapes that disagree), so what
    # becomes of the call is the sibling's and PyTorch's business, not this guard's. Only the
    # selection test runs: the kernel's own verdict (`tk.explain`) names the guard.
    selection_only: bool = False

    @property
    def id(self) -> str:
        return f"{self.kernel}-{re.sub(r'[^0-9a-z]+', '_', self.guard).strip('_')}"


def tpuk(name: str):
    return getattr(torch.ops.tpuk, name).default


def T(new: Callable[..., torch.Tensor], *shape: int, dtype: torch.dtype = F32) -> torch.Tensor:
    return new(shape, dtype)


def _ln(x, w, b, normalized=None):
    return A.native_layer_norm.default, (x, list(x.shape[-1:] if normalized is None else normalized), w, b, 1e-5), {}


def _kernel_cases() -> list[Case]:
    c: list[Case] = []

    def add(kernel, guard, build, **kw):
        c.append(Case(kernel, guard, build, **kw))

    # --- aten::gelu: two kernels split by `approximate` ---
    for kernel, mine, other, sibling in [("gelu", "none", "tanh", "gelu_tanh"), ("gelu_tanh", "tanh", "none", "gelu")]:
        add(kernel, "dtypes", lambda r, mine=mine: (A.gelu.default, (T(r, 4, 8, dtype=F64),), {"approximate": mine}))
        add(
            kernel,
            f"static_eq(approximate, {mine})",
            lambda r, other=other: (A.gelu.default, (T(r, 4, 8),), {"approximate": other}),
            taken_by=sibling,
            probe={"approximate": "erf"},
        )
    add("silu", "dtypes", lambda r: (A.silu.default, (T(r, 4, 8, dtype=F64),), {}))

    # --- softmax, log_softmax: half_to_float=True is the CPU-unsupported upcasting form ---
    for kernel, op in [("softmax", A._softmax.default), ("log_softmax", A._log_softmax.default)]:
        add(kernel, "dtypes", lambda r, op=op: (op, (T(r, 4, 8, dtype=F64), -1, False), {}))
        add(kernel, "static_eq(half_to_float, false)", lambda r, op=op: (op, (T(r, 4, 8, dtype=F16), -1, True), {}))

    # --- aten::native_layer_norm: x [.., D], weight [D], bias [D], one dtype ---
    add("layer_norm", "dtypes", lambda r: _ln(T(r, 4, 8, dtype=F64), T(r, 8, dtype=F64), T(r, 8, dtype=F64)))
    add("layer_norm", "same_dtype()", lambda r: _ln(T(r, 4, 8, dtype=BF16), T(r, 8), T(r, 8)))
    add("layer_norm", f"rank(0, 1, {USIZE_MAX})", lambda r: _ln(T(r), T(r), T(r), normalized=[]))
    # Normalising over the last two dimensions: weight and bias are [4, 6].
    add("layer_norm", "rank(1, 1, 1)", lambda r: _ln(T(r, 3, 4, 6), T(r, 4, 6), T(r, 4, 6), normalized=[4, 6]))
    add("layer_norm", "same_dim(0, -1, 1, 0)", lambda r: _ln(T(r, 4, 8), T(r, 6), T(r, 8)))
    add("layer_norm", "rank(2, 1, 1)", lambda r: _ln(T(r, 4, 8), T(r, 8), T(r, 1, 8)))
    add("layer_norm", "same_dim(0, -1, 2, 0)", lambda r: _ln(T(r, 4, 8), T(r, 8), T(r, 6)))

    # --- tpuk::rms_norm and its backward ---
    def rms(x, w):
        return tpuk("rms_norm"), (x, w), {"eps": 1e-6}

    add("rms_norm", "dtypes", lambda r: rms(T(r, 4, 8, dtype=F64), T(r, 8, dtype=F64)))
    add("rms_norm", "same_dtype()", lambda r: rms(T(r, 4, 8), T(r, 8, dtype=BF16)))
    add("rms_norm", f"rank(0, 1, {USIZE_MAX})", lambda r: rms(T(r), T(r, 1)))
    add("rms_norm", "rank(1, 1, 1)", lambda r: rms(T(r, 4, 8), T(r, 1, 8)))
    add("rms_norm", "same_dim(0, -1, 1, 0)", lambda r: rms(T(r, 4, 8), T(r, 6)))

    def rms_bwd(g, x, w):
        return tpuk("rms_norm_backward"), (g, x, w), {"eps": 1e-6}

    add("rms_norm_backward", "dtypes", lambda r: rms_bwd(*(T(r, *s, dtype=F64) for s in [(4, 8), (4, 8), (8,)])))
    add("rms_norm_backward", "same_dtype()", lambda r: rms_bwd(T(r, 4, 8), T(r, 4, 8), T(r, 8, dtype=BF16)))
    add("rms_norm_backward", f"rank(0, 1, {USIZE_MAX})", lambda r: rms_bwd(T(r), T(r, 4, 8), T(r, 8)))
    add("rms_norm_backward", f"rank(1, 1, {USIZE_MAX})", lambda r: rms_bwd(T(r, 4, 8), T(r), T(r, 8)))
    add("rms_norm_backward", "same_dim(0, -1, 1, -1)", lambda r: rms_bwd(T(r, 4, 8), T(r, 4, 6), T(r, 8)))
    add("rms_norm_backward", "rank(2, 1, 1)", lambda r: rms_bwd(T(r, 4, 8), T(r, 4, 8), T(r, 1, 8)))
    add("rms_norm_backward", "same_dim(0, -1, 2, 0)", lambda r: rms_bwd(T(r, 4, 8), T(r, 4, 8), T(r, 6)))

    # --- tpuk::matmul_bias_act: x [M, K] @ weight [K, N] + bias [N] ---
    def mba(x, w, b):
        return tpuk("matmul_bias_act"), (x, w, b), {"activation": "relu"}

    add("matmul_bias_act", "dtypes", lambda r: mba(T(r, 4, 8, dtype=F64), T(r, 8, 3, dtype=F64), T(r, 3, dtype=F64)))
    add("matmul_bias_act", "same_dtype()", lambda r: mba(T(r, 4, 8), T(r, 8, 3, dtype=BF16), T(r, 3, dtype=BF16)))
    add("matmul_bias_act", "rank(0, 2, 2)", lambda r: mba(T(r, 2, 4, 8), T(r, 8, 3), T(r, 3)))
    add("matmul_bias_act", "rank(1, 2, 2)", lambda r: mba(T(r, 4, 8), T(r, 8, 3, 1), T(r, 3)))
    add("matmul_bias_act", "same_dim(0, 1, 1, 0)", lambda r: mba(T(r, 4, 8), T(r, 6, 3), T(r, 3)))
    add("matmul_bias_act", "rank(2, 1, 1)", lambda r: mba(T(r, 4, 8), T(r, 8, 3), T(r, 1, 3)))
    add("matmul_bias_act", "same_dim(1, 1, 2, 0)", lambda r: mba(T(r, 4, 8), T(r, 8, 3), T(r, 4)))

    # --- tpuk::matmul_act: x [M, K] @ weight [K, N] ---
    def mact(x, w):
        return tpuk("matmul_act"), (x, w), {"activation": "silu"}

    add("matmul_act", "dtypes", lambda r: mact(T(r, 4, 8, dtype=F64), T(r, 8, 3, dtype=F64)))
    add("matmul_act", "same_dtype()", lambda r: mact(T(r, 4, 8), T(r, 8, 3, dtype=BF16)))
    add("matmul_act", "rank(0, 2, 2)", lambda r: mact(T(r, 2, 4, 8), T(r, 8, 3)))
    add("matmul_act", "rank(1, 2, 2)", lambda r: mact(T(r, 4, 8), T(r, 8, 3, 1)))
    add("matmul_act", "same_dim(0, 1, 1, 0)", lambda r: mact(T(r, 4, 8), T(r, 6, 3)))

    # --- tpuk::swiglu and its backward: tensors of one shape ---
    def swi(gate, up):
        return tpuk("swiglu"), (gate, up), {}

    add("swiglu", "dtypes", lambda r: swi(T(r, 4, 8, dtype=F64), T(r, 4, 8, dtype=F64)))
    add("swiglu", "same_dtype()", lambda r: swi(T(r, 4, 8), T(r, 4, 8, dtype=F16)))
    add("swiglu", f"rank(0, 1, {USIZE_MAX})", lambda r: swi(T(r), T(r, 4)))
    add("swiglu", f"rank(1, 1, {USIZE_MAX})", lambda r: swi(T(r, 4), T(r)))
    add("swiglu", "same_dim(0, -1, 1, -1)", lambda r: swi(T(r, 4, 8), T(r, 4, 6)))

    def swi_bwd(g, gate, up):
        return tpuk("swiglu_backward"), (g, gate, up), {}

    add("swiglu_backward", "dtypes", lambda r: swi_bwd(*(T(r, 4, 8, dtype=F64) for _ in range(3))))
    add("swiglu_backward", "same_dtype()", lambda r: swi_bwd(T(r, 4, 8), T(r, 4, 8), T(r, 4, 8, dtype=BF16)))
    add("swiglu_backward", f"rank(0, 1, {USIZE_MAX})", lambda r: swi_bwd(T(r), T(r, 4), T(r, 4)))
    add("swiglu_backward", f"rank(1, 1, {USIZE_MAX})", lambda r: swi_bwd(T(r, 4), T(r), T(r, 4)))
    add("swiglu_backward", "same_dim(0, -1, 1, -1)", lambda r: swi_bwd(T(r, 4, 8), T(r, 4, 6), T(r, 4, 8)))
    add("swiglu_backward", f"rank(2, 1, {USIZE_MAX})", lambda r: swi_bwd(T(r, 4), T(r, 4), T(r)))
    add("swiglu_backward", "same_dim(0, -1, 2, -1)", lambda r: swi_bwd(T(r, 4, 8), T(r, 4, 8), T(r, 4, 6)))

    # --- tpuk::cross_entropy and its backward: logits [N, C], target i64[N] ---
    def ce(logits, target):
        return tpuk("cross_entropy"), (logits, target), {}

    add("cross_entropy", "dtypes", lambda r: ce(T(r, 4, 8, dtype=F64), T(r, 4, dtype=I64)))
    add("cross_entropy", "rank(0, 2, 2)", lambda r: ce(T(r, 2, 4, 8), T(r, 2, dtype=I64)))
    add("cross_entropy", "dtype_is(1, i64)", lambda r: ce(T(r, 4, 8), T(r, 4, dtype=I32)))
    add("cross_entropy", "rank(1, 1, 1)", lambda r: ce(T(r, 4, 8), T(r, 4, 1, dtype=I64)))
    add("cross_entropy", "same_dim(0, 0, 1, 0)", lambda r: ce(T(r, 4, 8), T(r, 3, dtype=I64)))

    def ce_bwd(grad, logits, target):
        return tpuk("cross_entropy_backward"), (grad, logits, target), {}

    add(
        "cross_entropy_backward",
        "dtypes",
        lambda r: ce_bwd(T(r, dtype=F64), T(r, 4, 8, dtype=F64), T(r, 4, dtype=I64)),
    )
    add("cross_entropy_backward", "rank(1, 2, 2)", lambda r: ce_bwd(T(r), T(r, 2, 4, 8), T(r, 2, dtype=I64)))
    add("cross_entropy_backward", "dtype_is(2, i64)", lambda r: ce_bwd(T(r), T(r, 4, 8), T(r, 4, dtype=I32)))
    add("cross_entropy_backward", "rank(2, 1, 1)", lambda r: ce_bwd(T(r), T(r, 4, 8), T(r, 4, 1, dtype=I64)))
    add("cross_entropy_backward", "same_dim(1, 0, 2, 0)", lambda r: ce_bwd(T(r), T(r, 4, 8), T(r, 3, dtype=I64)))

    # --- tpuk::rotary: x [B, S, H, D], cos and sin [S, D/2], D even ---
    def rot(x, cos, sin):
        return tpuk("rotary"), (x, cos, sin), {}

    add("rotary", "dtypes", lambda r: rot(T(r, 1, 4, 2, 8, dtype=F64), T(r, 4, 4, dtype=F64), T(r, 4, 4, dtype=F64)))
    add("rotary", "same_dtype()", lambda r: rot(T(r, 1, 4, 2, 8), T(r, 4, 4, dtype=BF16), T(r, 4, 4, dtype=BF16)))
    add("rotary", "rank(0, 4, 4)", lambda r: rot(T(r, 4, 2, 8), T(r, 4, 4), T(r, 4, 4)))
    add("rotary", "rank(1, 2, 2)", lambda r: rot(T(r, 1, 4, 2, 8), T(r, 4, 4, 1), T(r, 4, 4)))
    add("rotary", "same_dim(0, 1, 1, 0)", lambda r: rot(T(r, 1, 4, 2, 8), T(r, 3, 4), T(r, 4, 4)))
    add("rotary", "rank(2, 2, 2)", lambda r: rot(T(r, 1, 4, 2, 8), T(r, 4, 4), T(r, 4, 4, 1)))
    add("rotary", "same_dim(0, 1, 2, 0)", lambda r: rot(T(r, 1, 4, 2, 8), T(r, 4, 4), T(r, 3, 4)))
    add("rotary", "same_dim(1, 1, 2, 1)", lambda r: rot(T(r, 1, 4, 2, 8), T(r, 4, 4), T(r, 4, 3)))
    add("rotary", "divisible_by(0, 3, 2)", lambda r: rot(T(r, 1, 4, 2, 7), T(r, 4, 4), T(r, 4, 4)))

    # --- tpuk::dropout: x [..], seed i64[] ---
    def drop(x, seed):
        return tpuk("dropout"), (x, seed), {"p": 0.5}

    add("dropout", "dtypes", lambda r: drop(T(r, 4, 8, dtype=F64), T(r, dtype=I64)))
    add("dropout", "dtype_is(1, i64)", lambda r: drop(T(r, 4, 8), T(r, dtype=I32)))
    add("dropout", "rank(1, 0, 0)", lambda r: drop(T(r, 4, 8), T(r, 1, dtype=I64)))

    # --- tpuk::adamw_step: param, grad, exp_avg, exp_avg_sq [..], step f32[] ---
    def adamw(dtype=F32, step=None):
        def build(r):
            state = [T(r, 4, 8, dtype=dtype) for _ in range(4)]
            state[3] = state[3].abs()
            return tpuk("adamw_step"), (*state, step(r) if step else T(r).abs() + 1), {"lr": 1e-3}

        return build

    add("adamw_step", "dtypes", adamw(dtype=F64))
    add("adamw_step", "dtype_is(4, f32)", adamw(step=lambda r: torch.tensor(3.0, dtype=F64)))
    add("adamw_step", "rank(4, 0, 0)", adamw(step=lambda r: torch.tensor([3.0])))
    # --- the tiled kernels: the guards of their StableHLO counterparts, on the same ops (their
    # tile plans are not guards: a signature a plan refuses is declined, as the plan's own tests
    # in registry/tests/tiled_kernels.rs show) ---
    for tiled, plain in [("tiled_rms_norm", "rms_norm"), ("tiled_matmul_bias_act", "matmul_bias_act"),
                         ("tiled_matmul_act", "matmul_act")]:
        c.extend(Case(tiled, x.guard, x.build, x.taken_by, x.probe, x.unchecked_by_pytorch, x.selection_only)
                 for x in list(c) if x.kernel == plain)
    return c


# ----- kernels with long, regular guard lists: a valid base call, each guard violated by rule -----


@dataclass(frozen=True)
class Base:
    """A call the kernel accepts: its inputs' (dtype, shape), its statics, and the op call."""

    specs: tuple[tuple[torch.dtype, tuple[int, ...]], ...]
    call: Callable[[list[torch.Tensor], dict[str, Any]], tuple[Any, tuple, dict]]
    statics: dict[str, Any] = field(default_factory=dict)
    # False for PyTorch overloads that trust their inputs' shapes (autograd's internal backward
    # and attention overloads read out of bounds or corrupt the heap on inconsistent shapes).
    pytorch_checks_shapes: bool = True


def base_cases(kernel: str, base: Base, guards: list[str], **statics: Any) -> list[Case]:
    """One case per guard (and `dtypes`) of `kernel`, each `base` with that guard violated."""
    out = []
    for guard in ["dtypes", *guards]:
        shape_guard = _parse_guard(guard)[0] in ("rank", "same_dim", "dim_eq") if guard != "dtypes" else False
        unchecked = shape_guard and not base.pytorch_checks_shapes
        out.append(Case(kernel, guard, violate(base, guard, **statics), unchecked_by_pytorch=unchecked))
    return out


def violate(base: Base, guard: str, **statics: Any):
    """A builder of `base` with `guard` violated by the smallest change to one input: `dtypes`:
    float inputs in f64; `rank(i, lo, hi)`: input i one dimension short of `lo` (or past `hi`);
    `same_dim(a, da, b, db)`: input b's dim db one larger; `dim_eq(i, d, n)`: that dim n + 1;
    `dtype_is(i, d)`: input i in another type; `same_dtype()`: the last input in another type;
    `static_eq`: the value given in `statics`. The selection test checks the result violates
    exactly that guard (the first failing guard is the reason)."""
    specs = [list(s) for s in base.specs]
    if guard == "dtypes":
        specs = [[F64 if dt.is_floating_point else dt, sh] for dt, sh in specs]
    else:
        kind, a = _parse_guard(guard)
        if kind == "rank":
            i, lo, hi = int(a[0]), int(a[1]), int(a[2])
            shape = specs[i][1]
            want = lo - 1 if lo > 0 else hi + 1
            # Drop leading dimensions, or add leading 1s: negative dim indices keep their meaning.
            specs[i][1] = shape[len(shape) - want :] if want <= len(shape) else (1,) * (want - len(shape)) + shape
        elif kind == "same_dim":
            i, d = int(a[2]), int(a[3])
            shape = list(specs[i][1])
            shape[d] += 1
            specs[i][1] = tuple(shape)
        elif kind == "dim_eq":
            i, d, size = int(a[0]), int(a[1]), int(a[2])
            shape = list(specs[i][1])
            shape[d] = size + 1
            specs[i][1] = tuple(shape)
        elif kind == "dtype_is":
            specs[int(a[0])][0] = F32 if a[1] != "f32" else F64
        elif kind == "same_dtype":
            specs[-1][0] = BF16 if specs[0][0] != BF16 else F32
        elif kind == "static_eq":
            assert a[0] in statics, f"violate({guard}): give the violating value as `{a[0]}=`"
        else:
            raise AssertionError(f"violate: no rule for `{guard}`; write the case's builder by hand")
    merged = {**base.statics, **statics}

    def build(r):
        return base.call([T(r, *sh, dtype=dt) for dt, sh in specs], merged)

    return build


def _attention_cases() -> list[Case]:
    # query [B, H, L, E] = [1, 2, 3, 4]; key and value [B, G, S, E] = [1, 2, 5, 4].
    q, kv, mask, lse = (F32, (1, 2, 3, 4)), (F32, (1, 2, 5, 4)), (F32, (1, 1, 3, 5)), (F32, (1, 2, 3))
    sdpa = A._scaled_dot_product_flash_attention_for_cpu.default
    sdpa_bwd = A._scaled_dot_product_flash_attention_for_cpu_backward.default

    def fwd(t, st):
        return sdpa, (*t[:3], st["dropout_p"], False), {"attn_mask": t[3]} if len(t) > 3 else {}

    def bwd(t, st):
        return sdpa_bwd, (*t[:6], st["dropout_p"], False), {"attn_mask": t[6]} if len(t) > 6 else {}

    unchecked = {"statics": {"dropout_p": 0.0}, "pytorch_checks_shapes": False}
    bases = {
        "sdpa_flash_cpu": Base((q, kv, kv), fwd, **unchecked),
        "sdpa_flash_cpu_masked": Base((q, kv, kv, mask), fwd, **unchecked),
        "sdpa_flash_cpu_backward": Base((q, q, kv, kv, q, lse), bwd, **unchecked),
        "sdpa_flash_cpu_masked_backward": Base((q, q, kv, kv, q, lse, mask), bwd, **unchecked),
        "attention": Base((q, kv, kv, mask), lambda t, st: (tpuk("attention"), tuple(t), {"is_causal": False})),
        "attention_backward": Base(
            (q, q, kv, kv, mask), lambda t, st: (tpuk("attention_backward"), tuple(t), {"is_causal": False})
        ),
    }
    # query, key, value: ranks, then key and value against query, then value against key.
    forward = [
        "rank(0, 4, 4)",
        "rank(1, 4, 4)",
        "same_dim(0, 0, 1, 0)",
        "same_dim(0, 3, 1, 3)",
        "rank(2, 4, 4)",
        "same_dim(0, 0, 2, 0)",
        "same_dim(1, 1, 2, 1)",
        "same_dim(1, 2, 2, 2)",
        "same_dim(0, 3, 2, 3)",
    ]
    # grad, query, key, value (, out, logsumexp): query and out against grad, key and value.
    backward = [
        "rank(0, 4, 4)",
        "rank(1, 4, 4)",
        "same_dim(0, 0, 1, 0)",
        "same_dim(0, 1, 1, 1)",
        "same_dim(0, 2, 1, 2)",
        "same_dim(0, 3, 1, 3)",
        "rank(2, 4, 4)",
        "same_dim(0, 0, 2, 0)",
        "same_dim(0, 3, 2, 3)",
        "rank(3, 4, 4)",
        "same_dim(0, 0, 3, 0)",
        "same_dim(2, 1, 3, 1)",
        "same_dim(2, 2, 3, 2)",
        "same_dim(0, 3, 3, 3)",
    ]
    saved = [
        "rank(4, 4, 4)",
        "same_dim(0, 0, 4, 0)",
        "same_dim(0, 1, 4, 1)",
        "same_dim(0, 2, 4, 2)",
        "same_dim(0, 3, 4, 3)",
        "dtype_is(5, f32)",
        "rank(5, 3, 3)",
        "same_dim(0, 0, 5, 0)",
        "same_dim(0, 1, 5, 1)",
        "same_dim(0, 2, 5, 2)",
    ]
    guards = {
        "sdpa_flash_cpu": forward,
        "sdpa_flash_cpu_masked": forward,
        "sdpa_flash_cpu_backward": backward + saved,
        "sdpa_flash_cpu_masked_backward": backward + saved,
        "attention": forward,
        "attention_backward": backward,
    }
    c = []
    for kernel, base in bases.items():
        c += base_cases(kernel, base, guards[kernel])
        if kernel.startswith("sdpa"):
            guard = "static_eq(dropout_p, 0e0)"
            c.append(Case(kernel, guard, violate(base, guard, dropout_p=0.1)))
    return c


def _backward_cases() -> list[Case]:
    """The ATen backward overloads of softmax, log-softmax and layer norm."""
    c = []
    for kernel, op in [
        ("softmax_backward", A._softmax_backward_data.default),
        ("log_softmax_backward", A._log_softmax_backward_data.default),
    ]:
        base = Base(((F32, (4, 8)), (F32, (4, 8))), lambda t, st, op=op: (op, (*t, -1, t[1].dtype), {}))
        c += base_cases(kernel, base, ["same_dtype()"])

    def ln_bwd(t, st):
        grad, x, mean, rstd, w, b = t
        return A.native_layer_norm_backward.default, (grad, x, list(w.shape), mean, rstd, w, b, [True] * 3), {}

    # grad_out, input [N, D] = [4, 8]; mean, rstd [4, 1]; weight, bias [8].
    specs = ((F32, (4, 8)), (F32, (4, 8)), (F32, (4, 1)), (F32, (4, 1)), (F32, (8,)), (F32, (8,)))
    base = Base(specs, ln_bwd, pytorch_checks_shapes=False)
    guards = [
        "same_dtype()",
        f"rank(0, 1, {USIZE_MAX})",
        f"rank(1, 1, {USIZE_MAX})",
        "same_dim(0, -1, 1, -1)",
        f"rank(2, 1, {USIZE_MAX})",
        "dim_eq(2, -1, 1)",
        f"rank(3, 1, {USIZE_MAX})",
        "dim_eq(3, -1, 1)",
        "rank(4, 1, 1)",
        "same_dim(0, -1, 4, 0)",
        "rank(5, 1, 1)",
        "same_dim(0, -1, 5, 0)",
    ]
    return c + base_cases("layer_norm_backward", base, guards)


def _tiled_guard_cases(plain_cases: list[Case]) -> list[Case]:
    """The newer tiled kernels: each plain sibling's case whose guard the tiled kernel has too
    (the same violation is the tiled kernel's first failing guard), and by hand the guards only
    the tiled kernel has, each case breaking as well a guard of the plain kernel that the tiled
    kernel checks later, so that no kernel takes the call."""
    siblings = {
        "tiled_layer_norm": "layer_norm",
        "tiled_layer_norm_backward": "layer_norm_backward",
        "tiled_rms_norm_backward": "rms_norm_backward",
        "tiled_sdpa_flash": "sdpa_flash_cpu",
        "tiled_sdpa_flash_backward": "sdpa_flash_cpu_backward",
        "tiled_sdpa_flash_masked": "sdpa_flash_cpu_masked",
        "tiled_sdpa_flash_masked_4d": "sdpa_flash_cpu_masked",
        "tiled_attention_4d": "attention",
        "tiled_softmax_backward": "softmax_backward",
        "tiled_log_softmax_backward": "log_softmax_backward",
        "tiled_cross_entropy": "cross_entropy",
        "tiled_cross_entropy_backward": "cross_entropy_backward",
    }
    guards = {k["name"]: set(k["guards"]) | {"dtypes"} for k in tk.kernels()}
    c = [
        Case(tiled, x.guard, x.build, x.taken_by, x.probe, x.unchecked_by_pytorch, x.selection_only)
        for tiled, plain in siblings.items()
        for x in plain_cases
        if x.kernel == plain and x.guard in guards[tiled]
        # The plain masked kernel's dropout case has a 4-d mask, which the tiled one refuses
        # first: its own case is below.
        and (tiled, x.guard) != ("tiled_sdpa_flash_masked", "static_eq(dropout_p, 0e0)")
    ]
    # softmax, log_softmax over the last dim only (`dim = -1`), rank >= 1. The plain kernel takes
    # a call that breaks only these (and cannot build a scalar's), so each case also asks for
    # `half_to_float`, which the plain kernel refuses and the tiled one checks after them.
    for kernel, op in [("tiled_softmax", A._softmax.default), ("tiled_log_softmax", A._log_softmax.default)]:
        c.append(Case(kernel, "dtypes", lambda r, op=op: (op, (T(r, 4, 8, dtype=F64), -1, False), {})))
        c.append(Case(kernel, f"rank(0, 1, {USIZE_MAX})", lambda r, op=op: (op, (T(r), -1, True), {})))
        c.append(Case(kernel, "static_eq(dim, -1)", lambda r, op=op: (op, (T(r, 4, 8), 0, True), {})))
        c.append(Case(kernel, "static_eq(half_to_float, false)", lambda r, op=op: (op, (T(r, 4, 8), -1, True), {})))
    # The softmax backwards over the last dim only: the StableHLO kernels take any dim and
    # shape, so they take each of these calls (`taken_by`), and the selection test reads the
    # tiled kernel's own verdict (`tk.explain`).
    for kernel, plain, op in [
        ("tiled_softmax_backward", "softmax_backward", A._softmax_backward_data.default),
        ("tiled_log_softmax_backward", "log_softmax_backward", A._log_softmax_backward_data.default),
    ]:
        def sm_bwd(r, op=op, shapes=((4, 8), (4, 8)), dim=-1):
            return op, (T(r, *shapes[0]), T(r, *shapes[1]), dim, F32), {}

        for guard, kw, only in [
            (f"rank(0, 1, {USIZE_MAX})", {"shapes": ((), ())}, False),
            (f"rank(1, 1, {USIZE_MAX})", {"shapes": ((4, 8), ())}, True),
            ("same_dim(0, -1, 1, -1)", {"shapes": ((4, 8), (2, 16))}, True),
            ("static_eq(dim, -1)", {"shapes": ((4, 8), (4, 8)), "dim": 0}, False),
        ]:
            c.append(Case(kernel, guard, lambda r, kw=kw, f=sm_bwd: f(r, **kw), taken_by=plain,
                          selection_only=only))
    # The flash forward's one-dtype guard (the StableHLO kernel checks it in its body): with
    # dropout asked for as well, which the plain kernel refuses and the tiled one checks last.
    sdpa = A._scaled_dot_product_flash_attention_for_cpu.default
    c.append(Case("tiled_sdpa_flash", "same_dtype()",
                  lambda r: (sdpa, (T(r, 1, 2, 3, 4), T(r, 1, 2, 5, 4), T(r, 1, 2, 5, 4, dtype=BF16), 0.1, False), {})))

    # The masked forwards' masks: of rank 2 `[ML, S]` or of rank 4 `[MB, MH, ML, S]`, with the
    # keys' length last (the StableHLO kernels take any broadcastable mask); dropout is asked
    # for as well, which the plain kernel refuses and the tiled ones check last.
    def masked(r, mask_shape=(3, 5), dtype=F32, op=sdpa):
        q, kv = T(r, 1, 2, 3, 4), T(r, 1, 2, 5, 4)
        if op is not sdpa:
            return op, (q, kv, kv, T(r, *mask_shape, dtype=dtype)), {}
        return sdpa, (q, kv, kv, 0.1, False), {"attn_mask": T(r, *mask_shape, dtype=dtype)}

    c.append(Case("tiled_sdpa_flash_masked", "static_eq(dropout_p, 0e0)", masked))
    for kernel, guard, shape in [
        ("tiled_sdpa_flash_masked", "rank(3, 2, 2)", (1, 3, 5)),
        ("tiled_sdpa_flash_masked", "same_dim(1, 2, 3, 1)", (3, 6)),
        ("tiled_sdpa_flash_masked_4d", "rank(3, 4, 4)", (1, 3, 5)),
        ("tiled_sdpa_flash_masked_4d", "same_dim(1, 2, 3, 3)", (1, 1, 3, 6)),
    ]:
        c.append(Case(kernel, guard, lambda r, shape=shape: masked(r, shape), unchecked_by_pytorch=True))
    # `tpuk::attention`'s mask: the StableHLO kernel takes a valid rank-3 mask; a mask whose
    # last dim is not the keys' length is no valid call (selection only).
    attention = tpuk("attention")
    c.append(Case("tiled_attention_4d", "rank(3, 4, 4)", lambda r: masked(r, (1, 3, 5), op=attention),
                  taken_by="attention"))
    c.append(Case("tiled_attention_4d", "same_dim(1, 2, 3, 3)", lambda r: masked(r, (1, 1, 3, 6), op=attention),
                  taken_by="attention", selection_only=True))
    return c


_PLAIN = _kernel_cases() + _attention_cases() + _backward_cases()
CASES = _PLAIN + _tiled_guard_cases(_PLAIN)
# The cases the dispatch modes run (strict, debug, fused).
MODE_CASES = [c for c in CASES if not c.selection_only]


@dataclass(frozen=True)
class BodyCase:
    """A call every guard admits that the kernel's body refuses when it builds."""

    kernel: str
    what: str
    build: Callable[[Callable[..., torch.Tensor]], tuple[Any, tuple, dict]]
    # The build error's text (a regex), which the fallback reason must contain.
    message: str
    bug: str | None = None  # set: the kernel computes instead of refusing (a strict xfail)
    unchecked_by_pytorch: bool = False  # as `Case.unchecked_by_pytorch`

    @property
    def id(self) -> str:
        return f"{self.kernel}-{re.sub(r'[^0-9a-z]+', '_', self.what).strip('_')}"


BODY_CASES = [
    BodyCase(
        "softmax",
        "dim out of range",
        lambda r: (A._softmax.default, (T(r, 4, 8), 5, False), {}),
        r"axis 5 out of range",
    ),
    BodyCase(
        "matmul_bias_act",
        "unknown activation",
        lambda r: (tpuk("matmul_bias_act"), (T(r, 4, 8), T(r, 8, 3), T(r, 3)), {"activation": "tanh"}),
        r"unknown activation `tanh`",
    ),
    BodyCase(
        "matmul_act",
        "unknown activation",
        lambda r: (tpuk("matmul_act"), (T(r, 4, 8), T(r, 8, 3)), {"activation": "tanh"}),
        r"unknown activation `tanh`",
    ),
    BodyCase(
        "swiglu",
        "leading dims differ",
        lambda r: (tpuk("swiglu"), (T(r, 4, 8), T(r, 2, 8)), {}),
        r"gate tensor<4x8xf32> and up tensor<2x8xf32> differ in shape",
    ),
    BodyCase(
        "swiglu",
        "ranks differ",
        lambda r: (tpuk("swiglu"), (T(r, 4, 8), T(r, 8)), {}),
        r"differ in shape",
    ),
    BodyCase(
        "swiglu_backward",
        "leading dims differ",
        lambda r: (tpuk("swiglu_backward"), (T(r, 4, 8), T(r, 4, 8), T(r, 2, 8)), {}),
        r"differ in shape",
    ),
    BodyCase(
        "rms_norm_backward",
        "grad and x differ in leading dims",
        lambda r: (tpuk("rms_norm_backward"), (T(r, 4, 8), T(r, 2, 8), T(r, 8)), {"eps": 1e-6}),
        r"differ in shape",
    ),
    BodyCase(
        "rms_norm_backward",
        "grad [1, D] against x [N, D]",
        lambda r: (tpuk("rms_norm_backward"), (T(r, 1, 8), T(r, 4, 8), T(r, 8)), {"eps": 1e-6}),
        r"differ in shape",
    ),
    BodyCase(
        "rms_norm_backward",
        "x [1, D] against grad [N, D]",
        lambda r: (tpuk("rms_norm_backward"), (T(r, 4, 8), T(r, 1, 8), T(r, 8)), {"eps": 1e-6}),
        r"differ in shape",
    ),
    BodyCase(
        "rms_norm_backward",
        "grad has an extra leading dim",
        lambda r: (tpuk("rms_norm_backward"), (T(r, 2, 4, 8), T(r, 4, 8), T(r, 8)), {"eps": 1e-6}),
        r"differ in shape",
    ),
    BodyCase(
        "rotary",
        "cos/sin not half as wide as x",
        lambda r: (tpuk("rotary"), (T(r, 1, 4, 2, 8), T(r, 4, 3), T(r, 4, 3)), {}),
        r"must be half as wide as x",
    ),
    BodyCase(
        "cross_entropy_backward",
        "grad not one element",
        lambda r: (tpuk("cross_entropy_backward"), (T(r, 4), T(r, 4, 8), T(r, 4, dtype=I64)), {}),
        r"not the gradient of a scalar",
    ),
    BodyCase(
        "cross_entropy_backward",
        "grad and logits differ in dtype",
        lambda r: (tpuk("cross_entropy_backward"), (T(r), T(r, 4, 8, dtype=BF16), T(r, 4, dtype=I64)), {}),
        r"differ in element type",
    ),
    BodyCase(
        "adamw_step",
        "state dtypes differ",
        lambda r: (tpuk("adamw_step"), (T(r, 4), T(r, 4), T(r, 4, dtype=BF16), T(r, 4).abs(), torch.tensor(1.0)), {}),
        r"exp_avg tensor<4xbf16> and param tensor<4xf32> differ in element type",
    ),
    BodyCase(
        "adamw_step",
        "state shapes differ",
        lambda r: (tpuk("adamw_step"), (T(r, 4), T(r, 5), T(r, 4), T(r, 4).abs(), torch.tensor(1.0)), {}),
        r"grad tensor<5xf32> and param tensor<4xf32> differ in shape",
    ),
    BodyCase(
        "attention",
        "query heads not a multiple of key heads",
        lambda r: (tpuk("attention"), (T(r, 1, 3, 3, 4), T(r, 1, 2, 5, 4), T(r, 1, 2, 5, 4), T(r, 1, 1, 3, 5)), {}),
        r"query has 3 heads, not a multiple of key/value's 2",
    ),
    BodyCase(
        "attention",
        "key and query differ in dtype",
        lambda r: (
            tpuk("attention"),
            (T(r, 1, 2, 3, 4), T(r, 1, 2, 5, 4, dtype=BF16), T(r, 1, 2, 5, 4, dtype=BF16), T(r, 1, 1, 3, 5)),
            {},
        ),
        r"differ in element type",
    ),
    BodyCase(
        "attention",
        "mask does not broadcast to the scores",
        lambda r: (tpuk("attention"), (T(r, 1, 2, 3, 4), T(r, 1, 2, 5, 4), T(r, 1, 2, 5, 4), T(r, 1, 1, 3, 4)), {}),
        r"does not broadcast to the scores' shape \[1, 2, 3, 5\]",
    ),
    BodyCase(
        "attention",
        "integer mask",
        lambda r: (
            tpuk("attention"),
            (T(r, 1, 2, 3, 4), T(r, 1, 2, 5, 4), T(r, 1, 2, 5, 4), T(r, 1, 1, 3, 5, dtype=I32)),
            {},
        ),
        r"mask tensor<1x1x3x5xi32> must be",
    ),
    BodyCase(
        "attention",
        "negative scale",
        lambda r: (
            tpuk("attention"),
            (T(r, 1, 2, 3, 4), T(r, 1, 2, 5, 4), T(r, 1, 2, 5, 4), T(r, 1, 1, 3, 5)),
            {"scale": -1.0},
        ),
        r"scale = -1 ",
    ),
    BodyCase(
        "softmax_backward",
        "input_dtype of a half_to_float forward",
        lambda r: (A._softmax_backward_data.default, (T(r, 4, 8), T(r, 4, 8), -1, F16), {}),
        r"input_dtype float16 differs from the output's float32",
    ),
    BodyCase(
        "log_softmax_backward",
        "input_dtype of a half_to_float forward",
        lambda r: (A._log_softmax_backward_data.default, (T(r, 4, 8), T(r, 4, 8), -1, F16), {}),
        r"input_dtype float16 differs from the output's float32",
    ),
    BodyCase(
        "layer_norm_backward",
        "mean has other rows than input",
        lambda r: (
            A.native_layer_norm_backward.default,
            (T(r, 4, 8), T(r, 4, 8), [8], T(r, 2, 1), T(r, 4, 1), T(r, 8), T(r, 8), [True] * 3),
            {},
        ),
        r"mean tensor<2x1xf32> does not match input tensor<4x8xf32>",
        unchecked_by_pytorch=True,
    ),
    BodyCase(
        "dropout",
        "p above 1",
        lambda r: (tpuk("dropout"), (T(r, 4), torch.tensor(3)), {"p": 1.5}),
        r"p = 1.5 is not a probability",
    ),
]

# ----- helpers -----


def _new(seed_text: str) -> Callable[..., torch.Tensor]:
    gen = torch.Generator().manual_seed(zlib.crc32(seed_text.encode()))

    def new(shape, dtype):
        if dtype.is_floating_point:
            return torch.randn(shape, generator=gen, dtype=dtype)
        return torch.randint(0, 4, shape, generator=gen, dtype=dtype)

    return new


def _build(case) -> tuple[Any, tuple, dict]:
    return case.build(_new(case.id))


def _clone(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _standard() -> dict[str, dict]:
    return {k["name"]: k for k in tk.kernels() if not k["runtime"]}


def _selection(op, args, kwargs) -> tuple[str, str, dict, list[bool]]:
    """(op key, input signature, statics, contiguity) as the dispatch mode binds the call."""
    TABLE.refresh()
    plan = TABLE.plan(op, mutable=True)
    assert plan is not None, f"no kernel binds {op_key(op)}"
    bound = plan.bind(args, kwargs)
    assert not isinstance(bound, str), bound
    tensors, statics = bound
    sig = ", ".join(f"{SHORT[t.dtype]}[{','.join(map(str, t.shape))}]" for t in tensors)
    return plan.key, sig, dict(statics), [t.is_contiguous() for t in tensors]


def unviolable(guard: str) -> bool:
    """A guard no input can violate: `rank(i, 0, usize::MAX)`, from a `[..]` shape."""
    if guard == "dtypes":
        return False
    kind, args = _parse_guard(guard)
    return kind == "rank" and args[1] == "0" and int(args[2]) == USIZE_MAX


def expected_reason(info: dict, guard: str) -> str:
    """The registry's rejection reason for `guard` (a regex), as `Guard::check` words it."""
    if guard == "dtypes":
        return rf"dtype \w+ not in \[{re.escape(', '.join(info['dtypes']))}\]"
    kind, a = _parse_guard(guard)
    if kind == "static_eq":
        return rf"static `{a[0]}` is \S+, kernel needs {re.escape(a[1])}"
    if kind == "rank":
        lo, hi = a[1], a[2]
        needs = f"at least {lo}" if hi == str(2**64 - 1) else lo if hi == lo else rf"{lo}\.\.={hi}"
        return rf"input {a[0]} \S+ has rank \d+, kernel needs {needs}"
    if kind == "same_dim":
        return rf"input {a[0]} dim {a[1]} \(\d+\) != input {a[2]} dim {a[3]} \(\d+\)"
    if kind == "same_dtype":
        return r"inputs mix \w+ and \w+"
    if kind == "dtype_is":
        return rf"input {a[0]} is \w+, kernel needs {a[1]}"
    if kind == "divisible_by":
        return rf"input {a[0]} dim {a[1]} is not a multiple of {a[2]}"
    if kind == "dim_eq":
        return rf"input {a[0]} dim {a[1]} is not {a[2]}"
    raise AssertionError(f"guard kind `{kind}` ({guard}) has no expected reason in test_guards.py")


def _kernel_reason(message: str, kernel: str) -> str:
    """The reason a `NoKernelError` (or fallback) message gives for `kernel`."""
    m = re.search(rf"`{re.escape(kernel)}`: (.*?);(?= `[\w.]+`: |\s*$)", message)
    assert m, f"no reason for `{kernel}` in: {message}"
    return m.group(1)


def _outcome(fn):
    """('ok', value) or ('raised', exception)."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001 (compared with PyTorch's own outcome)
        return "raised", e


def _assert_same_outcome(got, expected, exact: bool = True) -> None:
    assert got[0] == expected[0], f"substituted: {got}, eager: {expected}"
    if got[0] == "raised":
        assert type(got[1]) is type(expected[1]) and str(got[1]) == str(expected[1]), (got[1], expected[1])
        return
    g, e = got[1], expected[1]
    g, e = (list(g), list(e)) if isinstance(e, (tuple, list)) else ([g], [e])
    for a, b in zip(g, e, strict=True):
        if exact:
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(a, b, equal_nan=True)


class _PyTorchStub(TorchDispatchMode):
    """Entered below a substitution mode: takes the calls of `op` that the mode hands back to
    PyTorch, counts them and answers with an empty tensor instead of running PyTorch's kernel."""

    def __init__(self, op) -> None:
        super().__init__()
        self.op = op
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is self.op:
            self.calls += 1
            n = len(func._schema.returns)
            return torch.empty(0) if n == 1 else tuple(torch.empty(0) for _ in range(n))
        return func(*args, **(kwargs or {}))


def _params(cases):
    return [pytest.param(c, id=c.id) for c in cases]


# ----- the table against the registry -----


def test_every_guard_has_a_case():
    covered = {(c.kernel, c.guard) for c in CASES}
    missing = [
        f"{name}: {guard}"
        for name, info in sorted(_standard().items())
        for guard in ["dtypes", *info["guards"]]
        if (name, guard) not in covered and not unviolable(guard)
    ]
    assert not missing, (
        "guards without a case in python/tests/test_guards.py (add one to `_kernel_cases`: inputs that "
        "violate the guard and meet every guard before it, and the op call):\n  " + "\n  ".join(missing)
    )


def test_every_case_names_a_live_guard():
    kernels = _standard()
    stale = [
        f"{c.kernel}: {c.guard}"
        for c in CASES
        if c.kernel not in kernels or (c.guard != "dtypes" and c.guard not in kernels[c.kernel]["guards"])
    ]
    assert not stale, "cases for guards no standard kernel has (remove or update them):\n  " + "\n  ".join(stale)
    ids = [c.id for c in CASES] + [c.id for c in BODY_CASES]
    assert len(ids) == len(set(ids))


def _unviolable_guards():
    return [
        pytest.param(name, g, id=f"{name}-{g}")
        for name, info in sorted(_standard().items())
        for g in info["guards"]
        if unviolable(g)
    ]


@pytest.mark.parametrize(("kernel", "guard"), _unviolable_guards())
def test_unviolable_guards_admit_every_rank(kernel, guard):
    info = _standard()[kernel]
    op = info["ops"][0]
    i = int(_parse_guard(guard)[1][0])
    types = re.findall(r"(\w+)\[([^\]]*)\]", info["canonical"][0].split(";")[0])
    for dims in ["", "1,1,1,1,1"]:
        sig = ", ".join(f"{dt}[{dims if j == i else d}]" for j, (dt, d) in enumerate(types))
        # The kernel's own verdict: a sibling of higher priority may be the one selected.
        assert dict(tk.explain(op, sig))[kernel] is None, sig


# ----- per case: selection, strict, debug, fused -----


@pytest.mark.parametrize("case", _params(CASES))
def test_selection_rejects_with_the_guard_as_reason(case: Case):
    info = _standard()[case.kernel]
    op, args, kwargs = _build(case)
    key, sig, statics, contiguous = _selection(op, args, kwargs)
    assert key in info["ops"]
    if case.taken_by:
        assert tk.select(key, sig, statics, contiguous=contiguous) == case.taken_by
        if not case.probe:
            # No statics make the sibling refuse too: the kernel's own verdict, by name.
            verdicts = dict(tk.explain(key, sig, statics, contiguous=contiguous))
            reason = verdicts[case.kernel]
            assert reason is not None, f"`{case.kernel}` takes {sig} {statics}"
            assert re.fullmatch(expected_reason(info, case.guard), reason), (
                f"`{case.kernel}` rejects {sig} {statics} with `{reason}`, not by its guard `{case.guard}`"
            )
            return
        statics = {**statics, **case.probe}
    with pytest.raises(tk.NoKernelError) as e:
        tk.select(key, sig, statics, contiguous=contiguous)
    reason = _kernel_reason(str(e.value), case.kernel)
    assert re.fullmatch(expected_reason(info, case.guard), reason), (
        f"`{case.kernel}` rejects {sig} {statics} with `{reason}`, not by its guard `{case.guard}`"
    )


@pytest.mark.parametrize("case", _params(MODE_CASES))
def test_strict_falls_back_to_pytorch(case: Case):
    info = _standard()[case.kernel]
    op, args, kwargs = _build(case)
    key = op_key(op)
    if case.unchecked_by_pytorch:
        before, substituted = tkt.report().fallbacks(key), tkt.report().substituted(key)
        with _PyTorchStub(op) as stub, tkt.substitute("strict"):
            op(*_clone(args), **kwargs)
        assert stub.calls == 1, "strict mode did not hand the call back to PyTorch"
        expected = got = None
    else:
        # A new op (`tpuk::*`) reaches its kernels without substitution too: counted after it.
        expected = _outcome(lambda: op(*_clone(args), **kwargs))
        before, substituted = tkt.report().fallbacks(key), tkt.report().substituted(key)
        with tkt.substitute("strict"):
            got = _outcome(lambda: op(*_clone(args), **kwargs))
    r = tkt.report()
    if case.taken_by:
        assert r.substituted(key) == substituted + 1 and r.fallbacks(key) == before
        _assert_same_outcome(got, expected, exact=False)
        return
    assert r.fallbacks(key) > before, f"{key}: no fallback recorded"
    reason = _kernel_reason(r.ops[key]["last_fallback"], case.kernel)
    assert re.fullmatch(expected_reason(info, case.guard), reason), reason
    if case.unchecked_by_pytorch:
        return
    # An ATen op runs PyTorch's kernel, a new op its reference: the same either way.
    _assert_same_outcome(got, expected)
    if not key.startswith("aten::"):
        assert not (got[0] == "raised" and isinstance(got[1], KernelOpError)), got


@pytest.mark.parametrize("case", _params(MODE_CASES))
def test_debug_falls_back_with_the_guards_reason(case: Case):
    """Debug mode treats a call no kernel takes as strict mode does: PyTorch's result (or
    exception), the fallback counted with the guard's reason; then it checks the outputs."""
    info = _standard()[case.kernel]
    op, args, kwargs = _build(case)
    key = op_key(op)
    if case.unchecked_by_pytorch:
        # PyTorch does not check these inputs: a stub answers for its kernel.
        before = tkt.report().fallbacks(key)
        with _PyTorchStub(op) as stub, tkt.substitute("debug"):
            op(*_clone(args), **kwargs)
        assert stub.calls >= 1, "debug mode did not hand the call back to PyTorch"
        expected = got = None
    else:
        # A new op (`tpuk::*`) reaches its kernels without substitution too: counted after it.
        expected = _outcome(lambda: op(*_clone(args), **kwargs))
        before, substituted = tkt.report().fallbacks(key), tkt.report().substituted(key)
        with tkt.substitute("debug"):
            got = _outcome(lambda: op(*_clone(args), **kwargs))
        assert not (got[0] == "raised" and isinstance(got[1], SubstitutionError)), got
    r = tkt.report()
    if case.taken_by:
        assert r.fallbacks(key) == before
        if got is not None:
            assert r.substituted(key) == substituted + 1
            _assert_same_outcome(got, expected, exact=False)
        return
    assert r.fallbacks(key) > before, f"{key}: no fallback recorded under debug"
    reason = _kernel_reason(r.ops[key]["last_fallback"], case.kernel)
    assert re.fullmatch(expected_reason(info, case.guard), reason), reason
    if got is not None:
        _assert_same_outcome(got, expected)


def _fused_cases():
    out = []
    for c in MODE_CASES:
        op, args, kwargs = _build(c)
        if c.unchecked_by_pytorch:
            continue
        if op_key(op).startswith("aten::") and _outcome(lambda: op(*args, **kwargs))[0] == "ok":
            out.append(c)
    return out


@pytest.mark.parametrize("case", _params(_fused_cases()))
def test_fused_gives_pytorch_values(case: Case):
    op, args, kwargs = _build(case)
    expected = op(*_clone(args), **kwargs)
    with tkt.substitute("fused"):
        got = op(*_clone(args), **kwargs)
        got = [t.clone() for t in got] if isinstance(got, tuple) else got.clone()
    _assert_same_outcome(("ok", got), ("ok", expected), exact=False)


# ----- rejections the guards cannot express: the kernel's body refuses at build time -----


def _body_params():
    return [
        pytest.param(c, id=c.id, marks=pytest.mark.xfail(strict=True, reason=c.bug) if c.bug else ())
        for c in BODY_CASES
    ]


@pytest.mark.parametrize("case", _body_params())
def test_body_refuses_what_guards_admit(case: BodyCase):
    op, args, kwargs = _build(case)
    key, sig, statics, contiguous = _selection(op, args, kwargs)
    assert tk.select(key, sig, statics, contiguous=contiguous) == case.kernel, "a guard rejects it: make it a CASE"
    # A body's own refusal is `unsupported` (declined); a builder error the guards let through
    # (an axis out of range) is `build`, a kernel's failure: it falls back only under the
    # "fallback" error policy.
    def refusals(report):
        fallbacks = report.ops.get(key, {}).get("fallbacks", {})
        return fallbacks.get("build", 0) + fallbacks.get("unsupported", 0)

    builds = refusals(tkt.report())
    before = dict(tkt.report().ops.get(key, {}).get("fallbacks", {}))
    with error_policy("fallback"):
        if case.unchecked_by_pytorch:
            with _PyTorchStub(op) as stub, tkt.substitute("strict"):
                op(*_clone(args), **kwargs)
            assert stub.calls == 1, "strict mode did not hand the call back to PyTorch"
        else:
            expected = _outcome(lambda: op(*_clone(args), **kwargs))
            with tkt.substitute("strict"):
                got = _outcome(lambda: op(*_clone(args), **kwargs))
    r = tkt.report()
    assert refusals(r) > builds, f"`{case.kernel}` computed {sig} {statics} instead of refusing it"
    last = r.ops[key]["last_fallback"]
    assert f"from kernel `{case.kernel}`" in last and re.search(case.message, last), last
    if case.unchecked_by_pytorch:
        pass
    else:
        _assert_same_outcome(got, expected)
    grew = {c for c, n in r.ops[key]["fallbacks"].items() if n > before.get(c, 0)}
    if "build" in grew:
        # A kernel's failure: debug mode raises, naming the op and the kernel.
        debug = rf"{re.escape(key)} \(kernel {case.kernel}\): build: "
        with tkt.substitute("debug"), pytest.raises(SubstitutionError, match=debug):
            op(*_clone(args), **kwargs)
    elif not case.unchecked_by_pytorch:
        # The body's refusal is a decline: debug mode falls back as strict mode does.
        n = r.ops[key]["fallbacks"].get("unsupported", 0)
        with tkt.substitute("debug"):
            got = _outcome(lambda: op(*_clone(args), **kwargs))
        assert tkt.report().ops[key]["fallbacks"].get("unsupported", 0) > n
        _assert_same_outcome(got, expected)
