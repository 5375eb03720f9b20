"""Sharded training steps (`tpu_kernels.torch.distributed`): one SPMD program partitioned by XLA
over 4 PJRT CPU devices under data, FSDP-style and tensor parallelism, against the
single-device float64 reference, and the same programs compiled by libtpu for `v5e:2x2`.

What shows that the sharded program ran: the step has no PyTorch path (its loss and gradients
are the program's outputs, device by device), the partitioner's collectives are in the compiled
per-device program, each input crosses as a quarter when it is sharded, and the registered
kernels are inlined into it.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import pytest
import torch

from tpu_kernels.testing import assert_close_to_reference
from tpu_kernels.torch import distributed as tkd
from tpu_kernels.torch._native import native

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "gpt"))
import gpt  # noqa: E402

COLWISE = ["blocks.*.attn.qkv", "blocks.*.mlp.gate", "blocks.*.mlp.up"]
ROWWISE = ["blocks.*.attn.out", "blocks.*.mlp.down"]
KERNELS = {"silu", "log_softmax", "log_softmax_backward", "sdpa_flash_cpu", "sdpa_flash_cpu_backward"}


def _gpt():
    torch.manual_seed(0)
    cfg = gpt.Config()
    model = gpt.Gpt(cfg)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab, (4, cfg.seq), generator=g)
    y = torch.randint(0, cfg.vocab, (4, cfg.seq), generator=g)
    return model, x, y


def _loss(m, x, y):
    return m(x, y)


def _reference(model, loss_fn, inputs):
    """Loss and gradients of the whole model in float64 eager PyTorch, by parameter name."""
    ref = copy.deepcopy(model).double()
    loss = loss_fn(ref, *inputs)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in ref.named_parameters()}


def _check(model, step, inputs, ref):
    runs = native().sharded_stats()[0]
    model.zero_grad(set_to_none=True)
    loss = step(*inputs)
    assert native().sharded_stats()[0] == runs + 1, "the sharded program did not run"
    assert_close_to_reference(loss, ref[0], msg="loss: ")
    for name, p in model.named_parameters():
        assert_close_to_reference(p.grad, ref[1][name], msg=f"grad of {name}: ")


def _plans(mesh):
    return {
        "dp": tkd.data_parallel(mesh),
        "fsdp": tkd.fully_sharded(mesh),
        "tp": tkd.tensor_parallel(mesh, colwise=COLWISE, rowwise=ROWWISE),
    }


@pytest.mark.parametrize("layout", ["dp", "fsdp", "tp"])
def test_gpt_trains_a_step_sharded_over_four_devices(layout):
    model, x, y = _gpt()
    ref = _reference(model, _loss, (x, y))
    mesh = tkd.init_device_mesh((4,), mesh_dim_names=("dp",))
    step = tkd.compile_step(model, _loss, mesh, example=(x, y), **_plans(mesh)[layout])
    assert KERNELS <= set(step.kernels), step.kernels
    collectives = step.collectives
    shapes = step.program.shard_shapes
    n = len(step.params) + len(step.buffers)
    emb = step.names.index("emb.weight")
    qkv = step.names.index("blocks.0.attn.qkv.weight")
    out = step.names.index("blocks.0.attn.out.weight")
    if layout == "dp":
        # The batch is cut in four, the parameters are whole, the gradients all-reduced.
        assert shapes[n] == [1, 16] and shapes[emb] == [128, 64]
        assert set(collectives) == {"all-reduce"}, collectives
    elif layout == "fsdp":
        assert shapes[n] == [1, 16] and shapes[emb] == [32, 64] and shapes[qkv] == [48, 64]
        assert collectives.get("all-gather", 0) > 0, collectives
    else:
        assert shapes[n] == [4, 16] and shapes[qkv] == [48, 64] and shapes[out] == [64, 16]
        assert collectives.get("all-reduce", 0) > 0, collectives
    _check(model, step, (x, y), ref)
    # A second step on the same program accumulates into .grad, as backward() does.
    first = {name: p.grad.clone() for name, p in model.named_parameters()}
    step(x, y)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, 2 * first[name])
    # The optimizer takes the gradients where backward() leaves them: one SGD step, against the
    # float64 reference's.
    before = {name: p.detach().double() for name, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    for name, p in model.named_parameters():
        assert_close_to_reference(p, before[name] - 0.1 * 2 * ref[1][name], msg=f"{name} after SGD: ")


def test_a_two_dimensional_mesh_shards_the_batch_and_the_linears():
    model, x, y = _gpt()
    ref = _reference(model, _loss, (x, y))
    mesh = tkd.init_device_mesh((2, 2), mesh_dim_names=("dp", "tp"))
    tp = tkd.tensor_parallel(mesh, colwise=COLWISE, rowwise=ROWWISE, mesh_dim="tp")
    step = tkd.compile_step(model, _loss, mesh, example=(x, y), params=tp["params"], inputs=(tkd.Shard(0), tkd.Replicate()))
    assert tkd.hlo_sharding(mesh, (tkd.Shard(0), tkd.Replicate()), x.shape) == "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"
    assert tkd.hlo_sharding(mesh, (tkd.Replicate(), tkd.Shard(0)), (192, 64)) == "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}"
    qkv = step.names.index("blocks.0.attn.qkv.weight")
    assert step.program.shard_shapes[qkv] == [96, 64]
    assert step.program.shard_shapes[len(step.params) + len(step.buffers)] == [2, 16]
    _check(model, step, (x, y), ref)


LLAMA_COLWISE = ["model.layers.*.self_attn.q_proj", "model.layers.*.self_attn.k_proj",
                 "model.layers.*.self_attn.v_proj", "model.layers.*.mlp.gate_proj", "model.layers.*.mlp.up_proj"]
LLAMA_ROWWISE = ["model.layers.*.self_attn.o_proj", "model.layers.*.mlp.down_proj"]


@pytest.mark.parametrize("layout", ["dp", "fsdp", "tp"])
def test_a_zoo_model_trains_a_step_sharded_over_four_devices(layout):
    """The zoo's Llama (RoPE, grouped-query attention; its rotary frequencies are a buffer that
    crosses replicated) with a batch of four sequences."""
    import zoo

    spec = zoo.SPECS["llama"]
    model, _ = zoo.build(spec)
    ids = torch.randint(0, zoo.VOCAB, (4, zoo.SEQ), generator=torch.Generator().manual_seed(2))

    def loss(m, ids, labels):
        return spec.loss(m, {"input_ids": ids, "labels": labels})

    inputs = (ids, ids.clone())
    ref = _reference(model, loss, inputs)
    mesh = tkd.init_device_mesh((4,), mesh_dim_names=("dp",))
    plan = {
        "dp": tkd.data_parallel(mesh),
        "fsdp": tkd.fully_sharded(mesh),
        "tp": tkd.tensor_parallel(mesh, colwise=LLAMA_COLWISE, rowwise=LLAMA_ROWWISE),
    }[layout]
    step = tkd.compile_step(model, loss, mesh, example=inputs, name=f"llama_{layout}", **plan)
    assert step.collectives, step.collectives
    q = step.names.index("model.layers.0.self_attn.q_proj.weight")
    assert step.program.shard_shapes[q] == ([64, 64] if layout == "dp" else [16, 64])
    _check(model, step, inputs, ref)
    from tpu_kernels.torch import report

    listed = report().sharded["steps"][-1]
    assert listed["name"] == f"llama_{layout}" and listed["devices"] == 4
    assert listed["collectives"] == step.collectives
    assert f"llama_{layout}: 4 devices, collectives: " in str(report())
    _libtpu()
    assert step.compile_for("v5e:2x2")["executable_bytes"] > 0


SDPA_PER_SHARD = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": ((0, 0, 0), (0, 0)),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": ((0,) * 6, (0, 0, 0)),
}


def test_attention_kernels_run_per_shard_in_a_manually_sharded_region():
    """As `shard_map` runs a kernel: the attention kernels (forward and backward) specialised to
    a quarter of the batch, between `SPMDFullToShardShape` and `SPMDShardToFullShape`: for
    v5e:2x2 the tiled Mosaic kernels at the shard's shapes, on the CPU their twins."""
    model, x, y = _gpt()
    ref = _reference(model, _loss, (x, y))
    mesh = tkd.init_device_mesh((4,))
    step = tkd.compile_step(model, _loss, mesh, example=(x, y), per_shard=SDPA_PER_SHARD, **tkd.data_parallel(mesh))
    assert step.notes == []
    # On the CPU, the twins of the tiled kernels the TPU program runs, in the same regions.
    tiled = ["tiled_sdpa_flash", "tiled_sdpa_flash", "tiled_sdpa_flash_backward", "tiled_sdpa_flash_backward"]
    assert step.per_shard == tiled
    text = step.program.text
    # The forward kernel at the shard's signature: one sequence of the four, 4 heads.
    assert "custom_call @SPMDFullToShardShape" in text and "custom_call @SPMDShardToFullShape" in text
    assert "(tensor<4x4x16x16xf32>) -> tensor<1x4x16x16xf32>" in text
    _check(model, step, (x, y), ref)
    from tpu_kernels.torch import report

    assert "per shard (manually sharded region): tiled_sdpa_flash" in str(report())
    _libtpu()
    tpu = step.compile_for("v5e:2x2")
    assert tpu["per_shard"] == tiled
    assert tpu["mosaic_calls"] > 0 and tpu["notes"] == []
    # The Mosaic calls take the shard's (batch, heads) = (1, 4) rows, not the whole batch's 16.
    calls = [line for line in tpu["text"].splitlines() if "custom_call @tpu_custom_call" in line]
    assert calls and all("tensor<4x16x16xf32>" in c and "tensor<16x16x16xf32>" not in c for c in calls), calls


def test_a_kernel_that_cannot_run_per_shard_runs_whole_and_says_why():
    model, x, y = _gpt()
    ref = _reference(model, _loss, (x, y))
    eight = tkd.init_device_mesh((8,))
    # A batch of 4 does not cut into 8 shards: the kernels run whole, the step is still right.
    step = tkd.compile_step(model, _loss, eight, example=(x, y), per_shard=SDPA_PER_SHARD)
    assert step.per_shard == []
    assert len(step.notes) == 4
    assert "runs whole, not per shard: " in step.notes[0]
    assert "tiled_sdpa_flash: input 0 f32[4,4,16,16]: dimension 0 of size 4 does not divide into 8 shards" in step.notes[0]
    _check(model, step, (x, y), ref)
    four = tkd.init_device_mesh((4,))
    wrong = {
        "aten::_scaled_dot_product_flash_attention_for_cpu": ((0, 0), (0, 0)),
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward": ((0,) * 6, (None, 0, 0)),
    }
    step = tkd.compile_step(model, _loss, four, example=(x, y), per_shard=wrong)
    assert step.per_shard == []
    assert any("the spec names 2 inputs, the kernel takes 3" in n for n in step.notes), step.notes
    assert any("not independent along the spec's dimensions" in n for n in step.notes), step.notes
    _check(model, step, (x, y), ref)
    with pytest.raises(tkd.ShardingError, match=r"per_shard\['aten::x'\] must be \(input dims, output dims\)"):
        tkd.compile_step(model, _loss, four, example=(x, y), per_shard={"aten::x": 0})


def _libtpu():
    import tpu_kernels as tk

    if not tk._native.libtpu_available():
        if os.environ.get("TPUK_REQUIRE_RUNTIMES"):
            pytest.fail("libtpu cannot be loaded: the v5e:2x2 compile must run here")
        pytest.skip("SKIPPED LOUDLY: libtpu cannot be loaded, so the v5e:2x2 compile is not checked")


@pytest.mark.parametrize("layout", ["dp", "fsdp", "tp"])
def test_the_sharded_programs_compile_for_a_v5e_2x2_slice(layout):
    _libtpu()
    model, x, y = _gpt()
    mesh = tkd.init_device_mesh((4,))
    step = tkd.compile_step(model, _loss, mesh, example=(x, y), **_plans(mesh)[layout])
    report = step.compile_for("v5e:2x2")
    assert report["topology"] == "v5e:2x2" and report["devices"] == 4
    assert report["executable_bytes"] > 0
    # Mosaic kernels (the tiled attention) sit inside the sharded TPU program.
    assert report["mosaic_calls"] > 0, report
    with pytest.raises(ValueError, match=r"topology v5e:1x1 has 1 devices, the program's mesh 4"):
        step.compile_for("v5e:1x1")


def test_bad_meshes_and_placements_are_named():
    model, x, y = _gpt()
    with pytest.raises(tkd.ShardingError, match=r"a mesh of shape \(64,\) needs 64 devices; this process has \d+"):
        tkd.init_device_mesh((64,))
    three = tkd.init_device_mesh((3,), mesh_dim_names=("dp",))
    with pytest.raises(
        tkd.ShardingError,
        match=r"parameter `emb.weight`: dimension 0 of size 128 does not divide into 3 shards \(mesh \(3,\), sharded over dp=3\)",
    ):
        tkd.compile_step(model, _loss, three, example=(x, y), **tkd.fully_sharded(three))
    with pytest.raises(tkd.ShardingError, match=r"input 0: dimension 0 of size 4 does not divide into 3 shards"):
        tkd.compile_step(model, _loss, three, example=(x, y), **tkd.data_parallel(three))
    mesh = tkd.init_device_mesh((4,))
    with pytest.raises(tkd.ShardingError, match=r"input 0: Partial placements are not taken"):
        tkd.compile_step(model, _loss, mesh, example=(x, y), inputs=(tkd.Partial(),))
    with pytest.raises(tkd.ShardingError, match=r"parameter `head.bias`: Shard\(1\) of a tensor of rank 1"):
        tkd.compile_step(model, _loss, mesh, example=(x, y), params={"head.bias": (tkd.Shard(1),)})
    with pytest.raises(tkd.ShardingError, match=r"2 placements for a mesh of 1 dimensions"):
        tkd.compile_step(model, _loss, mesh, example=(x, y), inputs=(tkd.Shard(0), tkd.Replicate()))
    with pytest.raises(tkd.ShardingError, match=r"the mesh has no dimension 'tp'"):
        tkd.data_parallel(mesh, mesh_dim="tp")
    step = tkd.compile_step(model, _loss, mesh, example=(x, y), **tkd.data_parallel(mesh))
    with pytest.raises(tkd.ShardingError, match=r"the step takes 2 inputs, got 1"):
        step(x)
    # Nothing was written into the model by the refused calls.
    assert all(p.grad is None for p in model.parameters())
