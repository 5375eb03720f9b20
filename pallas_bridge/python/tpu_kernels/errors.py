"""The exceptions of tpu_kernels.

Every class subclasses :class:`TpuKernelsError` and the builtin that fits (``ValueError``,
``TypeError``, ``RuntimeError``), so callers can catch either. The native extension raises the
same classes, with the Rust error's message.
"""

from __future__ import annotations


class TpuKernelsError(Exception):
    """Base class of every tpu_kernels error."""


class RegistrationError(TpuKernelsError, ValueError):
    """The registry refused a kernel (duplicate name, ambiguity, invalid record) or a removal."""


class LibraryError(RegistrationError):
    """A kernel library (a crate of Rust kernels built as a cdylib) could not be loaded: the file
    is not a library or lacks the entry symbol, its ABI or tpu-kernels version is not this
    package's, a record is bad, a kernel fails a check at a canonical signature, or a name
    clashes with a registered kernel. Nothing was registered."""


class ModuleParseError(TpuKernelsError, ValueError):
    """A module did not parse (jaxlib's MLIR parser or the Rust reader)."""


class SignatureMismatchError(TpuKernelsError, TypeError):
    """A module's or function's signature does not match the declared binding."""


class NotJaxError(TpuKernelsError, TypeError):
    """The callable is not a JAX function (it cannot be traced with abstract inputs)."""


class ExportError(TpuKernelsError, RuntimeError):
    """``jax.export`` failed for a reason other than the ones with their own class."""


class SymbolicShapeError(TpuKernelsError, ValueError):
    """Symbolic dimensions without the constraints the kernel needs."""


class TpuCompileError(TpuKernelsError, RuntimeError):
    """The TPU compiler (libtpu, compile-only) or jax's Mosaic lowering rejected the kernel."""


class CpuRunError(TpuKernelsError, RuntimeError):
    """The CPU variant failed to compile or run on the PJRT CPU client."""


class NumericsMismatchError(TpuKernelsError, ValueError):
    """The CPU variant's results differ from the JAX function's on random inputs."""


class JaxNotInstalledError(TpuKernelsError, RuntimeError, ImportError):
    """jax is needed (importing kernels) but cannot be imported."""


class RuntimeUnavailableError(TpuKernelsError, RuntimeError):
    """A PJRT runtime (the CPU plugin, libtpu) cannot be loaded."""


class NoKernelError(TpuKernelsError, LookupError):
    """No kernel is registered under a name, or none accepts a call."""


class InternalError(TpuKernelsError, RuntimeError):
    """A kernel or tpu_kernels' own code failed (a build, compile, lowering or execute error, a
    fused program or compiled graph that could not run, an exception in the binding code) and
    the error policy is ``"raise"`` (see :func:`set_error_policy`). Under the default policy the
    same failure is counted (``report()`` lists it under its category) and the op runs in
    PyTorch instead."""


class LoweringDeclined(TpuKernelsError, ValueError):
    """A graph has a node no kernel takes and the default lowering does not cover (an op, or
    argument values, outside both): the graph, or that node, runs in PyTorch. Not a failure of
    tpu_kernels, so never an :class:`InternalError`; the message names the nodes."""


class FallbackError(TpuKernelsError, RuntimeError):
    """A dispatched call ran no kernel; ``category`` says why, the message says the rest."""

    def __init__(
        self, message: str, category: str = "", op: str = "", kernel: str | None = None
    ) -> None:
        super().__init__(message)
        self.category = category
        self.op = op
        self.kernel = kernel


_POLICIES = ("fallback", "raise")


def _native_bridge():
    from ._native import torch_bridge

    return torch_bridge


def error_policy() -> str:
    """What happens when a kernel or tpu_kernels' own code fails: ``"fallback"`` (the default:
    the failure is counted by category and the op, program or graph runs in PyTorch) or
    ``"raise"`` (:class:`InternalError`). The environment variable ``TPUK_ON_ERROR=raise`` sets
    ``"raise"`` for the whole process. A call that no kernel takes (a dtype, shape or device
    the kernels do not cover) is not an error: it always falls back, counted as such."""
    return "raise" if _native_bridge().raise_errors() else "fallback"


def set_error_policy(policy: str) -> str:
    """Sets :func:`error_policy` for the process; returns the previous one."""
    if policy not in _POLICIES:
        raise ValueError(f"error policy must be one of {', '.join(map(repr, _POLICIES))}, not {policy!r}")
    previous = _native_bridge().set_raise_errors(policy == "raise")
    return "raise" if previous else "fallback"
