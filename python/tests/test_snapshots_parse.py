"""Every StableHLO snapshot parses and verifies under jaxlib's MLIR parser (an outside check).

A failure shows the parser's own diagnostic, with line and column in the snapshot's module.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import stablehlo_check

SNAPSHOTS = Path(__file__).resolve().parents[2] / "snapshots" / "hlo"
FILES = sorted(SNAPSHOTS.glob("*.snap"))


def test_snapshots_exist():
    # Guards against a glob that silently matches nothing.
    assert len(FILES) >= 30, f"only {len(FILES)} snapshots under {SNAPSHOTS}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_snapshot_parses_and_verifies(path: Path):
    text = stablehlo_check.snapshot_body(path)
    try:
        stablehlo_check.parse(text)
    except ValueError as e:
        pytest.fail(f"{path.name}: jaxlib rejects the module:\n{e}", pytrace=False)


def test_checker_rejects_a_broken_module():
    # The check can fail: a type mismatch jaxlib must report with its diagnostic.
    bad = (
        "module {\n  func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {\n"
        "    %0 = stablehlo.add %arg0, %arg0 : tensor<3xf32>\n    return %0 : tensor<4xf32>\n  }\n}\n"
    )
    with pytest.raises(ValueError, match="expects different type"):
        stablehlo_check.parse(bad)
