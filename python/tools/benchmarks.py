"""Writes BENCHMARKS.md (tables) and BENCHMARKS.png (plot): the whole benchmark report in one run.

    scripts/dev bench                      # set up, then run this script
    python python/tools/benchmarks.py     # after eval "$(scripts/dev env)"

Sections:

1. Every registered kernel (``tpu_kernels.kernels()``) at a realistic size (1024x4096 rows, see
   ``SIZES``), run through the dispatch API on torch tensors (``tk.call``) on the PJRT CPU plugin
   vs the equivalent PyTorch eager ops on CPU; effective GB/s (bytes read + written / median
   time) against a memcpy of the same traffic measured in the same run (``dst.copy_(src)``).
   Medians of repeated, interleaved runs, with min and max; compiles are excluded (warm-up).
2. The existing benchmarks, run and their printed summaries parsed: ``cargo bench`` ``emit``
   (tpu-kernels), ``pjrt``, ``registry``, ``cache`` (tpu-kernels-registry) with short criterion
   settings, ``python/tools/bench_torch.py`` and ``python/tools/import_timing.py``. Output that
   does not have the expected form is reported as "not parsed" (with its tail), never a crash.

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
    check: bool = True  # compare outputs with eager (not for random kernels)


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
        "dropout": Case(
            "tpuk::dropout",
            f"{x2}, i64[]",
            lambda: [rn(R, C), torch.tensor(1234)],
            lambda x, seed: F.dropout(x, 0.1, training=True),
            {"p": 0.1},
            "random: outputs not compared",
            check=False,
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


def bench_kernels(repeats: int, warmup: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import torch

    import tpu_kernels as tk

    d = tk.Dispatcher()
    cases = _cases()
    rows: list[dict[str, Any]] = []
    for k in tk.kernels():
        name = k["name"]
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
        row.update(op=case.op, shape=case.shape, note=case.note)
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
                diffs = [
                    (o.double() - r.double()).abs().max().item()
                    for o, r in zip(outs, ref, strict=False)
                    if o.is_floating_point() and o.numel() and o.shape == r.shape
                ]
                if diffs:
                    row["max_abs_diff"] = max(diffs)
            nbytes = sum(a.numel() * a.element_size() for a in args) + sum(
                o.numel() * o.element_size() for o in outs
            )
            row["bytes"] = nbytes
            # memcpy of the same traffic: half read, half written.
            half = max(nbytes // 2 // 4, 1)
            src, dst = torch.randn(half), torch.empty(half)
            copy_fn = lambda: dst.copy_(src)  # noqa: E731
            del outs, ref
            for _ in range(warmup):
                tk_fn(), eager_fn(), copy_fn()
            tk_t, eager_t, copy_t = [], [], []
            for _ in range(repeats):  # interleaved, so drift on a noisy machine hits all three
                tk_t.append(_time_ms(tk_fn))
                eager_t.append(_time_ms(eager_fn))
                copy_t.append(_time_ms(copy_fn))
            row["pjrt"], row["eager"], row["memcpy"] = _stats(tk_t), _stats(eager_t), _stats(copy_t)
            copy_bytes = 2 * half * 4
            row["pjrt_gbs"] = nbytes / (row["pjrt"][0] * 1e-3) / 1e9
            if eager:
                row["eager_gbs"] = nbytes / (row["eager"][0] * 1e-3) / 1e9
            else:
                del row["eager"]
            row["memcpy_gbs"] = copy_bytes / (row["memcpy"][0] * 1e-3) / 1e9
            eager_ms = f"{row['eager'][0]:.2f} ms" if eager else "n/a"
            log(f"kernel {name}: PJRT {row['pjrt'][0]:.2f} ms, eager {eager_ms}, memcpy {row['memcpy'][0]:.2f} ms")
        except Exception as e:  # report, do not crash the whole report
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            log(f"kernel {name}: FAILED {row['error']}")
    info = {"torch_threads": torch.get_num_threads(), "repeats": repeats, "warmup": warmup}
    return rows, info


# ---------------------------------------------------------------------------------------------
# 2. The existing benchmarks, run and parsed
# ---------------------------------------------------------------------------------------------


@dataclass
class Run:
    title: str
    cmd: list[str]
    rc: int | None = None
    out: str = ""
    seconds: float = 0.0
    tables: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)  # caption, header, rows
    notes: list[str] = field(default_factory=list)


def run_cmd(run: Run, timeout: float) -> Run:
    log(f"running: {shlex.join(run.cmd)}")
    t = time.perf_counter()
    try:
        p = subprocess.run(
            run.cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, "NO_COLOR": "1"}
        )
        run.rc, run.out = p.returncode, p.stdout + ("\n" + p.stderr if p.returncode else "")
        run.stdout = p.stdout  # type: ignore[attr-defined]
    except subprocess.TimeoutExpired as e:
        run.rc = None
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        run.out = out + f"\n(timed out after {timeout:.0f} s)"
        run.stdout = out  # type: ignore[attr-defined]
    except OSError as e:
        run.rc, run.out, run.stdout = 127, str(e), ""  # type: ignore[attr-defined]
    run.seconds = time.perf_counter() - t
    log(f"  done in {run.seconds:.1f} s (exit {run.rc})")
    return run


NUM = r"-?\d+(?:\.\d+)?"


def _after(lines: list[str], marker: str) -> list[str]:
    for i, line in enumerate(lines):
        if marker in line:
            return lines[i + 1 :]
    return []


def parse_criterion(run: Run) -> None:
    """Criterion's own estimates: `name  time: [low est high]`."""
    rows, prev = [], ""
    for line in run.stdout.splitlines():  # type: ignore[attr-defined]
        m = re.match(r"^(\S.*?)?\s*time:\s+\[(\S+ \S+) (\S+ \S+) (\S+ \S+)\]", line)
        if m:
            name = (m.group(1) or prev).strip()
            rows.append([name, m.group(3), m.group(2), m.group(4)])
        elif line.strip() and not line.startswith(" "):
            prev = line.strip()
    if rows:
        run.tables.append(("criterion estimates (short run)", ["benchmark", "estimate", "low", "high"], rows))


def parse_emit(run: Run) -> None:
    rows = []
    for line in _after(run.stdout.splitlines(), "build + verify + print"):  # type: ignore[attr-defined]
        m = re.match(rf"^(\S+)\s+({NUM})\s+({NUM})\s+({NUM})\s+(\d+)\s+(.*)$", line)
        if m:
            rows.append(list(m.groups()))
    if rows:
        run.tables.append(
            (
                "build + verify + print at 1024x4096 (µs, 2000 runs each)",
                ["kernel", "median µs", "min µs", "max µs", "text bytes", "signature"],
                rows,
            )
        )


def parse_pjrt(run: Run) -> None:
    rows = []
    for line in _after(run.stdout.splitlines(), "== pjrt summary"):  # type: ignore[attr-defined]
        m = re.match(rf"^(.*?)\s+({NUM})\s*(us|ms|%)(?:\s+(.*?))?\s*$", line)
        if not m or line.startswith("measurement"):
            continue
        label, val, unit, rest = m.group(1), m.group(2), m.group(3), (m.group(4) or "")
        verdict = ""
        if rest.endswith(("ok", "MISSED")):
            rest, verdict = rest.rsplit(None, 1) if " " in rest else ("", rest)
        rows.append([label.strip(), f"{val} {unit.replace('us', 'µs')}", rest.strip(), verdict])
    if rows:
        run.tables.append(("PJRT summary (medians)", ["measurement", "median", "target", "verdict"], rows))


def parse_registry(run: Run) -> None:
    rows = []
    for line in _after(run.stdout.splitlines(), "registry and dispatch"):  # type: ignore[attr-defined]
        m = re.match(rf"^(.*?)\s+({NUM})(?:\s+({NUM})\s+({NUM}))?\s*$", line)
        if m and not line.startswith("measure "):
            rows.append([m.group(1).strip(), m.group(2), m.group(3) or "", m.group(4) or ""])
    if rows:
        run.tables.append(("registry and dispatch (ns)", ["measure", "median ns", "min ns", "max ns"], rows))


def parse_cache(run: Run) -> None:
    lines = run.stdout.splitlines()  # type: ignore[attr-defined]
    caption = next((ln.strip("= ").strip() for ln in lines if ln.startswith("== compile cache")), "")
    rows = []
    for line in _after(lines, "== compile cache"):
        m = re.match(rf"^(.*?)\s+({NUM})\s*(ms|x)\b\s*(.*)$", line)
        if m:
            rows.append([m.group(1).strip(), f"{m.group(2)} {m.group(3)}", m.group(4).strip()])
    if rows:
        run.tables.append((caption or "compile cache", ["measurement", "median", "note"], rows))


def parse_bench_torch(run: Run) -> None:
    caption, rows = "", []

    def flush() -> None:
        if caption and rows:
            run.tables.append((caption, ["measurement", "median"], list(rows)))

    for line in run.stdout.splitlines():  # type: ignore[attr-defined]
        head = re.match(r"^(\d+)\.\s+(.*)$", line)
        if head:
            flush()
            caption, rows = line.strip(), []
            continue
        note = re.match(r"^\s+=>\s*(.*)$", line)
        if note:
            run.notes.append(f"{re.sub(r' [(](ms|us)[)]$', '', caption)}: {note.group(1)}")
            continue
        m = re.match(rf"^\s+(.*?)\s+({NUM})\s*$", line)
        if m and caption:
            unit = "µs" if "(us)" in caption else "ms" if "(ms)" in caption else ""
            rows.append([m.group(1), f"{m.group(2)} {unit}".strip()])
    flush()


def parse_import_timing(run: Run) -> None:
    rows = []
    for line in _after(run.stdout.splitlines(), "step"):  # type: ignore[attr-defined]
        m = re.match(rf"^(\S+)\s+({NUM})\s+(.*)$", line)
        if m:
            rows.append([m.group(1), m.group(2), m.group(3)])
        elif line.startswith("output to torch"):
            run.notes.append(line.strip())
    if rows:
        run.tables.append(("flash attention import, step by step (ms)", ["step", "ms", "what"], rows))


def existing_benches(python: str, timeout: float, quick_torch: bool) -> list[Run]:
    cb = ["cargo", "bench", "--locked"]
    specs: list[tuple[Run, list[Callable[[Run], None]]]] = [
        (
            Run("emit: build + verify + print (tpu-kernels)", [*cb, "-p", "tpu-kernels", "--bench", "emit", "--", *CRITERION_ARGS]),
            [parse_emit],
        ),
        (
            Run("pjrt: round trip, execute, donation vs memcpy, compile", [*cb, "-p", "tpu-kernels-registry", "--bench", "pjrt", "--", *CRITERION_ARGS]),
            [parse_pjrt, parse_criterion],
        ),
        (
            Run("registry: selection among 1,000 kernels, dispatch overhead", [*cb, "-p", "tpu-kernels-registry", "--bench", "registry", "--", *CRITERION_ARGS]),
            [parse_registry, parse_criterion],
        ),
        (
            Run("cache: warm start vs cold compile", [*cb, "-p", "tpu-kernels-registry", "--bench", "cache", "--", *CRITERION_ARGS]),
            [parse_cache, parse_criterion],
        ),
        (
            Run(
                "PyTorch integration: host overhead, fused vs strict, GPT forward",
                [python, "python/tools/bench_torch.py", *(["--quick"] if quick_torch else [])],
            ),
            [parse_bench_torch],
        ),
        (
            Run("Pallas flash attention import", [python, "python/tools/import_timing.py"]),
            [parse_import_timing],
        ),
    ]
    runs = []
    for run, parsers in specs:
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

    commit = _sh(["git", "rev-parse", "--short=12", "HEAD"])
    if _sh(["git", "status", "--porcelain", "--untracked-files=no"]):
        commit += " (with uncommitted changes)"
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
        ("commit", commit),
    ]


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
    ax.scatter(memcpy, range(len(ok)), marker="|", s=300, color="k", zorder=3, label="memcpy of the same bytes")
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
    """The before-and-after log of performance work (`docs/perf-log.md`, kept by hand), as a
    section of the report."""
    path = ROOT / "docs" / "perf-log.md"
    if not path.exists():
        return []
    return ["## Performance work, before and after", "", *path.read_text().rstrip().splitlines(), ""]


def report(
    rows: list[dict[str, Any]], info: dict[str, Any], runs: list[Run], png: Path | None, cmdline: str, seconds: float
) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    L = [
        "# Benchmarks",
        "",
        f"Generated by `{cmdline}` (or `scripts/dev bench`) on {now}, in {seconds / 60:.1f} minutes.",
        "Regenerate it with that command; do not edit by hand. The machine is small and shared: compare",
        "numbers from the same run, not across runs.",
        "",
        *md_table(["", ""], machine(), "ll"),
        "",
        *perf_log(),
        "## Kernels: PJRT CPU plugin vs PyTorch eager",
        "",
        f"Each registered kernel through `tk.call(op, *tensors, dispatcher=d, **statics)` on torch CPU tensors",
        "(DLPack in and out, so the host overhead of a call is included) against the same computation in",
        f"PyTorch eager on CPU ({info['torch_threads']} threads). Times in ms: median (min–max) of",
        f"{info['repeats']} interleaved runs after {info['warmup']} warm-up runs; the first call, which",
        "compiles, is shown apart. GB/s: bytes read + written (inputs + outputs) / median time; memcpy:",
        "`dst.copy_(src)` moving the same number of bytes (half read, half written), measured in the same",
        "loop. *vs eager*: eager time / PJRT time (> 1: the kernel is faster).",
        "",
    ]
    if png is not None:
        L += [f"![per-kernel time, PJRT CPU vs PyTorch eager]({png.name})", ""]
    trows = []
    for r in rows:
        if "error" in r:
            trows.append([f"`{r['kernel']}`", r.get("shape", ""), f"not run: {r['error']}", "", "", "", "", "", "", "", ""])
            continue
        trows.append(
            [
                f"`{r['kernel']}`",
                r["shape"],
                _mmm(r["pjrt"]),
                _mmm(r["eager"]) if "eager" in r else "n/a",
                f"{r['eager'][0] / r['pjrt'][0]:.2f}x" if "eager" in r else "",
                f"{r['bytes'] / 1e6:.1f}",
                f"{r['pjrt_gbs']:.1f}",
                f"{r['eager_gbs']:.1f}" if "eager_gbs" in r else "",
                f"{r['memcpy_gbs']:.1f}",
                f"{100 * r['pjrt_gbs'] / r['memcpy_gbs']:.0f}%",
                f"{r['first_call_ms']:.0f}",
            ]
        )
    L += md_table(
        [
            "kernel",
            "shape",
            "PJRT ms",
            "eager ms",
            "vs eager",
            "MB moved",
            "PJRT GB/s",
            "eager GB/s",
            "memcpy GB/s",
            "PJRT / memcpy",
            "first call ms",
        ],
        trows,
        "llrrrrrrrrr",
    )
    notes = [(r["kernel"], r["note"]) for r in rows if r.get("note")]
    diffs = [(r["kernel"], r["max_abs_diff"]) for r in rows if not math.isnan(r.get("max_abs_diff", math.nan))]
    L.append("")
    if notes:
        L += [f"- `{k}`: {n}." for k, n in notes]
    if diffs:
        each = ", ".join(f"`{k}` {d:.1e}" for k, d in diffs)
        L.append(f"- Outputs against eager on the same inputs, max |difference|: {each}.")
    L.append("")
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
            L += [f"**{caption}**", "", *md_table(header, trs), ""]
        if run.notes:
            L += [f"- {n}" for n in run.notes] + [""]
    return "\n".join(L).rstrip() + "\n"


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md", help="report path (default: BENCHMARKS.md)")
    p.add_argument("--repeats", type=int, default=20, help="timed runs per kernel (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up runs per kernel after the compile (default 3)")
    p.add_argument("--kernels-only", action="store_true", help="skip the existing benchmarks")
    p.add_argument("--quick-torch", action="store_true", help="bench_torch.py --quick (no inductor)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per existing benchmark (default 300)")
    args = p.parse_args()
    out = args.out.resolve()
    png = out.with_suffix(".png")

    log("kernels: PJRT CPU plugin vs PyTorch eager")
    rows, info = bench_kernels(args.repeats, args.warmup)
    runs = [] if args.kernels_only else existing_benches(sys.executable, args.timeout, args.quick_torch)
    log("writing the plot and the report")
    try:
        has_png = plot(rows, png)
    except Exception as e:  # a plot failure must not lose the tables
        log(f"plot failed: {type(e).__name__}: {e}")
        has_png = False
    cmdline = "python " + shlex.join([os.path.relpath(__file__, ROOT), *sys.argv[1:]])
    text = report(rows, info, runs, png if has_png else None, cmdline, time.perf_counter() - START)
    write_atomic(out, text)
    log(f"wrote {out}" + (f" and {png}" if has_png else ""))


if __name__ == "__main__":
    main()
