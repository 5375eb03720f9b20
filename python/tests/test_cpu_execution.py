"""The shared PJRT CPU client runs each program on the calling thread (the Rust side's
`a_synchronous_client_runs_programs_on_the_calling_thread` checks the option itself);
`TPUK_CPU_ASYNC=1` gives the plugin's worker thread back. On a host with AVX-512 it compiles
with 512-bit vectors unless `XLA_FLAGS` names the flag (the Rust side's
`compile_option_overrides_reach_the_compiler` checks that XLA reads the option). Each way is
checked in a fresh interpreter, since the client is made once per process, with a kernel that
ran (no fallback)."""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

CODE = """
import torch, torch.nn.functional as F
import tpu_kernels.torch as tkt
from tpu_kernels.testing import no_fallbacks
x = torch.randn(64, 256)
with no_fallbacks(kernels=("silu",)):
    with tkt.substitute("strict"):
        y = F.silu(x)
torch.testing.assert_close(y, x * torch.sigmoid(x))
r = tkt.report()
print(r.cpu_compile_options)
print(r.cpu_execution, "|", "TPUK_CPU_ASYNC" in str(r))
"""


def _run(**env: str) -> list[str]:
    drop = ("TPUK_CPU_ASYNC", "XLA_FLAGS", "TPUK_VECTOR_INTERLEAVE")
    full = {k: v for k, v in os.environ.items() if k not in drop}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(CODE)], env=full, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()


def _fresh(**env: str) -> str:
    return _run(**env)[-1]


def _avx512() -> bool:
    with open("/proc/cpuinfo") as f:
        return "avx512f" in f.read().split()


def test_programs_run_on_the_calling_thread_by_default():
    assert _fresh() == "calling thread | False"


def test_tpuk_cpu_async_gives_the_worker_thread_back_and_the_report_says_so():
    assert _fresh(TPUK_CPU_ASYNC="1") == "worker thread | True"


def test_programs_compile_with_512_bit_vectors_on_an_avx512_host_unless_xla_flags_say():
    # The loop interleave option (test_vector_interleave.py) is listed beside the width.
    interleave = {"xla_backend_extra_options": "-small-loop-cost=2000"}
    expected = {"xla_cpu_prefer_vector_width": 512, **interleave} if _avx512() else interleave
    assert _run()[-2] == repr(expected)
    # The user's own setting of the flag wins: nothing is added over it.
    assert _run(XLA_FLAGS="--xla_cpu_prefer_vector_width=256")[-2] == repr(interleave)
