import sys
from pathlib import Path

import pytest

# The helpers next to the tests (stablehlo_check) import by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def cleanup():
    """Unregisters every kernel a test registered (the process has one registry)."""
    import tpu_kernels as tk

    before = {k["name"] for k in tk.kernels()}
    yield
    for k in tk.kernels():
        if k["name"] not in before:
            tk.unregister(k["name"])
