"""The Pallas-vs-ours comparison (`python/tools/pallas_compare.py`) on one small case per side:
its parsers (backend_config rewriting, libtpu's E1001 sizes, Mosaic op counts, source lines) and
its numbers (the bisected scoped VMEM limit compiles and one step below it is refused with
E1001; op counts and executable sizes are what the kernels are). A corrupted module becomes a
failure row, not a crash.

The tests that compile need libtpu (jax's compile-only TPU client) and, for our side, the
tpu_kernels extension: they skip loudly without them, and fail instead under
``TPUK_REQUIRE_RUNTIMES=1`` (the project's test command).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

TOOL = Path(__file__).resolve().parents[1] / "tools" / "pallas_compare.py"
SNAPSHOTS = Path(__file__).resolve().parents[2] / "snapshots" / "mosaic"
GEN = "v5e"
N = 256  # the small matmul: f32[256,256] @ f32[256,256]


def _tool():
    if "pallas_compare_tool" in sys.modules:
        return sys.modules["pallas_compare_tool"]
    spec = importlib.util.spec_from_file_location("pallas_compare_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["pallas_compare_tool"] = module
    spec.loader.exec_module(module)
    return module


def _unavailable(what: str, error: object) -> None:
    """Skips loudly, or fails under TPUK_REQUIRE_RUNTIMES=1 (as the Rust tests' helper does,
    registry/src/pjrt/testing.rs)."""
    message = f"{what} is unavailable: {error}"
    if os.environ.get("TPUK_REQUIRE_RUNTIMES") == "1":
        pytest.fail(f"TPUK_REQUIRE_RUNTIMES=1 but {message}", pytrace=False)
    sys.stderr.write(f"\n*** SKIPPED: {message}\n*** (set TPUK_REQUIRE_RUNTIMES=1 to make this a failure)\n")
    pytest.skip(message)


def _snapshot_body(path: Path) -> str:
    text = path.read_text()
    if text.startswith("---\n"):
        text = text[text.index("\n---\n", 4) + 5 :]
    return text


@pytest.fixture(scope="module")
def pc():
    return _tool()


@pytest.fixture(scope="module")
def compiler(pc):
    pytest.importorskip("jax")
    try:
        return pc.Compiler([GEN])
    except Exception as e:
        _unavailable("libtpu (jax's compile-only TPU client)", e)


@pytest.fixture(scope="module")
def case(pc):
    return pc.matmul_cases(N, (128, 128, 128))[0]


@pytest.fixture(scope="module")
def pallas(pc, case, compiler):
    built = case.pallas()
    assert built.text is not None, built.error
    return built


@pytest.fixture(scope="module")
def ours(pc, case, compiler):
    try:
        import tpu_kernels  # noqa: F401
    except ImportError as e:
        _unavailable("the tpu_kernels extension", e)
    built = pc.build_ours(*case.ours)
    assert built.text is not None, built.error
    return built


# ----- parsers, no libtpu -----


def test_backend_config_is_rewritten_with_the_scoped_vmem_limit(pc):
    config = {"custom_call_config": {"body": "QUJD+/==", "needs_layout_passes": True}, "x": 'a "q" \\ \n'}
    text = (
        "    %0 = stablehlo.custom_call @tpu_custom_call(%arg0, %arg1) {backend_config = \""
        + pc.mlir_escape(json.dumps(config))
        + '", kernel_name = "k"} : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>\n'
    )
    (call,) = pc.custom_calls(text)
    assert call.operands == 2 and call.config == config
    (after,) = pc.custom_calls(pc.with_scoped_vmem(text, 12288))
    assert after.config["scoped_memory_configs"] == [{"memory_space": 1, "offset": 0, "size": 12288}]
    assert {k: v for k, v in after.config.items() if k != "scoped_memory_configs"} == config
    assert '", kernel_name = "k"}' in pc.with_scoped_vmem(text, 4096)


def test_e1001_sizes_are_read(pc):
    msg = "RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:\nRan out ... Scoped allocation with size 704.0K and limit 256.0K exceeded"
    assert pc.e1001_size(msg) == 704 * 1024 and pc.is_vmem_oom(msg)
    assert pc.e1001_size("Scoped allocation with size 64.00M and limit 16.00M exceeded") == 64 << 20
    assert pc.e1001_size("INTERNAL: something else") is None


class _FakeCompiler:
    """Refuses a limit below `need` with libtpu's E1001 text, naming `reported(limit)` as the size."""

    def __init__(self, pc, need, reported):
        self.pc, self.need, self.reported, self.limits = pc, need, reported, []

    def compile(self, text, gen):
        (call,) = self.pc.custom_calls(text)
        limit = call.config["scoped_memory_configs"][0]["size"]
        self.limits.append(limit)
        if limit < self.need:
            size = self.reported(limit) / 1024
            raise self.pc.CompileError(
                f"RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:\nRan out of memory ... Scoped allocation "
                f"with size {size:.1f}K and limit {limit / 1024:.1f}K exceeded scoped vmem limit"
            )
        return None, 0.0


@pytest.mark.parametrize(
    "need, reported",
    [
        (704 << 10, lambda limit: 704 << 10),  # E1001 names the whole need: two compiles after the first
        (704 << 10, lambda limit: 192 << 10),  # it names a partial allocation: plain bisection
        (3 << 20, lambda limit: (3 << 20) + (64 << 10)),  # it overstates: the hint compiles, then bisection
        (4096, lambda limit: 4096),  # fits in one step
        (200 << 20, lambda limit: 200 << 20),  # more than any limit tried
    ],
)
def test_vmem_bisection_finds_the_least_limit(pc, need, reported):
    text = (
        '%0 = stablehlo.custom_call @tpu_custom_call(%arg0) {backend_config = "'
        + pc.mlir_escape(json.dumps({"custom_call_config": {"body": "QQ=="}}))
        + '"} : (tensor<8xf32>) -> tensor<8xf32>'
    )
    fake = _FakeCompiler(pc, need, reported)
    result = pc.GenResult()
    pc.bisect_vmem(fake, text, GEN, result)
    if need > pc.VMEM_MAX:
        assert result.vmem_min is None and result.vmem_note.startswith("refused at")
        return
    want = -(-need // pc.VMEM_STEP) * pc.VMEM_STEP
    assert result.vmem_min == want and len(fake.limits) <= 20, fake.limits
    assert want in fake.limits and (want == pc.VMEM_STEP or want - pc.VMEM_STEP in fake.limits)
    if reported(0) == need and need > pc.VMEM_STEP:
        assert len(fake.limits) == 3  # 4 KiB refused (names the need), the need compiles, one step less refused


def test_source_lines(pc):
    def kernel(x):  # a comment line follows
        """Docstring lines are not code."""
        # comment
        y = x + 1

        return y

    assert pc.python_lines([kernel]) == 3  # def, y = ..., return
    rust = pc.rust_lines("tiled_matmul_act")
    assert rust is not None and rust.file.endswith("tiled.rs")
    assert "accumulate" in rust.helpers and rust.body > 20 and rust.spec > 10
    assert pc.rust_lines("no_such_kernel") is None


def test_mosaic_ops_are_counted_alike_in_both_printed_forms(pc):
    pytest.importorskip("jax")
    name = "tiled_matmul_act@f32_256x1024-f32_1024x256-activation=silu"
    kernels = {}
    for form, extra in (("readable", {}), ("shipped", {"serialization_format": 1})):
        body = _snapshot_body(SNAPSHOTS / f"{name}.{form}.snap")
        config = {"custom_call_config": {"body": base64.b64encode(body.encode()).decode(), **extra}}
        (kernels[form],) = pc.parse_mosaic(config, operands=2)
    k = kernels["shipped"]
    assert k.ops == kernels["readable"].ops and k.total_ops > 0
    assert k.ops["tpu.matmul"] == 1 and k.ops["scf.if"] >= 1 and k.ops["tpu.vector_store"] >= 1
    assert k.grid == [1, 1, 2] and k.windows == [[256, 512], [512, 256], [256, 256]] and k.inputs == 2
    assert k.scratch == ["256x256xf32"]
    assert pc.blocks_cell(k) == "grid (1, 1, 2); in 256x512, 512x256 → out 256x256; scratch 256x256xf32"


# ----- one small case per side, compiled by libtpu -----


def _check_side(pc, compiler, case, built, side):
    row = pc.measure_side(compiler, case, side, built, [GEN], repeats=1)
    r = row.gens[GEN]
    assert r.error == "", r.error
    assert r.compile_ms is not None and r.compile_ms > 0
    (k,) = row.kernels
    assert k.total_ops > 0 and k.ops["tpu.matmul"] == 1 and k.ops["tpu.vector_store"] >= 1
    assert r.memory["argument_size_in_bytes"] == 2 * N * N * 4 and r.memory["output_size_in_bytes"] == N * N * 4
    # The bisection brackets the need: it compiles at vmem_min, and one step below libtpu refuses
    # with its scoped-VMEM OOM (E1001), whose size is at most the bracketed limit.
    v = r.vmem_min
    assert v is not None and v % pc.VMEM_STEP == 0 and pc.VMEM_STEP < v < pc.DEFAULT_SCOPED_VMEM[GEN], (v, r.vmem_note)
    compiler.compile(pc.with_scoped_vmem(built.text, v), GEN)
    with pytest.raises(pc.CompileError, match="E1001") as refused:
        compiler.compile(pc.with_scoped_vmem(built.text, v - pc.VMEM_STEP), GEN)
    assert v - pc.VMEM_STEP < pc.e1001_size(str(refused.value)) <= v
    # The whole block working set, double-buffered, fits under it.
    assert r.e1001_size is not None and r.e1001_size <= v
    header, rows = pc.table_rows([row], [GEN])
    assert len(rows[0]) == len(header) and rows[0][3].startswith("ok ")
    return row


def test_pallas_side(pc, compiler, case, pallas):
    row = _check_side(pc, compiler, case, pallas, "Pallas")
    assert row.kernels[0].grid == [2, 2, 2] and row.kernels[0].scratch == ["128x128xf32"]
    assert pallas.body_lines and pallas.spec_lines


def test_ours_side(pc, compiler, case, ours):
    row = _check_side(pc, compiler, case, ours, "ours")
    (scratch,) = row.kernels[0].scratch  # the f32 accumulator
    assert scratch.endswith("xf32")
    assert ours.body_lines and ours.spec_lines


def test_a_corrupted_module_is_a_failure_row(pc, compiler, case, pallas):
    def garbage(config):
        config["custom_call_config"]["body"] = base64.b64encode(b"module { this is not mosaic }").decode()

    broken = pc.Built(text=pc.rewrite_configs(pallas.text, garbage))
    row = pc.measure_side(compiler, case, "Pallas", broken, [GEN], repeats=1)
    assert row.mosaic_error.startswith("Mosaic body not parsed") and row.kernels == []
    assert row.gens[GEN].error and row.gens[GEN].compile_ms is None and row.gens[GEN].vmem_min is None
    truncated = pc.Built(text=pallas.text[: len(pallas.text) // 2])
    row2 = pc.measure_side(compiler, case, "Pallas", truncated, [GEN], repeats=1)
    assert row2.gens[GEN].error.startswith("StableHLO parse failed")
    _, rows = pc.table_rows([row, row2], [GEN])
    assert all(r[3].startswith("FAIL: ") for r in rows)


def test_main_writes_a_section(pc, compiler, tmp_path):
    # norms: Pallas's GPU norms refuse to lower for tpu (a row, not a crash); ours compiles if built.
    out = tmp_path / "section.md"
    assert pc.main(["--out", str(out), "--families", "norms", "--generations", GEN, "--repeats", "1", "--no-vmem"]) == 0
    text = out.read_text()
    assert text.startswith("## Pallas vs ours") and "### norms" in text
    assert "FAIL: ValueError: Compiler params for platform gpu cannot be used for tpu lowering." in text
