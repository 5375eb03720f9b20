"""One training step of each zoo model (python/tests/zoo.py) timed in every path, side by side in
one run: plain eager, Inductor (`torch.compile`), the compiled tpu_kernels path (split into host
time and PJRT program time), and the strict and fused eager modes. Prints a Markdown section.

    # after eval "$(scripts/dev env)"
    python python/tools/bench_zoo.py                       # every model
    python python/tools/bench_zoo.py --models llama,gpt2 --steps 5
    python python/tools/bench_zoo.py --paths tpu,tpu-fused,tpu-fused-python,tpu-compile   # the "tpu" device only

Each model runs in a fresh process of its own (`--one-process` times them all in this one), so what
one model's paths leave behind in a process does not weigh on the next model's timings; the paths
of one model share its process. A step is forward, backward and one AdamW step (foreach=False) on
the model's batch; each path gets a fresh model from the same seed, `--warmup` untimed steps
(compiles happen there), then `--steps` timed ones; the median is reported. Program time is what
the extension measures around each compiled program's run (`report().graphs["run_time_s"]`:
uploads, execution, outputs); the AdamW step runs in eager PyTorch in every path and is shown
apart; host time is the rest of the compiled step (Dynamo's guards, AOT's wrappers, argument and
output handling, the model's Python between graphs, PyTorch nodes of split graphs), also per graph
call, with the backend's own share (`report().compiled["call_time_s"]` less the program time)
apart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import tpu_kernels  # noqa: E402,F401  before torch, as a user would: see tpu_kernels._openmp
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "tests"))

PATHS = ("eager", "inductor", "tpu_kernels", "strict", "fused", "tpu", "tpu-fused", "tpu-fused-python", "tpu-compile")
# The "tpu" device's paths and the device mode each runs under.
DEVICE_MODES = {"tpu": "strict", "tpu-fused": "fused", "tpu-fused-python": "fused", "tpu-compile": "strict"}
# The recorder of each device path in fused mode: the native one (the default) and the Python one.
RECORDERS = {"tpu-fused": "native", "tpu-fused-python": "python"}


def _step_fn(spec, path: str):
    """A fresh model and a function running one training step on it through `path`."""
    import torch

    import zoo

    model, batch = zoo.build(spec)
    on_device = path in DEVICE_MODES
    if on_device:
        model = model.to("tpu")
        batch = {k: zoo._to_device(v) for k, v in batch.items()}
    opt = torch.optim.AdamW(model.parameters(), lr=zoo.LR, foreach=False)
    runner = model
    if path in ("inductor", "tpu_kernels", "tpu-compile"):
        torch._dynamo.reset()
        runner = torch.compile(model, backend="inductor" if path == "inductor" else "tpu_kernels")
    mode = None
    if path in ("strict", "fused"):
        from tpu_kernels.torch import substitute

        mode = path

    def step() -> float:
        """One step; returns the seconds the optimizer step took."""
        opt.zero_grad(set_to_none=True)
        if mode is None:
            loss = spec.loss(runner, batch)
            loss.backward()
            t = time.perf_counter()
            opt.step()
            spent = time.perf_counter() - t
            if on_device:
                float(loss)  # the device's fused mode runs its step's programs here
            return spent
        from tpu_kernels.torch import substitute

        with substitute(mode):
            loss = spec.loss(runner, batch)
            loss.backward()
            t = time.perf_counter()
            opt.step()
            spent = time.perf_counter() - t
            float(loss)  # a materialisation point: the fused step's programs run here
        return spent

    return step


def _graph_counters() -> tuple[float, float, int]:
    """(seconds running programs, seconds in the backend's calls, calls) so far."""
    from tpu_kernels.torch import report

    r = report()
    return float(r.graphs.get("run_time_s", 0.0)), float(r.compiled["call_time_s"]), int(r.compiled["calls"])


def _rss() -> tuple[int, int]:
    """(resident bytes now, their high-water mark) of this process, from /proc/self/status."""
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                got[key] = int(value.split()[0]) * 1024
    return got["VmRSS"], got["VmHWM"]


def _reset_peak_rss() -> bool:
    """Resets the high-water mark to the resident size now (Linux's clear_refs "5")."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure(spec, path: str, warmup: int, steps: int) -> dict[str, float]:
    step = _step_fn(spec, path)
    on_device = path in DEVICE_MODES
    if on_device:
        import torch

        import tpu_kernels.device as device

        device.set_mode(DEVICE_MODES[path], **({"recorder": RECORDERS[path]} if path in RECORDERS else {}))
    rows = []
    try:
        for _ in range(warmup):
            step()
        # Memory over the timed steps, above where they start: the process's peak RSS, and on the
        # device the peak of the device's allocated bytes (every tensor's memory, kernel outputs
        # and fallback results alike).
        rss0 = _rss()[0] if _reset_peak_rss() else None
        if on_device:
            device0 = torch.tpu.memory_allocated()
            torch.tpu.reset_peak_memory_stats()
        for _ in range(steps):
            p0, c0, n0 = _graph_counters()
            t0 = time.perf_counter()
            optimizer = step()
            elapsed = time.perf_counter() - t0
            p1, c1, n1 = _graph_counters()
            rows.append(
                {"step": elapsed, "program": p1 - p0, "backend": c1 - c0, "calls": n1 - n0, "optimizer": optimizer}
            )
        peaks = {"peak_rss": None if rss0 is None else _rss()[1] - rss0}
        if on_device:
            peaks["peak_device"] = torch.tpu.max_memory_allocated() - device0
    finally:
        if on_device:
            device.set_mode("strict")
    times = [r["step"] for r in rows]
    return {**rows[times.index(statistics.median_low(times))], **peaks}


def _in_child(name: str, paths: list[str], args) -> dict[str, dict[str, float] | str]:
    """One model's cells, measured by this script in a fresh process."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "rows.json"
        r = subprocess.run(
            [sys.executable, __file__, "--models", name, "--paths", ",".join(paths), "--steps", str(args.steps),
             "--warmup", str(args.warmup), "--json-out", str(out)],
            stdout=subprocess.DEVNULL,
        )
        if r.returncode != 0 or not out.exists():
            return {path: f"the model's process failed (exit code {r.returncode})" if path in paths
                    else "not run (--paths)" for path in PATHS}
        [(_, _, got)] = json.loads(out.read_text())
        return got


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", help="comma-separated zoo models (default: all)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per path (default 20)")
    p.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed steps first (default 3: fused mode compiles its steady trace at the third, "
        "once the optimizer's changing floats are lifted into program inputs)",
    )
    p.add_argument("--paths", help=f"comma-separated paths to time (default: all of {', '.join(PATHS)})")
    p.add_argument("--one-process", action="store_true",
                   help="time every model in this process (default: a fresh process per model)")
    p.add_argument("--json-out", help=argparse.SUPPRESS)  # a child's rows, for its parent
    args = p.parse_args(argv)
    paths = args.paths.split(",") if args.paths else list(PATHS)
    if set(paths) - set(PATHS):
        p.error(f"unknown paths {sorted(set(paths) - set(PATHS))}; known: {', '.join(PATHS)}")

    import torch

    import zoo

    torch.manual_seed(0)
    names = args.models.split(",") if args.models else list(zoo.SPECS)
    unknown = [n for n in names if n not in zoo.SPECS]
    if unknown:
        p.error(f"unknown models {unknown}; known: {', '.join(zoo.SPECS)}")
    rows = []
    start = time.perf_counter()
    for name in names:
        spec = zoo.SPECS[name]
        if len(names) > 1 and not args.one_process:
            # Each model in a fresh process: what one model's paths leave behind in a process
            # (threads, caches, the heap) does not weigh on the next model's timings.
            rows.append((name, spec.family, _in_child(name, paths, args)))
            continue
        got: dict[str, dict[str, float] | str] = {path: "not run (--paths)" for path in PATHS}
        for path in paths:
            t = time.perf_counter()
            try:
                got[path] = measure(spec, path, args.warmup, args.steps)
            except Exception as e:  # a path that fails is a cell with its error, not a crash
                got[path] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
            print(f"[bench_zoo {time.perf_counter() - start:6.1f}s] {name} {path} ({time.perf_counter() - t:.1f} s)",
                  file=sys.stderr, flush=True)
        rows.append((name, spec.family, got))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows))
        return 0

    def ms(v) -> str:
        if isinstance(v, dict):
            return f"{v['step'] * 1e3:.1f}"
        return v if v.startswith("not run") else f"failed: {v}"

    def ratio(v, base) -> str:
        if isinstance(v, dict) and isinstance(base, dict) and base["step"] > 0:
            return f"{v['step'] / base['step']:.2f}"
        return "n/a"

    separate = ", each model in a process of its own" if len(names) > 1 and not args.one_process else ""
    print("## Zoo: one training step per path (ms, median)")
    print()
    print(f"{args.steps} timed steps after {args.warmup} untimed ones, each path on a fresh model from the same "
          f"seed{separate}; forward, backward and an AdamW step. tpu_kernels = `torch.compile(backend=\"tpu_kernels\")`, its "
          "program time measured around each compiled program's run, the AdamW step (eager PyTorch in every path) "
          "apart, host time the rest of the step.")
    print()
    print("| model | kind | eager | Inductor | tpu_kernels | of which program | of which AdamW | of which host "
          "| graph calls | host per call | backend per call | host target | tpu_kernels / Inductor | strict | fused "
          "| fused / strict |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for name, family, got in rows:
        tk = got["tpu_kernels"]
        if isinstance(tk, dict):
            host = tk["step"] - tk["program"] - tk["optimizer"]
            calls = max(tk["calls"], 1)
            # The target: host time at most 10% of the step or 0.3 ms per graph call, the larger.
            allowed = max(0.1 * tk["step"], 0.3e-3 * calls)
            cells = [f"{tk['program'] * 1e3:.1f}", f"{tk['optimizer'] * 1e3:.1f}", f"{host * 1e3:.1f}",
                     str(tk["calls"]), f"{host / calls * 1e3:.2f}",
                     f"{(tk['backend'] - tk['program']) / calls * 1e3:.3f}",
                     f"{'met' if host <= allowed else 'missed'} ({allowed * 1e3:.1f})"]
        else:
            cells = ["n/a"] * 7
        print(f"| {name} | {family} | {ms(got['eager'])} | {ms(got['inductor'])} | {ms(tk)} | {' | '.join(cells)} | "
              f"{ratio(tk, got['inductor'])} | {ms(got['strict'])} | {ms(got['fused'])} | "
              f"{ratio(got['fused'], got['strict'])} |")
    print()
    print("Host time is the compiled step but its programs' runs and the AdamW step: Dynamo's guards, AOT's "
          "runtime wrappers, the autograd engine, the model's Python between graphs, PyTorch nodes of split graphs, "
          "and the backend's own handling of arguments and outputs (`backend per call`: the backend's call time "
          "less the program's run). The host target is met when host time is at most the larger of 10% of the step "
          "and 0.3 ms per graph call (the allowance in parentheses, ms).")
    print()
    if any(p in DEVICE_MODES for p in paths):
        print("## Zoo on the tpu device: one training step per device mode (ms, median)")
        print()
        print("The same steps with the model and batch on the \"tpu\" device (`model.to(\"tpu\")`), under the "
              "device's strict and fused modes (`tpu_kernels.device.set_mode`), fused with the native recorder "
              "(the default) and with the Python one (`recorder=\"python\"`), and under `torch.compile` "
              "(backend \"tpu_kernels\"); each step ends by reading the loss. Targets, judged on the native "
              "recorder: fused at least 1.5x faster than strict, and within 1.25x of the compiled step.")
        print()
        print("| model | tpu strict | tpu fused (Python) | tpu fused (native) | strict / native | 1.5x target "
              "| tpu compiled | native / compiled | 1.25x target |")
        print("|---|---:|---:|---:|---:|---|---:|---:|---|")
        for name, _, got in rows:
            strict, fused, native, comp = got["tpu"], got["tpu-fused-python"], got["tpu-fused"], got["tpu-compile"]
            speedup = ratio(strict, native)
            versus = ratio(native, comp)
            print(f"| {name} | {ms(strict)} | {ms(fused)} | {ms(native)} | {speedup} | "
                  f"{'n/a' if speedup == 'n/a' else ('met' if float(speedup) >= 1.5 else 'missed')} | {ms(comp)} | "
                  f"{versus} | {'n/a' if versus == 'n/a' else ('met' if float(versus) <= 1.25 else 'missed')} |")
        print()
    print("## Zoo: memory over the timed steps (MiB above where they start)")
    print()
    print("Peak resident memory of the process over the timed steps less its resident memory before them "
          "(`VmHWM` after resetting it, Linux), and on the device the peak of `torch.tpu.max_memory_allocated()` "
          "less the allocated bytes before them. Target: a fused step keeps no more live memory than strict "
          "(RSS with 1 MiB of slack for pages the allocator and Python touch; the device's bytes exactly).")
    print()

    def mib(v, key: str) -> str:
        if not isinstance(v, dict):
            return "n/a"
        return "n/a" if v.get(key) is None else f"{v[key] / 2**20:.1f}"

    def within(a, b, key: str) -> str:
        if not (isinstance(a, dict) and isinstance(b, dict)) or a.get(key) is None or b.get(key) is None:
            return "n/a"
        # RSS gets 1 MiB of slack (it moves by pages the allocator and Python touch, whatever the
        # path); the device's allocated bytes are exact and get none.
        slack = 2**20 if key == "peak_rss" else 0
        return "met" if a[key] <= b[key] + slack else "missed"

    print("| model | eager RSS | strict RSS | fused RSS | fused <= strict | tpu strict RSS | tpu fused (native) RSS "
          "| tpu strict device | tpu fused (Python) device | tpu fused (Python) <= strict (device) "
          "| tpu native device | tpu native <= strict (device) |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---|")
    for name, _, got in rows:
        print(f"| {name} | {mib(got['eager'], 'peak_rss')} | {mib(got['strict'], 'peak_rss')} | "
              f"{mib(got['fused'], 'peak_rss')} | {within(got['fused'], got['strict'], 'peak_rss')} | "
              f"{mib(got['tpu'], 'peak_rss')} | {mib(got['tpu-fused'], 'peak_rss')} | "
              f"{mib(got['tpu'], 'peak_device')} | {mib(got['tpu-fused-python'], 'peak_device')} | "
              f"{within(got['tpu-fused-python'], got['tpu'], 'peak_device')} | {mib(got['tpu-fused'], 'peak_device')} | "
              f"{within(got['tpu-fused'], got['tpu'], 'peak_device')} |")
    print()
    print(f"Run time {time.perf_counter() - start:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
