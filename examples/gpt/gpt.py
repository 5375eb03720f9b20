"""End-to-end: a small GPT under every tpu-kernels mode, checked against plain PyTorch.

The model (defined here, random weights): token embedding, RMSNorm, causal attention through
`F.scaled_dot_product_attention`, a SwiGLU MLP, a tied-free linear head and cross-entropy.
One forward and backward runs

  1. in plain PyTorch eager on CPU (the reference),
  2. on the "tpu" device, `model.to("tpu")`, in its strict, debug and fused modes
     (`tpu_kernels.device.set_mode`), and under a plain `torch.compile` of the device model,
  3. on CPU tensors under `tpu_kernels.substitute(mode="strict")`, `"debug"` and `"fused"`,
  4. on CPU tensors under `torch.compile(model, backend="tpu_kernels")`,

and each loss and every parameter gradient must match the reference within tolerance. Values
alone cannot tell our path from PyTorch's (everything falls back to PyTorch when something
fails), so each mode also runs inside `tpu_kernels.testing.no_fallbacks`: nothing may fall back,
replay or run in PyTorch, and the model's kernels (SDPA forward and backward, SiLU, log-softmax
forward and backward) must have run, inside one fused or compiled program or more where the
mode has programs. Then `tpu_kernels.report()` shows which kernels ran, what fell back and why,
the cache hits and the time spent in kernels.

    python examples/gpt/gpt.py [--layers 2] [--dim 64] [--seq 16] [--batch 2]

Exit status 1 when a mode disagrees with the reference or did not run on tpu_kernels.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import tpu_kernels.torch as tkt


@dataclass
class Config:
    vocab: int = 128
    dim: int = 64
    heads: int = 4
    layers: int = 2
    hidden: int = 128
    seq: int = 16
    batch: int = 2
    eps: float = 1e-6


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, eps=self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.out = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(a.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.up = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.down = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.norm1 = RMSNorm(cfg.dim, cfg.eps)
        self.attn = Attention(cfg)
        self.norm2 = RMSNorm(cfg.dim, cfg.eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Gpt(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.emb = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=True)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, self.cfg.vocab), targets.view(-1))


def step(model: nn.Module, run, tokens, targets):
    """(loss, {name: grad}) of one forward and backward through `run(tokens, targets)`."""
    model.zero_grad(set_to_none=True)
    loss = run(tokens, targets)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return loss.detach().clone(), grads


def compare(name: str, ref, got, rtol: float, atol: float) -> bool:
    (l0, g0), (l1, g1) = ref, got
    worst = max((g1[n] - g0[n]).abs().max().item() for n in g0)
    ok = math.isclose(l1.item(), l0.item(), rel_tol=rtol, abs_tol=atol) and all(
        torch.allclose(g1[n], g0[n], rtol=rtol, atol=atol) for n in g0
    )
    print(f"  {name:<28} loss {l1.item():.6f}  |dloss| {abs(l1.item() - l0.item()):.2e}  max|dgrad| {worst:.2e}  {'ok' if ok else 'MISMATCH'}")
    return ok


# The kernels one training step runs in every mode.
KERNELS = ["sdpa_flash_cpu", "sdpa_flash_cpu_backward", "silu", "log_softmax", "log_softmax_backward"]


def ran_ours(name: str, fn, programs: int = 0, kernels: list[str] = KERNELS):
    """`fn()` inside `no_fallbacks`: (its result, True), or (its result, False) after printing
    what fell back or did not run."""
    from tpu_kernels.testing import no_fallbacks

    try:
        with no_fallbacks(kernels=kernels, programs=programs) as ran:
            out = fn()
    except AssertionError as e:
        print(f"  {name:<28} NOT ON TPU_KERNELS: {e}")
        return None, False
    print(f"  {name:<28} kernels ran: {', '.join(f'{k}x{n}' for k, n in sorted(ran.kernels.items()))}"
          + (f"; {ran.programs} programs" if ran.programs else ""))
    return out, True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--skip-compile", action="store_true", help="skip torch.compile")
    args = p.parse_args(argv)
    cfg = Config(layers=args.layers, dim=args.dim, seq=args.seq, batch=args.batch)
    torch.manual_seed(0)
    model = Gpt(cfg)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq))
    targets = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"GPT: {cfg.layers} layers, dim {cfg.dim}, {cfg.heads} heads, vocab {cfg.vocab}, {n_params} parameters")

    ref = step(model, model, tokens, targets)
    print(f"  {'plain PyTorch eager (CPU)':<28} loss {ref[0].item():.6f}")
    ok = True

    # The one-word change: the model and its inputs on the "tpu" device.
    import copy

    import tpu_kernels.device as device

    on_tpu = copy.deepcopy(model).to("tpu")
    tok_t, tgt_t = tokens.to("tpu"), targets.to("tpu")

    def to_cpu(got):
        loss, grads = got
        return loss.cpu(), {n: g.cpu() for n, g in grads.items()}

    for mode in ("strict", "debug", "fused"):
        device.set_mode(mode)
        t = time.perf_counter()
        try:
            def device_step():
                got = step(on_tpu, on_tpu, tok_t, tgt_t)
                torch.tpu.synchronize()  # fused mode: run what was recorded (a step boundary)
                return got

            got, ours = ran_ours(f'to("tpu"), {mode}', device_step, programs=1 if mode == "fused" else 0)
        finally:
            device.set_mode("strict")
        ok &= ours
        if got is not None:
            ok &= compare(f'to("tpu"), {mode}', ref, to_cpu(got), rtol=1e-4, atol=1e-5)
        print(f"      {(time.perf_counter() - t) * 1e3:.1f} ms")
    if not args.skip_compile:
        torch._dynamo.reset()
        compiled_tpu = torch.compile(on_tpu)  # a plain torch.compile: device graphs go to tpu_kernels
        step(on_tpu, compiled_tpu, tok_t, tgt_t)
        t = time.perf_counter()
        got, ours = ran_ours('to("tpu"), torch.compile', lambda: step(on_tpu, compiled_tpu, tok_t, tgt_t), programs=2)
        ok &= ours
        if got is not None:
            ok &= compare('to("tpu"), torch.compile', ref, to_cpu(got), rtol=1e-4, atol=1e-5)
        print(f"      {(time.perf_counter() - t) * 1e3:.1f} ms (second step)")

    # The same kernels on CPU tensors, through the context manager and the compile backend.
    for mode in ("strict", "debug", "fused"):
        def run(tok, tgt, mode=mode):
            with tkt.substitute(mode=mode):
                loss = model(tok, tgt)
                loss.backward()
            return loss

        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        loss, ours = ran_ours(f"substitute({mode!r})", lambda run=run: run(tokens, targets),
                              programs=1 if mode == "fused" else 0)
        ok &= ours
        if loss is None:
            continue
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        ok &= compare(f"substitute({mode!r})", ref, (loss.detach(), grads), rtol=1e-4, atol=1e-5)
        print(f"      {(time.perf_counter() - t) * 1e3:.1f} ms")

    if not args.skip_compile:
        import tpu_kernels.torch.backend  # noqa: F401  (registers the backend without install)

        torch._dynamo.reset()
        compiled = torch.compile(model, backend="tpu_kernels")
        t = time.perf_counter()
        got = step(model, compiled, tokens, targets)
        first = time.perf_counter() - t
        t = time.perf_counter()
        got, ours = ran_ours('torch.compile("tpu_kernels")', lambda: step(model, compiled, tokens, targets),
                             programs=2)
        ok &= ours
        if got is not None:
            ok &= compare('torch.compile("tpu_kernels")', ref, got, rtol=1e-4, atol=1e-5)
        print(f"      first step {first * 1e3:.0f} ms (compiles), second {(time.perf_counter() - t) * 1e3:.1f} ms")

    print()
    print(tkt.report())
    print()
    print("every path matches plain PyTorch" if ok else "MISMATCH against plain PyTorch")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
