"""Numerics harness: every standard kernel x dtype x shape against a float64 reference.

Each case runs the kernel directly on torch tensors through a dispatcher that forbids fallbacks
(`tk.call(..., dispatcher=Dispatcher(no_fallback=True))`), so a call that falls back to PyTorch
raises instead of passing, and the dispatcher's stats must show the expected kernel ran. The
reference is the same PyTorch op evaluated in float64 on the upcast inputs;
`assert_close_to_reference` rounds it to the tested dtype and applies the one tolerance table,
`tpu_kernels.testing.TOLERANCES`, element by element. There is no other way to pass: PyTorch
eager in the tested dtype is measured against the same reference only to be shown beside the
kernel's error when a case fails.

Tiled (Mosaic) kernels run with tiled kernels forced (`tpu_kernels.testing.force_tiled`), so on
the CPU their twin runs (the stats must name the tiled kernel), and their printed Mosaic text also
runs through the interpreter (`_native.tiled_interpret`); both are held to the same reference.

Gradients: the autograd of `torch.ops.tpuk.rms_norm`, `swiglu` and `cross_entropy` (their paired
backward kernels) and the backward kernels called directly, against f64 autograd of the reference
formulas. Integer inputs (cross entropy's class indices) are passed as int64, not rounded.

`python python/tests/test_numerics.py` prints, per kernel x dtype, the largest error of the kernel
and of PyTorch eager against the f64 reference (`ratio` = largest |error| / (atol + rtol |ref|);
<= 1 passes). Inputs are seeded per case, so a run is deterministic.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tpu_kernels as tk  # noqa: E402
from tpu_kernels.torch._references import ACTIVATIONS  # noqa: E402
from tpu_kernels.testing import (  # noqa: E402
    TOLERANCES,
    assert_close_to_reference,
    force_tiled,
    reference_errors,
)

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}

def _seed(name: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(name.encode()))


def _randn(gen: torch.Generator, shape: tuple[int, ...], scale: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64) * scale


@dataclass(frozen=True)
class Case:
    """One kernel call: `make(gen)` gives f64 inputs (rounded to the tested dtype before use),
    `ref(*f64 inputs)` the f64 reference outputs, `eager(*dtype inputs)` PyTorch eager's."""

    kernel: str
    op: str
    shape_id: str
    make: Callable[[torch.Generator], list[torch.Tensor]]
    ref: Callable[..., Any]
    eager: Callable[..., Any]
    statics: dict[str, Any] = field(default_factory=dict)
    dtypes: tuple[str, ...] = ("f32", "bf16", "f16")
    # Positions of inputs that are class indices (int64), not rounded to the tested dtype.
    integer_inputs: tuple[int, ...] = ()
    # Positions of inputs kept in float32 whatever the tested dtype (AdamW's step count).
    f32_inputs: tuple[int, ...] = ()
    # Positions of outputs in float32 whatever the tested dtype (attention's logsumexp).
    f32_outputs: tuple[int, ...] = ()
    # A tiled (Mosaic) kernel: selected with tiled kernels forced (on the CPU its twin runs),
    # and also run through the interpreter of its printed Mosaic text, both against the
    # reference.
    tiled: bool = False

    @property
    def id(self) -> str:
        return f"{self.kernel}-{self.shape_id}"


def _shape_id(*shapes: tuple[int, ...]) -> str:
    return "_".join("x".join(map(str, s)) for s in shapes)


def _tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


# ----- cases -----

ELEMENTWISE_SHAPES = [(3, 7, 33), (1, 5), (4, 1), (8, 128), (1,)]
NORM_SHAPES = [(3, 7, 33), (1, 5), (4, 1), (8, 128), (2, 3, 1)]
SOFTMAX_SHAPES = [((3, 7, 33), -1), ((3, 7, 33), 1), ((1, 5), -1), ((4, 1), -1), ((8, 128), 0)]
MATMUL_SHAPES = [(7, 33, 5), (1, 5, 1), (4, 1, 3), (16, 128, 64)]  # (M, K, N)


def rms_norm_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _elementwise_cases() -> list[Case]:
    out = []
    for shape in ELEMENTWISE_SHAPES:
        # Scale 3 reaches GELU's erf tails and SiLU's saturation in every case.
        def make(g, shape=shape):
            return [_randn(g, shape, 3.0)]

        for kernel, approximate in [("gelu", "none"), ("gelu_tanh", "tanh")]:
            out.append(
                Case(
                    kernel,
                    "aten::gelu.default",
                    _shape_id(shape),
                    make,
                    ref=lambda x, a=approximate: F.gelu(x, approximate=a),
                    eager=lambda x, a=approximate: F.gelu(x, approximate=a),
                    statics={"approximate": approximate},
                )
            )
        out.append(Case("silu", "aten::silu.default", _shape_id(shape), make, ref=F.silu, eager=F.silu))
    return out


SOFTMAX_OPS = [("softmax", "aten::_softmax.default", torch._softmax),
               ("log_softmax", "aten::_log_softmax.default", torch._log_softmax)]


def _softmax_cases(shapes=SOFTMAX_SHAPES, prefix: str = "", **kw: Any) -> list[Case]:
    """Softmax and log-softmax at each `(shape, dim)`; `prefix` names the kernels (`tiled_`)
    and `kw` goes to each case."""
    out = []
    for shape, dim in shapes:
        def make(g, shape=shape):
            return [_randn(g, shape, 3.0)]

        for kernel, op, fn in SOFTMAX_OPS:
            out.append(
                Case(
                    prefix + kernel,
                    op,
                    f"{_shape_id(shape)}-dim{dim}",
                    make,
                    ref=lambda x, fn=fn, dim=dim: fn(x, dim, False),
                    eager=lambda x, fn=fn, dim=dim: fn(x, dim, False),
                    statics={"dim": dim, "half_to_float": False},
                    **kw,
                )
            )
    return out


TORCH_NAMES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def _softmax_backward_cases(shapes=SOFTMAX_SHAPES, prefix: str = "", **kw: Any) -> list[Case]:
    """`_softmax_backward_data` / `_log_softmax_backward_data` from the forward's output; the
    `input_dtype` static is the tested dtype's torch name (a callable of the dtype); `prefix`
    names the kernels (`tiled_`) and `kw` goes to each case."""
    out = []
    for shape, dim in shapes:
        for kernel, op, fwd, bwd in [
            ("softmax_backward", "aten::_softmax_backward_data.default", torch._softmax, torch._softmax_backward_data),
            (
                "log_softmax_backward",
                "aten::_log_softmax_backward_data.default",
                torch._log_softmax,
                torch._log_softmax_backward_data,
            ),
        ]:
            def make(g, shape=shape, dim=dim, fwd=fwd):
                return [_randn(g, shape), fwd(_randn(g, shape, 3.0), dim, False)]

            out.append(
                Case(
                    prefix + kernel,
                    op,
                    f"{_shape_id(shape)}-dim{dim}",
                    make,
                    ref=lambda grad, y, bwd=bwd, dim=dim: bwd(grad, y, dim, y.dtype),
                    eager=lambda grad, y, bwd=bwd, dim=dim: bwd(grad, y, dim, y.dtype),
                    statics={"dim": dim, "input_dtype": TORCH_NAMES.__getitem__},
                    **kw,
                )
            )
    return out


def _layer_norm_backward_cases() -> list[Case]:
    out = []
    for shape in NORM_SHAPES:
        d = shape[-1]

        def make(g, shape=shape, d=d):
            # x on bf16's grid (exact in every tested dtype) so the saved statistics belong to it.
            x = _randn(g, shape).bfloat16().double()
            _, mean, rstd = torch.native_layer_norm(x, [d], None, None, 1e-5)
            return [_randn(g, shape), x, mean, rstd, _randn(g, (d,)), _randn(g, (d,))]

        def eager(grad, x, mean, rstd, w, b, d=d):
            return torch.ops.aten.native_layer_norm_backward(grad, x, [d], mean, rstd, w, b, [True] * 3)

        # The reference is the gradient given the saved statistics the kernel is handed (in
        # 16-bit cases they are rounded to the dtype, as PyTorch's CPU forward saves them):
        # ATen's kernel in float64 on the upcast inputs. Recomputing exact statistics instead
        # would measure the statistics' rounding, not the kernel.
        out.append(
            Case(
                "layer_norm_backward",
                "aten::native_layer_norm_backward.default",
                _shape_id(shape),
                make,
                ref=eager,
                eager=eager,
            )
        )
    return out


def _norm_cases() -> list[Case]:
    out = []
    for shape in NORM_SHAPES:
        d = shape[-1]

        def make(g, shape=shape, d=d):
            return [_randn(g, shape), _randn(g, (d,)), _randn(g, (d,))]

        eps = 1e-5
        out.append(
            Case(
                "layer_norm",
                "aten::native_layer_norm.default",
                _shape_id(shape),
                make,
                ref=lambda x, w, b, d=d: torch.native_layer_norm(x, [d], w, b, eps),
                eager=lambda x, w, b, d=d: torch.native_layer_norm(x, [d], w, b, eps),
                statics={"eps": eps},
            )
        )

        def make_rms(g, shape=shape, d=d):
            return [_randn(g, shape), _randn(g, (d,))]

        out.append(
            Case(
                "rms_norm",
                "tpuk::rms_norm.default",
                _shape_id(shape),
                make_rms,
                ref=lambda x, w: rms_norm_ref(x, w, eps),
                eager=lambda x, w, d=d: F.rms_norm(x, [d], w, eps),
                statics={"eps": eps},
            )
        )

        def make_bwd(g, shape=shape, d=d):
            return [_randn(g, shape), _randn(g, shape), _randn(g, (d,))]

        out.append(
            Case(
                "rms_norm_backward",
                "tpuk::rms_norm_backward.default",
                _shape_id(shape),
                make_bwd,
                ref=lambda grad, x, w: _rms_grads(grad, x, w, eps, rms_norm_ref),
                eager=lambda grad, x, w, d=d: _rms_grads(grad, x, w, eps, lambda a, b, e: F.rms_norm(a, [d], b, e)),
                statics={"eps": eps},
            )
        )
    return out


def _rms_grads(grad, x, w, eps, fn) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    with torch.enable_grad():
        fn(x, w, eps).backward(grad)
    return x.grad, w.grad


def _matmul_cases() -> list[Case]:
    out = []
    for m, k, n in MATMUL_SHAPES:
        def make(g, m=m, k=k, n=n):
            return [_randn(g, (m, k)), _randn(g, (k, n), 1 / math.sqrt(k)), _randn(g, (n,))]

        for act in ACTIVATIONS:
            out.append(
                Case(
                    "matmul_bias_act",
                    "tpuk::matmul_bias_act.default",
                    f"{m}x{k}x{n}-{act}",
                    make,
                    ref=lambda x, w, b, act=act: ACTIVATIONS[act](x @ w + b),
                    # Eager in the tested dtype: matmul, add and activation each round.
                    eager=lambda x, w, b, act=act: ACTIVATIONS[act](x @ w + b),
                    statics={"activation": act},
                )
            )

        def make_nobias(g, m=m, k=k, n=n):
            return [_randn(g, (m, k)), _randn(g, (k, n), 1 / math.sqrt(k))]

        for act in ACTIVATIONS:
            out.append(
                Case(
                    "matmul_act",
                    "tpuk::matmul_act.default",
                    f"{m}x{k}x{n}-{act}",
                    make_nobias,
                    ref=lambda x, w, act=act: ACTIVATIONS[act](x @ w),
                    eager=lambda x, w, act=act: ACTIVATIONS[act](x @ w),
                    statics={"activation": act},
                )
            )
    return out


TILED_MATMUL_SHAPES = [(7, 33, 5), (16, 1024, 384), (256, 512, 256)]  # (M, K, N)
TILED_NORM_SHAPES = [(3, 7, 33), (8, 128), (2, 3, 1), (2, 512, 512)]
# The norms' backwards sum their weight gradients over every row: over 1024 rows (2x512x512)
# no f32 sum meets the tolerance of a result rounded once (PyTorch eager's misses it by 2-7x
# too), so their two-block case is 16 rows of 32768 (two 8-row blocks) instead.
TILED_NORM_BWD_SHAPES = [(3, 7, 33), (8, 128), (2, 3, 1), (2, 8, 32768)]


def _tiled_cases() -> list[Case]:
    """The tiled kernels: several grid steps along each axis where the shapes allow (K split
    in two for 16x1024x384, rows in two blocks for 2x512x512), single full-array blocks for odd
    sizes."""
    out = []
    for m, k, n in TILED_MATMUL_SHAPES:
        def make(g, m=m, k=k, n=n):
            return [_randn(g, (m, k)), _randn(g, (k, n), 1 / math.sqrt(k)), _randn(g, (n,))]

        def make_nobias(g, m=m, k=k, n=n):
            return [_randn(g, (m, k)), _randn(g, (k, n), 1 / math.sqrt(k))]

        for act in ACTIVATIONS:
            out.append(
                Case(
                    "tiled_matmul_bias_act", "tpuk::matmul_bias_act.default", f"{m}x{k}x{n}-{act}", make,
                    ref=lambda x, w, b, act=act: ACTIVATIONS[act](x @ w + b),
                    eager=lambda x, w, b, act=act: ACTIVATIONS[act](x @ w + b),
                    statics={"activation": act}, dtypes=("f32", "bf16"), tiled=True,
                )
            )
            out.append(
                Case(
                    "tiled_matmul_act", "tpuk::matmul_act.default", f"{m}x{k}x{n}-{act}", make_nobias,
                    ref=lambda x, w, act=act: ACTIVATIONS[act](x @ w),
                    eager=lambda x, w, act=act: ACTIVATIONS[act](x @ w),
                    statics={"activation": act}, dtypes=("f32", "bf16"), tiled=True,
                )
            )
    eps = 1e-6
    for shape in TILED_NORM_SHAPES:
        d = shape[-1]

        def make_rms(g, shape=shape, d=d):
            return [_randn(g, shape), _randn(g, (d,))]

        out.append(
            Case(
                "tiled_rms_norm", "tpuk::rms_norm.default", _shape_id(shape), make_rms,
                ref=lambda x, w: rms_norm_ref(x, w, eps),
                eager=lambda x, w, d=d: F.rms_norm(x, [d], w, eps),
                statics={"eps": eps}, dtypes=("f32", "bf16"), tiled=True,
            )
        )
        out += _tiled_row_cases(shape, backward_sums=shape in TILED_NORM_BWD_SHAPES)
    for shape in TILED_NORM_BWD_SHAPES:
        if shape not in TILED_NORM_SHAPES:
            out += [c for c in _tiled_row_cases(shape, backward_sums=True) if "norm_backward" in c.kernel]
    return out


def _tiled_row_cases(shape: tuple[int, ...], backward_sums: bool) -> list[Case]:
    """The row-block tiled kernels at one shape: softmax and log-softmax over the last dim and
    their backwards, layer norm and its backward, RMSNorm's backward (the backwards' weight sums
    accumulate across row blocks)."""
    d, sid, tiled = shape[-1], _shape_id(shape), {"dtypes": ("f32", "bf16"), "tiled": True}
    out = []

    out += _softmax_cases([(shape, -1)], prefix="tiled_", **tiled)
    out += _softmax_backward_cases([(shape, -1)], prefix="tiled_", **tiled)

    def make_ln(g):
        return [_randn(g, shape), _randn(g, (d,)), _randn(g, (d,))]

    out.append(
        Case(
            "tiled_layer_norm", "aten::native_layer_norm.default", sid, make_ln,
            ref=lambda x, w, b: torch.native_layer_norm(x, [d], w, b, 1e-5),
            eager=lambda x, w, b: torch.native_layer_norm(x, [d], w, b, 1e-5),
            statics={"eps": 1e-5}, **tiled,
        )
    )

    def make_ln_bwd(g):
        # As in `_layer_norm_backward_cases`: x on bf16's grid, its own saved statistics.
        x = _randn(g, shape).bfloat16().double()
        _, mean, rstd = torch.native_layer_norm(x, [d], None, None, 1e-5)
        return [_randn(g, shape), x, mean, rstd, _randn(g, (d,)), _randn(g, (d,))]

    def ln_bwd(grad, x, mean, rstd, w, b):
        return torch.ops.aten.native_layer_norm_backward(grad, x, [d], mean, rstd, w, b, [True] * 3)

    if not backward_sums:
        return out
    out.append(
        Case("tiled_layer_norm_backward", "aten::native_layer_norm_backward.default", sid, make_ln_bwd,
             ref=ln_bwd, eager=ln_bwd, **tiled)
    )
    eps = 1e-6

    def make_rms_bwd(g):
        return [_randn(g, shape), _randn(g, shape), _randn(g, (d,))]

    out.append(
        Case(
            "tiled_rms_norm_backward", "tpuk::rms_norm_backward.default", sid, make_rms_bwd,
            ref=lambda grad, x, w: _rms_grads(grad, x, w, eps, rms_norm_ref),
            eager=lambda grad, x, w: _rms_grads(grad, x, w, eps, lambda a, b, e: F.rms_norm(a, [d], b, e)),
            statics={"eps": eps}, **tiled,
        )
    )
    return out


SWIGLU_SHAPES = [(3, 7, 33), (1, 5), (4, 1), (8, 128), (1,)]
CROSS_ENTROPY_SHAPES = [(7, 33), (1, 5), (4, 1), (8, 128), (1, 1)]  # (N, C)
ROTARY_SHAPES = [(3, 5, 1, 6), (1, 1, 1, 2), (2, 8, 4, 64), (1, 7, 3, 10)]  # (B, S, H, D)


def swiglu_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def _swiglu_grads(grad, gate, up, fn) -> tuple[torch.Tensor, torch.Tensor]:
    gate = gate.detach().clone().requires_grad_()
    up = up.detach().clone().requires_grad_()
    with torch.enable_grad():
        fn(gate, up).backward(grad)
    return gate.grad, up.grad


def _cross_entropy_grads(grad, logits, target) -> tuple[torch.Tensor, torch.Tensor]:
    """(dlogits, dtarget): autograd's dlogits and the kernel's zero class-index "gradient"."""
    logits = logits.detach().clone().requires_grad_()
    with torch.enable_grad():
        F.cross_entropy(logits, target).backward(grad)
    return logits.grad, torch.zeros_like(target)


def rotary_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def _targets(g: torch.Generator, n: int, c: int) -> torch.Tensor:
    """Class indices, as f64 so `make`'s inputs round to the tested dtype; `_as_target` restores."""
    return torch.randint(0, c, (n,), generator=g).double()


def _gated_cases() -> list[Case]:
    out = []
    for shape in SWIGLU_SHAPES:
        def make(g, shape=shape):
            return [_randn(g, shape, 3.0), _randn(g, shape)]

        out.append(Case("swiglu", "tpuk::swiglu.default", _shape_id(shape), make, ref=swiglu_ref, eager=swiglu_ref))

        def make_bwd(g, shape=shape):
            return [_randn(g, shape), _randn(g, shape, 3.0), _randn(g, shape)]

        out.append(
            Case(
                "swiglu_backward",
                "tpuk::swiglu_backward.default",
                _shape_id(shape),
                make_bwd,
                ref=lambda grad, gate, up: _swiglu_grads(grad, gate, up, swiglu_ref),
                eager=lambda grad, gate, up: _swiglu_grads(grad, gate, up, swiglu_ref),
            )
        )
    return out


def _loss_cases() -> list[Case]:
    out = []
    for n, c in CROSS_ENTROPY_SHAPES:
        def make(g, n=n, c=c):
            return [_randn(g, (n, c), 3.0), _targets(g, n, c)]

        out.append(
            Case(
                "cross_entropy",
                "tpuk::cross_entropy.default",
                _shape_id((n, c)),
                make,
                ref=lambda logits, target: F.cross_entropy(logits, target),
                eager=lambda logits, target: F.cross_entropy(logits, target),
                integer_inputs=(1,),
            )
        )

        def make_bwd(g, n=n, c=c):
            return [_randn(g, ()), _randn(g, (n, c), 3.0), _targets(g, n, c)]

        out.append(
            Case(
                "cross_entropy_backward",
                "tpuk::cross_entropy_backward.default",
                _shape_id((n, c)),
                make_bwd,
                ref=_cross_entropy_grads,
                eager=_cross_entropy_grads,
                integer_inputs=(2,),
            )
        )
    return out


# (N, C): one vocabulary tile and an odd size, two row blocks, two vocabulary tiles, and a
# 32000-word vocabulary in 25 tiles of 1280.
TILED_CROSS_ENTROPY_SHAPES = [(7, 33), (512, 384), (16, 4096), (8, 32000)]


def _tiled_loss_cases() -> list[Case]:
    """The tiled cross-entropy and its backward (an online logsumexp over vocabulary tiles)."""
    out = []
    tiled = {"dtypes": ("f32", "bf16"), "tiled": True}
    for n, c in TILED_CROSS_ENTROPY_SHAPES:
        def make(g, n=n, c=c):
            return [_randn(g, (n, c), 3.0), _targets(g, n, c)]

        def make_bwd(g, n=n, c=c):
            return [_randn(g, ()), _randn(g, (n, c), 3.0), _targets(g, n, c)]

        out.append(
            Case("tiled_cross_entropy", "tpuk::cross_entropy.default", _shape_id((n, c)), make,
                 ref=F.cross_entropy, eager=F.cross_entropy, integer_inputs=(1,), **tiled)
        )
        out.append(
            Case("tiled_cross_entropy_backward", "tpuk::cross_entropy_backward.default", _shape_id((n, c)),
                 make_bwd, ref=_cross_entropy_grads, eager=_cross_entropy_grads, integer_inputs=(2,), **tiled)
        )
    return out


def _rotary_cases() -> list[Case]:
    out = []
    for b, s, h, d in ROTARY_SHAPES:
        def make(g, b=b, s=s, h=h, d=d):
            angles = _randn(g, (s, d // 2), 3.0)
            return [_randn(g, (b, s, h, d)), angles.cos(), angles.sin()]

        out.append(
            Case("rotary", "tpuk::rotary.default", _shape_id((b, s, h, d)), make, ref=rotary_ref, eager=rotary_ref)
        )
    return out


ADAMW_SHAPES = [(3, 7, 33), (1, 5), (8, 128), (1,)]
ADAMW_STEPS = [1, 10, 1000]


def adamw_ref(param, grad, exp_avg, exp_avg_sq, step, **hp) -> tuple[torch.Tensor, ...]:
    """One `torch.optim.AdamW(foreach=False)` step from the given state, in the inputs' dtype
    (`step` is the step count after the update)."""
    p = param.detach().clone().requires_grad_()
    opt = torch.optim.AdamW([p], foreach=False, **hp)
    opt.state[p] = {
        "step": torch.tensor(float(step) - 1.0),
        "exp_avg": exp_avg.clone(),
        "exp_avg_sq": exp_avg_sq.clone(),
    }
    p.grad = grad.clone()
    opt.step()
    st = opt.state[p]
    return p.detach(), st["exp_avg"], st["exp_avg_sq"]


def _adamw_cases() -> list[Case]:
    out = []
    for shape in ADAMW_SHAPES:
        for step in ADAMW_STEPS:
            def make(g, shape=shape, step=step):
                m = _randn(g, shape, 0.1)
                v = _randn(g, shape, 0.1) ** 2 + _randn(g, shape, 0.01) ** 2
                return [_randn(g, shape), _randn(g, shape), m, v, torch.tensor(float(step), dtype=torch.float64)]

            for hp in [{}, {"lr": 1e-2, "weight_decay": 0.1, "beta2": 0.99}] if shape == (3, 7, 33) else [{}]:
                full = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}
                statics = {}
                for k, val in hp.items():
                    statics[k] = val
                    if k == "beta2":
                        full["betas"] = (0.9, val)
                    else:
                        full[k] = val
                tag = "-".join(f"{k}{v}" for k, v in hp.items())
                out.append(
                    Case(
                        "adamw_step",
                        "tpuk::adamw_step.default",
                        f"{_shape_id(shape)}-step{step}" + (f"-{tag}" if tag else ""),
                        make,
                        ref=lambda *a, full=full: adamw_ref(*a, **full),
                        eager=lambda *a, full=full: adamw_ref(*a, **full),
                        statics=statics,
                        f32_inputs=(4,),
                    )
                )
    return out


# ----- dropout: the kernel's counter-based RNG, reimplemented in NumPy -----


def _fmix32(h):
    import numpy as np

    with np.errstate(over="ignore"):
        h = np.asarray(h, dtype=np.uint32).copy()
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return h


def dropout_bits(seed: int, n: int):
    """The kernel's 24-bit uniforms `h >> 8` for flat indices `0..n` (see `tpuk::dropout`)."""
    import numpy as np

    s = seed % 2**64
    lo = np.array([s & 0xFFFFFFFF], dtype=np.uint32)
    hi = np.array([s >> 32], dtype=np.uint32)
    key = _fmix32(_fmix32(lo ^ np.uint32(0x9E3779B9)) ^ hi)
    return _fmix32(np.arange(n, dtype=np.uint32) ^ key) >> np.uint32(8)


def dropout_mask_ref(shape: tuple[int, ...], seed: int, p: float) -> torch.Tensor:
    threshold = math.ceil(p * 2**24)
    bits = dropout_bits(seed, math.prod(shape))
    return torch.from_numpy(bits >= threshold).reshape(shape)


def dropout_ref(x: torch.Tensor, seed: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    mask = dropout_mask_ref(tuple(x.shape), int(seed), p)
    scale = 1.0 / (1.0 - p) if p < 1.0 else 0.0
    return torch.where(mask, x * scale, torch.zeros_like(x)), mask


DROPOUT_SHAPES = [(3, 7, 33), (1, 5), (8, 128), (1,)]
DROPOUT_SEEDS = [0, 12345, -7, 2**40 + 3]


def _dropout_cases() -> list[Case]:
    out = []
    for shape in DROPOUT_SHAPES:
        for seed, p in zip(DROPOUT_SEEDS, [0.1, 0.5, 0.25, 0.9]):
            def make(g, shape=shape, seed=seed):
                return [_randn(g, shape), torch.tensor(float(seed), dtype=torch.float64)]

            out.append(
                Case(
                    "dropout",
                    "tpuk::dropout.default",
                    f"{_shape_id(shape)}-seed{seed}-p{p}",
                    make,
                    ref=lambda x, seed, p=p: dropout_ref(x, seed, p),
                    eager=lambda x, seed, p=p: dropout_ref(x, seed, p),
                    statics={"p": p},
                    integer_inputs=(1,),
                )
            )
    return out


# (B, H, L, E), (Hk, S): plain, grouped-query (H = 2 Hk), one query row, one key.
ATTENTION_SHAPES = [((2, 4, 16, 32), (4, 16)), ((2, 4, 5, 8), (2, 7)), ((1, 1, 1, 8), (1, 3)), ((1, 2, 7, 64), (2, 1))]
FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu.default"
FLASH_BWD = "aten::_scaled_dot_product_flash_attention_for_cpu_backward.default"


def attention_ref(q, k, v, mask=None, is_causal=False, scale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, logsumexp) of scaled dot-product attention, written out (grouped-query heads
    repeated; a bool mask keeps where true, a float one adds; causal aligned top-left)."""
    scale = scale or 1.0 / math.sqrt(q.shape[-1])
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask
    if is_causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        s = s.masked_fill(~keep, -math.inf)
    return torch.softmax(s, -1) @ v, s.logsumexp(-1)


def _attention_grads(grad, q, k, v, mask, **kw) -> tuple[torch.Tensor, ...]:
    """Autograd of `attention_ref`'s output: (dq, dk, dv), and dmask for a float mask."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    float_mask = mask is not None and mask.is_floating_point()
    m = mask.detach().clone().requires_grad_() if float_mask else mask
    with torch.enable_grad():
        attention_ref(*leaves, m, **kw)[0].backward(grad)
    return tuple(t.grad for t in leaves) + ((m.grad,) if float_mask else ())


def _additive(mask, dtype):
    """PyTorch's flash op takes an additive mask; `F.scaled_dot_product_attention` turns a bool
    mask into one (-inf where false) before calling it."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, -math.inf)


# (B, H, L, E), (Hk, S), causal: several query and key/value blocks of 128 (the causal one
# skips the block past the diagonal), grouped-query heads, and lengths no 128 divides.
TILED_ATTENTION_SHAPES = [
    ((1, 2, 256, 128), (2, 256), True),
    ((1, 4, 128, 64), (2, 384), False),
    ((2, 4, 40, 32), (2, 24), True),
    ((1, 2, 7, 64), (2, 5), False),
]


def _tiled_attention_cases() -> list[Case]:
    """The tiled flash-attention forward (no mask) against the written-out reference."""
    out = []
    for (b, h, l, e), (hk, s), is_causal in TILED_ATTENTION_SHAPES:
        kw = {"is_causal": is_causal, "scale": None}

        def make(g, b=b, h=h, l=l, e=e, hk=hk, s=s):
            return [_randn(g, (b, h, l, e)), _randn(g, (b, hk, s, e)), _randn(g, (b, hk, s, e))]

        def flash_ref(q, k, v, kw=kw):
            return attention_ref(q, k, v, None, **kw)

        def flash_eager(q, k, v, kw=kw):
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, kw["is_causal"])

        tag = _shape_id((b, h, l, e), (b, hk, s, e)) + ("-causal" if is_causal else "")
        out.append(
            Case("tiled_sdpa_flash", FLASH, tag, make, ref=flash_ref, eager=flash_eager,
                 statics={"is_causal": is_causal}, f32_outputs=(1,), dtypes=("f32", "bf16"), tiled=True)
        )

        # An additive f32 [L, S] mask, the same for every batch and head.
        def make_masked(g, make=make, l=l, s=s):
            return make(g) + [_randn(g, (l, s))]

        def masked_ref(q, k, v, mask, kw=kw):
            return attention_ref(q, k, v, mask, **kw)

        def masked_eager(q, k, v, mask, kw=kw):
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, kw["is_causal"], attn_mask=mask
            )

        out.append(
            Case("tiled_sdpa_flash_masked", FLASH, tag + "-mask", make_masked, ref=masked_ref, eager=masked_eager,
                 statics={"is_causal": is_causal}, f32_inputs=(3,), f32_outputs=(1,), dtypes=("f32", "bf16"),
                 tiled=True)
        )
        # Masks that broadcast, in the query's type: a key row [1, S], and of rank 4 a padding
        # mask [B, 1, 1, S], a per-head bias shared by the batch [1, H, L, S] and a full one;
        # the rank-4 ones through `tpuk::attention` (the output alone) too.
        for kernel, mshape in [
            ("tiled_sdpa_flash_masked", (1, s)),
            ("tiled_sdpa_flash_masked_4d", (b, 1, 1, s)),
            ("tiled_sdpa_flash_masked_4d", (1, h, l, s)),
            ("tiled_sdpa_flash_masked_4d", (b, h, l, s)),
        ]:
            def make_bcast(g, make=make, mshape=mshape):
                return make(g) + [_randn(g, mshape)]

            mtag = f"{tag}-mask{'x'.join(map(str, mshape))}"
            out.append(
                Case(kernel, FLASH, mtag, make_bcast, ref=masked_ref, eager=masked_eager,
                     statics={"is_causal": is_causal}, f32_outputs=(1,), dtypes=("f32", "bf16"), tiled=True)
            )
            if len(mshape) == 4:
                def op_ref(q, k, v, mask, kw=kw):
                    return attention_ref(q, k, v, mask, **kw)[0]

                out.append(
                    Case("tiled_attention_4d", "tpuk::attention.default", mtag, make_bcast, ref=op_ref, eager=op_ref,
                         statics={"is_causal": is_causal}, dtypes=("f32", "bf16"), tiled=True)
                )
        def make_bwd(g, make=make, kw=kw):
            # As for the flash backward: inputs on bf16's grid, the forward's own out and lse.
            q, k, v = (t.bfloat16().double() for t in make(g))
            o, lse = attention_ref(q, k, v, None, **kw)
            return [_randn(g, tuple(o.shape)), q, k, v, o, lse]

        def bwd_ref(grad, q, k, v, o, lse, kw=kw):
            return _attention_grads(grad, q, k, v, None, **kw)[:3]

        def bwd_eager(grad, q, k, v, o, lse, kw=kw):
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad, q, k, v, o, lse, 0.0, kw["is_causal"]
            )

        out.append(
            Case("tiled_sdpa_flash_backward", FLASH_BWD, tag, make_bwd, ref=bwd_ref, eager=bwd_eager,
                 statics={"is_causal": is_causal}, f32_inputs=(5,), dtypes=("f32",), tiled=True)
        )
    return out


def _attention_cases() -> list[Case]:
    """Every shape with no mask, a float mask and a bool mask for the flash kernels (causal on
    every other shape, an explicit scale on one), and with a float mask for `tpuk::attention`."""
    out = []
    for i, ((b, h, l, e), (hk, s)) in enumerate(ATTENTION_SHAPES):
        is_causal = i % 2 == 0
        statics = {"is_causal": is_causal} | ({"scale": 0.3} if i == 1 else {})
        kw = {"is_causal": is_causal, "scale": statics.get("scale")}
        # The mask broadcasts over batch and heads ([L, S]) or over heads ([B, 1, L, S]).
        mask_shape = (l, s) if i % 2 == 0 else (b, 1, l, s)
        shape_tag = _shape_id((b, h, l, e), (b, hk, s, e)) + ("-causal" if is_causal else "")

        def qkv(g, b=b, h=h, l=l, e=e, hk=hk, s=s):
            return [_randn(g, (b, h, l, e)), _randn(g, (b, hk, s, e)), _randn(g, (b, hk, s, e))]

        def mask_of(g, kind, shape=mask_shape):
            if kind == "bool":
                m = torch.rand(shape, generator=g) > 0.3
                m[..., 0] = True  # every row keeps a key
                return m
            return _randn(g, shape)

        def make(g, kind, qkv=qkv, mask_of=mask_of):
            return qkv(g) + ([] if kind is None else [mask_of(g, kind)])

        for mask_kind in (None, "float", "bool"):
            tag = f"{shape_tag}-{mask_kind or 'nomask'}"
            kernel = "sdpa_flash_cpu" + ("" if mask_kind is None else "_masked")

            def make_fwd(g, kind=mask_kind, make=make):
                return make(g, kind)

            def flash_ref(q, k, v, mask=None, kw=kw):
                return attention_ref(q, k, v, mask, **kw)

            def flash_eager(q, k, v, mask=None, kw=kw):
                return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    q, k, v, 0.0, kw["is_causal"], attn_mask=_additive(mask, q.dtype), scale=kw["scale"]
                )

            out.append(
                Case(kernel, FLASH, tag, make_fwd, ref=flash_ref, eager=flash_eager, statics=statics, f32_outputs=(1,))
            )

            def make_bwd(g, kind=mask_kind, kw=kw, make=make):
                # Inputs on bf16's grid (which f16 and f32 hold exactly), so that the saved `out`
                # and `logsumexp` belong to the inputs the kernel gets in every tested dtype.
                q, k, v, *m = (t if t.dtype == torch.bool else t.bfloat16().double() for t in make(g, kind))
                o, lse = attention_ref(q, k, v, *(m or [None]), **kw)
                return [_randn(g, tuple(o.shape)), q, k, v, o, lse, *m]

            def bwd_ref(grad, q, k, v, o, lse, mask=None, kw=kw):
                return _attention_grads(grad, q, k, v, mask, **kw)[:3]

            def bwd_eager(grad, q, k, v, o, lse, mask=None, kw=kw):
                return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                    grad, q, k, v, o, lse, 0.0, kw["is_causal"], attn_mask=_additive(mask, q.dtype), scale=kw["scale"]
                )

            out.append(
                Case(kernel + "_backward", FLASH_BWD, tag, make_bwd, ref=bwd_ref, eager=bwd_eager, statics=statics,
                     f32_inputs=(5,))
            )

        # The new op: an additive mask of the query's type.
        def make_op(g, make=make):
            return make(g, "float")

        def op_ref(q, k, v, mask, kw=kw):
            return attention_ref(q, k, v, mask, **kw)[0]

        out.append(Case("attention", "tpuk::attention.default", shape_tag, make_op, ref=op_ref, eager=op_ref,
                        statics=statics))

        def make_op_bwd(g, l=l, e=e, b=b, h=h, make=make):
            return [_randn(g, (b, h, l, e))] + make(g, "float")

        def op_bwd_ref(grad, q, k, v, mask, kw=kw):
            return _attention_grads(grad, q, k, v, mask, **kw)

        out.append(
            Case("attention_backward", "tpuk::attention_backward.default", shape_tag, make_op_bwd, ref=op_bwd_ref,
                 eager=op_bwd_ref, statics=statics)
        )
    return out


CASES = (
    _elementwise_cases()
    + _softmax_cases()
    + _norm_cases()
    + _matmul_cases()
    + _gated_cases()
    + _loss_cases()
    + _rotary_cases()
    + _adamw_cases()
    + _dropout_cases()
    + _attention_cases()
    + _softmax_backward_cases()
    + _layer_norm_backward_cases()
    + _tiled_cases()
    + _tiled_attention_cases()
    + _tiled_loss_cases()
)
PARAMS = [pytest.param(c, dt, id=f"{c.kernel}-{dt}-{c.shape_id}") for c in CASES for dt in c.dtypes]


def run_case(case: Case, dt: str) -> list[dict[str, Any]]:
    """Runs one case; returns per output {kernel errors, eager errors}. Asserts the expected
    kernel ran (strict dispatcher: a fallback raises FallbackError)."""
    dtype = DTYPES[dt]
    made = case.make(_seed(f"{case.id}-{dt}"))
    inputs = [
        t
        if t.dtype == torch.bool
        else t.long()
        if i in case.integer_inputs
        else t.float()
        if i in case.f32_inputs
        else t.to(dtype)
        for i, t in enumerate(made)
    ]
    # References first, on copies: a kernel donating its inputs (adamw_step) may not leave them.
    exact = [i in case.integer_inputs or t.dtype == torch.bool for i, t in enumerate(inputs)]
    refs = _tuple(case.ref(*[t if x else t.double() for t, x in zip(inputs, exact)]))
    eagers = _tuple(case.eager(*[t.clone() for t in inputs]))
    d = tk.Dispatcher(no_fallback=True)
    statics = {k: v(dt) if callable(v) else v for k, v in case.statics.items()}
    if case.tiled:
        with force_tiled():
            outs = tk.call(case.op, *inputs, dispatcher=d, **statics)
    else:
        outs = tk.call(case.op, *inputs, dispatcher=d, **statics)
    stats = d.stats()
    assert stats["fallbacks"] == 0, stats
    assert stats["ops"][case.op]["kernels"] == {case.kernel: 1}, stats

    assert len(outs) == len(refs) == len(eagers)
    if case.tiled:
        outs = list(outs) + _interpreted(case, dt, inputs, statics, refs)
        refs = tuple(refs) + tuple(refs)
        eagers = tuple(eagers) + tuple(eagers)
    results = []
    for i, (out, ref, eager) in enumerate(zip(outs, refs, eagers)):
        assert out.shape == ref.shape, (i, out.shape, ref.shape)
        odtype = torch.float32 if i in case.f32_outputs else dtype
        results.append(
            {
                "output": i,
                "dtype": odtype,
                "kernel": reference_errors(out, ref, odtype),
                "eager": reference_errors(eager.to(odtype), ref, odtype),
                "actual": out,
                "reference": ref,
            }
        )
    return results


def _interpreted(case: Case, dt: str, inputs: list[torch.Tensor], statics: dict[str, Any], refs) -> list:
    """The tiled kernel's outputs from the interpreter of its printed Mosaic text (the readable
    form), in the tested dtype: reported after the twin's outputs."""
    from tpu_kernels import _native

    names = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.int64: "i64"}
    tensors = ", ".join(f"{names.get(t.dtype, dt)}[{','.join(map(str, t.shape))}]" for t in inputs)
    spelled = {k: str(v).lower() if isinstance(v, bool) else v for k, v in statics.items()}
    given = ", ".join(f"{k}={v}" for k, v in spelled.items())
    sig = f"{tensors}; {given}" if given else tensors
    flat = [t.double().flatten().tolist() for t in inputs]
    outs = _native.tiled_interpret(case.kernel, sig, flat)
    assert len(outs) == len(refs), (case.kernel, len(outs))
    return [
        torch.tensor(o, dtype=torch.float64).reshape(r.shape).to(DTYPES[dt] if r.is_floating_point() else r.dtype)
        for o, r in zip(outs, refs)
    ]


@pytest.mark.parametrize(("case", "dt"), PARAMS)
def test_kernel_numerics(case: Case, dt: str) -> None:
    for r in run_case(case, dt):
        dtype = r["dtype"]
        k, e = r["kernel"], r["eager"]
        where = f"{case.kernel} {dt} {case.shape_id} output {r['output']}: "
        if not r["actual"].is_floating_point():
            # Integer outputs (cross entropy's class-index gradient) are exact.
            assert r["actual"].dtype == r["reference"].dtype and torch.equal(r["actual"], r["reference"]), where
            continue
        assert_close_to_reference(r["actual"], r["reference"], dtype, msg=where + f"(eager: {e}) ")


# ----- gradients through the custom op's autograd -----

@pytest.mark.parametrize("offset", [0.0, 1e2, 1e3])
def test_layer_norm_keeps_pytorchs_precision_far_from_zero(offset: float) -> None:
    """The layer-norm kernel centers the input with its own copy of the mean for the variance
    and another for the output (`Tensor::copies`), so the centered input is never one value two
    passes share. Against f64, its error stays within 3x of PyTorch's own f32 kernel (and 1e-5
    when the mean is 0) at means of 0, 100 and 1000 standard deviations; the one-pass variance
    E[x²] - mean² misses that by a factor of thousands at 1000."""
    g = _seed(f"layer_norm-offset-{offset}")
    x64 = _randn(g, (64, 1024)) + offset
    w64, b64 = _randn(g, (1024,)), _randn(g, (1024,))
    x, w, b = x64.float(), w64.float(), b64.float()
    ref = F.layer_norm(x.double(), (1024,), w.double(), b.double(), 1e-5)

    d = tk.default_dispatcher()
    op = "aten::native_layer_norm.default"
    before = d.stats()["ops"].get(op, {}).get("kernels", {}).get("layer_norm", 0)
    ours = tk.call("aten::native_layer_norm", x, w, b, eps=1e-5, dispatcher=d)[0]
    assert d.stats()["ops"][op]["kernels"]["layer_norm"] == before + 1
    theirs = F.layer_norm(x, (1024,), w, b, 1e-5)
    err_ours = float((ours.double() - ref).abs().max())
    err_theirs = float((theirs.double() - ref).abs().max())
    assert err_ours <= max(3 * err_theirs, 1e-5), (offset, err_ours, err_theirs)



@pytest.mark.parametrize("offset", [0.0, 1e3, 1e4])
def test_log_softmax_keeps_pytorchs_precision_far_from_zero(offset: float) -> None:
    """The log-softmax kernel computes `(x - max) - log(sum)` from its own copy of the max
    (`Tensor::copies`), not `x - (max + log(sum))`: that one shift would round `max` into the
    sum's low digits, an error near half an ulp of `max` (about 5e-4 at logits of 1e4). Against
    f64, its error stays within 3x of PyTorch's own f32 kernel (and 1e-5) at logits offset by 0,
    1000 and 10000."""
    g = _seed(f"log_softmax-offset-{offset}")
    x = (_randn(g, (64, 1024)) * 3 + offset).float()
    ref = torch.log_softmax(x.double(), -1)

    d = tk.default_dispatcher()
    op = "aten::_log_softmax.default"
    before = d.stats()["ops"].get(op, {}).get("kernels", {}).get("log_softmax", 0)
    ours = tk.call("aten::_log_softmax", x, dim=-1, half_to_float=False, dispatcher=d)[0]
    assert d.stats()["ops"][op]["kernels"]["log_softmax"] == before + 1
    err_ours = float((ours.double() - ref).abs().max())
    err_theirs = float((torch.log_softmax(x, -1).double() - ref).abs().max())
    assert err_ours <= max(3 * err_theirs, 1e-5), (offset, err_ours, err_theirs)


GRAD_SHAPES = [(3, 7, 33), (1, 5), (4, 1), (8, 128)]


@pytest.mark.parametrize("shape", GRAD_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dt", ["f32", "bf16", "f16"])
def test_rms_norm_autograd(dt: str, shape: tuple[int, ...]) -> None:
    """`torch.ops.tpuk.rms_norm` forward and backward (the `rms_norm_backward` kernel) against
    f64 autograd through the reference formula."""
    from tpu_kernels.torch import custom_ops
    from tpu_kernels.torch._native import native

    custom_ops()
    dtype, eps = DTYPES[dt], 1e-6
    g = _seed(f"rms_norm-autograd-{dt}-{shape}")
    x, w, grad = (t.to(dtype) for t in (_randn(g, shape), _randn(g, shape[-1:]), _randn(g, shape)))

    before = native().stats()["ops"]
    xk, wk = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = torch.ops.tpuk.rms_norm(xk, wk, eps)
    out.backward(grad)
    after = native().stats()["ops"]
    for op, kernel in [("tpuk::rms_norm.default", "rms_norm"), ("tpuk::rms_norm_backward.default", "rms_norm_backward")]:
        ran = after[op]["kernels"].get(kernel, 0) - before.get(op, {}).get("kernels", {}).get(kernel, 0)
        assert ran == 1, (op, before.get(op), after[op])

    dx, dw = _rms_grads(grad.double(), x.double(), w.double(), eps, rms_norm_ref)
    ref_out = rms_norm_ref(x.double(), w.double(), eps)
    for name, actual, ref in [("out", out, ref_out), ("dx", xk.grad, dx), ("dweight", wk.grad, dw)]:
        assert_close_to_reference(actual, ref, dtype, msg=f"rms_norm autograd {dt} {shape} {name}: ")


def _kernels_ran(before: dict, pairs: list[tuple[str, str]]) -> None:
    from tpu_kernels.torch._native import native

    after = native().stats()["ops"]
    for op, kernel in pairs:
        ran = after[op]["kernels"].get(kernel, 0) - before.get(op, {}).get("kernels", {}).get(kernel, 0)
        assert ran == 1, (op, before.get(op), after[op])


@pytest.mark.parametrize("shape", GRAD_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dt", ["f32", "bf16", "f16"])
def test_swiglu_autograd(dt: str, shape: tuple[int, ...]) -> None:
    """`torch.ops.tpuk.swiglu` forward and backward (the `swiglu_backward` kernel) against f64
    autograd through the reference formula."""
    from tpu_kernels.torch import custom_ops
    from tpu_kernels.torch._native import native

    custom_ops()
    dtype = DTYPES[dt]
    g = _seed(f"swiglu-autograd-{dt}-{shape}")
    gate, up, grad = (t.to(dtype) for t in (_randn(g, shape, 3.0), _randn(g, shape), _randn(g, shape)))

    before = native().stats()["ops"]
    gk, uk = gate.clone().requires_grad_(), up.clone().requires_grad_()
    out = torch.ops.tpuk.swiglu(gk, uk)
    out.backward(grad)
    _kernels_ran(before, [("tpuk::swiglu.default", "swiglu"), ("tpuk::swiglu_backward.default", "swiglu_backward")])

    dgate, dup = _swiglu_grads(grad.double(), gate.double(), up.double(), swiglu_ref)
    ref_out = swiglu_ref(gate.double(), up.double())
    for name, actual, ref in [("out", out, ref_out), ("dgate", gk.grad, dgate), ("dup", uk.grad, dup)]:
        assert_close_to_reference(actual, ref, dtype, msg=f"swiglu autograd {dt} {shape} {name}: ")


@pytest.mark.parametrize("shape", CROSS_ENTROPY_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dt", ["f32", "bf16", "f16"])
def test_cross_entropy_autograd(dt: str, shape: tuple[int, int]) -> None:
    """`torch.ops.tpuk.cross_entropy` forward and backward (the `cross_entropy_backward` kernel,
    whose zero class-index gradient autograd drops) against f64 autograd of `F.cross_entropy`."""
    from tpu_kernels.torch import custom_ops
    from tpu_kernels.torch._native import native

    custom_ops()
    dtype = DTYPES[dt]
    n, c = shape
    g = _seed(f"cross_entropy-autograd-{dt}-{shape}")
    logits, grad = _randn(g, shape, 3.0).to(dtype), _randn(g, ()).to(dtype)
    target = _targets(g, n, c).long()

    before = native().stats()["ops"]
    lk = logits.clone().requires_grad_()
    out = torch.ops.tpuk.cross_entropy(lk, target)
    out.backward(grad)
    _kernels_ran(
        before,
        [("tpuk::cross_entropy.default", "cross_entropy"), ("tpuk::cross_entropy_backward.default", "cross_entropy_backward")],
    )
    assert target.grad is None

    dlogits, _ = _cross_entropy_grads(grad.double(), logits.double(), target)
    ref_out = F.cross_entropy(logits.double(), target)
    for name, actual, ref in [("out", out, ref_out), ("dlogits", lk.grad, dlogits)]:
        assert_close_to_reference(actual, ref, dtype, msg=f"cross_entropy autograd {dt} {shape} {name}: ")


# ----- dropout's RNG: determinism, statistics, and the NumPy reimplementation -----


def _dropout(x: torch.Tensor, seed: int, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    d = tk.Dispatcher(no_fallback=True)
    out, mask = tk.call("tpuk::dropout.default", x, torch.tensor(seed), p=p, dispatcher=d)
    assert d.stats()["ops"]["tpuk::dropout.default"]["kernels"] == {"dropout": 1}
    return out, mask


DROPOUT_N = 100_000


def test_dropout_mask_is_deterministic_per_seed() -> None:
    x = torch.ones(250, 400)
    a, b, c = (_dropout(x, s, 0.5)[1] for s in (7, 7, 8))
    assert a.dtype == torch.bool and torch.equal(a, b)
    assert not torch.equal(a, c)
    assert 0.4 < (a != c).float().mean().item() < 0.6  # different seeds: unrelated masks


def test_dropout_mask_is_independent_of_shape() -> None:
    """A function of (seed, flat index) only: the same elements in any shape get the same mask."""
    flat = _dropout(torch.ones(DROPOUT_N), 99, 0.3)[1]
    for shape in [(250, 400), (10, 100, 100), (DROPOUT_N, 1)]:
        assert torch.equal(_dropout(torch.ones(shape), 99, 0.3)[1].reshape(-1), flat), shape
    assert torch.equal(_dropout(torch.ones(1000), 99, 0.3)[1], flat[:1000])


@pytest.mark.parametrize("seed", [0, 1, 12345, -1, 2**40 + 3, -(2**62)])
@pytest.mark.parametrize("p", [0.1, 0.25, 0.5, 0.75])
def test_dropout_matches_numpy_hash_and_keep_fraction(seed: int, p: float) -> None:
    """Bit-for-bit the NumPy reimplementation of the hash; keep fraction within 4 sigma of 1-p."""
    mask = _dropout(torch.ones(DROPOUT_N), seed, p)[1]
    assert torch.equal(mask, dropout_mask_ref((DROPOUT_N,), seed, p))
    sigma = math.sqrt(p * (1 - p) / DROPOUT_N)
    assert abs(mask.double().mean().item() - (1 - p)) < 4 * sigma


@pytest.mark.parametrize("seed", [3, 2**33 + 1])
def test_dropout_uniforms_pass_chi_square(seed: int) -> None:
    """The masks at p = 1/4, 1/2, 3/4 split the uniforms into quarters (nested masks); their
    counts pass a chi-square test (3 degrees of freedom, 0.999 quantile 16.27); so do the 256
    buckets of the NumPy uniforms (255 dof, mean 255, sd 22.6: below 255 + 5 sd)."""
    x = torch.ones(DROPOUT_N)
    m25, m50, m75 = (_dropout(x, seed, p)[1] for p in (0.25, 0.5, 0.75))
    assert torch.all(m50 <= m25) and torch.all(m75 <= m50)  # nested: one uniform per element
    quarter = m25.long() + m50.long() + m75.long()
    counts = torch.bincount(quarter, minlength=4).double()
    expected = DROPOUT_N / 4
    assert ((counts - expected) ** 2 / expected).sum().item() < 16.27, counts
    import numpy as np

    buckets = np.bincount(dropout_bits(seed, DROPOUT_N) >> 16, minlength=256).astype(np.float64)
    e = DROPOUT_N / 256
    assert ((buckets - e) ** 2 / e).sum() < 255 + 5 * math.sqrt(2 * 255)


def test_dropout_output_is_exact_in_f32() -> None:
    g = _seed("dropout-exact")
    x = torch.randn(DROPOUT_N, generator=g)
    for p in [0.1, 0.3, 0.5]:
        out, mask = _dropout(x, 5, p)
        scale = torch.tensor(1.0 / (1.0 - p), dtype=torch.float32)  # 1/(1-p) rounded to f32
        assert torch.equal(out, x * mask * scale), p  # one f32 rounding of x * scale
        assert torch.allclose(out, x * mask / (1 - p), rtol=2**-23, atol=0)


def test_dropout_p0_keeps_everything_p1_drops_everything() -> None:
    x = torch.randn(1000, generator=_seed("dropout-p01"))
    out, mask = _dropout(x, 11, 0.0)
    assert bool(mask.all()) and torch.equal(out, x)
    out, mask = _dropout(x, 11, 1.0)
    assert not bool(mask.any()) and torch.equal(out, torch.zeros_like(x))


@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_dropout_16bit_output_dtype(dt: str) -> None:
    dtype = DTYPES[dt]
    x = torch.randn(64, 33, generator=_seed(f"dropout-{dt}")).to(dtype)
    out, mask = _dropout(x, 2, 0.2)
    assert out.dtype == dtype and mask.dtype == torch.bool
    assert torch.equal(mask, dropout_mask_ref((64, 33), 2, 0.2))
    assert torch.equal(out, (x.float() * mask / 0.8).to(dtype))


def test_adamw_step_matches_closed_form_and_leaves_borrowed_inputs() -> None:
    """The reference (torch.optim.AdamW) is the closed form; the call does not write its
    (borrowed) torch inputs, donation notwithstanding."""
    g = _seed("adamw-closed-form")
    p, grad, m = (_randn(g, (5, 7)) for _ in range(3))
    v = _randn(g, (5, 7)) ** 2
    lr, b1, b2, eps, wd, t = 1e-3, 0.9, 0.999, 1e-8, 1e-2, 10
    m1 = b1 * m + (1 - b1) * grad
    v1 = b2 * v + (1 - b2) * grad**2
    p1 = p * (1 - lr * wd) - lr * (m1 / (1 - b1**t)) / ((v1 / (1 - b2**t)).sqrt() + eps)
    for a, b in zip(adamw_ref(p, grad, m, v, torch.tensor(float(t))), (p1, m1, v1)):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-15)
    inputs = [t_.float() for t_ in (p, grad, m, v)] + [torch.tensor(float(t))]
    copies = [x.clone() for x in inputs]
    outs = tk.call("tpuk::adamw_step.default", *inputs, dispatcher=tk.Dispatcher(no_fallback=True))
    assert all(torch.equal(a, b) for a, b in zip(inputs, copies))
    for out, ref in zip(outs, (p1, m1, v1)):
        assert_close_to_reference(out, ref, torch.float32)


# ----- the harness itself -----


def test_every_standard_kernel_is_covered() -> None:
    """A new standard kernel cannot escape the harness: each one built into the package has
    cases, in each dtype it registers."""
    covered: dict[str, set[str]] = {}
    for c in CASES:
        covered.setdefault(c.kernel, set()).update(c.dtypes)
    for k in tk.kernels():
        if k["runtime"] or k["imported"]:
            continue
        assert k["name"] in covered, f"kernel `{k['name']}` has no numerics case"
        assert set(k["dtypes"]) <= covered[k["name"]], (k["name"], k["dtypes"], covered[k["name"]])


def test_tolerance_table_covers_tested_dtypes() -> None:
    assert set(DTYPES.values()) <= set(TOLERANCES)
    for rtol, atol in TOLERANCES.values():
        assert 0 < rtol < 0.01 and 0 < atol < 1e-3


def test_harness_rejects_a_wrong_reference() -> None:
    """The check can fail: silu's kernel output against sigmoid instead of silu."""
    x = torch.linspace(-4, 4, 257).to(torch.bfloat16)
    out = tk.call("aten::silu.default", x, dispatcher=tk.Dispatcher(no_fallback=True))[0]
    assert_close_to_reference(out, F.silu(x.double()))
    with pytest.raises(AssertionError, match="exceed rtol"):
        assert_close_to_reference(out, torch.sigmoid(x.double()))


@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_harness_tolerance_is_one_ulp(dt: str) -> None:
    """The rounded reference passes exactly; one ulp off passes; two ulps off fails."""
    dtype = DTYPES[dt]
    ref = torch.linspace(0.3, 7.7, 101, dtype=torch.float64)
    rounded = ref.to(dtype)
    assert reference_errors(rounded, ref)["max_abs"] == 0.0
    assert_close_to_reference(_next(rounded), ref)
    with pytest.raises(AssertionError):
        assert_close_to_reference(_next(_next(rounded)), ref)


def _next(t: torch.Tensor) -> torch.Tensor:
    """The next representable value above each (positive) element, in t's dtype."""
    bits = t.view(torch.int16) + 1
    return bits.view(t.dtype)


def test_harness_flags_nan() -> None:
    ref = torch.ones(4, dtype=torch.float64)
    bad = torch.tensor([1.0, float("nan"), 1.0, 1.0])
    with pytest.raises(AssertionError, match="1 of 4"):
        assert_close_to_reference(bad, ref)


def _report() -> None:
    """Prints the largest kernel and eager errors per kernel x dtype (for the tolerance table)."""
    rows: dict[tuple[str, str], dict[str, float]] = {}
    for c in CASES:
        for dt in c.dtypes:
            for r in run_case(c, dt):
                row = rows.setdefault((c.kernel, dt), {"k_abs": 0.0, "k_ratio": 0.0, "e_abs": 0.0, "e_ratio": 0.0})
                row["k_abs"] = max(row["k_abs"], r["kernel"]["max_abs"])
                row["k_ratio"] = max(row["k_ratio"], r["kernel"]["ratio"])
                row["e_abs"] = max(row["e_abs"], r["eager"]["max_abs"])
                row["e_ratio"] = max(row["e_ratio"], r["eager"]["ratio"])
    print(f"{'kernel':<18} {'dtype':<5} {'kernel max_abs':>14} {'ratio':>6} {'eager max_abs':>14} {'ratio':>6}")
    for (kernel, dt), row in rows.items():
        print(
            f"{kernel:<18} {dt:<5} {row['k_abs']:>14.3g} {row['k_ratio']:>6.2f} "
            f"{row['e_abs']:>14.3g} {row['e_ratio']:>6.2f}"
        )


if __name__ == "__main__":
    _report()
