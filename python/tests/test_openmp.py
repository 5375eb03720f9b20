"""`import tpu_kernels` before torch shortens the spin of torch's OpenMP workers
(`tpu_kernels._openmp`), unless the user has a say; each way the setting can go is checked in a
fresh interpreter, where the import order is what the test writes.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

import tpu_kernels as tk  # noqa: E402


def _fresh(code: str, **env: str) -> str:
    """Runs `code` in a fresh interpreter with `env` added (and the OpenMP settings cleared
    unless given); returns its stdout's last line."""
    full = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "TPUK_KEEP_OPENMP_SPIN")}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_importing_tpu_kernels_first_shortens_the_openmp_spin():
    got = _fresh(
        """
        import os
        import tpu_kernels
        import torch
        maps = open("/proc/self/maps").read()
        print(tpu_kernels._openmp.state()["spin"], os.environ.get("GOMP_SPINCOUNT"), "libgomp" in maps)
        """
    )
    assert got == f"shortened {tk._openmp.SPIN_COUNT} True"


def test_importing_torch_first_keeps_the_default_and_says_so():
    got = _fresh(
        """
        import os
        import torch
        import tpu_kernels
        print(tpu_kernels._openmp.state()["spin"], os.environ.get("GOMP_SPINCOUNT"), "OpenMP: libgomp's default" in str(tpu_kernels.report()))
        """
    )
    assert got == "default None True"


@pytest.mark.parametrize(
    ("env", "want"),
    [({"OMP_WAIT_POLICY": "PASSIVE"}, "user None"), ({"GOMP_SPINCOUNT": "77"}, "user 77"), ({"TPUK_KEEP_OPENMP_SPIN": "1"}, "kept None")],
)
def test_the_users_openmp_setting_wins(env, want):
    got = _fresh(
        """
        import os
        import tpu_kernels
        print(tpu_kernels._openmp.state()["spin"], os.environ.get("GOMP_SPINCOUNT"))
        """,
        **env,
    )
    assert got == want
