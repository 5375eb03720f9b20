"""PyTorch implementations of the standard kernels' new ops (`tpuk::*`), for calls no kernel
takes (a dtype, shape or static value its guards refuse, a kernel-side error).

A new op has no PyTorch implementation of its own, so without these such a call could only
raise. Each function takes the op's tensors in the kernel's order and its statics by name, and
returns what the kernel returns; like the kernels, it computes in f32 for 16-bit inputs and
rounds once.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

# The epilogues of `tpuk::matmul_act` / `tpuk::matmul_bias_act`, by their `act` static.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda y: y,
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
    "silu": F.silu,
}


def _up(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation `{name}` (known: {', '.join(ACTIVATIONS)})") from None


def rms_norm(x, weight, eps=1e-6):
    xf = _up(x)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * _up(weight)).to(x.dtype)


def matmul_bias_act(x, weight, bias, activation="none"):
    return _activation(activation)(_up(x) @ _up(weight) + _up(bias)).to(x.dtype)


def matmul_act(x, weight, activation="none"):
    return _activation(activation)(_up(x) @ _up(weight)).to(x.dtype)


def swiglu(gate, up):
    _same_shape("swiglu", gate=gate, up=up)
    g = _up(gate)
    return (F.silu(g) * _up(up)).to(gate.dtype)


def cross_entropy(logits, target):
    """Mean over rows of `-log_softmax(logits)[i, target[i]]`; a target outside `0..C` selects
    no class (its row adds 0 and still counts), as the kernel."""
    logp = torch.log_softmax(_up(logits), 1)
    hot = target[:, None] == torch.arange(logits.shape[1])[None, :]
    return -(torch.where(hot, logp, 0.0).sum(1).mean()).to(logits.dtype)


def rotary(x, cos, sin):
    half = x.shape[-1] // 2
    xf = _up(x)
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = _up(cos)[None, :, None, :], _up(sin)[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def adamw_step(param, grad, exp_avg, exp_avg_sq, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2):
    p, g, m, v = (_up(t) for t in (param, grad, exp_avg, exp_avg_sq))
    t = max(float(step), 1.0)
    v = v.clamp_min(0.0)
    p = p * (1.0 - lr * weight_decay)
    m = m * beta1 + g * (1.0 - beta1)
    v = v * beta2 + g * g * (1.0 - beta2)
    bc1 = -math.expm1(t * math.log(beta1))
    bc2 = -math.expm1(t * math.log(beta2))
    p = p - m / (v.sqrt() / math.sqrt(bc2) + eps) * (lr / bc1)
    return p.to(param.dtype), m.to(param.dtype), v.to(param.dtype)


_M32 = 0xFFFFFFFF


def _mul32(h: torch.Tensor, c: int) -> torch.Tensor:
    """`h * c mod 2^32` for int64 `h` in `[0, 2^32)`, without int64 overflow."""
    lo = h * (c & 0xFFFF)
    hi = ((h * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def dropout(x, seed, p=0.1):
    """The kernel's counter-based RNG (see `tpuk::dropout`), in int64 arithmetic."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p = {p} is not a probability in [0, 1]")
    s = int(seed) % 2**64
    lo, hi = torch.tensor(s & _M32), torch.tensor(s >> 32)
    key = _fmix32(_fmix32(lo ^ 0x9E3779B9) ^ hi)
    bits = _fmix32(torch.arange(x.numel(), dtype=torch.int64) ^ key) >> 8
    threshold = math.ceil(p * 2**24)
    keep = (bits >= threshold).reshape(x.shape)
    scale = 1.0 / (1.0 - p) if p < 1.0 else 0.0
    return torch.where(keep, _up(x) * scale, 0.0).to(x.dtype), keep


def _scale(scale: float, e: int) -> float:
    """The kernels' `scale`: -0 (the default) stands for PyTorch's None, 1/sqrt(E)."""
    return 1.0 / math.sqrt(e) if scale == 0.0 and math.copysign(1.0, scale) < 0 else scale


def _softmax(s: torch.Tensor) -> torch.Tensor:
    """Softmax along the keys, 0 for a row every key of which is masked out (as the kernels and
    PyTorch's CPU flash attention)."""
    m = s.amax(-1, keepdim=True)
    e = (s - torch.where(m == -math.inf, 0.0, m)).exp()
    l = e.sum(-1, keepdim=True)
    return e / torch.where(l == 0, 1.0, l)


def attention(query, key, value, mask, is_causal=False, scale=-0.0):
    q, k, v = _up(query), _up(key), _up(value)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * _scale(scale, q.shape[-1]) + _up(mask)
    if is_causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        s = s.masked_fill(~keep, -math.inf)
    return (_softmax(s) @ v).to(query.dtype)


# The backward references are written out, not autograd of the forwards: they run where a
# dispatch mode handed the call back, below autograd.


def _same_shape(op: str, **tensors: torch.Tensor) -> None:
    shapes = {name: list(t.shape) for name, t in tensors.items()}
    if len({tuple(v) for v in shapes.values()}) > 1:
        raise ValueError(f"{op}: " + ", ".join(f"{k} {v}" for k, v in shapes.items()) + " differ in shape")


def rms_norm_backward(grad, x, weight, eps=1e-6):
    _same_shape("rms_norm_backward", grad=grad, x=x)
    g, xf, w = _up(grad), _up(x), _up(weight)
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    gw = g * w
    dx = r * gw - xf * r.pow(3) * (gw * xf).mean(-1, keepdim=True)
    dw = (g * xf * r).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)


def swiglu_backward(grad, gate, up):
    _same_shape("swiglu_backward", grad=grad, gate=gate, up=up)
    g, x, u = _up(grad), _up(gate), _up(up)
    s = torch.sigmoid(x)
    return (g * u * s * (1 + x * (1 - s))).to(gate.dtype), (g * x * s).to(up.dtype)


def cross_entropy_backward(grad, logits, target):
    if grad.numel() != 1:
        raise ValueError(f"grad of shape {list(grad.shape)} is not the gradient of a scalar")
    lf = _up(logits)
    hot = (target[:, None] == torch.arange(logits.shape[1])[None, :]).to(lf.dtype)
    # A row whose target selects no class adds a constant 0 to the loss: its gradient is 0.
    found = hot.sum(1, keepdim=True)
    d = (torch.softmax(lf, 1) * found - hot) * (_up(grad).reshape(()) / logits.shape[0])
    return d.to(logits.dtype), torch.zeros_like(target)


def attention_backward(grad, query, key, value, mask, is_causal=False, scale=-0.0):
    q, k, v, g = _up(query), _up(key), _up(value), _up(grad)
    group = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = _scale(scale, q.shape[-1])
    s = q @ kr.transpose(-1, -2) * scale + _up(mask)
    if is_causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        s = s.masked_fill(~keep, -math.inf)
    p = _softmax(s)
    dv = p.transpose(-1, -2) @ g
    dp = g @ vr.transpose(-1, -2)
    ds = p * (dp - (g * (p @ vr)).sum(-1, keepdim=True))
    dq = ds @ kr * scale
    dk = ds.transpose(-1, -2) @ q * scale

    def fold(t):  # [B, H, S, E] summed over each key/value head's query group
        b, _, n, e = t.shape
        return t.reshape(b, k.shape[1], group, n, e).sum(2)

    # The mask's gradient: `ds` summed over the dimensions the mask was broadcast along.
    lead = ds.dim() - mask.dim()
    dmask = ds.sum(tuple(range(lead))) if lead else ds
    dims = tuple(i for i, n in enumerate(mask.shape) if n == 1 and dmask.shape[i] != 1)
    dmask = dmask.sum(dims, keepdim=True) if dims else dmask
    return dq.to(query.dtype), fold(dk).to(key.dtype), fold(dv).to(value.dtype), dmask.to(mask.dtype)


REFERENCES: dict[str, Callable] = {
    "tpuk::rms_norm.default": rms_norm,
    "tpuk::rms_norm_backward.default": rms_norm_backward,
    "tpuk::matmul_bias_act.default": matmul_bias_act,
    "tpuk::matmul_act.default": matmul_act,
    "tpuk::swiglu.default": swiglu,
    "tpuk::swiglu_backward.default": swiglu_backward,
    "tpuk::cross_entropy.default": cross_entropy,
    "tpuk::cross_entropy_backward.default": cross_entropy_backward,
    "tpuk::rotary.default": rotary,
    "tpuk::adamw_step.default": adamw_step,
    "tpuk::dropout.default": dropout,
    "tpuk::attention.default": attention,
    "tpuk::attention_backward.default": attention_backward,
}
