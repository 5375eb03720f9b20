"""Imports the example Pallas kernels and runs them from PyTorch on the PJRT CPU client.

    scripts/dev env > /tmp/env && . /tmp/env && python examples/pallas/run.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # no TPU here: keep jax off libtpu's runtime
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import tpu_kernels as tk  # noqa: E402
from kernels import register_all  # noqa: E402


def main() -> None:
    imported = register_all()
    for key, k in imported.items():
        print(f"{k.name:16} {k.op:32} fingerprint {k.fingerprint[:12]}  import {k.timings['total']:.2f} s")
    x, y = torch.randn(256, 256), torch.randn(256, 256)
    print("matmul     max err", (torch.ops.tpuk_examples.matmul(x, y) - x @ y).abs().max().item())
    x, w = torch.randn(24, 128), torch.randn(128)  # B = 24: specialised to this call
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    print("rms_norm   max err", (torch.ops.tpuk_examples.rms_norm(x, w) - ref).abs().max().item())
    x, y = torch.randn(16, 256), torch.randn(16, 256)
    print("silu_mul   max err", (torch.ops.tpuk_examples.silu_mul(x, y) - torch.nn.functional.silu(x) * y).abs().max().item())
    q, k, v = (torch.randn(1, 2, 256, 128) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    print("flash_attn max err", (torch.ops.tpuk_examples.flash_attention(q, k, v) - ref).abs().max().item())
    s = tk.stats()
    print(f"substituted {s['substituted']} calls, {s['fallbacks']} fallbacks")


if __name__ == "__main__":
    main()
