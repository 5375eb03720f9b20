"""Which ATen op overloads real models send to the dispatcher, and which kernels bind them.

Models (small sizes, seeded, train mode):

- `gpt`: the GPT example (`examples/gpt/gpt.py`): embedding, RMSNorm through `F.rms_norm`,
  causal `F.scaled_dot_product_attention`, SwiGLU MLP, linear head, cross-entropy;
- `encoder_post`, `encoder_pre`: `nn.TransformerEncoderLayer` (batch_first, gelu, dropout 0,
  `norm_first` False / True) under an MSE loss;
- `mlp`: a classifier: `nn.Linear`, `nn.GELU(approximate="tanh")`, `nn.LayerNorm`, `nn.Dropout`
  (train mode), cross-entropy plus an entropy term through `F.softmax` and `F.log_softmax`.

Paths: eager forward and backward, seen by a logging `TorchDispatchMode` (what
`substitute(...)` sees: after autograd and CompositeImplicitAutograd decomposition); and
`torch.compile` through aot_autograd, forward and backward graphs captured by a compiler that
runs them unchanged, with the decomposition table of the project's backend
(`tpu_kernels.torch.backend.decompositions`): what the `"tpu_kernels"` backend receives.

For each call of an op overload some standard kernel binds, the tool records which kernel
`tpu_kernels.select` picks for the call's signature (bound as the dispatch mode binds it), or
that none does and why.

    python python/tools/trace_bindings.py          # writes docs/aten-bindings.md
    python python/tools/trace_bindings.py --check  # exit 1 when docs/aten-bindings.md is stale

The output is deterministic: rows sorted, no timestamps, the torch version stated.
`python/tests/test_aten_bindings.py` checks the committed file and that every bound overload is
reached.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "docs" / "aten-bindings.md"
COMMAND = "python python/tools/trace_bindings.py"

PATHS = ("eager fwd", "eager bwd", "compiled fwd", "compiled bwd")
MODELS = ("gpt", "encoder_post", "encoder_pre", "mlp")

# Unbound overloads worth a line when a traced path reaches them: what they are part of.
NOTABLE = {
    "aten::pow.Tensor_Scalar": (
        "`F.rms_norm` decomposed (CompositeImplicitAutograd): `x.pow(2)`; `tpuk::rms_norm` is a new op, "
        "reached only when called"
    ),
    "aten::mean.dim": "`F.rms_norm` decomposed: `mean(x^2, -1)`",
    "aten::rsqrt.default": "`F.rms_norm` decomposed: `rsqrt(mean + eps)`",
    "aten::silu_backward.default": "SiLU's gradient (the forward has the `silu` kernel)",
    "aten::gelu_backward.default": "GELU's gradient (the forward has the `gelu` / `gelu_tanh` kernels)",
    "aten::native_layer_norm_backward.default": "LayerNorm's gradient (the forward has the `layer_norm` kernel)",
    "aten::_softmax_backward_data.default": "softmax's gradient (the forward has the `softmax` kernel)",
    "aten::_log_softmax_backward_data.default": "log-softmax's gradient (the forward has the `log_softmax` kernel)",
    "aten::nll_loss_forward.default": (
        "`F.cross_entropy` is `log_softmax` + `nll_loss`; `tpuk::cross_entropy` is a new op, reached only when called"
    ),
    "aten::nll_loss_backward.default": "`F.cross_entropy`'s gradient: `tpuk::cross_entropy_backward` is not reached",
    "aten::_scaled_dot_product_flash_attention_for_cpu.default": "`F.scaled_dot_product_attention` on CPU",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward.default": "its gradient",
    "aten::native_dropout.default": (
        "`nn.Dropout` in train mode (compiled); `tpuk::dropout` is a new op with its own RNG"
    ),
    "aten::bernoulli_.float": "`nn.Dropout` in train mode (eager CPU: `bernoulli_`, `div_`, `mul`)",
    "aten::addmm.default": "`nn.Linear` with bias: `tpuk::matmul_bias_act` is a new op, reached only when called",
    "aten::mm.default": "`nn.Linear` without bias, and linear gradients",
    "aten::embedding.default": "`nn.Embedding`",
    "aten::embedding_dense_backward.default": "`nn.Embedding`'s gradient",
}

# ----- models -----


class WithLoss(nn.Module):
    """`model` and its training loss as one module, so compiled graphs include the loss."""

    def __init__(self, model: nn.Module, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.loss(self.model(x), target)


class MlpClassifier(nn.Module):
    def __init__(self, d_in: int = 16, hidden: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.norm = nn.LayerNorm(hidden)
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.norm(self.act(self.fc1(x)))))


def _mlp_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    # Cross-entropy minus a small entropy bonus (`sum p log p`).
    entropy = -(F.softmax(logits, dim=-1) * F.log_softmax(logits, dim=-1)).sum(-1).mean()
    return F.cross_entropy(logits, target) - 0.01 * entropy


def _gpt() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    sys.path.insert(0, str(REPO / "examples" / "gpt"))
    try:
        import gpt
    finally:
        sys.path.pop(0)
    cfg = gpt.Config(vocab=64, dim=32, heads=2, layers=1, hidden=64, seq=8, batch=2)
    model = gpt.Gpt(cfg)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq))
    targets = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq))
    return model, (tokens, targets)


def _encoder(norm_first: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    layer = nn.TransformerEncoderLayer(
        d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, activation="gelu", batch_first=True, norm_first=norm_first
    )
    return WithLoss(layer, F.mse_loss), (torch.randn(2, 8, 32), torch.randn(2, 8, 32))


def _mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return WithLoss(MlpClassifier(), _mlp_loss), (torch.randn(8, 16), torch.randint(0, 10, (8,)))


MODEL_BUILDERS: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "gpt": _gpt,
    "encoder_post": lambda: _encoder(norm_first=False),
    "encoder_pre": lambda: _encoder(norm_first=True),
    "mlp": _mlp,
}

# ----- tracing -----


@dataclass
class Trace:
    """op overload -> path -> models that reached it; bound op -> outcomes of selection."""

    seen: dict[str, dict[str, set[str]]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(set)))
    # op -> {kernel name, or "no kernel: <reason>"} over every traced call of the op.
    selected: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    # (op, outcome) -> path -> models whose calls gave it; and the first such call's signature.
    where: dict[tuple[str, str], dict[str, set[str]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(set))
    )
    signature: dict[tuple[str, str], str] = field(default_factory=dict)

    def record(self, path: str, model: str, func, args, kwargs) -> None:
        from tpu_kernels.torch._bindings import op_key

        key = op_key(func)
        self.seen[key][path].add(model)
        outcome = _selection(func, args, kwargs)
        if outcome is not None:
            result, sig = outcome
            self.selected[key].add(result)
            self.where[(key, result)][path].add(model)
            self.signature.setdefault((key, result), sig)


_SHORT_REASON = re.compile(r"^no kernel for `[^`]+` accepts the call: ")


def _selection(func, args, kwargs) -> tuple[str, str] | None:
    """(the selected kernel or "no kernel: why", the call's signature) for an op some kernel
    binds; None for other ops."""
    import tpu_kernels as tk
    from tpu_kernels.torch._bindings import TABLE
    from tpu_kernels.torch.graph import DTYPES

    plan = TABLE.plan(func)
    if plan is None:
        return None
    bound = plan.bind(args, kwargs)
    if isinstance(bound, str):  # the call does not bind to any kernel's parameters
        return f"no kernel: {bound}", ""
    tensors, statics = bound
    sig = ", ".join(f"{DTYPES.get(t.dtype, t.dtype)}[{','.join(str(int(d)) for d in t.shape)}]" for t in tensors)
    statics_text = ", ".join(f"{n}={v}" for n, v in statics)
    full = f"{sig}; {statics_text}" if statics_text else sig
    try:
        name = tk.select(plan.key, sig, dict(statics), contiguous=[t.is_contiguous() for t in tensors])
    except tk.TpuKernelsError as e:
        return f"no kernel: {_SHORT_REASON.sub('', str(e)).strip()}", full
    return name, full


class _Logger(TorchDispatchMode):
    def __init__(self, trace: Trace, path: str, model: str) -> None:
        super().__init__()
        self.trace, self.path, self.model = trace, path, model

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.trace.record(self.path, self.model, func, args, kwargs)
        return func(*args, **kwargs)


def _eager(trace: Trace, name: str) -> None:
    torch.manual_seed(0)
    model, inputs = MODEL_BUILDERS[name]()
    model.train()
    with _Logger(trace, "eager fwd", name):
        loss = model(*inputs)
    with _Logger(trace, "eager bwd", name):
        loss.backward()


def _compiled(trace: Trace, name: str) -> None:
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from tpu_kernels.torch.backend import decompositions

    def capture(path: str):
        def compile_fn(gm: torch.fx.GraphModule, example_inputs):
            for node in gm.graph.nodes:
                if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
                    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
                    trace.record(path, name, node.target, args, kwargs)
            return make_boxed_func(gm.forward)

        return compile_fn

    torch.manual_seed(0)
    model, inputs = MODEL_BUILDERS[name]()
    model.train()
    backend = aot_autograd(
        fw_compiler=capture("compiled fwd"), bw_compiler=capture("compiled bwd"), decompositions=decompositions()
    )
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=backend, fullgraph=True)
        compiled(*inputs).backward()
    finally:
        torch._dynamo.reset()


def trace(models: tuple[str, ...] = MODELS) -> Trace:
    """Runs every model on every path."""
    import tpu_kernels.torch  # noqa: F401  (the kernel table, the custom ops' namespace)
    from tpu_kernels.torch._bindings import TABLE

    TABLE.refresh()
    t = Trace()
    for name in models:
        _eager(t, name)
        _compiled(t, name)
    return t


# ----- the record -----


def standard_bindings() -> dict[str, list[str]]:
    """op overload -> names of the standard (linked-in) kernels bound to it."""
    import tpu_kernels as tk

    out: dict[str, list[str]] = defaultdict(list)
    for k in tk.kernels():
        if k["runtime"]:
            continue
        for op in k["ops"]:
            out[op].append(k["name"])
    return {op: sorted(names) for op, names in sorted(out.items())}


def _cell(models: set[str]) -> str:
    return ", ".join(m for m in MODELS if m in models) or "·"


def _code(text: str) -> str:
    return f"`{text}`"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(t: Trace, bindings: dict[str, list[str]] | None = None) -> str:
    """The markdown record of trace `t` against `bindings` (default: the standard kernels')."""
    bindings = standard_bindings() if bindings is None else bindings
    aten_bound = {op: ks for op, ks in bindings.items() if op.startswith("aten::")}
    new_ops = {op: ks for op, ks in bindings.items() if not op.startswith("aten::")}
    header = "| op overload | " + " | ".join(PATHS)
    rule = "|---|" + "---|" * len(PATHS)
    lines = [
        "# ATen bindings: what real models send to the dispatcher",
        "",
        f"Generated by `{COMMAND}` with torch {torch.__version__.split('+')[0]}; do not edit by hand.",
        "`python/tests/test_aten_bindings.py` fails when this file is stale, and when an ATen overload",
        "a standard kernel binds is reached by no traced path.",
        "",
        "Models (small, seeded, train mode): `gpt` (examples/gpt, one block), `encoder_post` and",
        "`encoder_pre` (`nn.TransformerEncoderLayer`, batch_first, gelu, dropout 0, `norm_first`",
        "False / True, MSE loss), `mlp` (Linear, GELU tanh, LayerNorm, Dropout, softmax / log_softmax,",
        "cross-entropy). Paths: eager forward and backward as a `TorchDispatchMode` sees them (what",
        "`substitute(...)` sees), and `torch.compile` through aot_autograd with the decompositions of",
        "`tpu_kernels.torch.backend` (what the `\"tpu_kernels\"` backend receives), forward and backward",
        "graphs. A cell lists the models whose path reached the overload (`·`: none).",
        "",
        "## Overloads standard kernels bind",
        "",
        "`selected` is what `tpu_kernels.select` chose for the traced calls' signatures; calls no kernel",
        "took are listed below the table.",
        "",
        header + " | kernels | selected |",
        rule + "---|---|",
    ]
    for op, kernels in aten_bound.items():
        paths = t.seen.get(op, {})
        cells = [_cell(paths.get(p, set())) for p in PATHS]
        outcomes = t.selected.get(op, set())
        chosen = ", ".join(_code(s) for s in sorted(outcomes) if not s.startswith("no kernel")) or "·"
        if any(s.startswith("no kernel") for s in outcomes):
            chosen += "; some calls: none"
        lines.append(f"| {_code(op)} | " + " | ".join(cells) + f" | {', '.join(map(_code, kernels))} | {chosen} |")
    rejected = sorted((op, s) for op in aten_bound for s in t.selected.get(op, set()) if s.startswith("no kernel"))
    lines += ["", "### Traced calls no kernel took", ""]
    if rejected:
        for op, s in rejected:
            paths = t.where[(op, s)]
            where = "; ".join(f"{p}: {_cell(paths[p])}" for p in PATHS if p in paths)
            sig = t.signature[(op, s)]
            where += f"; first call `{sig}`" if sig else ""
            lines.append(f"- {_code(op)} ({where}): {_escape(s.removeprefix('no kernel: '))}")
    else:
        lines.append("None: a kernel took every traced call of a bound overload.")

    unreached = [op for op in aten_bound if op not in t.seen]
    lines += ["", "## Bound overloads no traced path reaches", ""]
    if unreached:
        for op in unreached:
            lines.append(f"- {_code(op)}: {', '.join(map(_code, aten_bound[op]))}")
    else:
        lines.append("None.")

    taken = {k for outcomes in t.selected.values() for k in outcomes}
    idle = sorted((k, op) for op, ks in aten_bound.items() for k in ks if k not in taken)
    lines += ["", "## ATen-bound kernels no traced call selected", ""]
    if idle:
        for k, op in idle:
            lines.append(f"- {_code(k)} ({_code(op)})")
    else:
        lines.append("None.")

    lines += [
        "",
        "## New ops",
        "",
        "Kernels that define new ops (not ATen) are reached when a program calls `torch.ops.<ns>.<op>`;",
        "no traced model does unless a row says so.",
        "",
        "| op | kernels | reached by |",
        "|---|---|---|",
    ]
    for op, kernels in new_ops.items():
        reached = "; ".join(f"{p}: {_cell(ms)}" for p, ms in sorted(t.seen.get(op, {}).items())) or "·"
        lines.append(f"| {_code(op)} | {', '.join(map(_code, kernels))} | {reached} |")

    unbound = sorted(op for op in t.seen if op not in bindings)
    notable = [op for op in sorted(NOTABLE) if op in t.seen and op not in bindings]
    lines += ["", "## Notable unbound overloads", ""]
    for op in notable:
        lines.append(f"- {_code(op)}: {NOTABLE[op]}.")
    if not notable:
        lines.append("None.")
    lines += ["", "## Every unbound overload reached", "", header + " |", rule]
    for op in unbound:
        lines.append(f"| {_code(op)} | " + " | ".join(_cell(t.seen[op].get(p, set())) for p in PATHS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 when the committed record is stale")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    text = render(trace())
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: rerun `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
