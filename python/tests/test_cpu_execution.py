"""The shared PJRT CPU client runs each program on the calling thread (the Rust side's
`a_synchronous_client_runs_programs_on_the_calling_thread` checks the option itself);
`TPUK_CPU_ASYNC=1` gives the plugin's worker thread back. Each way is checked in a fresh
interpreter, since the client is made once per process, with a kernel that ran (no fallback)."""

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
print(r.cpu_execution, "|", "TPUK_CPU_ASYNC" in str(r))
"""


def _fresh(**env: str) -> str:
    full = {k: v for k, v in os.environ.items() if k != "TPUK_CPU_ASYNC"}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(CODE)], env=full, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_programs_run_on_the_calling_thread_by_default():
    assert _fresh() == "calling thread | False"


def test_tpuk_cpu_async_gives_the_worker_thread_back_and_the_report_says_so():
    assert _fresh(TPUK_CPU_ASYNC="1") == "worker thread | True"
