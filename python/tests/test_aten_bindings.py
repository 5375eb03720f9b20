"""ATen bindings are real: every ATen overload a standard kernel binds is reached by a real model
on some path (eager or `torch.compile` through aot_autograd, forward or backward), a kernel takes
a traced call of it, and `docs/aten-bindings.md` is the current record.

The models and paths are `python/tools/trace_bindings.py`'s (traced once per module, about 10 s:
aot_autograd with capturing compilers, no inductor).
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python" / "tools"))
import trace_bindings as tb  # noqa: E402

# Bound ATen overloads no traced model has to reach: overload -> why. Keep it small; a binding
# listed here is one nothing checks against a real program.
UNREACHED_OK: dict[str, str] = {}


@pytest.fixture(scope="module")
def traced() -> tb.Trace:
    return tb.trace()


def _aten_bound() -> dict[str, list[str]]:
    return {op: ks for op, ks in tb.standard_bindings().items() if op.startswith("aten::")}


def test_every_bound_overload_is_reached(traced: tb.Trace):
    missing = [
        f"{op} (kernels: {', '.join(ks)})"
        for op, ks in _aten_bound().items()
        if op not in traced.seen and op not in UNREACHED_OK
    ]
    assert not missing, (
        "ATen overloads bound by standard kernels that no traced model reaches (a binding to an "
        "overload PyTorch never dispatches is dead): bind the overload real programs reach, add a "
        f"model to {tb.COMMAND.split()[-1]}, or list it with a reason in UNREACHED_OK:\n  " + "\n  ".join(missing)
    )


def test_a_kernel_takes_a_traced_call_of_every_reached_overload(traced: tb.Trace):
    refused = {
        op: sorted(traced.selected.get(op, set()))
        for op in _aten_bound()
        # `all` of no outcomes is true: an overload reached but never selected for counts too.
        if op in traced.seen and all(s.startswith("no kernel") for s in traced.selected.get(op, set()))
    }
    assert not refused, f"bound overloads whose every traced call no kernel took: {refused}"


def test_allow_list_is_current(traced: tb.Trace):
    bound = _aten_bound()
    stale = {op: why for op, why in UNREACHED_OK.items() if op not in bound or op in traced.seen}
    assert not stale, f"UNREACHED_OK entries no longer needed (unbound, or now reached): {stale}"


def test_record_is_current(traced: tb.Trace):
    expected = tb.render(traced)
    current = tb.OUT.read_text() if tb.OUT.exists() else ""
    if current != expected:
        diff = difflib.unified_diff(
            current.splitlines(), expected.splitlines(), "docs/aten-bindings.md", "fresh trace", lineterm="", n=1
        )
        shown = "\n".join(list(diff)[:60])
        pytest.fail(f"docs/aten-bindings.md is stale: rerun `{tb.COMMAND}`\n{shown}")

