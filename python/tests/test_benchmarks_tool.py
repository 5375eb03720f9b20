"""The benchmark report's parsers (`python/tools/benchmarks.py`), which only the benchmark
command runs: every parser a bench names exists, and the tiled bench's two tables are read from
output in the form `registry/benches/tiled.rs` prints."""

import importlib.util
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "benchmarks.py"


def _tool():
    spec = importlib.util.spec_from_file_location("benchmarks_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["benchmarks_tool"] = module
    spec.loader.exec_module(module)
    return module


def test_every_bench_names_parsers_that_exist():
    # Builds every bench's (run, parsers) and runs none of them.
    assert _tool().existing_benches(sys.executable, 1.0, True, only=set()) == []


def test_the_tiled_bench_output_becomes_its_two_tables():
    bm = _tool()
    stdout = "\n".join(
        [
            "",
            "libtpu compile, shipped Mosaic form (ms, median of 3)",
            "kernel                       v5e       v6e  signature",
            "tiled_rms_norm              80.9      86.9  f32_8x128-f32_128-eps=1e-6",
            "",
            "tiled twin vs StableHLO kernel on the CPU (us, median of 30 interleaved runs)",
            "tiled kernel           StableHLO kernel         twin  stablehlo   ratio  signature",
            "tiled_rms_norm         rms_norm                 17.0       17.1    1.00  f32_8x128-f32_128-eps=1e-6",
        ]
    )
    run = bm.Run("tiled", [], stdout=stdout)
    bm.parse_tiled(run)
    (compile_caption, _, compile_rows), (twin_caption, _, twin_rows) = run.tables
    assert "libtpu compile time" in compile_caption
    assert compile_rows == [["tiled_rms_norm", "80.9", "86.9", "f32_8x128-f32_128-eps=1e-6"]]
    assert "twin vs the StableHLO kernel" in twin_caption
    assert twin_rows == [["tiled_rms_norm", "rms_norm", "17.0", "17.1", "1.00", "f32_8x128-f32_128-eps=1e-6"]]


def test_a_markdown_bench_is_kept_whole_below_the_runs_heading():
    """The Pallas and zoo benches print Markdown: kept as printed, headings demoted under the
    run's own `###`; output without a table is left unparsed (the report shows its tail)."""
    bm = _tool()
    stdout = "## Zoo: one step\n\nnotes\n\n| model | eager |\n|---|---:|\n| gpt2 | 4.4 |\n\n### detail\n"
    run = bm.Run("zoo", [], stdout=stdout)
    bm.parse_markdown(run)
    assert run.markdown[0] == "#### Zoo: one step" and "##### detail" in run.markdown
    assert "| gpt2 | 4.4 |" in run.markdown and run.tables == [("zoo", [], [])]
    empty = bm.Run("zoo", [], stdout="Traceback (most recent call last):\n  boom\n")
    bm.parse_markdown(empty)
    assert empty.markdown == [] and empty.tables == []
