"""The traced GPT block's forward and backward ATen graphs, lowered to one StableHLO module each
by the Rust lowering, run on the inputs of a real training step and compared with PyTorch.

The reference is the FX graph's own outputs in that step (which aot_autograd ran eagerly), and
the loss of the eager model. Every lowered module also parses and verifies under jaxlib's
StableHLO parser.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python" / "tools"))

import graph_lowering  # noqa: E402
import stablehlo_check  # noqa: E402
import trace_gpt_block  # noqa: E402

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def traced():
    fwd, bwd, eager_loss = trace_gpt_block.trace(seed=0)
    return {"fwd": fwd, "bwd": bwd, "eager_loss": eager_loss}


def _numpy(ts):
    return [t.detach().contiguous().numpy() for t in ts if t is not None]


def _compare(name, got, want, rtol=1e-4, atol=1e-5):
    assert len(got) == len(want), f"{name}: {len(got)} outputs, PyTorch gives {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"{name} output {i}: shape {g.shape} vs {w.shape}"
        assert g.dtype == w.dtype, f"{name} output {i}: dtype {g.dtype} vs {w.dtype}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{name} output {i}")


def test_checked_in_graphs_are_what_the_tracer_writes(traced):
    for key in ("fwd", "bwd"):
        cap = traced[key]
        path = trace_gpt_block.DEFAULT_OUT / f"{cap.name}.json"
        on_disk = json.loads(path.read_text())
        assert on_disk == cap.to_json(), (
            f"{path.name} is stale: rerun `python python/tools/trace_gpt_block.py`"
        )


def test_the_compiled_step_matches_eager(traced):
    loss = traced["fwd"].outputs[0]
    torch.testing.assert_close(loss, traced["eager_loss"])


@pytest.mark.parametrize("kernels", [False, True], ids=["table", "kernels"])
@pytest.mark.parametrize("key", ["fwd", "bwd"])
def test_gpt_block_numerics_under_the_reference_interpreter(traced, key, kernels):
    cap = traced[key]
    text = graph_lowering.lower(cap.to_json(), kernels=kernels)
    stablehlo_check.parse(text)
    if kernels and key == "fwd":
        assert "call @" in text, "a registered kernel should replace _log_softmax"
    got = graph_lowering.run_reference(text, _numpy(cap.inputs))
    _compare(f"{cap.name} ({'kernels' if kernels else 'table'})", got, _numpy(cap.outputs))


@pytest.mark.parametrize("key", ["fwd", "bwd"])
def test_gpt_block_numerics_under_xla_cpu(traced, key):
    cap = traced[key]
    text = graph_lowering.lower(cap.to_json(), kernels=True)
    try:
        got = graph_lowering.run_xla(text, _numpy(cap.inputs))
    except AttributeError as e:  # jax's client API moved
        pytest.fail(f"cannot compile through jax's client: {e}")
    _compare(f"{cap.name} (XLA:CPU)", got, _numpy(cap.outputs))


def test_an_unsupported_op_is_reported_by_name():
    g = {
        "version": 1,
        "inputs": [{"name": "x", "type": "f32[2]"}],
        "nodes": [{"name": "w", "op": "aten::frobnicate.default", "args": [{"tensor": {"node": "x"}}],
                   "outputs": ["f32[2]"]}],
        "outputs": [{"node": "w"}],
    }
    with pytest.raises(graph_lowering.LoweringError, match=r"aten::frobnicate.default \(node `w`\)"):
        graph_lowering.lower(g)
