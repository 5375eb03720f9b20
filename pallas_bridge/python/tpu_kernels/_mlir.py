"""jaxlib's MLIR tools: the outside parser check, shape refinement, Mosaic body decoding.

Everything here needs jaxlib (imported lazily, see :func:`require_jax`).
"""

from __future__ import annotations

import base64
import functools
import io
import json
import re
from typing import Any

from . import _native
from .errors import JaxNotInstalledError, ModuleParseError, SymbolicShapeError

INSTALL_HINT = (
    "install it with `pip install 'jax==0.12.0.1' 'jaxlib==0.12.0.1' flatbuffers` "
    "(or run `scripts/dev setup` in a tpu-kernels checkout)"
)


def require_jax() -> Any:
    """Imports and returns jax, or raises :class:`JaxNotInstalledError` saying how to install."""
    try:
        import jax
        import jax.export  # noqa: F401  (the export API is a submodule)
    except ImportError as e:
        raise JaxNotInstalledError(
            f"jax is needed to import kernels but cannot be imported ({e}): {INSTALL_HINT}"
        ) from e
    return jax


def new_context() -> Any:
    """A new context with stablehlo, chlo and MLIR's upstream dialects (func among them),
    verifying on parse; unregistered dialects are errors."""
    require_jax()
    from jaxlib.mlir import ir
    from jaxlib.mlir._mlir_libs import _jax_mlir_ext
    from jaxlib.mlir.dialects import chlo, stablehlo

    ctx = ir.Context()
    registry = ir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)
    ctx.append_dialect_registry(registry)
    ctx.load_all_available_dialects()
    stablehlo.register_dialect(ctx)
    chlo.register_dialect(ctx)
    ctx.allow_unregistered_dialects = False
    return ctx


# The package's one context (parsing never mutates it).
_context = functools.cache(new_context)


def parse_check(text: str, what: str) -> Any:
    """Parses and verifies `text` with jaxlib; raises :class:`ModuleParseError` with jaxlib's
    line-numbered diagnostics, prefixed by `what`."""
    from jaxlib.mlir import ir

    with _context():
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as e:
            raise ModuleParseError(f"{what}: jaxlib parse check failed: {e}") from None
        if not module.operation.verify():
            raise ModuleParseError(f"{what}: jaxlib parse check failed: module does not verify")
        return module


def refine(text: str, arg_types: str, what: str) -> str:
    """Specialises a module with dynamic shapes to the static input types `arg_types`
    (``"f32[8,128], ..."``): a wrapper entry with those types calls the old entry, then jaxlib's
    ``refine_polymorphic_shapes`` makes every shape static (checking the export's shape
    assertions). Raises :class:`SymbolicShapeError` when the shapes do not satisfy them."""
    from jax._src.lib import _jax
    from jaxlib.mlir import ir

    wrapper = _native.specialisation_wrapper(text, arg_types)
    with _context():
        try:
            module = ir.Module.parse(wrapper)
        except ir.MLIRError as e:
            raise ModuleParseError(f"{what}: specialisation wrapper: {e}") from None
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
    try:
        refined = _jax.mlir.refine_polymorphic_shapes(
            buf.getvalue(), enable_shape_assertions=True, validate_static_shapes=True
        )
    except Exception as e:  # jaxlib raises plain exceptions carrying the pass diagnostics
        raise SymbolicShapeError(
            f"{what}: cannot specialise to ({arg_types}): {str(e).strip()}"
        ) from None
    with _context():
        out = ir.Module.parse(refined)
        return out.operation.get_asm(enable_debug_info=False)


_BACKEND_CONFIG = re.compile(r'backend_config = "((?:[^"\\]|\\.)*)"')


def _mlir_string(s: str) -> str:
    """Decodes an MLIR string literal body (``\\22`` hex escapes, ``\\\\``)."""
    return re.sub(
        r"\\([0-9A-Fa-f]{2}|\\)",
        lambda m: "\\" if m.group(1) == "\\" else chr(int(m.group(1), 16)),
        s,
    )


def mosaic_bodies(text: str) -> list[tuple[str, str]]:
    """The Mosaic kernels inside a module's ``tpu_custom_call``s, decoded to readable MLIR:
    ``[(kernel_name, text)]``. The ``backend_config`` body is base64 MLIR bytecode of the
    serialized (``stable_mosaic``) module; it is parsed with the tpu dialect loaded and
    deserialized (``mosaic-serde{serialize=false}``), then printed without locations."""
    from jax._src.interpreters import mlir
    from jax._src.lib import tpu
    from jaxlib.mlir import ir
    from jaxlib.mlir.passmanager import PassManager

    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        if "@tpu_custom_call" not in line:
            continue
        m = _BACKEND_CONFIG.search(line)
        if not m:
            continue
        config = json.loads(_mlir_string(m.group(1)))
        body = base64.b64decode(config["custom_call_config"]["body"])
        name_match = re.search(r'kernel_name = "([^"]*)"', line)
        ctx = mlir.make_ir_context()
        tpu.register_dialect(ctx)
        with ctx, ir.Location.unknown():
            ctx.allow_unregistered_dialects = True
            module = ir.Module.parse(body)
            PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(
                module.operation
            )
            asm = module.operation.get_asm(enable_debug_info=False)
        out.append((name_match.group(1) if name_match else "kernel", asm))
    return out
