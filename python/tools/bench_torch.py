"""Side-by-side timings of the PyTorch integration, in one run.

1. Host overhead of one substituted op on 16 elements (`F.silu`) under
   `substitute("strict")` vs plain eager, per op (target: the whole substituted call <= 8 us).
   Also the bare native call and an empty TorchDispatchMode, to show where the time goes.
2. Fused vs strict on a chain of 8 kernel-backed ops over 4M elements (target: fused >= 2x
   faster than strict).
3. The example GPT's forward: torch.compile(backend="tpu_kernels") vs eager PyTorch vs inductor.
4. The "tpu" device (`import tpu_kernels.device`): one op on 16 elements whose kernel is
   registered at the device's key (target: <= 4 us over CPU eager) and one op that runs in the
   device's CPU fallback (target: <= 2.5 us over CPU eager), against the same ops on CPU; and
   the process's RSS over 1M kernel calls and 1M fallback calls (target: flat, under 8 MiB of
   growth after the first 10k).
6. An AdamW step on a 1024x4096 f32 parameter, updated in place (`torch.ops.tpuk.adamw_step`
   on CPU tensors and on "tpu" tensors, and inside a `torch.compile` program that donates the
   state), against the same kernel returning fresh outputs
   (`tk.call`), PyTorch's fused AdamW kernel (`torch._fused_adamw_`), the update in ATen ops,
   and memcpy (`copy_`) of the same bytes; section 7 gives the same runs in GB/s (the 4 arrays
   read and 3 written).
8. Fused mode's recording cost per op on a trace-cache hit: a chain of 100 small ops recorded
   under `substitute("fused")` on CPU tensors and under the "tpu" device's fused mode, timed
   apart from the flush that runs the step's program (each timed step is checked to be a hit),
   beside eager and strict per op.

    python python/tools/bench_torch.py [--quick] [--only overhead,chains,gpt,device,in_place,recording]

Before a substituted, fused or compiled path is timed, it runs once inside
`tpu_kernels.testing.no_fallbacks(...)`, which fails if an op fell back to PyTorch, a fused
program was replayed in PyTorch, a compiled graph ran in PyTorch, or the expected kernels and
programs did not run. A path that fails that check is printed as `NOT OURS: <reason>` instead
of a time (a fallback is never timed as ours), and the script exits 1 at the end.

Each line with a target says MET or MISSED. Numbers from elsewhere are printed only as
`cited (not measured here): ...` lines, apart from the measured ones.

Medians of repeated runs; the machine is noisy, so compare numbers from the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import tpu_kernels  # before torch, as a user would: see tpu_kernels._openmp
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import tpu_kernels.torch as tkt
from tpu_kernels.torch._native import native

ROOT = Path(__file__).resolve().parents[2]
CITED = [
    "TorchTPU's custom-kernel path costs 65-77 us of host overhead per op, as reported by TorchTPU's users",
]
SECTIONS = ("overhead", "chains", "gpt", "device", "in_place", "recording")  # in_place prints 6 and 7


class NotOurs(Exception):
    """A timed path that did not run our kernels or programs."""


NOT_OURS: list[str] = []  # "what: reason", for the exit status


def _no_fallbacks(**expect: Any) -> contextlib.AbstractContextManager:
    try:
        from tpu_kernels.testing import no_fallbacks
    except ImportError as e:
        raise NotOurs(f"cannot check that our kernels ran: tpu_kernels.testing.no_fallbacks is missing ({e})") from e
    return no_fallbacks(**expect)


@contextlib.contextmanager
def ours(**expect: Any) -> Iterator[Any]:
    """`tpu_kernels.testing.no_fallbacks(**expect)`, its failure (or any error inside) raised
    as `NotOurs` with the reason."""
    try:
        with _no_fallbacks(**expect) as seen:
            yield seen
    except NotOurs:
        raise
    except AssertionError as e:
        raise NotOurs(" ".join(str(e).split()) or "no_fallbacks failed") from e
    except Exception as e:
        raise NotOurs(f"{type(e).__name__}: {' '.join(str(e).split())}") from e


def check(f: Callable[[], Any], **expect: Any) -> None:
    """Runs `f` once inside `ours(**expect)`."""
    with ours(**expect):
        f()


def per_call_us(f, n: int, repeats: int = 5) -> float:
    f()
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            f()
        samples.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(samples)


def timed_ms(f, repeats: int) -> float:
    f()
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


def ours_timed(what: str, timer: Callable[[], float], f: Callable[[], Any], **expect: Any) -> float | str:
    """`timer()` after `f` ran once as ours; else "NOT OURS: reason" (and `timer` is not run)."""
    try:
        check(f, **expect)
    except NotOurs as e:
        NOT_OURS.append(f"{what}: {e}")
        return f"NOT OURS: {_short(e)}"
    return timer()


def _short(e: Exception, n: int = 300) -> str:
    s = str(e).removeprefix("work that should have run on tpu_kernels did not: ")
    return s if len(s) <= n else s[: n - 3] + "..."


class _Nop(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def overhead(n: int) -> dict[str, float | str]:
    x = torch.randn(16)
    silu = lambda: F.silu(x)  # noqa: E731
    out: dict[str, float | str] = {"eager F.silu": per_call_us(silu, n)}
    with _Nop():
        out["empty TorchDispatchMode"] = per_call_us(silu, n)
    call = native().call
    native_silu = lambda: call("aten::silu.default", [x], [], False)  # noqa: E731
    out["native call (DLPack in, upload, execute, tensor out)"] = ours_timed(
        "native call", lambda: per_call_us(native_silu, n), native_silu, ops=("aten::silu.default",), kernels=("silu",)
    )
    # Not ours by design: what answering "no kernel" costs.
    out["  (fallback answer: DLPack in, no kernel)"] = per_call_us(lambda: call("aten::nonexistent.default", [x], [], False), n)
    for mode, count in (("strict", n), ("debug", max(n // 10, 100))):
        with tkt.substitute(mode):
            out[f"substitute('{mode}') F.silu"] = ours_timed(
                f"substitute('{mode}') F.silu", lambda c=count: per_call_us(silu, c), silu, kernels=("silu",)
            )
    return out


def chain(x):
    y = F.silu(x)
    y = F.gelu(y)
    y = torch.softmax(y, -1)
    y = F.gelu(y, approximate="tanh")
    y = F.silu(y)
    y = torch.log_softmax(y, -1)
    y = F.silu(y)
    y = F.gelu(y)
    return y


def elementwise_chain(x):
    y = F.silu(x)
    y = F.gelu(y, approximate="tanh")
    y = F.silu(y)
    y = F.gelu(y)
    y = F.silu(y)
    y = F.gelu(y, approximate="tanh")
    y = F.silu(y)
    y = F.gelu(y)
    return y


def mixed_chain(x):
    y = F.silu(x)
    y = y * 2.0
    y = y + 1.0
    y = torch.relu(y)
    y = F.silu(y)
    y = y * 0.5
    y = y - 0.25
    y = torch.abs(y)
    y = F.silu(y)
    return y


# title, chain, the ATen ops in it that have a kernel (strict must not fall back on them; the
# others have none and run in PyTorch under strict), the kernels that must run.
CHAINS = (
    ("mixed (3 silu kernels + 6 cheap ATen ops)", mixed_chain, ("aten::silu.default",), ("silu",)),
    (
        "elementwise kernels (silu/gelu/gelu-tanh x8)",
        elementwise_chain,
        ("aten::silu.default", "aten::gelu.default"),
        ("silu", "gelu", "gelu_tanh"),
    ),
    (
        "with reductions (silu, gelu, softmax, gelu-tanh, silu, log_softmax, silu, gelu)",
        chain,
        ("aten::silu.default", "aten::gelu.default", "aten::_softmax.default", "aten::_log_softmax.default"),
        ("silu", "gelu", "softmax", "gelu_tanh", "log_softmax"),
    ),
)


def fused_vs_strict(repeats: int, title: str, f, kernel_ops: tuple[str, ...], kernels: tuple[str, ...]) -> dict:
    x = torch.randn(2048, 2048)  # 4M elements
    ref = f(x)

    def strict():
        with tkt.substitute("strict"):
            return f(x)

    def fused():
        with tkt.substitute("fused"):
            return f(x)

    torch.testing.assert_close(fused(), ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(strict(), ref, rtol=1e-4, atol=1e-5)
    return {
        "eager PyTorch": timed_ms(lambda: f(x), repeats),
        "strict (one call per op)": ours_timed(
            f"{title}: strict", lambda: timed_ms(strict, repeats), strict, ops=kernel_ops, kernels=kernels
        ),
        "fused (1 program)": ours_timed(
            f"{title}: fused", lambda: timed_ms(fused, repeats), fused, kernels=kernels, programs=1
        ),
    }


# Kernels the GPT's forward must run under torch.compile(backend="tpu_kernels") (no_fallbacks
# also fails if any node of its graphs ran in PyTorch).
GPT_KERNELS = ("rms_norm", "sdpa_flash_cpu")


def gpt_forward(repeats: int, inductor: bool) -> dict[str, float | str]:
    sys.path.insert(0, str(ROOT / "examples" / "gpt"))
    import gpt

    import tpu_kernels.torch.backend  # noqa: F401

    torch.manual_seed(0)
    cfg = gpt.Config()
    model = gpt.Gpt(cfg)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq))
    targets = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq))
    out: dict[str, float | str] = {}
    with torch.no_grad():
        ref = model(tokens, targets)
        out["eager PyTorch"] = timed_ms(lambda: model(tokens, targets), repeats)
        torch._dynamo.reset()
        tk = torch.compile(model, backend="tpu_kernels")
        first, label = "tpu_kernels first call (compile)", "torch.compile(backend='tpu_kernels')"
        try:
            with ours(programs=1):  # the first call compiles, then runs the program
                t = time.perf_counter()
                got = tk(tokens, targets)
                out[first] = (time.perf_counter() - t) * 1e3
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
        except NotOurs as e:
            NOT_OURS.append(f"GPT forward, {first}: {e}")
            out[first] = f"NOT OURS: {_short(e)}"
            out[label] = "NOT OURS: its first call was not ours"
        else:
            out[label] = ours_timed(
                f"GPT forward, {label}",
                lambda: timed_ms(lambda: tk(tokens, targets), repeats),
                lambda: tk(tokens, targets),
                kernels=GPT_KERNELS,
                programs=1,
            )
        if inductor:  # PyTorch's own compiler, the reference: not ours, nothing to check
            torch._dynamo.reset()
            ind = torch.compile(model, backend="inductor")
            t = time.perf_counter()
            got = ind(tokens, targets)
            out["inductor first call (compile)"] = (time.perf_counter() - t) * 1e3
            out["torch.compile(backend='inductor')"] = timed_ms(lambda: ind(tokens, targets), repeats)
    return out


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def device_overhead(n: int, calls: int) -> tuple[dict[str, float | str], dict[str, float]]:
    """Per-op times on the "tpu" device against CPU eager, and RSS growth over `calls` calls."""
    import tpu_kernels.device  # noqa: F401  (registers the device)

    a, b = torch.randn(16), torch.randn(16)
    at, bt = a.to("tpu"), b.to("tpu")
    silu_cpu, silu_tpu = (lambda: F.silu(a)), (lambda: F.silu(at))  # noqa: E731
    add_cpu, add_tpu = (lambda: a + b), (lambda: at + bt)  # noqa: E731
    out: dict[str, float | str] = {}
    out["CPU eager F.silu"] = per_call_us(silu_cpu, n)
    out["tpu F.silu (kernel at the key)"] = ours_timed(
        "tpu F.silu", lambda: per_call_us(silu_tpu, n), silu_tpu, ops=("aten::silu.default",), kernels=("silu",)
    )
    with tkt.substitute("strict"):
        out["substitute('strict') F.silu on CPU tensors"] = ours_timed(
            "substitute F.silu", lambda: per_call_us(silu_cpu, n), silu_cpu, kernels=("silu",)
        )
    out["CPU eager a + b"] = per_call_us(add_cpu, n)
    # Not ours by design: no kernel binds aten::add; the device's fallback runs the CPU kernel
    # over the same memory. Checked to be the fallback (counted), not a kernel.
    before = tkt.report().device["fallbacks"].get("aten::add.out", 0)
    add_tpu()
    if tkt.report().device["fallbacks"].get("aten::add.out", 0) != before + 1:
        out["tpu a + b (the device's fallback)"] = "NOT OURS: the call did not go through the device's fallback"
        NOT_OURS.append("tpu a + b: not the device's fallback")
    else:
        out["tpu a + b (the device's fallback)"] = per_call_us(add_tpu, n)
    out["CPU torch.empty(16)"] = per_call_us(lambda: torch.empty(16), n)
    out["tpu torch.empty(16) (caching allocator)"] = per_call_us(lambda: torch.empty(16, device="tpu"), n)
    rss: dict[str, float] = {}
    for label, f in (("kernel calls (tpu F.silu)", silu_tpu), ("fallback calls (tpu a + b)", add_tpu)):
        for _ in range(10_000):
            f()
        start = _rss_mib()
        for _ in range(calls):
            f()
        rss[label] = _rss_mib() - start
    return out, rss


def adamw_in_place(repeats: int) -> tuple[dict[str, float | str], float]:
    """ms per AdamW step on 1024x4096 f32 state, each path in this run; and the bytes it moves."""
    import tpu_kernels.device  # noqa: F401  (registers the device)
    from tpu_kernels.torch import custom_ops

    custom_ops()
    op = torch.ops.tpuk.adamw_step.default
    shape = (1024, 4096)
    moved = 7 * shape[0] * shape[1] * 4
    gen = torch.Generator().manual_seed(0)
    p, g, m = (torch.randn(shape, generator=gen) for _ in range(3))
    v = torch.rand(shape, generator=gen)
    step = torch.tensor(10.0)
    state_tpu = [t.to("tpu") for t in (p, g, m, v, step)]
    out: dict[str, float | str] = {}
    timer = lambda f: lambda: timed_ms(f, repeats)  # noqa: E731
    f_cpu = lambda: op(p, g, m, v, step)  # noqa: E731
    out["tpuk::adamw_step in place, CPU tensors"] = ours_timed("adamw in place", timer(f_cpu), f_cpu, kernels=("adamw_step",))
    f_tpu = lambda: op(*state_tpu)  # noqa: E731
    out["tpuk::adamw_step in place, tpu tensors"] = ours_timed("adamw on tpu", timer(f_tpu), f_tpu, kernels=("adamw_step",))
    def compiled_step(p, g, m, v, step):
        op(p, g, m, v, step)

    torch._dynamo.reset()
    f_comp = torch.compile(compiled_step, backend="tpu_kernels", fullgraph=True)
    out["torch.compile(step), one program, state donated"] = ours_timed(
        "compiled adamw", lambda: timed_ms(lambda: f_comp(p, g, m, v, step), repeats),
        lambda: f_comp(p, g, m, v, step), kernels=("adamw_step",), programs=1,
    )
    import tpu_kernels as tk

    d = tk.Dispatcher(no_fallback=True)
    f_fresh = lambda: tk.call("tpuk::adamw_step", p, g, m, v, step, dispatcher=d)  # noqa: E731
    out["the same kernel, fresh outputs (tk.call)"] = timed_ms(f_fresh, repeats)
    steps = torch.tensor(10.0)
    fused = lambda: torch._fused_adamw_(  # noqa: E731
        [p], [g], [m], [v], [], [steps], lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=1e-2, eps=1e-8,
        amsgrad=False, maximize=False,
    )
    out["PyTorch fused AdamW (torch._fused_adamw_)"] = timed_ms(fused, repeats)

    def aten():
        m.mul_(0.9).add_(g, alpha=0.1)
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        p.mul_(1 - 1e-5).addcdiv_(m, (v / (1 - 0.999**10)).sqrt_().add_(1e-8), value=-1e-3 / (1 - 0.9**10))

    out["PyTorch eager, ATen in-place ops"] = timed_ms(aten, repeats)
    out.update(optimizer_steps(p, g, repeats))
    src, dst = torch.randn(moved // 8), torch.empty(moved // 8)
    out["memcpy of the same bytes (copy_)"] = timed_ms(lambda: dst.copy_(src), repeats)
    return out, moved


def optimizer_steps(p, g, repeats: int) -> dict[str, float | str]:
    """`torch.optim.AdamW(foreach=False).step()` on one parameter `p` with gradient `g`, as a
    user's training loop runs it: eager on CPU tensors, and on the "tpu" device in strict mode
    and in fused mode with the native recorder (one program a step, the parameter and its states
    written in place), each step ended by a sync."""
    import tpu_kernels.device as device

    def make(on_tpu: bool):
        param = torch.nn.Parameter(p.clone().to("tpu") if on_tpu else p.clone())
        param.grad = g.to("tpu") if on_tpu else g.clone()
        opt = torch.optim.AdamW([param], lr=1e-3, foreach=False)

        def f():
            opt.step()
            if on_tpu:
                torch.tpu.synchronize()

        return f

    out: dict[str, float | str] = {}
    out["torch.optim.AdamW, eager, CPU tensors"] = timed_ms(make(False), repeats)
    try:
        device.set_mode("strict")
        out["torch.optim.AdamW, tpu strict"] = timed_ms(make(True), repeats)
        device.set_mode("fused", recorder="native")
        f = make(True)
        f()  # the first steps record, compile and lift the bias corrections
        f()
        out["torch.optim.AdamW, tpu fused (native recorder)"] = ours_timed(
            "AdamW fused on tpu", lambda: timed_ms(f, repeats), f, programs=1
        )
    finally:
        device.set_mode("strict")
    return out


def _recorded_chain(x, w, n_ops: int):
    """`n_ops` small ops, alternately `silu` (a kernel binds it) and `* w` (none does)."""
    for i in range(n_ops):
        x = F.silu(x) if i % 2 == 0 else x * w
    return x


def recording(n_ops: int, steps: int) -> dict[str, float | str]:
    """us per op of a chain of `n_ops` ops on f32[16,16]: eager and strict run each op; fused
    mode records them (the step's trace a trace-cache hit: checked), timed apart from the flush
    that runs the step's one program. On CPU tensors (`substitute`) and on the tpu device."""
    import tpu_kernels.device as tdev
    from tpu_kernels.torch import report, sync

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(16, 16, generator=gen), torch.randn(16, 16, generator=gen)
    ref = _recorded_chain(x, w, n_ops)
    out: dict[str, float | str] = {}

    def median_us(f) -> float:
        f()
        samples = []
        for _ in range(steps):
            t = time.perf_counter()
            f()
            samples.append((time.perf_counter() - t) / n_ops * 1e6)
        return statistics.median(samples)

    out["eager, per op"] = median_us(lambda: _recorded_chain(x, w, n_ops))

    def strict_cpu():
        with tkt.substitute("strict"):
            return _recorded_chain(x, w, n_ops)

    out["substitute('strict'), per op"] = ours_timed(
        "recording: strict", lambda: median_us(strict_cpu), strict_cpu, kernels=("silu",), ops=("aten::silu.default",)
    )

    def python_cache() -> dict:
        return report().fused["trace_cache"]

    def native_cache() -> dict:
        r = report().device["recorder"]
        return {
            "hits": r["hits"],
            "misses": r["misses"],
            "last_miss": str(r["declined"])[:300],
            "record_timed_s": r["record_timed_s"],
            "record_timed_calls": r["record_timed_calls"],
            "recorded": r["recorded"],
        }

    def fused_split(run_chain, flush, cache=python_cache) -> tuple[float | str, float | str, torch.Tensor | None]:
        """(recording us per op, flush us per step) medians over `steps` steps, each checked to
        be a trace-cache hit, and the last step's result (compared once the mode is left: a
        comparison inside it would be recorded too)."""
        for _ in range(3):  # the first step compiles; later ones must hit
            y = run_chain()  # kept: a result nobody holds is never computed
            flush()
            del y
        before = cache()
        rec, fl, y = [], [], None
        with ours(programs=steps):
            for _ in range(steps):
                t = time.perf_counter()
                y = run_chain()
                t1 = time.perf_counter()
                flush()
                fl.append((time.perf_counter() - t1) * 1e6)
                rec.append((t1 - t) / n_ops * 1e6)
        after = cache()
        if "recorded" in after and after["record_timed_calls"] > before["record_timed_calls"]:
            # The recorder's own share (Rust's `record`, per call of those it timed), beside the
            # whole call.
            timed = after["record_timed_calls"] - before["record_timed_calls"]
            in_recorder = (after["record_timed_s"] - before["record_timed_s"]) / timed
            out["tpu fused, native recorder: of which in Rust's record, per op (mean)"] = in_recorder * 1e6
        hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
        if hits != steps or misses:
            why = f"{hits} trace-cache hits and {misses} misses in {steps} steps (last miss: {after['last_miss']})"
            NOT_OURS.append(f"recording: {why}")
            return f"NOT OURS: {why}", f"NOT OURS: {why}", None
        return statistics.median(rec), statistics.median(fl), y

    def fused_rows(label: str, split) -> None:
        try:
            rec, fl, y = split()
        except NotOurs as e:
            NOT_OURS.append(f"recording: {label}: {e}")
            rec = fl = f"NOT OURS: {_short(e)}"
            y = None
        if y is not None:
            torch.testing.assert_close(y.cpu(), ref, rtol=1e-5, atol=1e-6)
        out[f"{label} recording, per op (trace-cache hit)"] = rec
        out[f"{label} flush: the step's program, per step"] = fl
        share = "tpu fused, native recorder: of which in Rust's record, per op (mean)"
        if share in out:  # shown after the rows it is part of
            out[share] = out.pop(share)

    def fused_cpu():
        with tkt.substitute("fused"):
            return fused_split(lambda: _recorded_chain(x, w, n_ops), sync)

    fused_rows("substitute('fused')", fused_cpu)

    def fused_cpu_python():
        from tpu_kernels.torch.fused import FusedMode

        with FusedMode(native_handler=False):
            return fused_split(lambda: _recorded_chain(x, w, n_ops), sync)

    fused_rows("substitute('fused'), Python handler", fused_cpu_python)

    from torch.utils._python_dispatch import TorchDispatchMode

    class _RunEachOp(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def floor():
        with _RunEachOp():
            return _recorded_chain(x, w, n_ops)

    out["a Python dispatch mode that runs each op, per op (the mode's floor)"] = median_us(floor)

    xt, wt = x.to("tpu"), w.to("tpu")
    strict_tpu = lambda: _recorded_chain(xt, wt, n_ops)  # noqa: E731
    out["tpu strict, per op"] = ours_timed(
        "recording: tpu strict", lambda: median_us(strict_tpu), strict_tpu, kernels=("silu",), ops=("aten::silu.default",)
    )

    def fused_tpu():
        tdev.set_mode("fused", recorder="python")
        try:
            return fused_split(lambda: _recorded_chain(xt, wt, n_ops), torch.tpu.synchronize)
        finally:
            tdev.set_mode("strict")

    fused_rows("tpu fused, Python recorder", fused_tpu)

    def fused_tpu_native():
        tdev.set_mode("fused", recorder="native")
        try:
            return fused_split(lambda: _recorded_chain(xt, wt, n_ops), torch.tpu.synchronize, native_cache)
        finally:
            tdev.set_mode("strict")

    fused_rows("tpu fused, native recorder", fused_tpu_native)
    return out


def show(rows: dict[str, float | str]) -> None:
    for k, v in rows.items():
        print(f"   {k:<48} {v:8.2f}" if isinstance(v, float) else f"   {k:<48} {v}")


def target_line(what: str, value: float | str, shown: str, target: str, met: Callable[[float], bool]) -> None:
    """`=> what: shown; target T: MET|MISSED` (MISSED when the value was not measured)."""
    if isinstance(value, str):
        print(f"   => {what}: not measured; target {target}: MISSED (not measured: {value.split(':')[0]})")
    else:
        print(f"   => {what}: {shown}; target {target}: {'MET' if met(value) else 'MISSED'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions, no inductor")
    p.add_argument("--only", help=f"comma-separated sections to run, of {','.join(SECTIONS)} (default: all)")
    args = p.parse_args()
    only = set(SECTIONS) if args.only is None else {s.strip() for s in args.only.split(",") if s.strip()}
    if unknown := only - set(SECTIONS):
        p.error(f"unknown section(s) {', '.join(sorted(unknown))}; known: {', '.join(SECTIONS)}")
    n = 2000 if args.quick else 20000
    reps = 3 if args.quick else 10
    if "overhead" in only:
        print("1. host overhead per op, 16 elements (us)")
        o = overhead(n)
        show(o)
        strict = o["substitute('strict') F.silu"]
        shown = "" if isinstance(strict, str) else f"{strict:.2f} us ({strict - o['eager F.silu']:+.2f} us over eager)"
        target_line("substituted op (strict F.silu, the whole call)", strict, shown, "<= 8 us", lambda v: v <= 8.0)
        for c in CITED:
            print(f"   cited (not measured here): {c}")
    if "chains" in only:
        for title, f, kernel_ops, kernels in CHAINS:
            print(f"2. chain of >= 8 ops over 4M elements, {title} (ms)")
            c = fused_vs_strict(reps, title, f, kernel_ops, kernels)
            show(c)
            s, fu = c["strict (one call per op)"], c["fused (1 program)"]
            ratio = fu if isinstance(fu, str) else s if isinstance(s, str) else s / fu
            shown = "" if isinstance(ratio, str) else f"{ratio:.2f}x"
            target_line("fused speed-up over strict", ratio, shown, ">= 2x", lambda v: v >= 2.0)
    if "gpt" in only:
        print("3. example GPT forward (ms)")
        show(gpt_forward(reps, inductor=not args.quick))
    if "device" in only:
        calls = 100_000 if args.quick else 1_000_000
        print("4. the tpu device: host overhead per op, 16 elements (us)")
        d, rss = device_overhead(n, calls)
        show(d)
        for what, op, cpu, target in (
            ("kernel op at the key (tpu F.silu)", "tpu F.silu (kernel at the key)", "CPU eager F.silu", 4.0),
            ("fallback op (tpu a + b)", "tpu a + b (the device's fallback)", "CPU eager a + b", 2.5),
        ):
            v = d[op]
            over = v if isinstance(v, str) else v - d[cpu]
            shown = "" if isinstance(over, str) else f"{v:.2f} us ({over:+.2f} us over CPU eager)"
            target_line(what, over, shown, f"<= {target} us over CPU eager", lambda x, t=target: x <= t)
        print(f"5. the tpu device: RSS growth over {calls} calls after 10k warm-up calls (MiB)")
        show(rss)
        for label, grown in rss.items():
            target_line(f"RSS over {calls} {label}", grown, f"{grown:+.1f} MiB", "flat (< 8 MiB)", lambda x: x < 8.0)
    if "in_place" in only:
        print("6. an AdamW step on f32[1024,4096], updated in place (ms)")
        rows, moved = adamw_in_place(reps)
        show(rows)
        print("7. the same AdamW steps in GB/s (4 arrays read, 3 written)")
        show({k: moved / v / 1e6 for k, v in rows.items() if isinstance(v, float)})
    if "recording" in only:
        n_ops = 100
        print(f"8. fused mode: recording per op on a trace-cache hit, a chain of {n_ops} ops on f32[16,16] (us)")
        r = recording(n_ops, 20 if args.quick else 200)
        show(r)
        v = r["tpu fused, native recorder recording, per op (trace-cache hit)"]
        target_line(
            "tpu fused recording per op (native recorder)",
            v,
            "" if isinstance(v, str) else f"{v:.2f} us",
            "<= 2 us",
            lambda x: x <= 2.0,
        )
        v = r["tpu fused, Python recorder recording, per op (trace-cache hit)"]
        if not isinstance(v, str):
            print(f"   => tpu fused with the Python recorder (no target): {v:.2f} us per op")
        v = r["substitute('fused') recording, per op (trace-cache hit)"]
        vp = r["substitute('fused'), Python handler recording, per op (trace-cache hit)"]
        floor = r["a Python dispatch mode that runs each op, per op (the mode's floor)"]
        if not isinstance(v, str) and not isinstance(vp, str):
            print(
                f"   => substitute('fused') on CPU tensors (no target): {v:.2f} us per op with the native handler, "
                f"{vp:.2f} with the Python one; a Python dispatch mode that only runs each op: {floor:.2f}"
            )
    if NOT_OURS:
        print(f"{len(NOT_OURS)} timed paths were NOT OURS (not timed):", file=sys.stderr)
        for what in NOT_OURS:
            print(f"  {what}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
