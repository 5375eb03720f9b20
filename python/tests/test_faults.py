"""The tests bite: with a fault injected (`TPUK_TEST_FAULT`, see `tpu_kernels.testing`), the
tests that claim a kernel or a program ran fail.

Each case runs a few of the suite's own tests in a fresh pytest process with one fault set for
the whole run, under the "fallback" error policy, the one users get: every failure then falls
back or replays in PyTorch silently, and only the tests' checks (`no_fallbacks`, and the values)
can tell. Every named test must fail; the same tests pass in the normal run of the suite.

The Rust side's counterpart (a NaN output through the dispatcher fails `numerics::check_close`)
is `registry/tests/faults.rs`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

# kind -> (fault, the tests that must fail)
CASES = {
    # Fused mode: every program fails at run time and replays in PyTorch (values stay right).
    "fused program fails": (
        "run",
        [
            "test_torch_fused.py::test_fused_equals_strict_and_eager",
            "test_torch_fused.py::test_programs_are_cached_by_trace",
            "test_graph_fusion.py::test_fused_eager_mode_fuses_the_recorded_chain[F.rms_norm]",
        ],
    ),
    # Fused mode: a kernel inside the program computes NaN.
    "fused kernel wrong": (
        "nan:silu",
        ["test_torch_fused.py::test_fused_equals_strict_and_eager", "test_torch_fused.py::test_autograd_under_fused"],
    ),
    # torch.compile: lowering fails, so each graph runs in PyTorch (values stay right).
    "compiled lowering fails": (
        "lower",
        [
            "test_torch_compile.py::test_gpt_forward_and_backward_match_eager",
            "test_torch_compile.py::test_inference_graph",
            "test_graph_fusion.py::test_compiled_inference_graph_fuses[linear+gelu]",
            "test_torch_backward_kernels.py::test_compiled_backward_graph_inlines_the_backward_kernels",
        ],
    ),
    # torch.compile: programs fail at run time, so each graph runs in PyTorch.
    "compiled program fails": (
        "run",
        [
            "test_torch_compile.py::test_gpt_forward_and_backward_match_eager",
            "test_graph_fusion.py::test_compiled_inference_graph_fuses[F.rms_norm]",
        ],
    ),
    # An imported JAX kernel's new op: the kernel fails, so the JAX function runs instead.
    "imported op fails": (
        "run:softplus,run:imp_mul_bf16,run:imp_scale",
        [
            "test_import_jax.py::test_decorator_defines_a_new_torch_op",
            "test_import_jax.py::test_function_form_with_shape_dtype_structs",
            "test_import_jax.py::test_static_arguments",
        ],
    ),
    # Eager kernels: the backward kernels fail at run time and PyTorch computes the gradients.
    "eager kernel fails": (
        "run:softmax_backward",
        ["test_torch_backward_kernels.py::test_eager_training_step_runs_the_backward_kernels[strict]"],
    ),
    # The numerics harness: a kernel's output is off by one, then NaN.
    "numerics wrong value": ("offset:gelu", ["test_numerics.py::test_kernel_numerics[gelu-f32-3x7x33]"]),
    "numerics NaN": ("nan:gelu", ["test_numerics.py::test_kernel_numerics[gelu-bf16-1x5]"]),
    # The end-to-end example: every program and kernel fails.
    "example": ("run", ["test_torch_gpt_example.py::test_gpt_example_all_modes_match"]),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_injected_fault_fails_the_tests(kind: str) -> None:
    fault, tests = CASES[kind]
    env = dict(os.environ, TPUK_TEST_FAULT=fault, TPUK_ON_ERROR="fallback")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "--no-header", *tests],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert f"injected faults ['{fault.split(',')[0]}'" in out, out[-3000:]
    failed = {line.split(" ", 2)[1] for line in out.splitlines() if line.startswith("FAILED ")}
    passed = [t for t in tests if t not in failed]
    assert not passed, f"with fault {fault!r} these tests still pass: {passed}\n{out[-3000:]}"
    assert proc.returncode == 1, out[-3000:]
