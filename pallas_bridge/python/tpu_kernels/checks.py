"""The checks of the ``tpuk`` command line, on registered kernels: emit a kernel's module for a
signature, compile it for a TPU topology with libtpu (compile-only, no TPU needed), and run it
on the PJRT CPU client with random inputs."""

from __future__ import annotations

from typing import Any

from . import _native
from ._types import parse_signature
from .errors import RuntimeUnavailableError


def emit(kernel: str, signature: str, platform: str = "cpu") -> str:
    """The module `kernel` gives for `signature` (``"f32[8,128]; eps=1e-6"``) on `platform`."""
    return _native.emit(kernel, signature, platform)


def compile_tpu(kernel: str, signature: str, topology: str = "v5e:1x1") -> dict[str, Any]:
    """Compiles the kernel's TPU module for `topology`; ``{"topology", "executable_bytes",
    "compile_s"}``, or :class:`TpuCompileError` with libtpu's message."""
    if not _native.libtpu_available():
        raise RuntimeUnavailableError("libtpu is not installed (TPUK_LIBTPU)")
    return _native.compile_tpu(_native.emit(kernel, signature, "tpu"), topology)


def run_cpu(kernel: str, signature: str, seed: int = 0) -> dict[str, Any]:
    """Runs the kernel's CPU module on random inputs through the PJRT CPU client;
    ``{"outputs": [numpy arrays], "compile_s", "run_s", "cache"}``."""
    from .jax_import import _random_inputs, _run_cpu

    text = _native.emit(kernel, signature, "cpu")
    specs = parse_signature(signature.split(";", 1)[0])
    outputs, info = _run_cpu(text, specs, _random_inputs(specs, seed))
    return {"outputs": outputs, **info}
