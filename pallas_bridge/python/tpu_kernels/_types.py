"""Signatures in tpu-kernels' short spelling (``f32[8,128]``, ``bf16[B,128]``) and their jax
equivalents (``jax.ShapeDtypeStruct``, symbolic dims from ``jax.export.symbolic_shape``)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import SignatureMismatchError

# Short dtype names (the Rust `DType::short_name`) and their numpy/jax names.
DTYPE_NAMES: dict[str, str] = {
    "f32": "float32",
    "f64": "float64",
    "bf16": "bfloat16",
    "f16": "float16",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "u32": "uint32",
    "bool": "bool",
}
SHORT_NAMES: dict[str, str] = {v: k for k, v in DTYPE_NAMES.items()}
# MLIR element types, for comparing with module signatures.
MLIR_NAMES: dict[str, str] = {"u8": "ui8", "u32": "ui32", "bool": "i1"}

_TYPE = re.compile(r"^\s*([a-z0-9]+)\[([^\]]*)\]\s*$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class TensorSpec:
    """One tensor input: a short dtype name and dims (ints, or symbol names)."""

    dtype: str
    dims: tuple[int | str, ...]

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.dims)

    @property
    def symbols(self) -> list[str]:
        return [d for d in self.dims if isinstance(d, str)]

    def short(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.dims)}]"

    def mlir(self) -> str:
        dims = "".join(f"{'?' if isinstance(d, str) else d}x" for d in self.dims)
        return f"tensor<{dims}{MLIR_NAMES.get(self.dtype, self.dtype)}>"

    def concrete(self, values: Mapping[str, int]) -> TensorSpec:
        """The spec with each symbol replaced by its value in `values`."""
        return TensorSpec(
            self.dtype, tuple(values[d] if isinstance(d, str) else d for d in self.dims)
        )

    @staticmethod
    def parse(text: str) -> TensorSpec:
        m = _TYPE.match(text)
        if not m or m.group(1) not in DTYPE_NAMES:
            known = ", ".join(DTYPE_NAMES)
            raise SignatureMismatchError(
                f"`{text.strip()}` is not `dtype[dims]` with a dtype among {known}"
            )
        dims: list[int | str] = []
        for part in (p.strip() for p in m.group(2).split(",")):
            if not part:
                continue
            if part.isdigit():
                dims.append(int(part))
            elif _IDENT.match(part):
                dims.append(part)
            else:
                raise SignatureMismatchError(
                    f"bad dimension `{part}` in `{text.strip()}`: a size or a symbol name"
                )
        return TensorSpec(m.group(1), tuple(dims))

    @staticmethod
    def of(value: Any) -> TensorSpec:
        """From a ``jax.ShapeDtypeStruct`` (or anything with ``shape`` and ``dtype``) or a
        short-spelling string."""
        if isinstance(value, str):
            return TensorSpec.parse(value)
        shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
        if shape is None or dtype is None:
            raise SignatureMismatchError(
                f"{value!r} is neither a ShapeDtypeStruct nor a `dtype[dims]` string"
            )
        name = SHORT_NAMES.get(str(dtype))
        if name is None:
            raise SignatureMismatchError(f"dtype {dtype} has no tpu-kernels spelling")
        dims: list[int | str] = []
        for d in shape:
            if isinstance(d, int):
                dims.append(d)
            elif _IDENT.match(str(d)):
                dims.append(str(d))
            else:
                raise SignatureMismatchError(
                    f"symbolic dimension `{d}` is not a plain symbol; write constraints instead "
                    "(e.g. constraints=['mod(B, 8) == 0'])"
                )
        return TensorSpec(name, tuple(dims))


def parse_signature(sig: str | Sequence[Any]) -> list[TensorSpec]:
    """``"f32[8,128], f32[128]"`` or a sequence of ShapeDtypeStructs / short strings."""
    if isinstance(sig, str):
        parts: list[str] = []
        depth, start = 0, 0
        for i, c in enumerate(sig):
            if c == "[":
                depth += 1
            elif c == "]":
                depth -= 1
            elif c == "," and depth == 0:
                parts.append(sig[start:i])
                start = i + 1
        if sig[start:].strip():
            parts.append(sig[start:])
        return [TensorSpec.parse(p) for p in parts]
    return [TensorSpec.of(v) for v in sig]


def short(specs: Sequence[TensorSpec]) -> str:
    return ", ".join(s.short() for s in specs)


def static_kind(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    raise SignatureMismatchError(
        f"static argument value {value!r} must be a bool, int, float or str"
    )


def static_text(value: object) -> str:
    """The signature spelling of a static value (as the Rust `StaticValue` prints it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)
