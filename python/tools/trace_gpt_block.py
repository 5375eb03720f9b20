"""Trace a small GPT-style block through torch.compile's aot_autograd and write its ATen graphs.

The block: token embedding, RMSNorm (once as `F.rms_norm`, once written out as
`x * rsqrt(mean(x^2) + eps) * w`), causal attention through `F.scaled_dot_product_attention`,
a SwiGLU MLP, a linear head with bias and a cross-entropy loss. Sizes: batch 2, seq 8, dim 32,
heads 2, vocab 64.

The forward and backward FX graphs are captured with `aot_autograd` and the core ATen
decompositions minus the three scaled-dot-product entries (with them, SDPA gradients are
silently wrong while training). Each graph is written in the `tpu_kernels_registry::graph`
JSON format (see `registry/src/graph/mod.rs`):

    python python/tools/trace_gpt_block.py            # print the op overloads, write the JSON
    python python/tools/trace_gpt_block.py --out DIR  # write gpt_block_{fwd,bwd}.json to DIR

Importable: `trace()` returns both graphs with the real inputs and outputs of one training step,
which the numerics tests replay against the lowered StableHLO.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tpu_kernels.torch.backend import core_decompositions
from tpu_kernels.torch.graph import fx_to_json
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "registry" / "tests" / "data" / "graphs"

BATCH, SEQ, DIM, HEADS, VOCAB, HIDDEN = 2, 8, 32, 2, 64, 64
EPS = 1e-6


class GptBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.norm1 = nn.Parameter(1.0 + 0.1 * torch.randn(DIM))
        self.wqkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.norm2 = nn.Parameter(1.0 + 0.1 * torch.randn(DIM))
        self.w_gate = nn.Linear(DIM, HIDDEN, bias=False)
        self.w_up = nn.Linear(DIM, HIDDEN, bias=False)
        self.w_down = nn.Linear(HIDDEN, DIM, bias=False)
        self.head = nn.Linear(DIM, VOCAB, bias=True)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        b, t = tokens.shape
        x = self.emb(tokens)
        h = F.rms_norm(x, (DIM,), self.norm1, eps=EPS)
        q, k, v = self.wqkv(h).split(DIM, dim=-1)
        q, k, v = (z.view(b, t, HEADS, DIM // HEADS).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, t, DIM))
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.norm2
        x = x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))
        logits = self.head(x)
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


@dataclass
class Captured:
    """One ATen graph and the tensors of one real call of it."""

    name: str
    gm: torch.fx.GraphModule
    inputs: list[torch.Tensor] = field(default_factory=list)
    outputs: list[torch.Tensor | None] = field(default_factory=list)

    def to_json(self) -> dict:
        return fx_to_json(self.gm, self.name)


def trace(seed: int = 0) -> tuple[Captured, Captured, torch.Tensor]:
    """Compiles the block, runs one forward and backward; returns (fwd, bwd, eager loss)."""
    from torch._dynamo.backends.common import aot_autograd

    torch.manual_seed(seed)
    model = GptBlock()
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
    targets = torch.randint(0, VOCAB, (BATCH, SEQ))
    captured: dict[str, Captured] = {}

    def compiler(name: str):
        def compile_fn(gm: torch.fx.GraphModule, example_inputs):
            cap = Captured(name, gm)
            captured[name] = cap

            def run(args: list):
                # A boxed call: aot_autograd passes one list, which the callee may clear.
                cap.inputs = [a.detach().clone() for a in args]
                out = gm(*args)
                args.clear()
                cap.outputs = [o.detach().clone() if isinstance(o, torch.Tensor) else o for o in out]
                return out

            run._boxed_call = True
            return run

        return compile_fn

    backend = aot_autograd(
        fw_compiler=compiler("gpt_block_fwd"),
        bw_compiler=compiler("gpt_block_bwd"),
        decompositions=core_decompositions(),
    )
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    loss = compiled(tokens, targets)
    loss.backward()
    eager = model(tokens, targets)
    return captured["gpt_block_fwd"], captured["gpt_block_bwd"], eager.detach()


def op_set(*graphs: dict) -> list[str]:
    return sorted({n["op"] for g in graphs for n in g["nodes"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the JSON files")
    args = parser.parse_args()
    fwd, bwd, _ = trace()
    graphs = [fwd.to_json(), bwd.to_json()]
    args.out.mkdir(parents=True, exist_ok=True)
    for g in graphs:
        path = args.out / f"{g['name']}.json"
        path.write_text(json.dumps(g, indent=1) + "\n")
        print(f"wrote {path} ({len(g['nodes'])} nodes)")
    for name, g in zip(("forward", "backward"), graphs):
        print(f"{name}: {', '.join(op_set(g))}")
    print("all:", *op_set(*graphs), sep="\n  ")


if __name__ == "__main__":
    main()
