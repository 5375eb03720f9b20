"""The model zoo: small random-weight models (transformers architectures from small configs, a
diffusers UNet, no downloads; a DLRM-style recommender built from torch.nn) and one training step of each, run
through every path the project offers and compared with plain eager PyTorch.

A model is a `Spec`: a builder giving a fresh model for a seed (dropout off, so every path
computes the same function) and a batch maker. `train_step(spec, path)` runs forward, backward and
one AdamW step and returns the loss, every parameter's gradient and the parameters after the
step. The paths are "eager" (the reference), "strict", "debug", "fused" (`substitute(mode)`) and
"compile" (`torch.compile(model, backend="tpu_kernels")`).

The tests (test_zoo.py) and the benchmark (python/tools/bench_zoo.py) import it by name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

# On CPU tensors: plain eager, the three `substitute` modes, torch.compile. On the "tpu" device
# (`model.to("tpu")`): its strict, debug and fused modes, and torch.compile of the device model.
PATHS = (
    "eager", "strict", "debug", "fused", "compile", "tpu", "tpu-debug", "tpu-fused", "tpu-fused-python", "tpu-compile"
)
DEVICE_PATHS = {
    "tpu": "strict", "tpu-debug": "debug", "tpu-fused": "fused", "tpu-fused-python": "fused", "tpu-compile": "strict"
}
# The recorder of each device path in fused mode: the native one (the default) and the Python one.
RECORDERS = {"tpu-fused": "native", "tpu-fused-python": "python"}
VOCAB = 128
LR = 1e-3  # AdamW's learning rate
SEQ = 16
BATCH = 2


@dataclass(frozen=True)
class Spec:
    """One zoo model: `build()` gives the model (random weights from the ambient seed),
    `batch(generator)` its inputs, `loss(model, batch)` the scalar training loss."""

    name: str
    build: Callable[[], torch.nn.Module]
    batch: Callable[[torch.Generator], dict[str, Any]]
    loss: Callable[[torch.nn.Module, dict[str, Any]], torch.Tensor]
    family: str


def _tokens(g: torch.Generator) -> dict[str, Any]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


def _hf_loss(model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    return model(**batch).loss


def _decoder(config_cls: str, model_cls: str, **extra: Any) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import transformers

        config = getattr(transformers, config_cls)(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            attention_dropout=0.0,
            tie_word_embeddings=False,
            **extra,
        )
        return getattr(transformers, model_cls)(config)

    return build


def _gpt2() -> torch.nn.Module:
    import transformers

    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config)


def _bert() -> torch.nn.Module:
    import transformers

    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64, num_labels=3,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0,
    )
    return transformers.BertForSequenceClassification(config)


def _bert_batch(g: torch.Generator) -> dict[str, Any]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, SEQ * 3 // 4 :] = 0  # a padded second sequence: the attention mask matters
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, 3, (BATCH,), generator=g)}


def _t5() -> torch.nn.Module:
    import transformers

    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
        num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
    )
    return transformers.T5ForConditionalGeneration(config)


def _t5_batch(g: torch.Generator) -> dict[str, Any]:
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "labels": torch.randint(1, VOCAB, (BATCH, SEQ // 2), generator=g)}


def _vit() -> torch.nn.Module:
    import transformers

    config = transformers.ViTConfig(
        image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, num_labels=10,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return transformers.ViTForImageClassification(config)


def _images(g: torch.Generator) -> dict[str, Any]:
    return {
        "pixel_values": torch.randn(BATCH, 3, 32, 32, generator=g),
        "labels": torch.randint(0, 10, (BATCH,), generator=g),
    }


def _resnet() -> torch.nn.Module:
    import transformers

    config = transformers.ResNetConfig(
        num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
        layer_type="basic", num_labels=10,
    )
    return transformers.ResNetForImageClassification(config)


def _unet() -> torch.nn.Module:
    import diffusers

    return diffusers.UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(16, 32), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8,
    )


def _noisy(g: torch.Generator) -> dict[str, Any]:
    return {
        "sample": torch.randn(BATCH, 3, 16, 16, generator=g),
        "timestep": torch.randint(0, 1000, (BATCH,), generator=g),
        "noise": torch.randn(BATCH, 3, 16, 16, generator=g),
    }


def _unet_loss(model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    """The denoising objective: the predicted noise against the noise."""
    return F.mse_loss(model(batch["sample"], batch["timestep"]).sample, batch["noise"])


class DLRM(torch.nn.Module):
    """DLRM as its paper defines it: a bottom MLP over dense features, one embedding bag per
    sparse feature, the pairwise dot products of those vectors, and a top MLP to one logit."""

    def __init__(self, dense: int = 13, tables: int = 4, rows: int = 64, dim: int = 16) -> None:
        super().__init__()
        self.bottom = torch.nn.Sequential(
            torch.nn.Linear(dense, 32), torch.nn.ReLU(), torch.nn.Linear(32, dim), torch.nn.ReLU()
        )
        self.tables = torch.nn.ModuleList(torch.nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        n = tables + 1
        self.pairs = torch.triu_indices(n, n, offset=1)
        self.top = torch.nn.Sequential(
            torch.nn.Linear(dim + n * (n - 1) // 2, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
        )

    def forward(self, dense: torch.Tensor, indices: list[torch.Tensor], offsets: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottom(dense)
        vectors = [x] + [t(i, o) for t, i, o in zip(self.tables, indices, offsets)]
        z = torch.stack(vectors, dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)


def _dlrm_batch(g: torch.Generator) -> dict[str, Any]:
    n = 4
    lengths = [torch.randint(1, 4, (n,), generator=g) for _ in range(4)]
    return {
        "dense": torch.randn(n, 13, generator=g),
        "indices": [torch.randint(0, 64, (int(ln.sum()),), generator=g) for ln in lengths],
        "offsets": [torch.cat([torch.zeros(1, dtype=torch.long), ln.cumsum(0)[:-1]]) for ln in lengths],
        "labels": torch.randint(0, 2, (n,), generator=g).float(),
    }


def _dlrm_loss(model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    logits = model(batch["dense"], batch["indices"], batch["offsets"])
    return F.binary_cross_entropy_with_logits(logits, batch["labels"])


SPECS: dict[str, Spec] = {
    s.name: s
    for s in [
        Spec("llama", _decoder("LlamaConfig", "LlamaForCausalLM"), _tokens, _hf_loss, "decoder, RoPE, GQA"),
        Spec("mistral", _decoder("MistralConfig", "MistralForCausalLM", sliding_window=None), _tokens, _hf_loss,
             "decoder, RoPE, GQA"),
        Spec("qwen2", _decoder("Qwen2Config", "Qwen2ForCausalLM"), _tokens, _hf_loss, "decoder, RoPE, GQA, qkv bias"),
        Spec("mixtral", _decoder("MixtralConfig", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2),
             _tokens, _hf_loss, "decoder, mixture of experts"),
        Spec("gpt2", _gpt2, _tokens, _hf_loss, "decoder, learned positions"),
        Spec("bert", _bert, _bert_batch, _hf_loss, "encoder, padding mask"),
        Spec("t5", _t5, _t5_batch, _hf_loss, "encoder-decoder, relative position bias"),
        Spec("vit", _vit, _images, _hf_loss, "vision transformer"),
        Spec("resnet", _resnet, _images, _hf_loss, "convnet, batch norm"),
        Spec("dlrm", DLRM, _dlrm_batch, _dlrm_loss, "recommender, embedding bags"),
        Spec("unet", _unet, _noisy, _unet_loss, "diffusers UNet2DModel: convolutions, group norm, attention"),
    ]
}


@dataclass
class Step:
    """One training step's results: the loss, each parameter's gradient and each parameter
    after the optimizer step, by parameter name."""

    loss: torch.Tensor
    grads: dict[str, torch.Tensor]
    params: dict[str, torch.Tensor]


def build(spec: Spec, seed: int = 0) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The model and a batch, both from `seed`."""
    torch.manual_seed(seed)
    model = spec.build()
    model.train()
    return model, spec.batch(torch.Generator().manual_seed(seed + 1))


def _context(path: str) -> contextlib.AbstractContextManager:
    if path in ("strict", "debug", "fused"):
        from tpu_kernels.torch import substitute

        return substitute(path)
    return contextlib.nullcontext()


def _to_device(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.to("tpu")
    if isinstance(v, (list, tuple)):
        return type(v)(_to_device(x) for x in v)
    return v


def train_step(spec: Spec, path: str, seed: int = 0, autocast: torch.dtype | None = None) -> Step:
    """Forward, backward and one AdamW step of `spec`'s model through `path`; with `autocast`
    (``torch.bfloat16``) the forward runs under autocast to that dtype (CPU autocast, or the tpu
    device's on its paths)."""
    if path not in PATHS:
        raise ValueError(f"unknown path {path!r}; known: {', '.join(PATHS)}")
    model, batch = build(spec, seed)
    on_device = path in DEVICE_PATHS
    if on_device:
        import tpu_kernels.device as device

        model = model.to("tpu")
        batch = {k: _to_device(v) for k, v in batch.items()}
    opt = torch.optim.AdamW(model.parameters(), lr=LR, foreach=False)
    runner: Any = model
    if path in ("compile", "tpu-compile"):
        torch._dynamo.reset()
        runner = torch.compile(model, backend="tpu_kernels")
    cast = (
        torch.autocast("tpu" if on_device else "cpu", dtype=autocast)
        if autocast is not None
        else contextlib.nullcontext()
    )
    if on_device:
        device.set_mode(DEVICE_PATHS[path], **({"recorder": RECORDERS[path]} if path in RECORDERS else {}))
    try:
        with _context(path):
            with cast:
                loss = spec.loss(runner, batch)
            loss.backward()
            opt.step()
            loss = loss.detach().clone()
    finally:
        if on_device:
            device.set_mode("strict")
    named = dict(model.named_parameters())
    return Step(
        loss=loss.cpu(),
        grads={n: p.grad.detach().cpu().clone() for n, p in named.items() if p.grad is not None},
        params={n: p.detach().cpu().clone() for n, p in named.items()},
    )
