"""Side-by-side timings of the PyTorch integration, in one run.

1. Host overhead of one substituted op on 16 elements (`F.silu`) under
   `substitute("strict")` vs plain eager, per op (target: <= 8 us per substituted op; TorchTPU's
   custom-kernel path is reported at 65-77 us). Also the bare native call and an empty
   TorchDispatchMode, to show where the time goes.
2. Fused vs strict on a chain of 8 kernel-backed ops over 4M elements (target: fused >= 2x).
3. The example GPT's forward: torch.compile(backend="tpu_kernels") vs eager PyTorch vs inductor.

    python python/tools/bench_torch.py [--quick]

Medians of repeated runs; the machine is noisy, so compare numbers from the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import tpu_kernels.torch as tkt
from tpu_kernels.torch._native import native

ROOT = Path(__file__).resolve().parents[2]


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


class _Nop(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def overhead(n: int) -> dict:
    x = torch.randn(16)
    out = {"eager F.silu": per_call_us(lambda: F.silu(x), n)}
    with _Nop():
        out["empty TorchDispatchMode"] = per_call_us(lambda: F.silu(x), n)
    call = native().call
    out["native call (DLPack in, upload, execute, tensor out)"] = per_call_us(lambda: call("aten::silu.default", [x], [], False), n)
    out["  (fallback answer: DLPack in, no kernel)"] = per_call_us(lambda: call("aten::nonexistent.default", [x], [], False), n)
    with tkt.substitute("strict"):
        out["substitute('strict') F.silu"] = per_call_us(lambda: F.silu(x), n)
    with tkt.substitute("debug"):
        out["substitute('debug') F.silu"] = per_call_us(lambda: F.silu(x), max(n // 10, 100))
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


def fused_vs_strict(repeats: int, f) -> dict:
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
        "strict (one call per op)": timed_ms(strict, repeats),
        "fused (1 program)": timed_ms(fused, repeats),
    }


def gpt_forward(repeats: int, inductor: bool) -> dict:
    sys.path.insert(0, str(ROOT / "examples" / "gpt"))
    import gpt

    import tpu_kernels.torch.backend  # noqa: F401

    torch.manual_seed(0)
    cfg = gpt.Config()
    model = gpt.Gpt(cfg)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq))
    targets = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq))
    out = {}
    with torch.no_grad():
        ref = model(tokens, targets)
        out["eager PyTorch"] = timed_ms(lambda: model(tokens, targets), repeats)
        torch._dynamo.reset()
        tk = torch.compile(model, backend="tpu_kernels")
        t = time.perf_counter()
        got = tk(tokens, targets)
        out["tpu_kernels first call (compile)"] = (time.perf_counter() - t) * 1e3
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
        out["torch.compile(backend='tpu_kernels')"] = timed_ms(lambda: tk(tokens, targets), repeats)
        if inductor:
            torch._dynamo.reset()
            ind = torch.compile(model, backend="inductor")
            t = time.perf_counter()
            got = ind(tokens, targets)
            out["inductor first call (compile)"] = (time.perf_counter() - t) * 1e3
            out["torch.compile(backend='inductor')"] = timed_ms(lambda: ind(tokens, targets), repeats)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions, no inductor")
    args = p.parse_args()
    n = 2000 if args.quick else 20000
    reps = 3 if args.quick else 10
    print("1. host overhead per op, 16 elements (us)")
    o = overhead(n)
    for k, v in o.items():
        print(f"   {k:<48} {v:8.2f}")
    added = o["substitute('strict') F.silu"] - o["eager F.silu"]
    print(f"   => substituted op costs {o['substitute(' + repr('strict') + ') F.silu']:.2f} us ({added:+.2f} us over eager); target <= 8 us, TorchTPU 65-77 us")
    for title, f in (
        ("mixed (3 silu kernels + 6 cheap ATen ops)", mixed_chain),
        ("elementwise kernels (silu/gelu/gelu-tanh x8)", elementwise_chain),
        ("with reductions (silu, gelu, softmax, gelu-tanh, silu, log_softmax, silu, gelu)", chain),
    ):
        print(f"2. chain of >= 8 ops over 4M elements, {title} (ms)")
        c = fused_vs_strict(reps, f)
        for k, v in c.items():
            print(f"   {k:<48} {v:8.2f}")
        print(f"   => fused is {c['strict (one call per op)'] / c['fused (1 program)']:.2f}x strict (target >= 2x)")
    print("3. example GPT forward (ms)")
    g = gpt_forward(reps, inductor=not args.quick)
    for k, v in g.items():
        print(f"   {k:<48} {v:8.2f}")


if __name__ == "__main__":
    main()
