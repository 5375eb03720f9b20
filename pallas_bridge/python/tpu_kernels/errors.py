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


class FallbackError(TpuKernelsError, RuntimeError):
    """A dispatched call ran no kernel; ``category`` says why, the message says the rest."""

    def __init__(
        self, message: str, category: str = "", op: str = "", kernel: str | None = None
    ) -> None:
        super().__init__(message)
        self.category = category
        self.op = op
        self.kernel = kernel
