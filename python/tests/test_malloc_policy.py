"""The C allocator keeps large blocks (`registry::pjrt::malloc`): XLA:CPU allocates a program's
temporaries on every run, and glibc maps a block above its mmap threshold fresh each time, so
every run faulted its pages in again. Each way is checked in a fresh interpreter (the policy is
applied once per process, before the first CPU client), by the minor page faults of an attention
kernel whose scores (f32[4,8,512,512], 32 MiB) are such a temporary, run through PJRT (tk.call
raises rather than fall back) and checked against PyTorch."""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

CODE = """
import resource, torch, torch.nn.functional as F
import tpu_kernels as tk
from tpu_kernels.torch import report
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(4, 8, 512, 64, generator=g) for _ in range(3))
mask = torch.randn(512, 512, generator=g)
d = tk.Dispatcher()
call = lambda: tk.call("tpuk::attention", q, k, v, mask, dispatcher=d, is_causal=True)
for _ in range(5):
    out = call()[0]
causal = torch.full((512, 512), float("-inf")).triu(1)
torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask + causal), atol=1e-4, rtol=1e-4)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(12):
    call()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 12
r = report()
print(r.malloc["policy"], faults, "TPUK_MALLOC=keep" in str(r))
"""

_GLIBC_VARS = ("TPUK_MALLOC", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def _run(**env: str) -> tuple[str, float, bool]:
    full = {k: v for k, v in os.environ.items() if k not in _GLIBC_VARS}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(CODE)], env=full, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    policy, faults, named = out.stdout.strip().splitlines()[-1].split()
    return policy, float(faults), named == "True"


def _glibc() -> bool:
    return sys.platform == "linux" and os.confstr("CS_GNU_LIBC_VERSION") is not None


@pytest.mark.skipif(not _glibc(), reason="the policy changes glibc's allocator only")
def test_large_temporaries_are_not_faulted_in_again_on_every_run():
    policy, faults, _ = _run()
    assert policy == "retained"
    # 32 MiB of scores alone are 8192 pages a run when mapped fresh. Reusing the heap, a run
    # faults in far fewer on average: 860 measured on a quiet machine, up to 2742 under load
    # (a worker thread's arena that cannot fit the block maps it once). Half the scores' pages
    # is the line: above it, the scores are mapped fresh on most runs.
    assert faults < 4096, faults


@pytest.mark.skipif(not _glibc(), reason="the policy changes glibc's allocator only")
def test_tpuk_malloc_keep_keeps_the_allocators_defaults_and_the_report_says_so():
    policy, faults, named = _run(TPUK_MALLOC="keep")
    assert (policy, named) == ("kept", True)
    # glibc's defaults map blocks above 32 MiB fresh on every run (8209 faults a run measured):
    # the cost the policy removes.
    assert faults > 4096, faults


@pytest.mark.skipif(not _glibc(), reason="the policy changes glibc's allocator only")
def test_the_users_own_thresholds_are_left_as_they_are():
    policy, _, _ = _run(MALLOC_MMAP_THRESHOLD_="65536", TPUK_MALLOC="")
    assert policy == "user"
