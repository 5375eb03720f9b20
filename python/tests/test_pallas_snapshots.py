"""Snapshots of the imported modules under snapshots/imported/: per kernel, the CPU module and
the TPU module with locations stripped (the TPU module's Mosaic body, base64 bytecode that embeds
source paths, replaced by a marker), and the Mosaic kernels decoded to readable MLIR beside them.

A changed, missing or orphaned snapshot fails; regenerate with TPUK_UPDATE_SNAPSHOTS=1.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest

import tpu_kernels as tk

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT / "snapshots" / "imported"
sys.path.insert(0, str(ROOT / "examples" / "pallas"))

from kernels import register_all, unregister_all  # noqa: E402

BODY = re.compile(r'(\\22body\\22: \\22)([A-Za-z0-9+/=]*)(\\22)')


@pytest.fixture(scope="module")
def imported():
    yield register_all()
    unregister_all()  # the registry is per process: leave it as the next test module expects


def snapshot_files(imported: dict[str, tk.ImportedKernel]) -> dict[str, str]:
    files: dict[str, str] = {}
    for k in imported.values():
        cpu = tk._native.strip_locations(k.cpu)
        tpu = tk._native.strip_locations(k.tpu)
        tpu = BODY.sub(lambda m: f"{m.group(1)}<mosaic body: see {k.name}.mosaic.mlir>{m.group(3)}", tpu)
        mosaic = "".join(f"// kernel {name}\n{text}\n" for name, text in tk.decode_mosaic(k.tpu))
        files[f"{k.name}.cpu.mlir"] = cpu
        files[f"{k.name}.tpu.mlir"] = tpu
        files[f"{k.name}.mosaic.mlir"] = mosaic
    return files


def test_imported_snapshots(imported):
    files = snapshot_files(imported)
    if os.environ.get("TPUK_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOTS.mkdir(parents=True, exist_ok=True)
        for old in SNAPSHOTS.glob("*.mlir"):
            if old.name not in files:
                old.unlink()
        for name, text in files.items():
            (SNAPSHOTS / name).write_text(text)
    problems = []
    for name, text in files.items():
        path = SNAPSHOTS / name
        if not path.exists():
            problems.append(f"missing {path}")
        elif path.read_text() != text:
            problems.append(f"stale {path}")
    for path in SNAPSHOTS.glob("*"):
        if path.name not in files:
            problems.append(f"orphaned {path}")
    assert not problems, "; ".join(problems) + " (regenerate with TPUK_UPDATE_SNAPSHOTS=1)"


def test_snapshots_parse_and_show_the_mosaic_kernels(imported):
    from stablehlo_check import parse

    for path in sorted(SNAPSHOTS.glob("*.cpu.mlir")):
        parse(path.read_text())
    matmul = (SNAPSHOTS / "pallas_matmul.mosaic.mlir").read_text()
    assert "scratch_operands = 1" in matmul and "tpu.matmul" in matmul
    assert "window_params" in (SNAPSHOTS / "flash_attention.mosaic.mlir").read_text()
