"""The tiled kernels' Mosaic snapshots (snapshots/mosaic/, written by `snapshots/tests/emitted.rs`)
under an outside parser: jaxlib's MLIR with the TPU dialect. The readable form parses and
verifies; the shipped form (`stable_mosaic`, generic syntax) parses, deserializes with
jaxlib's own `mosaic-serde` pass and verifies; and the two are the same module: jaxlib prints
them identically once locations and the shipped form's version attribute are set aside.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

pytest.importorskip("jax")
from stablehlo_check import snapshot_body  # noqa: E402

SNAPSHOTS = Path(__file__).resolve().parents[2] / "snapshots" / "mosaic"
READABLE = sorted(SNAPSHOTS.glob("*.readable.snap"))


def _context():
    from jax._src.interpreters import mlir
    from jax._src.lib import tpu

    ctx = mlir.make_ir_context()
    tpu.register_dialect(ctx)
    return ctx


def _readable(text: str) -> str:
    from jaxlib.mlir import ir

    with _context():
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as e:
            raise ValueError(str(e)) from None
        assert module.operation.verify()
        return module.operation.get_asm(enable_debug_info=False)


def _shipped(text: str) -> str:
    from jaxlib.mlir import ir
    from jaxlib.mlir.passmanager import PassManager

    ctx = _context()
    with ctx:
        ctx.allow_unregistered_dialects = True
        try:
            module = ir.Module.parse(text)
            PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(module.operation)
        except ir.MLIRError as e:
            raise ValueError(str(e)) from None
        assert module.operation.verify()
        asm = module.operation.get_asm(enable_debug_info=False)
    version = "module attributes {stable_mosaic.version = 15 : i64} {"
    assert asm.startswith(version), asm[:200]
    return "module {" + asm[len(version) :]


def test_every_tiled_kernel_has_mosaic_snapshots():
    assert len(READABLE) >= 11, f"only {len(READABLE)} readable Mosaic snapshots under {SNAPSHOTS}"


@pytest.mark.parametrize("path", READABLE, ids=[p.name.removesuffix(".readable.snap") for p in READABLE])
def test_both_forms_parse_verify_and_are_the_same_module(path: Path):
    readable = _readable(snapshot_body(path))
    shipped = _shipped(snapshot_body(path.with_name(path.name.replace(".readable.", ".shipped."))))
    if readable != shipped:
        diff = "\n".join(difflib.unified_diff(readable.splitlines(), shipped.splitlines(), "readable", "shipped", lineterm=""))
        pytest.fail(f"{path.name}: the two forms differ under jaxlib:\n{diff}", pytrace=False)


def test_the_check_fails_on_a_broken_module():
    good = snapshot_body(READABLE[0])
    with pytest.raises(ValueError):
        _readable(good.replace("vector.load", "vector.lod", 1))
