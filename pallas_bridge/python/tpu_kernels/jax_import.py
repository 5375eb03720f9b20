"""Import Pallas/JAX kernels into the tpu-kernels registry.

``register_jax(fn, op=..., signatures=[...])`` (or the ``@jax_kernel(...)`` decorator) exports
`fn` with ``jax.export`` twice per example signature:

- for TPU (a Pallas kernel becomes a Mosaic ``tpu_custom_call``);
- for CPU: the same function exported for ``cpu`` under :func:`pallas_interpret`, which makes
  every ``pallas_call`` lower in interpret mode (plain StableHLO: a loop over the grid), so the
  kernel itself needs no change. Plain jnp code exports for CPU as it is. ``cpu_fn=`` supplies a
  different CPU implementation instead.

Then it validates, and only then registers both variants in one atomic step:

1. each module parses and verifies with jaxlib, and with the Rust reader;
2. its entry signature matches the declared inputs (and the op's binding: for an ATen overload,
   the tensor arguments of its schema);
3. the TPU variant compiles for ``topology`` (``v5e:1x1``) with libtpu's compile-only path.
   Where libtpu cannot be loaded this check is not done: a ``RuntimeWarning`` says so and the
   kernel's ``checks["tpu_compile"]`` records it (``"not done: ..."``); with
   ``TPUK_REQUIRE_RUNTIMES=1`` (the project's test command) it is an error instead;
4. the CPU variant runs through the Rust PJRT CPU client on random inputs, and its outputs are
   compared with, exactly as ``checks["cpu_numerics"]`` records:

   - `reference` (a function computing the same thing independently, e.g. in plain jnp),
     when given: the numerics check;
   - the JAX function itself run by jax on the CPU (Pallas in interpret mode): a round trip
     through ``jax.export`` and the CPU client. It catches export, lowering and runtime
     bugs, not a wrong kernel: without a `reference`, a kernel computing the wrong thing passes;
   - for modules loaded from files without a `reference`: nothing but finite outputs.

Any failure raises the :mod:`tpu_kernels.errors` class of the failed check, naming the kernel;
nothing is registered then.

Symbolic dims (``f32[B,128]``, with ``constraints=["B >= 8"]``) are exported with
``jax.export.symbolic_shape``. Such a kernel, or one with several example signatures or with
static arguments, is *generic*: each call is specialised to its concrete signature. A symbolic
module is refined to the call's static shapes (a wrapper entry with static types, then jaxlib's
``refine_polymorphic_shapes``, which also checks the export's shape assertions); a call with
other static values re-exports the function. Validation runs at every concrete example, with
symbols set from ``validate_dims`` (default: 128 each).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _events, _native
from ._mlir import mosaic_bodies, parse_check, refine, require_jax
from ._types import DTYPE_NAMES, TensorSpec, parse_signature, short, static_kind, static_text
from .errors import (
    CpuRunError,
    ExportError,
    ModuleParseError,
    NotJaxError,
    NumericsMismatchError,
    RegistrationError,
    RuntimeUnavailableError,
    SignatureMismatchError,
    SymbolicShapeError,
    TpuCompileError,
    TpuKernelsError,
)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
DEFAULT_TOPOLOGY = "v5e:1x1"
# Tolerances of the CPU check, per dtype: (rtol, atol).
TOLERANCES: dict[str, tuple[float, float]] = {
    "f64": (1e-9, 1e-9),
    "f32": (1e-4, 1e-5),
    "f16": (1e-2, 1e-2),
    "bf16": (2e-2, 2e-2),
}


@contextlib.contextmanager
def pallas_interpret() -> Iterator[None]:
    """Within this context every ``pallas_call`` traced runs (and lowers) in jax's interpret
    mode, the plain-StableHLO form that XLA:CPU runs. The flag is part of jax's jit cache key,
    so traces made inside and outside do not mix."""
    require_jax()
    from jax._src import config

    flag = config.pallas_tpu_interpret_mode_context_manager
    previous = flag.swap_local(True)
    try:
        yield
    finally:
        flag.set_local(previous)


@contextlib.contextmanager
def _x64(specs: Sequence[Sequence[TensorSpec]]) -> Iterator[None]:
    """jax's 64-bit mode, on exactly when a signature has a 64-bit type: the exported module
    must not depend on a process-wide flag (with it on, grid bounds become i64 scalars, which
    libtpu refuses)."""
    from jax._src import config

    wide = any(s.dtype in ("f64", "i64") for sig in specs for s in sig)
    with config.enable_x64(wide):
        yield


@dataclass
class ImportedKernel:
    """A kernel imported from JAX (or loaded from .mlir files) and registered.

    Calling it dispatches its op on torch tensors (see :func:`tpu_kernels.dispatch`).
    """

    name: str
    op: str
    inputs: list[str]
    signatures: list[str]
    statics: dict[str, Any]
    tpu: str | None
    cpu: str | None
    fingerprint: str
    generic: bool
    timings: dict[str, float] = field(default_factory=dict)
    fn: Callable[..., Any] | None = field(default=None, repr=False)
    #: What each validation check did (see the module documentation): "tpu_compile",
    #: "cpu_numerics".
    checks: dict[str, str] = field(default_factory=dict)

    def __call__(self, *tensors: Any, **statics: Any) -> Any:
        from .dispatch import dispatch

        return dispatch(self.op, *tensors, **statics)

    def save_mlir(self, directory: str | Path) -> dict[str, Path]:
        """Writes the variants as ``<name>.tpu.mlir`` / ``<name>.cpu.mlir`` (see
        :func:`save_mlir`)."""
        return save_mlir(self.name, directory)


def _classify(name: str, what: str, e: BaseException) -> TpuKernelsError:
    """The error class for an exception raised while tracing/lowering/exporting."""
    jax = require_jax()
    from jax._src import core

    message = f"kernel `{name}`: {what}: {type(e).__name__}: {e}"
    if isinstance(e, TpuKernelsError):
        return e
    if isinstance(e, core.InconclusiveDimensionOperation) or "symbolic dimension" in str(e).lower():
        return SymbolicShapeError(
            f"{message} (declare what the kernel needs of its symbols with `constraints=`, "
            "e.g. ['B >= 8', 'mod(B, 8) == 0'])"
        )
    if isinstance(e, (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError)):
        return NotJaxError(f"{message} (the function is not JAX code: it cannot be traced)")
    if isinstance(e, TypeError):
        return NotJaxError(f"{message} (the function is not JAX code: it cannot be traced)")
    text = str(e)
    if "pallas" in text.lower() or "mosaic" in text.lower() or "block shape" in text.lower():
        return TpuCompileError(f"kernel `{name}`: tpu compile check failed ({what}): {e}")
    return ExportError(message)


def _struct(jax: Any, spec: TensorSpec, scope: dict[str, Any]) -> Any:
    dims = tuple(scope[d] if isinstance(d, str) else d for d in spec.dims)
    return jax.ShapeDtypeStruct(dims, getattr(jax.numpy, DTYPE_NAMES[spec.dtype]))


def _symbol_scope(jax: Any, specs: Sequence[TensorSpec], constraints: Sequence[str], name: str) -> dict[str, Any]:
    symbols = sorted({s for spec in specs for s in spec.symbols})
    if not symbols:
        return {}
    try:
        dims = jax.export.symbolic_shape(", ".join(symbols), constraints=tuple(constraints))
    except Exception as e:
        raise SymbolicShapeError(f"kernel `{name}`: symbols {symbols}, constraints {list(constraints)}: {e}") from None
    return dict(zip(symbols, dims))


def _export(
    jax: Any,
    fn: Callable[..., Any],
    platform: str,
    specs: Sequence[TensorSpec],
    structs: Sequence[Any],
    name: str,
    what: str,
    donate: Sequence[int] = (),
) -> str:
    """`fn` exported for `platform` at `structs`; the inputs at positions `donate` are donated
    (``tf.aliasing_output`` on them: updated in place)."""
    jitted = jax.jit(fn, donate_argnums=tuple(donate)) if donate else jax.jit(fn)
    try:
        if platform == "cpu":
            with pallas_interpret(), _x64([specs]):
                exported = jax.export.export(jitted, platforms=["cpu"])(*structs)
        else:
            with _x64([specs]):
                exported = jax.export.export(jitted, platforms=[platform])(*structs)
        return exported.mlir_module()
    except Exception as e:
        raise _classify(name, what, e) from e


def _random_inputs(specs: Sequence[TensorSpec], seed: int = 0) -> list[Any]:
    import numpy as np

    jnp = require_jax().numpy
    rng = np.random.default_rng(seed)
    out = []
    for s in specs:
        shape = tuple(int(d) for d in s.dims)
        if s.dtype == "bool":
            out.append(rng.random(shape) < 0.5)
        elif s.dtype.startswith(("i", "u")):
            out.append(rng.integers(-8 if s.dtype.startswith("i") else 0, 8, shape).astype(DTYPE_NAMES[s.dtype]))
        else:
            out.append(rng.standard_normal(shape).astype(np.dtype(getattr(jnp, DTYPE_NAMES[s.dtype]))))
    return out


def _run_cpu(text: str, specs: Sequence[TensorSpec], inputs: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]:
    """Runs `text` through the Rust PJRT CPU client; outputs as numpy arrays (one copy)."""
    import numpy as np

    jnp = require_jax().numpy
    views = [a.view(np.int16) if a.dtype.itemsize == 2 and a.dtype.kind not in "iu" else a for a in inputs]
    views = [np.ascontiguousarray(v) for v in views]
    tensors, info = _native.run_module_cpu(text, views, short(specs))
    outs = []
    for t in tensors:
        dtype = np.dtype(getattr(jnp, DTYPE_NAMES[t.dtype]))
        outs.append(np.frombuffer(t.to_bytes(), dtype=dtype).reshape(t.shape))
    return outs, info


def _compare(name: str, label: str, ours: Sequence[Any], theirs: Sequence[Any], against: str) -> None:
    import numpy as np

    if len(ours) != len(theirs):
        raise NumericsMismatchError(
            f"kernel `{name}`: cpu numerics check failed at {label}: the CPU variant returns "
            f"{len(ours)} outputs, {against} {len(theirs)}"
        )
    for i, (a, b) in enumerate(zip(ours, theirs)):
        b = np.asarray(b)
        if a.shape != b.shape:
            raise NumericsMismatchError(
                f"kernel `{name}`: cpu numerics check failed at {label}: output {i} has shape "
                f"{a.shape}, {against} gives {b.shape}"
            )
        short_name = next((k for k, v in DTYPE_NAMES.items() if v == str(a.dtype)), "f32")
        rtol, atol = TOLERANCES.get(short_name, (0.0, 0.0))
        x, y = a.astype(np.float64), b.astype(np.float64)
        # Absolute tolerance scales with the output's magnitude (sums of many terms).
        scale = max(1.0, float(np.nanmax(np.abs(y)))) if y.size else 1.0
        bad = ~np.isclose(x, y, rtol=rtol, atol=atol * scale, equal_nan=True)
        if bad.any():
            err = float(np.nanmax(np.abs(x - y)))
            raise NumericsMismatchError(
                f"kernel `{name}`: cpu numerics check failed at {label}: output {i} differs from "
                f"{against} at {int(bad.sum())} of {bad.size} elements (max abs error {err:.3g}, "
                f"rtol {rtol}, atol {atol})"
            )


def _binding_check(name: str, op: str, inputs: Sequence[str], statics: Mapping[str, Any]) -> None:
    """For an ATen overload: the kernel's tensor inputs must be the schema's tensor arguments
    (the required ones, optionally followed by optional ones), in order, and each static must
    name a non-tensor argument of the schema. New ops (`mylib::op`) are defined by the kernel."""
    ns, _, rest = op.partition("::")
    if ns != "aten":
        return
    try:
        import torch
    except ImportError:
        return  # no torch: the binding is checked when torch dispatches to the kernel
    base, _, overload = rest.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    overload_op = getattr(packet, overload or "default", None) if packet is not None else None
    if overload_op is None:
        raise SignatureMismatchError(
            f"kernel `{name}`: binding check failed: `{op}` is not an ATen op overload in torch "
            f"{torch.__version__}"
        )
    schema = overload_op._schema
    tensors = [a for a in schema.arguments if str(a.type) in ("Tensor", "Optional[Tensor]")]
    required = [a for a in tensors if str(a.type) == "Tensor"]
    if not (len(required) <= len(inputs) <= len(tensors)):
        names = ", ".join(a.name for a in tensors)
        raise SignatureMismatchError(
            f"kernel `{name}`: binding check failed: `{op}` takes {len(tensors)} tensor "
            f"argument(s) ({names}), {len(required)} required, but the kernel takes "
            f"{len(inputs)} ({', '.join(inputs)})"
        )
    others = {a.name for a in schema.arguments if a not in tensors}
    for s in statics:
        if s not in others:
            raise SignatureMismatchError(
                f"kernel `{name}`: binding check failed: static `{s}` is not an argument of "
                f"`{op}` (its non-tensor arguments: {', '.join(sorted(others)) or 'none'})"
            )


def _auto_guards(sigs: Sequence[Sequence[TensorSpec]], generic: bool) -> list[tuple[object, ...]]:
    """Guards that pin what every example signature agrees on: ranks, static dims, and the
    dtypes of inputs after the first (the record's `dtypes` covers the first)."""
    guards: list[tuple[object, ...]] = []
    first = sigs[0]
    for i, spec in enumerate(first):
        column = [s[i] for s in sigs]
        if all(len(c.dims) == len(spec.dims) for c in column):
            if generic:
                guards.append(("rank", i, len(spec.dims), len(spec.dims)))
            for d, size in enumerate(spec.dims):
                if isinstance(size, int) and all(c.dims[d] == size for c in column):
                    guards.append(("dim_eq", i, d, size))
        if i > 0 and all(c.dtype == spec.dtype for c in column):
            guards.append(("dtype_is", i, spec.dtype))
    return guards


class _Specialiser:
    """Turns a generic kernel's registered module into the module of one concrete call."""

    def __init__(
        self,
        name: str,
        variants: Mapping[str, str],
        statics: Mapping[str, Any],
        exporter: Callable[[str, list[TensorSpec], dict[str, Any]], str] | None,
    ) -> None:
        self.name = name
        self.variants = dict(variants)
        self.statics = dict(statics)
        self.exporter = exporter
        self.memo: dict[tuple[str, str, tuple[tuple[str, str], ...]], str] = {}
        self.lock = threading.Lock()

    def seed(self, platform: str, specs: Sequence[TensorSpec], text: str) -> None:
        self.memo[(platform, short(specs), tuple(sorted((k, static_text(v)) for k, v in self.statics.items())))] = text

    def __call__(self, platform: str, types: list[str], statics: dict[str, Any]) -> str:
        specs = [TensorSpec.parse(t) for t in types]
        key = (platform, short(specs), tuple(sorted((k, static_text(v)) for k, v in statics.items())))
        with self.lock:
            if key in self.memo:
                return self.memo[key]
        what = f"kernel `{self.name}`"
        same_statics = all(statics.get(k) == v for k, v in self.statics.items())
        text = self.variants.get(platform)
        if same_statics and text is not None and "jax.uses_shape_polymorphism = true" in text:
            out = refine(text, short(specs), what)
        elif self.exporter is not None:
            out = self.exporter(platform, specs, statics)
        else:
            raise SymbolicShapeError(
                f"{what}: no module for {platform} at ({short(specs)}) with statics {statics}: "
                "it was loaded from files with static shapes"
            )
        with self.lock:
            self.memo[key] = out
        return out


def _validate(
    name: str,
    label: str,
    specs: list[TensorSpec],
    tpu: str | None,
    cpu: str | None,
    expected: Callable[[list[Any]], Sequence[Any]] | None,
    reference: Callable[..., Any] | None,
    topology: str,
    timings: dict[str, float],
    checks: dict[str, str],
) -> None:
    """The checks at one concrete signature (modules already specialised); `checks` records
    what each did."""
    t = time.perf_counter()
    for platform, text in (("tpu", tpu), ("cpu", cpu)):
        if text is not None:
            parse_check(text, f"kernel `{name}`, {platform} variant at {label}")
            sig = _native.module_signature(text)
            want = [s.mlir() for s in specs]
            if sig["args"] != want:
                raise SignatureMismatchError(
                    f"kernel `{name}`: signature check failed for the {platform} variant at "
                    f"{label}: @{sig['name']} takes ({', '.join(sig['args'])}) but the kernel "
                    f"declares ({', '.join(want)})"
                )
    timings["parse"] = timings.get("parse", 0.0) + time.perf_counter() - t

    libtpu = tpu is not None and _native.libtpu_available()
    if tpu is None:
        checks.setdefault("tpu_compile", "no tpu variant")
    elif not libtpu:
        message = (
            f"kernel `{name}`: the TPU compile check was not done at {label}: libtpu cannot be "
            "loaded (`scripts/dev setup` installs it; TPUK_LIBTPU names it)"
        )
        if os.environ.get("TPUK_REQUIRE_RUNTIMES") == "1":
            raise RuntimeUnavailableError(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)
        checks["tpu_compile"] = "not done: libtpu cannot be loaded"

    def tpu_check() -> float | None:
        if not libtpu:
            return None
        start = time.perf_counter()
        try:
            _native.compile_tpu(tpu, topology)
        except TpuCompileError as e:
            raise TpuCompileError(
                f"kernel `{name}`: tpu compile check failed ({topology}, {label}): {e}"
            ) from None
        return time.perf_counter() - start

    def cpu_run() -> tuple[list[Any], list[Any], float]:
        start = time.perf_counter()
        inputs = _random_inputs(specs)
        if cpu is None:
            return inputs, [], 0.0
        try:
            ours, _ = _run_cpu(cpu, specs, inputs)
        except CpuRunError as e:
            raise CpuRunError(f"kernel `{name}`: cpu run check failed at {label}: {e}") from None
        return inputs, ours, time.perf_counter() - start

    # libtpu's compile and the CPU client's compile release the GIL: run them side by side,
    # and compute jax's own result meanwhile.
    with ThreadPoolExecutor(max_workers=2) as pool:
        tpu_future = pool.submit(tpu_check)
        inputs, ours, timings_cpu = cpu_run()
        start = time.perf_counter()
        theirs = expected(inputs) if expected is not None and cpu is not None else None
        jax_s = time.perf_counter() - start
        tpu_s = tpu_future.result()
    if tpu_s is not None:
        timings["tpu_compile"] = timings.get("tpu_compile", 0.0) + tpu_s
        if not checks.get("tpu_compile", "").startswith("not done"):
            checks["tpu_compile"] = f"compiled for {topology}"
    timings["cpu_run"] = timings.get("cpu_run", 0.0) + timings_cpu
    timings["jax_cpu"] = timings.get("jax_cpu", 0.0) + jax_s
    if cpu is None:
        checks.setdefault("cpu_numerics", "no cpu variant")
    elif reference is not None:
        checks["cpu_numerics"] = "against the reference on random inputs" + (
            ", and against the JAX function (round trip)" if theirs is not None else ""
        )
    elif theirs is not None:
        checks["cpu_numerics"] = (
            "round trip only: against the JAX function it was exported from, on random inputs "
            "(no reference given)"
        )
    else:
        checks["cpu_numerics"] = "finite outputs only on random inputs (no reference given)"
    if theirs is not None:
        _compare(name, label, ours, theirs, "the JAX function on CPU")
    elif reference is None:
        import numpy as np

        for i, out in enumerate(ours):
            if out.dtype.kind == "f" or out.dtype.itemsize == 2:
                if not np.isfinite(out.astype(np.float64)).all():
                    raise NumericsMismatchError(
                        f"kernel `{name}`: cpu numerics check failed at {label}: output {i} has "
                        "non-finite values on random inputs"
                    )
    if reference is not None and cpu is not None:
        ref = reference(*inputs)
        _compare(name, label, ours, ref if isinstance(ref, (tuple, list)) else [ref], "the reference")


def _params(name: str, fn: Callable[..., Any], statics: Mapping[str, Any], count: int) -> list[str]:
    """The names of `fn`'s tensor parameters; an arity that cannot take `count` tensors is a
    signature error."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return [f"x{i}" for i in range(count)]
    positional = [
        p.name
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in statics
    ]
    required = [
        p for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        and p.default is p.empty and p.name not in statics
    ]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    if len(required) > count or (len(positional) < count and not varargs):
        raise SignatureMismatchError(
            f"kernel `{name}`: signature check failed: the example signatures have {count} "
            f"tensors, the function takes {len(positional)} ({', '.join(positional)})"
        )
    return positional[:count] if len(positional) >= count else [f"x{i}" for i in range(count)]


def register_jax(
    fn: Callable[..., Any],
    *,
    op: str,
    signatures: Sequence[str | Sequence[Any]],
    name: str | None = None,
    statics: Mapping[str, Any] | None = None,
    dtypes: Sequence[str] | None = None,
    guards: Sequence[tuple[object, ...]] = (),
    priority: int = 0,
    constraints: Sequence[str] = (),
    cpu_fn: Callable[..., Any] | None = None,
    reference: Callable[..., Any] | None = None,
    validate_dims: Mapping[str, int] | None = None,
    topology: str = DEFAULT_TOPOLOGY,
    doc: str | None = None,
    define_op: bool = True,
    backward: bool = False,
    mutates_args: Sequence[str] = (),
) -> ImportedKernel:
    """Exports `fn` (jnp code or a ``pallas_call``) for TPU and CPU, validates both variants and
    registers them as one kernel for `op` (an ATen overload it replaces, ``aten::gelu``, or a new
    op it defines, ``mylib::op``). See the module documentation for the checks.

    `backward`: `fn`'s gradient (``jax.vjp``; a Pallas kernel needs its ``custom_vjp``) is
    imported too, as kernel ``<name>_backward`` for op ``<ns>::<op>_backward`` taking
    ``(grad, *inputs, **statics)`` at each example signature, and becomes the new op's autograd
    formula: eager, and under ``torch.compile``, the backward runs as a kernel.

    `mutates_args`: tensor inputs `fn` updates in place (a Pallas kernel's
    ``input_output_aliases``), as ``torch.library.custom_op`` names them. `fn`'s first outputs
    are their new values, in argument order. The export donates them to those outputs
    (``donate_argnums``), the new op takes them as ``Tensor(a!)`` and returns only the other
    outputs, and each call writes the new values into the tensors' own memory, eagerly, on the
    "tpu" device and under ``torch.compile``.

    `signatures`: example signatures, each ``"f32[8,128], f32[128]"`` or a sequence of
    ``jax.ShapeDtypeStruct`` / short strings; symbols (``B``) are symbolic dims, with
    `constraints` in ``jax.export.symbolic_shape`` syntax. `statics`: static (non-tensor)
    arguments with their default values, passed to `fn` as keywords. `dtypes`: the first input's
    accepted dtypes (default: those of the signatures). `guards`: :mod:`tpu_kernels.guards`.
    """
    timings: dict[str, float] = {}
    checks: dict[str, str] = {}
    start = time.perf_counter()
    jax = require_jax()
    if not callable(fn):
        raise NotJaxError(f"kernel `{name or fn!r}`: {fn!r} is not callable, let alone a JAX function")
    name = name or getattr(fn, "__name__", "")
    if not _NAME.match(name):
        raise RegistrationError(
            f"kernel name `{name}` must match [A-Za-z_][A-Za-z0-9_.]* (pass name=...)"
        )
    statics = dict(statics or {})
    for k, v in statics.items():
        static_kind(v)
    if not signatures:
        raise SignatureMismatchError(f"kernel `{name}`: give at least one example signature")
    sigs = [parse_signature(s) for s in signatures]
    if any(len(s) != len(sigs[0]) for s in sigs):
        raise SignatureMismatchError(
            f"kernel `{name}`: signature check failed: the example signatures disagree on the "
            f"number of tensors ({'; '.join(short(s) for s in sigs)})"
        )
    inputs = _params(name, fn, statics, len(sigs[0]))
    _binding_check(name, op, inputs, statics)
    unknown = [a for a in mutates_args if a not in inputs]
    if unknown:
        raise RegistrationError(
            f"kernel `{name}`: mutates_args {unknown} are not tensor inputs of the function ({', '.join(inputs)})"
        )
    if mutates_args and (op.startswith("aten::") or not define_op or backward):
        raise RegistrationError(
            f"kernel `{name}`: mutates_args is for a new op it defines without a backward "
            "(ATen ops are bound as pure functions; autograd needs its saved inputs unchanged)"
        )
    mutates = [n for n in inputs if n in mutates_args]
    donate = [inputs.index(n) for n in mutates]
    symbolic = any(not spec.is_static for s in sigs for spec in s)
    generic = symbolic or len(sigs) > 1 or bool(statics)
    bound = functools.partial(fn, **statics) if statics else fn
    cpu_bound = functools.partial(cpu_fn, **statics) if (cpu_fn and statics) else (cpu_fn or bound)
    timings["prepare"] = time.perf_counter() - start

    def export(platform: str, specs: list[TensorSpec], values: Mapping[str, Any], label: str) -> str:
        scope = _symbol_scope(jax, specs, constraints, name)
        structs = [_struct(jax, s, scope) for s in specs]
        f = cpu_fn if platform == "cpu" and cpu_fn else fn
        g = functools.partial(f, **values) if values else f
        return _export(jax, g, platform, specs, structs, name, f"export for {platform} at {label}", donate)

    variants: list[tuple[list[TensorSpec], str, str]] = []
    for specs in sigs:
        label = short(specs)
        t = time.perf_counter()
        tpu_text = export("tpu", specs, statics, label)
        timings["export_tpu"] = timings.get("export_tpu", 0.0) + time.perf_counter() - t
        t = time.perf_counter()
        cpu_text = export("cpu", specs, statics, label)
        timings["export_cpu"] = timings.get("export_cpu", 0.0) + time.perf_counter() - t
        variants.append((specs, tpu_text, cpu_text))

    def expected(inputs: list[Any]) -> Sequence[Any]:
        # The JAX function itself (Pallas in interpret mode) on jax's CPU backend.
        with pallas_interpret(), _x64(sigs):
            out = jax.jit(bound)(*inputs)
        return out if isinstance(out, (tuple, list)) else [out]

    for specs, tpu_text, cpu_text in variants:
        concrete, tpu_c, cpu_c = specs, tpu_text, cpu_text
        if any(not s.is_static for s in specs):
            values = {sym: (validate_dims or {}).get(sym, 128) for s in specs for sym in s.symbols}
            concrete = [s.concrete(values) for s in specs]
            t = time.perf_counter()
            tpu_c = refine(tpu_text, short(concrete), f"kernel `{name}`, tpu variant")
            cpu_c = refine(cpu_text, short(concrete), f"kernel `{name}`, cpu variant")
            timings["refine"] = timings.get("refine", 0.0) + time.perf_counter() - t
        _validate(name, short(concrete), concrete, tpu_c, cpu_c, expected, reference, topology, timings, checks)

    t = time.perf_counter()
    first_specs, tpu_text, cpu_text = variants[0]
    specialiser: _Specialiser | None = None
    if generic:
        def exporter(platform: str, specs: list[TensorSpec], values: dict[str, Any]) -> str:
            return export(platform, specs, values, short(specs))

        specialiser = _Specialiser(name, {"tpu": tpu_text, "cpu": cpu_text}, statics, exporter)
        for specs, t_text, c_text in variants:
            if all(s.is_static for s in specs):
                specialiser.seed("tpu", specs, t_text)
                specialiser.seed("cpu", specs, c_text)
    canonical = [
        short(s) + ("; " + ", ".join(f"{k}={static_text(v)}" for k, v in statics.items()) if statics else "")
        for s in sigs
        if all(x.is_static for x in s)
    ]
    info = _native.register_imported(
        name,
        ops=[op],
        inputs=inputs,
        signature=short(first_specs),
        dtypes=list(dtypes) if dtypes else sorted({s[0].dtype for s in sigs}),
        tpu=tpu_text,
        cpu=cpu_text,
        statics=[(k, static_kind(v), static_text(v)) for k, v in statics.items()],
        guards=list(guards) + _auto_guards(sigs, generic),
        priority=priority,
        canonical=canonical,
        doc=doc or (inspect.getdoc(fn) or "").split("\n")[0],
        specialiser=specialiser,
        mutates=mutates,
    )
    if backward and (op.startswith("aten::") or not define_op):
        _native.unregister(name)
        raise RegistrationError(
            f"kernel `{name}`: backward=True gives a new op its gradient; `{op}` "
            + ("is PyTorch's, whose gradient is PyTorch's" if op.startswith("aten::") else "is not defined (define_op=False)")
        )
    try:
        if define_op and not op.startswith("aten::"):
            from .ops import define_new_op

            # The output count from the export itself: tracing again here (eval_shape) would
            # cost more than the whole registration's parse.
            n_outputs = len(_native.module_signature(cpu_text)["results"])
            define_new_op(op, name, inputs, statics, fn, cpu_bound, n_outputs=n_outputs, mutates=mutates)
        if backward:
            _register_backward(jax, fn, name, op, inputs, statics, sigs, constraints, dtypes, topology)
    except Exception:
        _native.unregister(name)
        raise
    timings["register"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - start
    _events.registry_changed()
    return ImportedKernel(
        name=name,
        op=op,
        inputs=inputs,
        signatures=[short(s) for s in sigs],
        statics=statics,
        tpu=tpu_text,
        cpu=cpu_text,
        fingerprint=info["fingerprint"],
        generic=generic,
        timings=timings,
        fn=fn,
        checks=checks,
    )


def _output_specs(
    jax: Any, fn: Callable[..., Any], specs: Sequence[TensorSpec], constraints: Sequence[str], name: str
) -> list[TensorSpec]:
    """`fn`'s outputs at `specs` (``jax.eval_shape``: traced, not run), symbols kept."""
    scope = _symbol_scope(jax, specs, constraints, name)
    structs = [_struct(jax, s, scope) for s in specs]
    with pallas_interpret(), _x64([specs]):
        out = jax.eval_shape(fn, *structs)
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [TensorSpec.of(o) for o in outs]


def _register_backward(
    jax: Any,
    fn: Callable[..., Any],
    name: str,
    op: str,
    inputs: Sequence[str],
    statics: Mapping[str, Any],
    sigs: Sequence[Sequence[TensorSpec]],
    constraints: Sequence[str],
    dtypes: Sequence[str] | None,
    topology: str,
) -> None:
    """Imports `fn`'s VJP as kernel `<name>_backward` (op `<op>_backward`) and registers it as
    `op`'s autograd formula; on failure nothing of it stays registered."""
    from .ops import define_autograd

    def grad_fn(grad: Any, *xs: Any, **values: Any) -> Any:
        _, vjp = jax.vjp(lambda *a: fn(*a, **values), *xs)
        return tuple(vjp(grad))

    grad_fn.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ["grad", *inputs]]
        + [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v) for k, v in statics.items()]
    )
    bound = functools.partial(fn, **statics) if statics else fn
    bsigs = []
    for specs in sigs:
        outs = _output_specs(jax, bound, specs, constraints, name)
        if len(outs) != 1:
            raise RegistrationError(f"kernel `{name}`: backward=True needs one output, the function has {len(outs)}")
        bsigs.append(short([outs[0], *specs]))
    ns, _, rest = op.partition("::")
    bwd_op = f"{ns}::{rest.partition('.')[0]}_backward"
    bwd = register_jax(
        grad_fn, op=bwd_op, name=f"{name}_backward", signatures=bsigs, statics=dict(statics),
        constraints=constraints, topology=topology, doc=f"the gradient of `{op}` (jax.vjp of kernel `{name}`)",
        dtypes=dtypes,
    )
    try:
        define_autograd(op, bwd_op, len(inputs), statics)
    except Exception:
        _native.unregister(bwd.name)
        raise


def jax_kernel(
    *,
    op: str,
    signatures: Sequence[str | Sequence[Any]],
    **options: Any,
) -> Callable[[Callable[..., Any]], ImportedKernel]:
    """Decorator form of :func:`register_jax`::

        @tpu_kernels.jax_kernel(op="mylib::double", signatures=["f32[16,128]"])
        def double(x):
            return x * 2
    """

    def wrap(fn: Callable[..., Any]) -> ImportedKernel:
        return register_jax(fn, op=op, signatures=signatures, **options)

    return wrap


def save_mlir(name: str, directory: str | Path) -> dict[str, Path]:
    """Writes kernel `name`'s variants, locations stripped, as ``<directory>/<name>.tpu.mlir``
    and ``<name>.cpu.mlir``: the files ``#[tpu_kernel(import(tpu = ..., cpu = ...))]`` takes, so
    a kernel authored in Python can ship inside a Rust crate. Returns the paths by platform."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    info = _native.kernel(name)
    paths: dict[str, Path] = {}
    for platform in info["platforms"]:
        text = _native.strip_locations(_native.variant_text(name, platform))
        path = directory / f"{name}.{platform}.mlir"
        path.write_text(text)
        paths[platform] = path
    return paths


def load_mlir(
    *,
    name: str,
    op: str,
    signature: str | Sequence[Any],
    tpu: str | Path | None = None,
    cpu: str | Path | None = None,
    dtypes: Sequence[str] | None = None,
    guards: Sequence[tuple[object, ...]] = (),
    priority: int = 0,
    reference: Callable[..., Any] | None = None,
    validate_dims: Mapping[str, int] | None = None,
    topology: str = DEFAULT_TOPOLOGY,
    doc: str = "",
    inputs: Sequence[str] | None = None,
) -> ImportedKernel:
    """Loads a kernel from .mlir files (as :func:`save_mlir` or ``jax.export`` wrote them),
    validates it like :func:`register_jax` (parse, signature, TPU compile, CPU run; numerics
    against `reference` when given, else the CPU outputs must be finite) and registers it."""
    timings: dict[str, float] = {}
    checks: dict[str, str] = {}
    start = time.perf_counter()
    if tpu is None and cpu is None:
        raise RegistrationError(f"kernel `{name}`: give a tpu and/or a cpu module file")
    if not _NAME.match(name):
        raise RegistrationError(f"kernel name `{name}` must match [A-Za-z_][A-Za-z0-9_.]*")
    texts: dict[str, str] = {}
    for platform, path in (("tpu", tpu), ("cpu", cpu)):
        if path is not None:
            try:
                texts[platform] = Path(path).read_text()
            except OSError as e:
                raise ModuleParseError(f"kernel `{name}`: cannot read the {platform} module {path}: {e}") from None
    specs = parse_signature(signature)
    input_names = list(inputs) if inputs else [f"x{i}" for i in range(len(specs))]
    _binding_check(name, op, input_names, {})
    concrete = specs
    tpu_c, cpu_c = texts.get("tpu"), texts.get("cpu")
    symbolic = any(not s.is_static for s in specs)
    if symbolic:
        require_jax()
        values = {sym: (validate_dims or {}).get(sym, 128) for s in specs for sym in s.symbols}
        concrete = [s.concrete(values) for s in specs]
        # Check the declared signature before specialising (the wrapper needs a matching arity).
        for platform, text in texts.items():
            sig = _native.module_signature(text)
            if sig["args"] != [s.mlir() for s in specs]:
                raise SignatureMismatchError(
                    f"kernel `{name}`: signature check failed for the {platform} variant: "
                    f"@{sig['name']} takes ({', '.join(sig['args'])}) but the kernel declares "
                    f"({', '.join(s.mlir() for s in specs)})"
                )
        tpu_c = refine(tpu_c, short(concrete), f"kernel `{name}`, tpu variant") if tpu_c else None
        cpu_c = refine(cpu_c, short(concrete), f"kernel `{name}`, cpu variant") if cpu_c else None

    require_jax()
    _validate(name, short(concrete), concrete, tpu_c, cpu_c, None, reference, topology, timings, checks)
    t = time.perf_counter()
    specialiser = _Specialiser(name, texts, {}, None) if symbolic else None
    info = _native.register_imported(
        name,
        ops=[op],
        inputs=input_names,
        signature=short(specs),
        dtypes=list(dtypes) if dtypes else [specs[0].dtype],
        tpu=texts.get("tpu"),
        cpu=texts.get("cpu"),
        guards=list(guards) + _auto_guards([specs], symbolic),
        priority=priority,
        canonical=[short(specs)] if not symbolic else [],
        doc=doc,
        specialiser=specialiser,
    )
    timings["register"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - start
    _events.registry_changed()
    return ImportedKernel(
        name=name,
        op=op,
        inputs=input_names,
        signatures=[short(specs)],
        statics={},
        tpu=texts.get("tpu"),
        cpu=texts.get("cpu"),
        fingerprint=info["fingerprint"],
        generic=symbolic,
        timings=timings,
        checks=checks,
    )


def decode_mosaic(text: str) -> list[tuple[str, str]]:
    """The Mosaic kernels of a TPU module, as readable MLIR (see ``_mlir.mosaic_bodies``)."""
    require_jax()
    return mosaic_bodies(text)
