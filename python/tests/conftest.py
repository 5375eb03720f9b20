import os
import sys
from pathlib import Path

import pytest

# The helpers next to the tests (stablehlo_check) import by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))

# A failure of a kernel or of tpu_kernels' own code raises in every test (InternalError), never
# a silent fallback; a test about the fallback itself sets the policy for its block
# (`tpu_kernels.testing.error_policy("fallback")`). Read by the extension when it loads.
os.environ.setdefault("TPUK_ON_ERROR", "raise")


def pytest_configure(config):
    # Faults for the whole run (`TPUK_TEST_FAULT`), as the meta-tests of test_faults.py set them
    # to show that the tests fail when their subject breaks.
    from tpu_kernels.testing import FAULT_ENV, apply_fault_env

    faults = apply_fault_env()
    if faults:
        sys.stderr.write(f"\n*** {FAULT_ENV}: injected faults {faults}: tests are expected to fail ***\n")


@pytest.fixture
def cleanup():
    """Unregisters every kernel a test registered (the process has one registry)."""
    import tpu_kernels as tk

    before = {k["name"] for k in tk.kernels()}
    yield
    for k in tk.kernels():
        if k["name"] not in before:
            tk.unregister(k["name"])
