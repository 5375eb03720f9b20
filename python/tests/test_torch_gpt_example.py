"""The end-to-end example (examples/gpt/gpt.py) passes: every mode matches plain PyTorch."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def test_gpt_example_all_modes_match(capsys):
    sys.path.insert(0, str(ROOT / "examples" / "gpt"))
    try:
        import gpt
    finally:
        sys.path.pop(0)
    assert gpt.main(["--layers", "1", "--dim", "32", "--seq", "8"]) == 0
    out = capsys.readouterr().out
    for mode in ("strict", "debug", "fused"):
        assert f"substitute('{mode}')" in out
        assert f'to("tpu"), {mode}' in out
    assert 'to("tpu"), torch.compile' in out
    assert "every path matches plain PyTorch" in out
    assert 'torch.compile("tpu_kernels")' in out
    assert "kernels inlined" in out and "silu" in out
