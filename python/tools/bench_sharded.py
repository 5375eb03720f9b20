"""Sharded training steps: step time of the GPT example on 1, 2 and 4 PJRT CPU devices under
data, FSDP-style and tensor parallelism, beside plain eager PyTorch's step in the same run, with
the collectives XLA's partitioner inserted.

    python python/tools/bench_sharded.py [--steps 10] [--batch 8] [--dim 128]

Every device of the CPU client shares this machine's cores, so the step time does not scale
with the device count here: the table shows what partitioning costs (collectives, host-side
cutting and gathering), not what more chips would gain.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "gpt"))
import gpt  # noqa: E402

from tpu_kernels.torch import distributed as tkd  # noqa: E402
from tpu_kernels.torch._native import native  # noqa: E402

COLWISE = ["blocks.*.attn.qkv", "blocks.*.mlp.gate", "blocks.*.mlp.up"]
ROWWISE = ["blocks.*.attn.out", "blocks.*.mlp.down"]


def _median_ms(fn, steps: int, warm: bool = True) -> float:
    if warm:
        fn()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    cfg = gpt.Config(dim=args.dim, hidden=2 * args.dim, batch=args.batch)
    model = gpt.Gpt(cfg)
    x = torch.randint(0, cfg.vocab, (args.batch, cfg.seq))
    y = torch.randint(0, cfg.vocab, (args.batch, cfg.seq))

    def loss_fn(m, a, b):
        return m(a, b)

    def eager():
        model.zero_grad(set_to_none=True)
        loss_fn(model, x, y).backward()

    rows = [("eager PyTorch", 1, _median_ms(eager, args.steps), "", "")]
    for devices in (1, 2, 4):
        mesh = tkd.init_device_mesh((devices,), mesh_dim_names=("dp",))
        plans = {
            "data parallel": tkd.data_parallel(mesh),
            "FSDP-style": tkd.fully_sharded(mesh),
            "tensor parallel": tkd.tensor_parallel(mesh, colwise=COLWISE, rowwise=ROWWISE),
        }
        for name, plan in plans.items():
            step = tkd.compile_step(model, loss_fn, mesh, example=(x, y), **plan)

            def run(step=step):
                model.zero_grad(set_to_none=True)
                step(x, y)

            collectives = ", ".join(f"{k} {v}" for k, v in sorted(step.collectives.items())) or "none"
            run()  # the first run, apart
            runs0, nanos0 = native().sharded_stats()
            ms = _median_ms(run, args.steps, warm=False)
            runs1, nanos1 = native().sharded_stats()
            program = (nanos1 - nanos0) / 1e6 / max(runs1 - runs0, 1)
            rows.append((name, devices, ms, f"{program:.2f}", collectives))
    print(f"GPT example (dim {args.dim}, batch {args.batch}, seq {cfg.seq}), forward and backward, "
          f"median of {args.steps} steps (ms)\n")
    print("| layout | devices | step ms | of which the program's run (mean of the same steps) | collectives in the per-device program |")
    print("|---|---:|---:|---:|---|")
    for name, devices, ms, program, collectives in rows:
        print(f"| {name} | {devices} | {ms:.2f} | {program} | {collectives} |")
    print(
        "\nThe program's run counts uploading each device's shards, the run on every device and the outputs "
        "coming back; the rest of a step is cutting the inputs into shards and putting the gradients back "
        "together on the host."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
