"""Writes BENCHMARKS.md (tables) and BENCHMARKS.png (plot): the whole benchmark report in one run.

    scripts/dev bench                      # set up, then run this script
    python python/tools/benchmarks.py     # after eval "$(scripts/dev env)"
    python python/tools/benchmarks.py --quick --only silu,dropout --benches torch --out /tmp/B.md

Every number in the report comes from this one invocation. Its header names the commit
(`git rev-parse HEAD`) and says DIRTY, loudly, when anything besides BENCHMARKS.md/.png is
modified or untracked (and not ignored) at the start or the end; such a report is not to be
committed. A warning goes to stderr too.

Sections:

1. Every registered kernel (``tpu_kernels.kernels()``) at a realistic size (1024x4096 rows),
   run through the dispatch API on torch tensors (``tk.call``) on the PJRT CPU plugin vs the
   same work in PyTorch eager on CPU (outputs compared; a row whose eager side does other work
   is labelled so and left out of the speed-up summary); effective GB/s (bytes read + written /
   median time) against a memcpy of the same traffic: the faster of torch's ``dst.copy_(src)``
   and a numpy copy split over one thread per CPU, both timed in the same loop. Medians of
   repeated, interleaved runs, with min and max; compiles are excluded (warm-up).
2. The existing benchmarks, run and their printed summaries parsed: ``cargo bench`` ``emit``
   (tpu-kernels), ``pjrt``, ``registry``, ``cache`` (tpu-kernels-registry) with short criterion
   settings, ``python/tools/bench_torch.py`` and ``python/tools/import_timing.py``. Output that
   does not have the expected form is reported as "not parsed" (with its tail), never a crash.
   Every stated target gets MET or MISSED (also gathered in a table at the top); paths that
   bench_torch.py found NOT OURS are listed, and make the exit status 1 (the report is still
   written). Cited numbers from elsewhere are kept apart from the measured tables.
3. The hand-kept before-and-after log, ``docs/perf-log.md``, last, marked as not this run.

Progress goes to stderr. The report is written atomically (temp file + rename).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata as md
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Imported before anything imports torch, as a user would: tpu_kernels then shortens the spin of
# torch's OpenMP workers (tpu_kernels._openmp; the report's machine table records the setting).
# The subprocess benchmarks inherit the setting through the environment.
import tpu_kernels

ROOT = Path(__file__).resolve().parents[2]
CRITERION_ARGS = ["--warm-up-time", "0.5", "--measurement-time", "1", "--sample-size", "10", "--noplot"]
START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[benchmarks {time.perf_counter() - START:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# 1. Kernels: PJRT CPU plugin (tk.call) vs PyTorch eager
# ---------------------------------------------------------------------------------------------

R, C = 1024, 4096  # rows x columns of the main input, as kernel_lib/benches/emit.rs
ATTN = (4, 8, 512, 64)  # attention's [B, H, L, E]
ATT = ",".join(map(str, ATTN))
ATT_LSE = ",".join(map(str, ATTN[:3]))


@dataclass
class Case:
    op: str
    shape: str  # for the table
    make: Callable[[], list[Any]]  # inputs
    eager: Callable[..., Any] | None  # the PyTorch eager equivalent
    statics: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    # How the eager side's work differs from the kernel's ("" when it is the same work): such a
    # row is labelled "different work" and left out of the speed-up summary.
    different_work: str = ""
    check: bool = True  # compare outputs with eager


_M32 = 0xFFFFFFFF


def _i32(c: int) -> int:
    """A u32 constant as the int32 of the same bits."""
    return c - (1 << 32) if c >= 1 << 31 else c


def _fmix32_int(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def _fmix32_(h: Any) -> Any:
    """murmur3's fmix32 in place on an int32 tensor holding u32 bits: multiplies wrap, and each
    right shift is masked to be logical."""
    for shift, mul in ((16, 0x85EBCA6B), (13, 0xC2B2AE35), (16, None)):
        h ^= (h >> shift).bitwise_and_((1 << (32 - shift)) - 1)
        if mul is not None:
            h *= _i32(mul)
    return h


def dropout_eager(x: Any, seed: Any, p: float) -> tuple[Any, Any]:
    """`tpuk::dropout` in eager PyTorch, the same work as the kernel: its counter-based RNG
    (kernel_lib/src/kernels.rs, `dropout`) on int32 tensors, `key` from the seed as a scalar.
    `tpu_kernels.torch._references.dropout` is the exact reference (int64 arithmetic that never
    overflows); this is the fast form, checked against the kernel's outputs in every run."""
    import torch

    s = int(seed) % 2**64
    key = _fmix32_int(_fmix32_int((s & _M32) ^ 0x9E3779B9) ^ (s >> 32))
    h = torch.arange(x.numel(), dtype=torch.int32).view(x.shape)
    h ^= _i32(key)
    bits = _fmix32_(h).__irshift__(8).bitwise_and_(0xFFFFFF)
    keep = bits >= math.ceil(p * 2**24)
    scale = 1.0 / (1.0 - p) if p < 1.0 else 0.0
    return torch.where(keep, x * scale, 0.0), keep


def _cases() -> dict[str, Case]:
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)

    def rn(*shape: int, scale: float = 1.0) -> Any:
        return torch.randn(*shape, generator=g) * scale

    def rms_bwd(grad: Any, x: Any, w: Any, eps: float = 1e-6) -> Any:
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        gw = grad * w
        dx = r * gw - x * r.pow(3) * (gw * x).mean(-1, keepdim=True)
        return dx, (grad * x * r).sum(0)

    def swiglu_bwd(grad: Any, gate: Any, up: Any) -> Any:
        s = torch.sigmoid(gate)
        return grad * up * s * (1 + gate * (1 - s)), grad * gate * s

    def ce_bwd(grad: Any, logits: Any, target: Any) -> Any:
        p = torch.softmax(logits, -1)
        p[torch.arange(logits.shape[0]), target] -= 1
        return p * (grad / logits.shape[0]), torch.zeros_like(target)

    def rotary(x: Any, cos: Any, sin: Any) -> Any:
        x1, x2 = x.chunk(2, -1)
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)

    def adamw(p: Any, grad: Any, m: Any, v: Any, step: Any) -> Any:
        lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 1e-2
        m = b1 * m + (1 - b1) * grad
        v = b2 * v + (1 - b2) * grad * grad
        denom = (v / (1 - b2**step)).sqrt() + eps
        return p * (1 - lr * wd) - lr * (m / (1 - b1**step)) / denom, m, v

    def causal_mask() -> Any:
        n = ATTN[2]
        return torch.zeros(n, n).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))

    def flash_saved(causal: bool, mask: Any = None) -> list[Any]:
        """The backward's inputs: a gradient, q, k, v, and the forward's saved out and
        logsumexp (for the same mask), then the mask if any."""
        q, k, v = rn(*ATTN), rn(*ATTN), rn(*ATTN)
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=mask)
        return [rn(*ATTN), q, k, v, o.contiguous(), lse.contiguous()] + ([] if mask is None else [mask])

    def ln_saved() -> list[Any]:
        x, w, b = rn(R, C), rn(C), rn(C)
        _, mean, rstd = torch.native_layer_norm(x, [C], w, b, 1e-5)
        return [rn(R, C), x, mean, rstd, w, b]

    tgt = lambda: torch.randint(0, C, (R,), generator=g)  # noqa: E731
    x2 = f"f32[{R},{C}]"
    return {
        "gelu": Case("aten::gelu", x2, lambda: [rn(R, C)], F.gelu, {"approximate": "none"}),
        "gelu_tanh": Case(
            "aten::gelu", x2, lambda: [rn(R, C)], lambda x: F.gelu(x, approximate="tanh"), {"approximate": "tanh"}
        ),
        "silu": Case("aten::silu", x2, lambda: [rn(R, C)], F.silu),
        "softmax": Case(
            "aten::_softmax", x2, lambda: [rn(R, C)], lambda x: torch.softmax(x, -1), {"dim": -1, "half_to_float": False}
        ),
        "log_softmax": Case(
            "aten::_log_softmax",
            x2,
            lambda: [rn(R, C)],
            lambda x: torch.log_softmax(x, -1),
            {"dim": -1, "half_to_float": False},
        ),
        "layer_norm": Case(
            "aten::native_layer_norm",
            f"{x2}, f32[{C}] x2",
            lambda: [rn(R, C), rn(C), rn(C)],
            lambda x, w, b: torch.native_layer_norm(x, [C], w, b, 1e-5),
            {"eps": 1e-5},
        ),
        "rms_norm": Case(
            "tpuk::rms_norm",
            f"{x2}, f32[{C}]",
            lambda: [rn(R, C), rn(C)],
            lambda x, w: F.rms_norm(x, (C,), w, 1e-6),
            {"eps": 1e-6},
        ),
        "rms_norm_backward": Case(
            "tpuk::rms_norm_backward",
            f"{x2} x2, f32[{C}]",
            lambda: [rn(R, C), rn(R, C), rn(C)],
            rms_bwd,
            {"eps": 1e-6},
            "eager: the formula in ATen ops",
        ),
        "swiglu": Case("tpuk::swiglu", f"{x2} x2", lambda: [rn(R, C), rn(R, C)], lambda a, b: F.silu(a) * b),
        "swiglu_backward": Case(
            "tpuk::swiglu_backward",
            f"{x2} x3",
            lambda: [rn(R, C), rn(R, C), rn(R, C)],
            swiglu_bwd,
            note="eager: the formula in ATen ops",
        ),
        "cross_entropy": Case(
            "tpuk::cross_entropy", f"{x2}, i64[{R}]", lambda: [rn(R, C), tgt()], F.cross_entropy
        ),
        "cross_entropy_backward": Case(
            "tpuk::cross_entropy_backward",
            f"f32[], {x2}, i64[{R}]",
            lambda: [torch.tensor(1.0), rn(R, C), tgt()],
            ce_bwd,
            note="eager: softmax - one_hot, scaled",
        ),
        # emit.rs's scaling of the canonical f32[8,64] @ f32[64,128]: 64 -> 4096, 8 -> 1024.
        "matmul_bias_act": Case(
            "tpuk::matmul_bias_act",
            f"{x2} @ f32[{C},128] + f32[128], gelu",
            lambda: [rn(R, C), rn(C, 128, scale=C**-0.5), rn(128)],
            lambda x, w, b: F.gelu(torch.addmm(b, x, w)),
            {"activation": "gelu"},
            "compute-bound: GB/s is not its limit",
        ),
        "adamw_step": Case(
            "tpuk::adamw_step",
            f"{x2} x4, f32[]",
            lambda: [rn(R, C), rn(R, C), rn(R, C), rn(R, C).abs(), torch.tensor(10.0)],
            adamw,
            note="eager: the AdamW update in ATen ops",
        ),
        # Not F.dropout: torch's RNG is other work. The kernel's own RNG in eager ops instead, so
        # the outputs are compared element for element.
        "dropout": Case(
            "tpuk::dropout",
            f"{x2}, i64[]",
            lambda: [rn(R, C), torch.tensor(1234)],
            lambda x, seed: dropout_eager(x, seed, 0.1),
            {"p": 0.1},
            "eager: the kernel's counter-based RNG in torch int32 ops (wrapping multiplies, masked logical "
            "shifts), not F.dropout's RNG",
        ),
        # Attention at [B, H, L, E] = [4, 8, 512, 64], causal.
        "sdpa_flash_cpu": Case(
            "aten::_scaled_dot_product_flash_attention_for_cpu",
            f"f32[{ATT}] x3, causal",
            lambda: [rn(*ATTN), rn(*ATTN), rn(*ATTN)],
            lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True),
            {"is_causal": True},
            "compute-bound: GB/s is not its limit",
        ),
        "sdpa_flash_cpu_masked": Case(
            "aten::_scaled_dot_product_flash_attention_for_cpu",
            f"f32[{ATT}] x3, f32[{ATTN[2]},{ATTN[2]}] mask",
            lambda: [rn(*ATTN), rn(*ATTN), rn(*ATTN), rn(ATTN[2], ATTN[2])],
            lambda q, k, v, m: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=m),
            note="compute-bound: GB/s is not its limit",
        ),
        "sdpa_flash_cpu_backward": Case(
            "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
            f"f32[{ATT}] x5, f32[{ATT_LSE}], causal",
            lambda: flash_saved(True),
            lambda g_, q, k, v, o, lse: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                g_, q, k, v, o, lse, 0.0, True
            ),
            {"is_causal": True},
            "compute-bound: GB/s is not its limit",
        ),
        "sdpa_flash_cpu_masked_backward": Case(
            "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
            f"f32[{ATT}] x5, f32[{ATT_LSE}], f32[{ATTN[2]},{ATTN[2]}] mask",
            lambda: flash_saved(False, rn(ATTN[2], ATTN[2])),
            lambda g_, q, k, v, o, lse, m: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                g_, q, k, v, o, lse, 0.0, False, attn_mask=m
            ),
            note="compute-bound: GB/s is not its limit",
        ),
        "attention_backward": Case(
            "tpuk::attention_backward",
            f"f32[{ATT}] x4, f32[{ATTN[2]},{ATTN[2]}] mask, causal",
            lambda: [rn(*ATTN), rn(*ATTN), rn(*ATTN), rn(*ATTN), rn(ATTN[2], ATTN[2])],
            None,
            {"is_causal": True},
            "PJRT only (PyTorch has no op giving the mask's gradient)",
        ),
        "attention": Case(
            "tpuk::attention",
            f"f32[{ATT}] x3, f32[{ATTN[2]},{ATTN[2]}] mask, causal",
            lambda: [rn(*ATTN), rn(*ATTN), rn(*ATTN), rn(ATTN[2], ATTN[2])],
            lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m + causal_mask()),
            {"is_causal": True},
            "eager: F.scaled_dot_product_attention with the causal mask added",
        ),
        "softmax_backward": Case(
            "aten::_softmax_backward_data",
            f"{x2} x2",
            lambda: [rn(R, C), torch.softmax(rn(R, C), -1)],
            lambda g_, y: torch._softmax_backward_data(g_, y, -1, y.dtype),
            {"dim": -1, "input_dtype": "float32"},
        ),
        "log_softmax_backward": Case(
            "aten::_log_softmax_backward_data",
            f"{x2} x2",
            lambda: [rn(R, C), torch.log_softmax(rn(R, C), -1)],
            lambda g_, y: torch._log_softmax_backward_data(g_, y, -1, y.dtype),
            {"dim": -1, "input_dtype": "float32"},
        ),
        "layer_norm_backward": Case(
            "aten::native_layer_norm_backward",
            f"{x2} x2, f32[{R},1] x2, f32[{C}] x2",
            lambda: ln_saved(),
            lambda g_, x, mean, rstd, w, b: torch.ops.aten.native_layer_norm_backward(
                g_, x, [C], mean, rstd, w, b, [True, True, True]
            ),
        ),
        "matmul_act": Case(
            "tpuk::matmul_act",
            f"{x2} @ f32[{C},128], gelu_tanh",
            lambda: [rn(R, C), rn(C, 128, scale=C**-0.5)],
            lambda x, w: F.gelu(x @ w, approximate="tanh"),
            {"activation": "gelu_tanh"},
            "compute-bound: GB/s is not its limit",
        ),
        "rotary": Case(
            "tpuk::rotary",
            "f32[4,1024,8,128], f32[1024,64] x2",
            lambda: [rn(4, 1024, 8, 128), rn(1024, 64), rn(1024, 64)],
            rotary,
        ),
    }


def _generic_case(k: dict[str, Any]) -> Case | None:
    """A kernel with no entry in `_cases`: its first canonical signature whose first input has
    rank 2, scaled as emit.rs does (columns -> 4096, rows -> 1024); timed on PJRT only."""
    import torch

    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "i64": torch.int64,
              "i32": torch.int32, "f64": torch.float64}
    types = {name: kind for name, kind, *_ in k.get("statics", [])}
    for canon in k.get("canonical", []):
        sig, _, st = canon.partition(";")
        tensors = re.findall(r"(\w+)\[([\d,]*)\]", sig)
        if not tensors:
            continue
        shapes = [[int(d) for d in dims.split(",") if d] for _, dims in tensors]
        if len(shapes[0]) != 2 or any(dt not in dtypes for dt, _ in tensors):
            continue
        rows, cols = shapes[0]
        shapes = [[C if d == cols else R if d == rows else d for d in sh] for sh in shapes]
        statics: dict[str, Any] = {}
        for kv in filter(None, (x.strip() for x in st.split(","))):
            key, _, val = kv.partition("=")
            kind = types.get(key.strip(), "str")
            statics[key.strip()] = {"float": float, "int": int, "bool": lambda v: v == "true"}.get(kind, str)(val.strip())

        def make(tensors: Any = tensors, shapes: Any = shapes) -> list[Any]:
            out = []
            for (dt, _), sh in zip(tensors, shapes, strict=True):
                t = dtypes[dt]
                out.append(torch.randint(0, min(sh or [2]), sh, dtype=t) if not t.is_floating_point
                           else torch.randn(*sh).to(t))
            return out

        shape = ", ".join(f"{dt}[{','.join(map(str, sh))}]" for (dt, _), sh in zip(tensors, shapes, strict=True))
        return Case(k["ops"][0].removesuffix(".default"), shape, make, None, statics,
                    "no PyTorch equivalent in benchmarks.py: PJRT only, size from its canonical signature")
    return None


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _time_ms(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def _stats(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


class Memcpy:
    """The memcpy baseline: the faster of torch's `dst.copy_(src)` (torch's own threads) and
    `numpy.copyto` split in one chunk per CPU over as many Python threads (numpy releases the
    GIL), each moving the same bytes (half read, half written). Both are timed in the same
    interleaved loop as the kernel, so drift on a noisy machine hits all of them."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.threads = os.cpu_count() or 1
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="memcpy")

    def fns(self, nbytes: int) -> tuple[int, Callable[[], Any], Callable[[], Any]]:
        """(bytes moved, torch copy, threaded numpy copy) for a copy of `nbytes // 2` bytes."""
        import numpy as np
        import torch

        half = max(nbytes // 2 // 4, 1)
        src, dst = torch.randn(half), torch.empty(half)
        s, d = src.numpy(), dst.numpy()
        step = -(-half // self.threads)
        chunks = [(d[i : i + step], s[i : i + step]) for i in range(0, half, step)]

        def threaded() -> None:
            for f in [self.pool.submit(np.copyto, dc, sc) for dc, sc in chunks]:
                f.result()

        return 2 * half * 4, lambda: dst.copy_(src), threaded

    def close(self) -> None:
        self.pool.shutdown()


def _compare(outs: list[Any], ref: list[Any]) -> tuple[float, int, int, str]:
    """Outputs against eager's: (max |difference| over floating outputs, number of differing
    elements in the other outputs, how many such outputs, how the outputs differ in kind)."""
    if len(outs) != len(ref):
        return math.nan, 0, 0, f"eager returns {len(ref)} outputs, the kernel {len(outs)}"
    diffs, mismatches, compared = [], 0, 0
    for i, (o, r) in enumerate(zip(outs, ref, strict=True)):
        if r is None or not hasattr(r, "shape"):
            return math.nan, 0, 0, f"eager's output {i} is not a tensor"
        if o.shape != r.shape:
            return math.nan, 0, 0, f"output {i}: the kernel's is {list(o.shape)}, eager's {list(r.shape)}"
        if not o.numel():
            continue
        if o.is_floating_point() and r.is_floating_point():
            diffs.append((o.double() - r.double()).abs().max().item())
        else:
            mismatches += int((o != r).sum().item())
            compared += 1
    return (max(diffs) if diffs else math.nan), mismatches, compared, ""


def bench_kernels(repeats: int, warmup: int, only: set[str] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import torch

    import tpu_kernels as tk

    d = tk.Dispatcher()
    cases = _cases()
    memcpy = Memcpy()
    rows: list[dict[str, Any]] = []
    for k in tk.kernels():
        name = k["name"]
        if only is not None and name not in only:
            continue
        row: dict[str, Any] = {"kernel": name}
        rows.append(row)
        case = cases.get(name)
        if case is None:
            try:
                case = _generic_case(k)
            except Exception as e:
                log(f"kernel {name}: no generic case: {type(e).__name__}: {e}")
        if case is None:
            row["error"] = "no benchmark size in benchmarks.py and no rank-2 canonical signature"
            log(f"kernel {name}: skipped (no case)")
            continue
        row.update(op=case.op, shape=case.shape, note=case.note, different_work=case.different_work)
        try:
            args = case.make()
            tk_fn = lambda: tk.call(case.op, *args, dispatcher=d, **case.statics)  # noqa: E731
            eager = case.eager
            eager_fn = (lambda: eager(*args)) if eager else (lambda: None)  # noqa: E731
            t0 = time.perf_counter()
            outs = tk_fn()  # compiles
            row["first_call_ms"] = (time.perf_counter() - t0) * 1e3
            ref = _as_list(eager_fn())
            if case.check and eager:
                diff, mismatches, compared, kind = _compare(outs, ref)
                row["max_abs_diff"], row["mismatches"], row["integer_outputs"] = diff, mismatches, compared
                if kind and not row["different_work"]:
                    row["different_work"] = kind
            nbytes = sum(a.numel() * a.element_size() for a in args) + sum(
                o.numel() * o.element_size() for o in outs
            )
            row["bytes"] = nbytes
            copy_bytes, copy_fn, threaded_fn = memcpy.fns(nbytes)
            del outs, ref
            for _ in range(warmup):
                tk_fn(), eager_fn(), copy_fn(), threaded_fn()
            tk_t, eager_t, copy_t, threaded_t = [], [], [], []
            for _ in range(repeats):  # interleaved, so drift on a noisy machine hits all four
                tk_t.append(_time_ms(tk_fn))
                eager_t.append(_time_ms(eager_fn))
                copy_t.append(_time_ms(copy_fn))
                threaded_t.append(_time_ms(threaded_fn))
            row["pjrt"], row["eager"] = _stats(tk_t), _stats(eager_t)
            row["memcpy_torch"], row["memcpy_threads"] = _stats(copy_t), _stats(threaded_t)
            torch_faster = row["memcpy_torch"][0] <= row["memcpy_threads"][0]
            row["memcpy"] = row["memcpy_torch"] if torch_faster else row["memcpy_threads"]
            row["memcpy_by"] = "copy_" if torch_faster else "threads"
            row["pjrt_gbs"] = nbytes / (row["pjrt"][0] * 1e-3) / 1e9
            if eager:
                row["eager_gbs"] = nbytes / (row["eager"][0] * 1e-3) / 1e9
            else:
                del row["eager"]
            for key in ("memcpy", "memcpy_torch", "memcpy_threads"):
                row[f"{key}_gbs"] = copy_bytes / (row[key][0] * 1e-3) / 1e9
            eager_ms = f"{row['eager'][0]:.2f} ms" if eager else "n/a"
            log(
                f"kernel {name}: PJRT {row['pjrt'][0]:.2f} ms, eager {eager_ms}, memcpy {row['memcpy'][0]:.2f} ms"
                f" ({row['memcpy_by']}; copy_ {row['memcpy_torch'][0]:.2f} ms,"
                f" {memcpy.threads} threads {row['memcpy_threads'][0]:.2f} ms)"
            )
            if row.get("mismatches"):
                log(f"kernel {name}: {row['mismatches']} output elements differ from eager's")
        except Exception as e:  # report, do not crash the whole report
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            log(f"kernel {name}: FAILED {row['error']}")
    memcpy.close()
    info = {"torch_threads": torch.get_num_threads(), "copy_threads": memcpy.threads, "repeats": repeats, "warmup": warmup}
    return rows, info


# ---------------------------------------------------------------------------------------------
# 2. The existing benchmarks, run and parsed
# ---------------------------------------------------------------------------------------------


@dataclass
class Run:
    title: str
    cmd: list[str]
    key: str = ""  # the name `--benches` selects it by
    rc: int | None = None
    out: str = ""
    stdout: str = ""
    seconds: float = 0.0
    tables: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)  # caption, header, rows
    notes: list[str] = field(default_factory=list)
    cited: list[str] = field(default_factory=list)  # numbers from elsewhere, never measured here
    targets: list[list[str]] = field(default_factory=list)  # measurement, value, target, MET/MISSED
    not_ours: list[str] = field(default_factory=list)  # timed paths whose kernels did not run
    markdown: list[str] = field(default_factory=list)  # a section the benchmark wrote itself


def run_cmd(run: Run, timeout: float) -> Run:
    log(f"running: {shlex.join(run.cmd)}")
    t = time.perf_counter()
    try:
        p = subprocess.run(
            run.cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, "NO_COLOR": "1"}
        )
        run.rc, run.out = p.returncode, p.stdout + ("\n" + p.stderr if p.returncode else "")
        run.stdout = p.stdout
    except subprocess.TimeoutExpired as e:
        run.rc = None
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        run.out = out + f"\n(timed out after {timeout:.0f} s)"
        run.stdout = out
    except OSError as e:
        run.rc, run.out, run.stdout = 127, str(e), ""
    run.seconds = time.perf_counter() - t
    log(f"  done in {run.seconds:.1f} s (exit {run.rc})")
    return run


NUM = r"-?\d+(?:\.\d+)?"
TARGET = re.compile(rf"(<=|>=|~)\s*({NUM})\s*([^\s:;)]*)")


def verdict(value: float, target: str) -> str:
    """MET or MISSED for `value` against a target written `<= N unit`, `>= N unit` or `~N unit`
    (about N: read as at most N), `value` in the target's unit."""
    m = TARGET.search(target)
    if not m:
        raise ValueError(f"target {target!r} is not of the form '<= N', '>= N' or '~N'")
    bound = float(m.group(2))
    return "MET" if (value >= bound if m.group(1) == ">=" else value <= bound) else "MISSED"


def _target(run: Run, measurement: str, value: float, unit: str, target: str) -> str:
    """Records a target row of `run`, returns its verdict."""
    v = verdict(value, target)
    run.targets.append([measurement, f"{value:g} {unit}".strip(), target, v])
    return v


def _after(lines: list[str], marker: str) -> list[str]:
    for i, line in enumerate(lines):
        if marker in line:
            return lines[i + 1 :]
    return []


def parse_criterion(run: Run) -> None:
    """Criterion's own estimates: `name  time: [low est high]`."""
    rows, prev = [], ""
    for line in run.stdout.splitlines():
        m = re.match(r"^(\S.*?)?\s*time:\s+\[(\S+ \S+) (\S+ \S+) (\S+ \S+)\]", line)
        if m:
            name = (m.group(1) or prev).strip()
            rows.append([name, m.group(3), m.group(2), m.group(4)])
        elif line.strip() and not line.startswith(" "):
            prev = line.strip()
    if rows:
        run.tables.append(("criterion estimates (short run)", ["benchmark", "estimate", "low", "high"], rows))


def _emit_rows(lines: list[str], marker: str, stop: str | None = None) -> list[list[str]]:
    """The `kernel median min max bytes signature` rows after `marker`, up to `stop`."""
    rows = []
    for line in _after(lines, marker):
        if stop and stop in line:
            break
        m = re.match(rf"^(\S+)\s+({NUM})\s+({NUM})\s+({NUM})\s+(\d+)\s+(.*)$", line)
        if m:
            rows.append(list(m.groups()))
    return rows


def parse_emit(run: Run) -> None:
    lines = run.stdout.splitlines()
    tiled = _emit_rows(lines, "tiled kernels: Mosaic emit", stop="build + verify + print")
    if tiled:
        run.tables.append(
            (
                "tiled kernels: build + verify + check + print of the shipped Mosaic module, per canonical signature (µs, 500 runs each)",
                ["kernel", "median µs", "min µs", "max µs", "module bytes", "signature"],
                tiled,
            )
        )
        worst = max(tiled, key=lambda r: float(r[1]))
        _target(run, f"tiled Mosaic emit, slowest signature ({worst[0]} {worst[5]})", float(worst[1]), "µs", "<= 1000")
    rows = _emit_rows(lines, "build + verify + print")
    if rows:
        run.tables.append(
            (
                "build + verify + print at 1024x4096 (µs, 2000 runs each)",
                ["kernel", "median µs", "min µs", "max µs", "text bytes", "signature"],
                rows,
            )
        )


def parse_tiled(run: Run) -> None:
    lines = run.stdout.splitlines()
    compile_rows = []
    for line in _after(lines, "libtpu compile, shipped Mosaic form"):
        if "twin vs StableHLO" in line:
            break
        m = re.match(rf"^(\S+)\s+({NUM})\s+({NUM})\s+(\S+)$", line)
        if m:
            compile_rows.append(list(m.groups()))
    if compile_rows:
        run.tables.append(
            ("libtpu compile time per tiled kernel, shipped form (ms, median of 3)", ["kernel", "v5e ms", "v6e ms", "signature"], compile_rows)
        )
    twin_rows = []
    for line in _after(lines, "tiled twin vs StableHLO kernel on the CPU"):
        m = re.match(rf"^(\S+)\s+(\S+)\s+({NUM})\s+({NUM})\s+({NUM})\s+(\S+)$", line)
        if m:
            twin_rows.append(list(m.groups()))
    if twin_rows:
        run.tables.append(
            (
                "tiled twin vs the StableHLO kernel of the same op on the CPU (µs, median of 30 interleaved runs; ratio > 1: the twin is slower)",
                ["tiled kernel", "StableHLO kernel", "twin µs", "StableHLO µs", "ratio", "signature"],
                twin_rows,
            )
        )


def parse_pjrt(run: Run) -> None:
    """The summary table; the verdict of each row with a target is computed here from the value
    (the bench prints `ok` for some and nothing for `~` targets)."""
    rows = []
    for line in _after(run.stdout.splitlines(), "== pjrt summary"):
        m = re.match(rf"^(.*?)\s+({NUM})\s*(us|ms|%)(?:\s+(.*?))?\s*$", line)
        if not m or line.startswith("measurement"):
            continue
        label, val, unit, rest = m.group(1).strip(), m.group(2), m.group(3), (m.group(4) or "")
        target = re.sub(r"\s*\b(ok|MISSED)$", "", rest).strip()
        shown_unit = unit.replace("us", "µs")
        v = _target(run, label, float(val), shown_unit, target) if TARGET.search(target) else ""
        rows.append([label, f"{val} {shown_unit}", target, v])
    if rows:
        run.tables.append(("PJRT summary (medians)", ["measurement", "median", "target", "verdict"], rows))


def parse_registry(run: Run) -> None:
    rows = []
    for line in _after(run.stdout.splitlines(), "registry and dispatch"):
        m = re.match(rf"^(.*?)\s+({NUM})(?:\s+({NUM})\s+({NUM}))?\s*$", line)
        if m and not line.startswith("measure "):
            label = m.group(1).strip()
            t = re.search(r"\(target\s*(.*?)\)", label)
            target = f"{t.group(1)} ns" if t else ""
            v = _target(run, label, float(m.group(2)), "ns", target) if t else ""
            rows.append([label, m.group(2), m.group(3) or "", m.group(4) or "", target, v])
    if rows:
        header = ["measure", "median ns", "min ns", "max ns", "target", "verdict"]
        run.tables.append(("registry and dispatch (ns)", header, rows))


def parse_cache(run: Run) -> None:
    lines = run.stdout.splitlines()
    caption = next((ln.strip("= ").strip() for ln in lines if ln.startswith("== compile cache")), "")
    rows = []
    for line in _after(lines, "== compile cache"):
        m = re.match(rf"^(.*?)\s+({NUM})\s*(ms|x)\b\s*(.*)$", line)
        if m:
            label, note = m.group(1).strip(), m.group(4).strip()
            t = re.search(rf"target\s*((?:<=|>=)\s*{NUM}\s*x?)", note)
            target = t.group(1) if t else ""
            v = _target(run, label, float(m.group(2)), m.group(3), target) if t else ""
            if t:
                note = ""
            rows.append([label, f"{m.group(2)} {m.group(3)}", note, target, v])
    if rows:
        run.tables.append((caption or "compile cache", ["measurement", "median", "note", "target", "verdict"], rows))


def parse_bench_torch(run: Run) -> None:
    """bench_torch.py's sections (`N. caption (unit)`, then `label value` rows or `label NOT OURS:
    reason`), its target lines (`=> what: value; target T: MET|MISSED`) and its cited numbers
    (`cited (not measured here): ...`)."""
    caption, rows = "", []

    def flush() -> None:
        if caption and rows:
            run.tables.append((caption, ["measurement", "median"], list(rows)))

    for line in run.stdout.splitlines():
        head = re.match(r"^(\d+)\.\s+(.*)$", line)
        if head:
            flush()
            caption, rows = line.strip(), []
            continue
        cited = re.match(r"^\s*cited \(not measured here\):\s*(.*)$", line)
        if cited:
            run.cited.append(cited.group(1))
            continue
        target = re.match(r"^\s+=>\s*(.*?):\s*(.*?);\s*target\s+(.*?):\s*(MET|MISSED)\b\s*(.*)$", line)
        if target:
            what, value, goal, v, why = target.groups()
            section = re.sub(r" [(](ms|us)[)]$", "", caption)
            run.targets.append([f"{section}: {what}", value, goal, v + (f" {why}" if why else "")])
            continue
        note = re.match(r"^\s+=>\s*(.*)$", line)
        if note:
            run.notes.append(f"{re.sub(r' [(](ms|us)[)]$', '', caption)}: {note.group(1)}")
            continue
        bad = re.match(r"^\s+(.*?)\s+NOT OURS:\s*(.*)$", line)
        if bad and caption:
            rows.append([bad.group(1), f"**NOT OURS**: {bad.group(2)}"])
            run.not_ours.append(f"{caption}: {bad.group(1)}: {bad.group(2)}")
            continue
        m = re.match(rf"^\s+(.*?)\s+({NUM})\s*$", line)
        if m and caption:
            unit = "µs" if "(us)" in caption else "ms" if "(ms)" in caption else ""
            rows.append([m.group(1), f"{m.group(2)} {unit}".strip()])
    flush()


def parse_import_timing(run: Run) -> None:
    rows = []
    for line in _after(run.stdout.splitlines(), "step"):
        m = re.match(rf"^(\S+)\s+({NUM})\s+(.*)$", line)
        if m:
            budget = re.search(rf"\(budget\s+({NUM})\s*ms\)", m.group(3))
            target = f"<= {budget.group(1)} ms" if budget else ""
            v = _target(run, f"import {m.group(1)}", float(m.group(2)), "ms", target) if budget else ""
            rows.append([m.group(1), m.group(2), m.group(3), target, v])
        elif line.startswith("output to torch"):
            run.notes.append(line.strip())
    if rows:
        header = ["step", "ms", "what", "target", "verdict"]
        run.tables.append(("flash attention import, step by step (ms)", header, rows))


BENCHES = ("emit", "pjrt", "registry", "cache", "tiled", "pallas", "zoo", "sharded", "torch", "import")


def parse_markdown(run: Run) -> None:
    """A benchmark that prints its section as Markdown (`pallas_compare.py`, `bench_zoo.py`):
    kept whole, its headings two levels below the run's own."""
    lines = run.stdout.splitlines()
    if not any(line.startswith("| ") for line in lines):
        return
    run.markdown = ["##" + line if line.startswith("#") else line for line in lines]
    run.tables.append((run.title, [], []))  # parsed: the Markdown is the table


def existing_benches(python: str, timeout: float, quick_torch: bool, only: set[str] | None = None) -> list[Run]:
    cb = ["cargo", "bench", "--locked"]
    specs: list[tuple[Run, list[Callable[[Run], None]]]] = [
        (
            Run("emit: build + verify + print (tpu-kernels)", [*cb, "-p", "tpu-kernels", "--bench", "emit", "--", *CRITERION_ARGS], "emit"),
            [parse_emit],
        ),
        (
            Run("pjrt: round trip, execute, donation vs memcpy, compile", [*cb, "-p", "tpu-kernels-registry", "--bench", "pjrt", "--", *CRITERION_ARGS], "pjrt"),
            [parse_pjrt, parse_criterion],
        ),
        (
            Run("registry: selection among 1,000 kernels, dispatch overhead", [*cb, "-p", "tpu-kernels-registry", "--bench", "registry", "--", *CRITERION_ARGS], "registry"),
            [parse_registry, parse_criterion],
        ),
        (
            Run("tiled: libtpu compile time, twin vs StableHLO on the CPU", [*cb, "-p", "tpu-kernels-registry", "--bench", "tiled", "--", *CRITERION_ARGS], "tiled"),
            [parse_tiled, parse_criterion],
        ),
        (
            Run(
                "Pallas side by side: jax's Pallas TPU kernels and ours, compiled for v5e and v6e",
                [python, "python/tools/pallas_compare.py"],
                "pallas",
            ),
            [parse_markdown],
        ),
        (
            Run(
                "zoo: one training step per model in eager, Inductor, tpu_kernels, strict and fused",
                [python, "python/tools/bench_zoo.py"],
                "zoo",
            ),
            [parse_markdown],
        ),
        (
            Run(
                "sharded: the GPT example's step on 1, 2 and 4 CPU devices, data, FSDP-style and tensor parallel",
                [python, "python/tools/bench_sharded.py"],
                "sharded",
            ),
            [parse_markdown],
        ),
        (
            Run("cache: warm start vs cold compile", [*cb, "-p", "tpu-kernels-registry", "--bench", "cache", "--", *CRITERION_ARGS], "cache"),
            [parse_cache, parse_criterion],
        ),
        (
            Run(
                "PyTorch integration: host overhead, fused vs strict, GPT forward",
                [python, "python/tools/bench_torch.py", *(["--quick"] if quick_torch else [])],
                "torch",
            ),
            [parse_bench_torch],
        ),
        (
            Run("Pallas flash attention import", [python, "python/tools/import_timing.py"], "import"),
            [parse_import_timing],
        ),
    ]
    runs = []
    for run, parsers in specs:
        if only is not None and run.key not in only:
            continue
        run_cmd(run, timeout)
        for parse in parsers:
            try:
                parse(run)
            except Exception as e:  # a format change must not sink the report
                run.notes.append(f"parser {parse.__name__} failed: {type(e).__name__}: {e}")
        runs.append(run)
    return runs


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _sh(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def machine() -> list[tuple[str, str]]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        kb = int(next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")).split()[1])
        mem = f"{kb / 2**20:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        pass

    def ver(pkg: str) -> str:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return "not installed"

    return [
        ("CPUs (`nproc`)", str(os.cpu_count() if not _sh(["nproc"]).isdigit() else _sh(["nproc"]))),
        ("CPU model", cpu),
        ("memory", mem),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("Python", platform.python_version()),
        ("torch", ver("torch")),
        ("jax / jaxlib", f"{ver('jax')} / {ver('jaxlib')}"),
        ("PJRT CPU plugin (lammps-jax-pjrt-cpu)", ver("lammps-jax-pjrt-cpu")),
        ("libtpu", ver("libtpu")),
        ("tpu_kernels", ver("tpu_kernels")),
        ("rustc", _sh(["rustc", "--version"])),
        ("torch's OpenMP spin", tpu_kernels._openmp.state()["detail"]),
    ]


# The report's own files: the only paths that may differ from HEAD in a run whose report is committed.
REPORT_FILES = ("BENCHMARKS.md", "BENCHMARKS.png")


@dataclass
class TreeState:
    commit: str  # `git rev-parse HEAD`, "?" outside a git checkout
    changed: list[str] | None  # `git status` lines other than the report's files; None: unknown

    @property
    def clean(self) -> bool:
        return self.changed == [] and self.commit != "?"


def tree_state() -> TreeState:
    """HEAD and what `git status` lists besides the report's files: modified, staged, deleted,
    and untracked files that are not ignored."""
    commit = _sh(["git", "rev-parse", "HEAD"]) or "?"
    try:
        p = subprocess.run(
            ["git", "status", "--porcelain=v1", "-z", "--untracked-files=all"],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return TreeState(commit, None)
    if p.returncode != 0:
        return TreeState(commit, None)
    changed, entries = [], iter(p.stdout.split("\0"))
    for entry in entries:
        if not entry:
            continue
        code, path = entry[:2], entry[3:]
        source = next(entries, "") if "R" in code or "C" in code else ""  # a rename's or copy's source
        if path not in REPORT_FILES or source:
            changed.append(f"{code.strip() or '?'} {path}" + (f" (from {source})" if source else ""))
    return TreeState(commit, changed)


def _changes(state: TreeState) -> str:
    """What differs from HEAD, for a dirty or unknown tree."""
    if state.changed is None:
        return "git status failed: cannot tell whether the work tree is clean"
    shown = ", ".join(f"`{c}`" for c in state.changed[:8])
    more = f", ... ({len(state.changed)} in all)" if len(state.changed) > 8 else ""
    return f"{len(state.changed)} paths besides {'/'.join(REPORT_FILES)} differ from HEAD: {shown}{more}"


def tree_warning(state: TreeState, when: str) -> str | None:
    """A loud warning for a dirty (or unknown) work tree, None for a clean one."""
    if state.clean:
        return None
    return (
        f"WARNING ({when}): the work tree is DIRTY at {state.commit[:12]}: {_changes(state)}. "
        "Do not commit a report generated from it."
    )


def _cell(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list[Any]], align: str | None = None) -> list[str]:
    if align is None:  # right-align the columns whose cells all start with a number
        num = re.compile(r"^-?\d")
        align = "l" + "".join(
            "r" if all(num.match(str(r[i])) or not str(r[i]) for r in rows) else "l" for i in range(1, len(header))
        )
    seps = ["---:" if a == "r" else "---" for a in align]
    out = ["| " + " | ".join(map(_cell, header)) + " |", "|" + "|".join(seps) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return out


def _mmm(t: tuple[float, float, float]) -> str:
    return f"{t[0]:.2f} ({t[1]:.2f}–{t[2]:.2f})"


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no plot (pip install -r python/requirements/bench.txt)")
        return False
    ok = [r for r in rows if "pjrt" in r]
    if not ok:
        return False
    names = [r["kernel"] for r in ok]
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(ok) + 1.6), dpi=110)
    h = 0.38
    for i, (key, label, color) in enumerate(
        (("pjrt", "tpu_kernels on the PJRT CPU plugin", "#1f77b4"), ("eager", "PyTorch eager (CPU)", "#ff7f0e"))
    ):
        nan = (math.nan, math.nan, math.nan)
        med = [r.get(key, nan)[0] for r in ok]
        lo = [r.get(key, nan)[0] - r.get(key, nan)[1] for r in ok]
        hi = [r.get(key, nan)[2] - r.get(key, nan)[0] for r in ok]
        ys = [j + (i - 0.5) * h for j in range(len(ok))]
        ax.barh(ys, med, height=h, color=color, label=label, xerr=[lo, hi], capsize=2, error_kw={"elinewidth": 0.8})
    memcpy = [r["memcpy"][0] for r in ok]
    ax.scatter(memcpy, range(len(ok)), marker="|", s=300, color="k", zorder=3, label="memcpy of the same bytes (the faster copy)")
    ax.set_xscale("log")
    ax.set_yticks(range(len(ok)), names)
    ax.invert_yaxis()
    ax.set_xlabel("time per call, ms (log scale; median, bars: min–max)")
    ax.set_title(f"Per-kernel time at 1024x4096 f32, {os.cpu_count()} CPUs")
    ax.grid(axis="x", which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)
    return True


def perf_log() -> list[str]:
    """The before-and-after log of performance work (`docs/perf-log.md`, kept by hand), as the
    last section of the report: its rows come from the runs each names, not from this one."""
    path = ROOT / "docs" / "perf-log.md"
    if not path.exists():
        return []
    body, fenced = [], False
    for line in path.read_text().rstrip().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("# "):
            continue  # its own title: the section heading below replaces it
        body.append("#" + line if not fenced and line.startswith("#") else line)  # one level down
    return [
        "## Performance work, before and after (docs/perf-log.md: not this run)",
        "",
        "Kept by hand and copied here as it is. Its numbers come from the earlier runs each row names,",
        "not from the run above; compare them with this report's tables only as different runs.",
        "",
        *body,
        "",
    ]


def _geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def _like_for_like(r: dict[str, Any]) -> bool:
    """A row whose eager side does the same work with outputs checked against the kernel's."""
    return "pjrt" in r and "eager" in r and not r.get("different_work") and not r.get("mismatches")


def _kernel_section(rows: list[dict[str, Any]], info: dict[str, Any], png: Path | None) -> list[str]:
    threads = info["copy_threads"]
    L = [
        "## Kernels: PJRT CPU plugin vs PyTorch eager",
        "",
        "Each registered kernel through `tk.call(op, *tensors, dispatcher=d, **statics)` on torch CPU tensors",
        "(DLPack in and out, so the host overhead of a call is included) against the same computation in",
        f"PyTorch eager on CPU ({info['torch_threads']} threads). Times in ms: median (min–max) of",
        f"{info['repeats']} interleaved runs after {info['warmup']} warm-up runs; the first call, which",
        "compiles, is shown apart. GB/s: bytes read + written (inputs + outputs) / median time.",
        f"*memcpy*: the faster (by median) of torch's `dst.copy_(src)` ({info['torch_threads']} torch threads) and",
        f"`numpy.copyto` split in {threads} chunks over {threads} threads (\"{threads} threads\"), each moving the same",
        "number of bytes (half read, half written), timed in the same loop as the kernel; the cell names",
        "the faster. *PJRT / memcpy* divides by that. *vs eager*: eager time / PJRT time (> 1: the kernel",
        "is faster); a row whose eager side does other work says so and is left out of the summary.",
        "",
    ]
    if png is not None:
        L += [f"![per-kernel time, PJRT CPU vs PyTorch eager]({png.name})", ""]
    trows = []
    for r in rows:
        if "error" in r:
            trows.append([f"`{r['kernel']}`", r.get("shape", ""), f"not run: {r['error']}", "", "", "", "", "", "", "", ""])
            continue
        vs = ""
        if "eager" in r:
            vs = f"{r['eager'][0] / r['pjrt'][0]:.2f}x"
            if not _like_for_like(r):
                vs += " (different work)"
        by = "copy_" if r["memcpy_by"] == "copy_" else f"{threads} threads"
        trows.append(
            [
                f"`{r['kernel']}`",
                r["shape"],
                _mmm(r["pjrt"]),
                _mmm(r["eager"]) if "eager" in r else "n/a",
                vs,
                f"{r['bytes'] / 1e6:.1f}",
                f"{r['pjrt_gbs']:.1f}",
                f"{r['eager_gbs']:.1f}" if "eager_gbs" in r else "",
                f"{r['memcpy_gbs']:.1f} ({by})",
                f"{100 * r['pjrt_gbs'] / r['memcpy_gbs']:.0f}%",
                f"{r['first_call_ms']:.0f}",
            ]
        )
    header = ["kernel", "shape", "PJRT ms", "eager ms", "vs eager", "MB moved", "PJRT GB/s", "eager GB/s",
              "memcpy GB/s", "PJRT / memcpy", "first call ms"]
    L += md_table(header, trows, "llrrrrrrrrr")
    L.append("")
    for r in rows:
        labels = [r["note"]] if r.get("note") else []
        if r.get("different_work"):
            labels.append(f"different work: {r['different_work']}")
        if r.get("mismatches"):
            labels.append(f"different work: {r['mismatches']} output elements differ from eager's")
        if labels:
            L.append(f"- `{r['kernel']}`: " + "; ".join(labels) + ".")
    diffs = [(r["kernel"], r["max_abs_diff"]) for r in rows if not math.isnan(r.get("max_abs_diff", math.nan))]
    if diffs:
        each = ", ".join(f"`{k}` {d:.1e}" for k, d in diffs)
        L.append(f"- Outputs against eager on the same inputs, max |difference|: {each}.")
    exact = [f"`{r['kernel']}`" for r in rows if r.get("mismatches") == 0 and r.get("integer_outputs")]
    if exact:
        L.append(f"- Integer and boolean outputs equal to eager's, element for element: {', '.join(exact)}.")
    timed = [r for r in rows if "memcpy" in r]
    if timed:
        n_torch = sum(r["memcpy_by"] == "copy_" for r in timed)
        gb_t = statistics.median(r["memcpy_torch_gbs"] for r in timed)
        gb_n = statistics.median(r["memcpy_threads_gbs"] for r in timed)
        L.append(
            f"- memcpy baseline: torch's `copy_` was the faster in {n_torch} of {len(timed)} rows, {threads} numpy "
            f"threads in {len(timed) - n_torch}; median over the rows: `copy_` {gb_t:.1f} GB/s, "
            f"{threads} threads {gb_n:.1f} GB/s."
        )
    same = [r for r in rows if _like_for_like(r)]
    if same:
        ratios = [r["eager"][0] / r["pjrt"][0] for r in same]
        left = [r["kernel"] for r in rows if "pjrt" in r and not _like_for_like(r)]
        L.append(
            f"- Summary over the {len(same)} like-for-like rows (same work, outputs compared): the kernel is faster"
            f" than eager in {sum(x > 1 for x in ratios)}, geometric mean of *vs eager* {_geomean(ratios):.2f}x."
            + (f" Left out (different work or PJRT only): {', '.join(f'`{k}`' for k in left)}." if left else "")
        )
    L.append("")
    return L


def _header(state: TreeState, end: TreeState, cmdline: str, seconds: float) -> list[str]:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    L = [
        "# Benchmarks",
        "",
        f"Generated by `{cmdline}` (or `scripts/dev bench`) on {now}, in {seconds / 60:.1f} minutes,",
        f"at commit `{state.commit}`. Regenerate it with that command; do not edit by hand.",
        "",
    ]
    dirty = not (state.clean and end.clean and end.commit == state.commit)
    if dirty:
        why = []
        if not state.clean:
            why.append(f"at the start: {_changes(state)}")
        if not end.clean:
            why.append("at the end: " + ("the same" if end.changed == state.changed else _changes(end)))
        elif not state.clean:
            why.append("at the end: clean")
        if end.commit != state.commit:
            why.append(f"HEAD moved during the run, from `{state.commit[:12]}` to `{end.commit[:12]}`")
        L += [
            "> **DIRTY WORK TREE: these numbers are not those of the commit named above. Do not commit",
            "> this report; regenerate it from a clean tree.**",
            *(f"> - {w}" for w in why),
            "",
        ]
    L += [
        "Every measured number below comes from this one run (one invocation of `benchmarks.py`; the",
        "existing benchmarks run as its subprocesses), so its comparisons are like for like in time.",
        "The machine is small and shared: compare numbers from the same run, not across runs. The",
        "hand-kept before-and-after log at the end (`docs/perf-log.md`) is the one exception: its rows",
        "name the runs they come from.",
        "",
    ]
    if dirty:
        tree = "**DIRTY**: " + ("git status failed" if state.changed is None else
                                f"{len(state.changed)} paths besides {'/'.join(REPORT_FILES)} differ (see above)")
    else:
        tree = f"clean (nothing modified or untracked besides {'/'.join(REPORT_FILES)}), at the start and the end"
    return L + ["|  |  |", "|---|---|"] + [
        f"| {_cell(k)} | {_cell(v)} |" for k, v in [*machine(), ("commit", f"`{state.commit}`"), ("work tree", tree)]
    ] + [""]


def report(
    rows: list[dict[str, Any]],
    info: dict[str, Any],
    runs: list[Run],
    png: Path | None,
    cmdline: str,
    seconds: float,
    state: TreeState,
    end: TreeState,
) -> str:
    L = _header(state, end, cmdline, seconds)
    targets = [[r.title.split(":")[0], *t] for r in runs for t in r.targets]
    not_ours = [f"{r.title.split(':')[0]}: {n}" for r in runs for n in r.not_ours]
    if targets or not_ours:
        L += ["## Targets in this run", ""]
        L += ["Every target a benchmark states, with its verdict from this run's numbers (`~N` is read as at most N).", ""]
        if targets:
            L += [*md_table(["benchmark", "measurement", "value", "target", "verdict"], targets, "lllll"), ""]
        if not_ours:
            L += ["**Paths not timed because their kernels did not run (NOT OURS):**", ""]
            L += [f"- {n}" for n in not_ours] + [""]
    if rows:
        L += _kernel_section(rows, info, png)
    if runs:
        L += ["## Existing benchmarks", ""]
        L += [
            "Run by this script with short criterion settings (`-- " + " ".join(CRITERION_ARGS) + "`), their",
            "printed summaries parsed. Each section gives its command, its exit status and run time.",
            "",
        ]
    for run in runs:
        status = "ok" if run.rc == 0 else ("timed out" if run.rc is None else f"exit {run.rc}")
        shown = ["python" if c == sys.executable else c for c in run.cmd]
        L += [f"### {run.title}", "", f"`{shlex.join(shown)}` ({status}, {run.seconds:.0f} s)", ""]
        if not run.tables:
            tail = "\n".join(run.out.strip().splitlines()[-15:])
            L += ["**not parsed**: the output did not have the expected form. Its last lines:", "", "```", tail, "```", ""]
        for caption, header, trs in run.tables:
            if header:
                L += [f"**{caption}**", "", *md_table(header, trs), ""]
        if run.markdown:
            L += [*run.markdown, ""]
        if run.targets:
            L += [f"- target: {m}: {v}; {t}: **{verdict_}**" for m, v, t, verdict_ in run.targets]
        if run.notes:
            L += [f"- {n}" for n in run.notes]
        if run.targets or run.notes:
            L.append("")
        if run.cited:
            L += ["Cited, not measured here (kept apart from the measured tables above):", ""]
            L += [f"- {c}" for c in run.cited] + [""]
    L += perf_log()
    return "\n".join(L).rstrip() + "\n"


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md", help="report path (default: BENCHMARKS.md)")
    p.add_argument("--repeats", type=int, default=20, help="timed runs per kernel (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up runs per kernel after the compile (default 3)")
    p.add_argument("--kernels-only", action="store_true", help="skip the existing benchmarks")
    p.add_argument("--only", help="comma-separated kernel names: time only these kernels ('none': no kernel)")
    p.add_argument("--benches", help=f"comma-separated existing benchmarks to run, of {','.join(BENCHES)} (default: all)")
    p.add_argument("--quick-torch", action="store_true", help="bench_torch.py --quick (no inductor)")
    p.add_argument("--quick", action="store_true", help="a smoke test: 3 repeats, 1 warm-up, bench_torch.py --quick")
    p.add_argument("--timeout", type=float, default=900, help="seconds per existing benchmark (default 900)")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.warmup, args.quick_torch = 3, 1, True
    only = None if args.only is None else {k.strip() for k in args.only.split(",") if k.strip() and k.strip() != "none"}
    benches = None
    if args.benches is not None:
        benches = {b.strip() for b in args.benches.split(",") if b.strip() and b.strip() != "none"}
        if unknown := benches - set(BENCHES):
            p.error(f"unknown benchmark(s) {', '.join(sorted(unknown))}; known: {', '.join(BENCHES)}")
    out = args.out.resolve()
    png = out.with_suffix(".png")

    state = tree_state()
    if warning := tree_warning(state, "at the start"):
        log(warning)
    log(f"commit {state.commit}")
    rows: list[dict[str, Any]] = []
    info: dict[str, Any] = {}
    if only != set():
        log("kernels: PJRT CPU plugin vs PyTorch eager")
        rows, info = bench_kernels(args.repeats, args.warmup, only)
    runs = [] if args.kernels_only else existing_benches(sys.executable, args.timeout, args.quick_torch, benches)
    log("writing the plot and the report")
    try:
        has_png = bool(rows) and plot(rows, png)
    except Exception as e:  # a plot failure must not lose the tables
        log(f"plot failed: {type(e).__name__}: {e}")
        has_png = False
    end = tree_state()
    if warning := tree_warning(end, "at the end"):
        log(warning)
    cmdline = "python " + shlex.join([os.path.relpath(__file__, ROOT), *sys.argv[1:]])
    text = report(rows, info, runs, png if has_png else None, cmdline, time.perf_counter() - START, state, end)
    write_atomic(out, text)
    log(f"wrote {out}" + (f" and {png}" if has_png else ""))
    missed = [f"{r.title.split(':')[0]}: {t[0]}" for r in runs for t in r.targets if t[3].startswith("MISSED")]
    if missed:
        log(f"{len(missed)} targets MISSED: " + "; ".join(missed))
    not_ours = [n for r in runs for n in r.not_ours]
    if not_ours:
        log(f"{len(not_ours)} paths NOT OURS (not timed): " + "; ".join(not_ours))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
