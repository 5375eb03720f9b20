"""Times the import (export + validate + register) of jax's flash attention kernel, step by step.

    eval "$(scripts/dev env)" && python python/tools/import_timing.py

`import jax` (and torch, which defines the new op) are excluded, as are the one-time runtime
starts (loading libtpu and the PJRT CPU plugin, jax's CPU backend), which the first import in a
process pays: they are shown separately. Steps that run side by side (libtpu's compile, the CPU
client's run, jax's own CPU run) are listed each with its own time; "total" is wall time.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "pallas"))

t0 = time.perf_counter()
import jax  # noqa: E402
import torch  # noqa: E402,F401

import tpu_kernels as tk  # noqa: E402
from kernels import attention_reference, flash_attention  # noqa: E402

IMPORTS = time.perf_counter() - t0
SIG = ["f32[1,2,256,128], f32[1,2,256,128], f32[1,2,256,128]"]
STEPS = [
    ("prepare", "arguments, signatures, binding"),
    ("export_tpu", "jax.export for TPU (Mosaic custom call)"),
    ("export_cpu", "jax.export for CPU (Pallas interpret mode)"),
    ("parse", "jaxlib parse + Rust reader signature check"),
    ("tpu_compile", "libtpu compile-only for v5e:1x1"),
    ("cpu_run", "CPU variant on the Rust PJRT CPU client"),
    ("jax_cpu", "the JAX function run by jax on CPU"),
    ("register", "register (atomic) + define the torch op"),
]


def warm_up() -> float:
    """The one-time starts: libtpu, the PJRT CPU client, jax's CPU backend."""
    start = time.perf_counter()
    tk.register_jax(lambda x: x + 1.0, name="warm_up", op="timing::warm_up", signatures=["f32[8,128]"])
    tk.unregister("warm_up")
    return time.perf_counter() - start


def main() -> None:
    once = warm_up()
    start = time.perf_counter()
    k = tk.register_jax(
        flash_attention, name="flash_attention", op="timing::flash_attention", signatures=SIG,
        reference=attention_reference,
    )
    wall = time.perf_counter() - start
    print(f"{'step':<12} {'ms':>8}  what")
    for key, what in STEPS:
        print(f"{key:<12} {k.timings.get(key, 0.0) * 1e3:8.1f}  {what}")
    print(f"{'total':<12} {wall * 1e3:8.1f}  wall time (budget 2000 ms)")
    print(f"{'(excluded)':<12} {IMPORTS * 1e3:8.1f}  import jax, torch, tpu_kernels")
    print(f"{'(excluded)':<12} {once * 1e3:8.1f}  first import in the process: libtpu, PJRT CPU client, jax CPU backend")
    # Outputs back to torch: zero-copy (DLPack alias) against one copy.
    d = tk.default_dispatcher()
    q = torch.randn(1, 2, 256, 128)
    (out,) = d.call("timing::flash_attention", [q, q, q])
    n = 2000
    t = time.perf_counter()
    for _ in range(n):
        torch.from_dlpack(out)
    alias = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for _ in range(n):
        torch.from_dlpack(out).clone()
    copy = (time.perf_counter() - t) / n
    print(f"output to torch (1x2x256x128 f32): zero-copy {alias * 1e6:.1f} us, one copy {copy * 1e6:.1f} us")
    if wall > 2.0:
        sys.exit(f"flash attention import took {wall:.2f} s > 2 s")


if __name__ == "__main__":
    main()
