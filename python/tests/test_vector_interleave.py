"""XLA:CPU's vectorized loops interleave vectors (`registry::pjrt::interleave`): before the
first CPU client, tpu_kernels appends an LLVM option to the process's `XLA_FLAGS`, which the
plugin reads at its first compile: `-small-loop-cost=2000` by default, a forced
`-force-vector-interleave` count under `TPUK_VECTOR_INTERLEAVE=N`. Each way is checked in a fresh
interpreter (the setting is made once per process): what the process's environment holds as the
plugin compiles (read with the C library's `getenv`, as the plugin reads it, not `os.environ`'s
copy from start-up), what `report()` lists, and that a kernel compiled under it runs through
PJRT with PyTorch's values."""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

CODE = """
import ctypes, torch, torch.nn.functional as F
import tpu_kernels as tk
from tpu_kernels.torch import report
x = torch.randn(64, 1000)
try:
    out = tk.call("aten::silu.default", x, dispatcher=tk.Dispatcher(no_fallback=True))[0]
except Exception as e:
    print("ERROR", type(e).__name__, e)
    raise SystemExit(0)
torch.testing.assert_close(out, F.silu(x))
getenv = ctypes.CDLL(None).getenv
getenv.restype = ctypes.c_char_p
flags = (getenv(b"XLA_FLAGS") or b"").decode()
print(repr(flags), "|", report().cpu_compile_options.get("xla_backend_extra_options"))
"""

OURS = "--xla_backend_extra_options="


def _run(**env: str) -> str:
    full = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "TPUK_VECTOR_INTERLEAVE")}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(CODE)], env=full, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_the_plugin_compiles_with_the_small_loop_cost_raised_and_the_report_says_so():
    assert _run() == f"'{OURS}-small-loop-cost=2000' | -small-loop-cost=2000"
    assert _run(TPUK_VECTOR_INTERLEAVE="auto") == f"'{OURS}-small-loop-cost=2000' | -small-loop-cost=2000"


def test_a_forced_count_is_appended_to_the_users_other_flags():
    assert _run(XLA_FLAGS="--xla_cpu_enable_fast_math=false", TPUK_VECTOR_INTERLEAVE="4") == (
        f"'--xla_cpu_enable_fast_math=false {OURS}-force-vector-interleave=4' | -force-vector-interleave=4"
    )


def test_the_users_own_llvm_options_and_off_are_left_as_they_are():
    mine = "--xla_backend_extra_options=-force-vector-width=8"
    assert _run(XLA_FLAGS=mine) == f"'{mine}' | None"
    assert _run(TPUK_VECTOR_INTERLEAVE="off") == "'' | None"


@pytest.mark.parametrize("bad", ["0", "65", "eight"])
def test_a_bad_count_is_refused_by_name_before_anything_compiles(bad):
    line = _run(TPUK_VECTOR_INTERLEAVE=bad)
    assert line.startswith("ERROR RuntimeUnavailableError"), line
    assert f'TPUK_VECTOR_INTERLEAVE="{bad}" is not an interleave setting' in line, line
