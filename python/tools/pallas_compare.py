"""Pallas vs ours: jax's own Pallas TPU kernels and this project's tiled (Mosaic) kernels, compiled
by libtpu for the same jobs, for v5e and v6e, in one run; prints a Markdown section.

    # after eval "$(scripts/dev env)"; about 1.5 minutes on 2 cores
    JAX_PLATFORMS=cpu python python/tools/pallas_compare.py
    JAX_PLATFORMS=cpu python python/tools/pallas_compare.py --out /tmp/pallas.md --generations v5e --families matmul

No TPU is needed: libtpu compiles for a TPU topology compile-only (jax's
``topologies.get_topology_desc(...).devices[0]``, a ``CompileOnlyPyClient`` device).

One table per kernel family (flash attention forward and backward, matmul, norms, and the rows
of ours that have no Pallas TPU counterpart, :data:`OURS_ONLY`). Each row is one side (ours or
Pallas) of one case and reports, per generation where it depends on one:

- the compile result (ok, or the first line of libtpu's error) and the compile time (median of
  ``--repeats`` compiles of the module as emitted, parsing excluded; one warm-up compile per
  generation first, so libtpu's start-up is not counted);
- the kernel's grid (``iteration_bounds``), its windows' block shapes (``window_params``
  ``window_bounds``, inputs then outputs) and its scratch buffers, read from the Mosaic kernel;
- the smallest scoped VMEM limit at which libtpu compiles the module, bisected to 4 KiB: every
  ``tpu_custom_call``'s ``backend_config`` JSON gets ``scoped_memory_configs = [{memory_space: 1
  (VMEM), offset: 0, size: N}]``, as ``kernel_lib/src/mosaic/wrap.rs`` writes a kernel's
  ``vmem_limit_bytes``; below it libtpu refuses with ``E1001: CompileTimeScopedVmemOom``, whose
  "Scoped allocation with size X" at the largest refused limit is shown too;
- what the compiled executable reports about itself: ``get_compiled_memory_stats()`` (argument,
  output, temp and generated-code sizes) and ``cost_analysis()`` (flops, transcendentals, bytes
  accessed). libtpu does not analyse a Mosaic kernel's work: flops and transcendentals are the
  ``cost_estimate`` the kernel's own ``backend_config`` declares (absent: not reported), plus
  XLA's count for the module's other ops;
- those other ops: the opcodes of the compiled entry computation besides the custom calls and
  the free ones (bitcast, tuple), as a relayout ``reduce`` or ``copy`` of a kernel's operand;
- Mosaic op counts of the kernel function's body (nested ops included; the index-map functions
  are not counted), from jaxlib's parser with the TPU dialect, after jaxlib's
  ``mosaic-serde{serialize=false}`` pass for a body in the shipped ``stable_mosaic`` form (both
  sides ship that form);
- lines of kernel source (non-blank, non-comment, docstrings excluded). Pallas: "body" is the
  kernel function(s) handed to ``pallas_call`` and the helpers they call (``inspect.getsource``);
  "spec" is the function(s) that build the ``pallas_call`` (grid, BlockSpecs, scratch). Ours:
  "body" is the ``fn`` item in ``kernel_lib/src/kernels/*.rs`` (signature and body) plus the fns
  of the same file it calls, transitively (consts, structs and ``#[allow]`` attributes are not
  counted); "spec" is its ``#[tpu_kernel(...)]`` attribute (ops, dtypes, shapes, grid, blocks).

A side that cannot be built (an export that fails, a missing extension) or compiled is a row
with the error, never a crash. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import ast
import base64
import inspect
import io
import json
import math
import os
import re
import statistics
import sys
import textwrap
import time
import tokenize
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
KERNELS_SRC = ROOT / "kernel_lib" / "src" / "kernels"
GENERATIONS = ("v5e", "v6e")
VMEM_STEP = 4096  # bisection resolution
VMEM_MAX = 128 << 20  # the largest limit tried (the VMEM of a v5e or v6e core)
DEFAULT_SCOPED_VMEM = {"v5e": 16 << 20, "v6e": 32 << 20}  # libtpu's defaults (mosaic-facts.md §4)
START = time.perf_counter()

# Rows of ours with no Pallas TPU counterpart: (kernel, signature), as `tk.emit` takes them.
OURS_ONLY: list[tuple[str, str]] = [
    ("tiled_softmax", "f32[4,1024,1024]; dim=-1"),
    ("tiled_log_softmax", "f32[4,1024,1024]; dim=-1"),
    ("tiled_softmax_backward", "f32[4,1024,1024], f32[4,1024,1024]; dim=-1, input_dtype=float32"),
    # Cross-entropy at a 32k (Llama 2) and a 128k (Llama 3: 128256) vocabulary.
    ("tiled_cross_entropy", "f32[1024,32000], i64[1024]"),
    ("tiled_cross_entropy", "bf16[1024,32000], i64[1024]"),
    ("tiled_cross_entropy", "f32[1024,128256], i64[1024]"),
    ("tiled_cross_entropy", "bf16[1024,128256], i64[1024]"),
    ("tiled_cross_entropy_backward", "f32[], f32[1024,32000], i64[1024]"),
    ("tiled_cross_entropy_backward", "bf16[], bf16[1024,128256], i64[1024]"),
    # Grouped-query attention's backward (8 query heads over 2 key/value heads); jax's Pallas
    # flash attention takes one key/value head per query head.
    (
        "tiled_sdpa_flash_backward",
        "f32[1,8,1024,128], f32[1,8,1024,128], f32[1,2,1024,128], f32[1,2,1024,128], "
        "f32[1,8,1024,128], f32[1,8,1024]; is_causal=true",
    ),
]

# The op counts shown as columns: (column, Mosaic op names counted in it).
KEY_OPS: list[tuple[str, tuple[str, ...]]] = [
    ("matmul", ("tpu.matmul",)),
    ("vld", ("vector.load", "tpu.load", "tpu.strided_load")),
    ("vst", ("tpu.vector_store", "vector.store", "tpu.store", "tpu.strided_store")),
    ("exp", ("math.exp", "math.exp2")),
    ("scf.if", ("scf.if",)),
    ("scf.for", ("scf.for", "scf.while")),
]


def log(msg: str) -> None:
    print(f"[pallas_compare {time.perf_counter() - START:6.1f}s] {msg}", file=sys.stderr, flush=True)


def first_line(e: BaseException | str) -> str:
    """The first non-empty line of an error, at most 160 characters."""
    text = str(e) if isinstance(e, str) else f"{type(e).__name__}: {e}"
    for line in text.splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= 160 else line[:157] + "..."
    return text.strip() or "(no message)"


# ---------------------------------------------------------------------------------------------
# The custom call's backend_config inside StableHLO text
# ---------------------------------------------------------------------------------------------

_CUSTOM_CALL = re.compile(r'stablehlo\.custom_call @tpu_custom_call\(([^)]*)\)\s*\{backend_config = "((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(r"\\([0-9A-Fa-f]{2}|.)")


def mlir_unescape(s: str) -> str:
    """The content of an MLIR string literal (``\\22``-style hex escapes and ``\\n``, ``\\"``)."""
    simple = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}

    def one(m: re.Match[str]) -> str:
        g = m.group(1)
        return chr(int(g, 16)) if len(g) == 2 else simple.get(g, g)

    return _ESCAPE.sub(one, s)


def mlir_escape(s: str) -> str:
    """`s` as the content of an MLIR string literal (as the Rust printer writes it)."""
    out = []
    for c in s:
        if c == '"':
            out.append("\\22")
        elif c == "\\":
            out.append("\\5C")
        elif ord(c) < 0x20:
            out.append(f"\\{ord(c):02X}")
        else:
            out.append(c)
    return "".join(out)


@dataclass
class CustomCall:
    operands: int  # StableHLO operands of the call (scalar-prefetch tables first, then inputs)
    config: dict[str, Any]  # the backend_config JSON


def custom_calls(text: str) -> list[CustomCall]:
    """Every ``tpu_custom_call`` of a StableHLO module, in order."""
    calls = []
    for m in _CUSTOM_CALL.finditer(text):
        operands = len([a for a in m.group(1).split(",") if a.strip()])
        calls.append(CustomCall(operands, json.loads(mlir_unescape(m.group(2)))))
    return calls


def rewrite_configs(text: str, change: Callable[[dict[str, Any]], None]) -> str:
    """`text` with `change` applied to every tpu_custom_call's backend_config JSON."""

    def one(m: re.Match[str]) -> str:
        config = json.loads(mlir_unescape(m.group(2)))
        change(config)
        start, end = m.span(2)
        return m.group(0)[: start - m.start()] + mlir_escape(json.dumps(config)) + m.group(0)[end - m.start() :]

    return _CUSTOM_CALL.sub(one, text)


def with_scoped_vmem(text: str, size: int) -> str:
    """`text` with every kernel's scoped VMEM limit set to `size` bytes (memory space 1 is VMEM,
    the spelling of kernel_lib/src/mosaic/wrap.rs)."""

    def change(config: dict[str, Any]) -> None:
        config["scoped_memory_configs"] = [{"memory_space": 1, "offset": 0, "size": size}]

    return rewrite_configs(text, change)


_E1001_SIZE = re.compile(r"Scoped allocation with size ([0-9.]+)([KMGT]?)\b")


def e1001_size(message: str) -> int | None:
    """The size libtpu's E1001 error says the kernel's scoped allocation needs (bytes, from its
    ``Scoped allocation with size 704.0K and limit ...``), or None."""
    m = _E1001_SIZE.search(message)
    if not m:
        return None
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2)]
    return round(float(m.group(1)) * scale)


def is_vmem_oom(message: str) -> bool:
    return "CompileTimeScopedVmemOom" in message or "E1001" in message


# ---------------------------------------------------------------------------------------------
# Mosaic bodies: decode, deserialize, count ops
# ---------------------------------------------------------------------------------------------

@dataclass
class MosaicKernel:
    name: str
    grid: list[int]
    windows: list[list[int]]  # window_bounds, in window_params order (inputs, then outputs)
    inputs: int  # how many windows are inputs
    scratch: list[str]  # scratch memref types, as "128x128xf32"
    ops: Counter[str]  # op name -> count, in the kernel function's body

    @property
    def total_ops(self) -> int:
        return sum(self.ops.values())


def _mosaic_context() -> Any:
    from jax._src.interpreters import mlir
    from jax._src.lib import tpu

    ctx = mlir.make_ir_context()
    tpu.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True  # the serialized form's ops are `stable_mosaic.*`
    return ctx


def _walk(op: Any, counts: Counter[str]) -> None:
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                counts[inner.operation.name] += 1
                _walk(inner.operation, counts)


def _ints(attr: Any) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", str(attr).split(":", 1)[-1])] if attr is not None else []


def _memref_shape(ty: Any) -> str:
    m = re.match(r"memref<([^,>]*)", str(ty))
    return m.group(1) if m else str(ty)


def parse_mosaic(config: dict[str, Any], operands: int) -> list[MosaicKernel]:
    """The kernel function(s) of one custom call's Mosaic body: the func with ``window_params``,
    ``tpu.core_type`` or the name ``main``. `operands`: the call's StableHLO operand count."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.passmanager import PassManager

    ccc = config["custom_call_config"]
    data = base64.b64decode(ccc["body"])
    ctx = _mosaic_context()
    with ctx:
        module = ir.Module.parse(data if data.startswith(b"ML\xefR") else data.decode())
        if ccc.get("serialization_format") == 1:
            PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(module.operation)
        kernels = []
        for op in module.body.operations:
            op = op.operation
            if op.name != "func.func":
                continue
            attrs = {name: op.attributes[name] for name in op.attributes}
            name = str(attrs["sym_name"]).strip('"')
            if not ("window_params" in attrs or "tpu.core_type" in attrs or name == "main"):
                continue
            counts: Counter[str] = Counter()
            _walk(op, counts)
            windows = [_ints(w) for w in re.findall(r"window_bounds = (array<i64[^>]*>)", str(attrs.get("window_params", "")))]
            prefetch = int(str(attrs.get("scalar_prefetch", "0 : i64")).split(":")[0])
            n_scratch = int(str(attrs.get("scratch_operands", "0 : i64")).split(":")[0])
            args = list(op.regions[0].blocks[0].arguments)
            scratch = [_memref_shape(a.type) for a in args[len(args) - n_scratch :]] if n_scratch else []
            kernels.append(
                MosaicKernel(
                    name=name,
                    grid=_ints(attrs.get("iteration_bounds")),
                    windows=windows,
                    inputs=max(0, operands - prefetch),
                    scratch=scratch,
                    ops=counts,
                )
            )
        return kernels


# ---------------------------------------------------------------------------------------------
# Lines of source
# ---------------------------------------------------------------------------------------------

def python_lines(fns: Sequence[Callable[..., Any]]) -> int:
    """Non-blank, non-comment lines of the functions' source (decorators included, docstrings
    excluded)."""
    total = 0
    for fn in fns:
        src = textwrap.dedent(inspect.getsource(inspect.unwrap(fn)))
        doc: set[int] = set()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                    doc.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
        code: set[int] = set()
        skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
        skip |= {tokenize.ENCODING, tokenize.ENDMARKER}
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type not in skip:
                code.update(range(tok.start[0], tok.end[0] + 1))
        total += len(code - doc)
    return total


def _rust_code_lines(lines: list[str]) -> int:
    n, in_block = 0, False
    for line in lines:
        s = line.strip()
        if in_block:
            if "*/" in s:
                in_block = False
            continue
        if s.startswith("/*"):
            in_block = "*/" not in s
            continue
        if s and not s.startswith("//"):
            n += 1
    return n


_RUST_FN = re.compile(r"^(?:pub(?:\([^)]*\))? )?fn (\w+)", re.M)


@dataclass
class RustSource:
    file: str
    spec: int  # the #[tpu_kernel(...)] attribute
    body: int  # the fn item and the helper fns it calls
    helpers: list[str]


def _rust_item(lines: list[str], name: str) -> tuple[int, int]:
    """(first, last) line index of the top-level fn `name` (rustfmt: it ends at a line `}`)."""
    pat = re.compile(rf"^(?:pub(?:\([^)]*\))? )?fn {re.escape(name)}\b")
    start = next(i for i, l in enumerate(lines) if pat.match(l))
    end = next(i for i in range(start, len(lines)) if lines[i].rstrip() == "}" or (i == start and lines[i].rstrip().endswith("}")))
    return start, end


def rust_lines(kernel: str, src_dir: Path = KERNELS_SRC) -> RustSource | None:
    """Lines of our kernel `kernel`'s Rust source (see the module documentation), or None when
    no file under `src_dir` defines it."""
    for path in sorted(src_dir.glob("*.rs")):
        lines = path.read_text().splitlines()
        if not any(re.match(rf"^(?:pub )?fn {re.escape(kernel)}\b", l) for l in lines):
            continue
        start, end = _rust_item(lines, kernel)
        attr = max(i for i in range(start) if lines[i].startswith("#[tpu_kernel("))
        # rustfmt closes a multi-line attribute with a line `)]`; a one-line one ends with it
        attr_end = next(i for i in range(attr, start) if lines[i].rstrip() == ")]" or (i == attr and lines[i].rstrip().endswith(")]")))
        spec = _rust_code_lines(lines[attr : attr_end + 1])
        defined = set(_RUST_FN.findall("\n".join(lines))) - {kernel}
        seen: list[str] = []
        todo = ["\n".join(lines[start : end + 1])]
        body = _rust_code_lines(lines[start : end + 1])
        while todo:
            text = "\n".join(l.split("//")[0] for l in todo.pop().splitlines())
            for helper in sorted(defined - set(seen)):
                if re.search(rf"(?<![.\w]){re.escape(helper)}\s*(?:::<[^>]*>)?\(", text):
                    seen.append(helper)
                    h0, h1 = _rust_item(lines, helper)
                    body += _rust_code_lines(lines[h0 : h1 + 1])
                    todo.append("\n".join(lines[h0 : h1 + 1]))
        return RustSource(str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path), spec, body, seen)
    return None


# ---------------------------------------------------------------------------------------------
# Compiling with libtpu (compile-only)
# ---------------------------------------------------------------------------------------------

class CompileError(Exception):
    pass


class Compiler:
    """libtpu's compile-only client for each TPU generation, through jax."""

    def __init__(self, generations: Sequence[str] = GENERATIONS) -> None:
        from jax._src.interpreters import mlir
        from jax.experimental import topologies

        self._ctx = mlir.make_ir_context()
        self.devices = {
            g: topologies.get_topology_desc(topology_name=f"{g}:1x1", platform="tpu").devices[0] for g in generations
        }
        self.warm: set[str] = set()
        self.compiles = 0

    def compile(self, text: str, gen: str) -> tuple[Any, float]:
        """(executable, seconds of the compile call); :class:`CompileError` with libtpu's (or the
        parser's) message."""
        from jax._src import compiler
        from jax._src.lib import xla_client as xc
        from jaxlib.mlir import ir

        dev = self.devices[gen]
        with self._ctx:
            try:
                module = ir.Module.parse(text)
            except Exception as e:  # MLIRError, with the parser's diagnostics
                raise CompileError("StableHLO parse failed: " + " ".join(str(e).split())) from None
            options = compiler.get_compile_options(1, 1)
            start = time.perf_counter()
            self.compiles += 1
            try:
                exe = dev.client.compile(module, xc.DeviceList((dev,)), options)
            except Exception as e:  # JaxRuntimeError and kin: libtpu's status
                raise CompileError(str(e)) from None
            return exe, time.perf_counter() - start

    def warm_up(self, text: str, gen: str) -> None:
        """One uncounted compile per generation (libtpu's first compile pays its start-up)."""
        if gen not in self.warm:
            self.warm.add(gen)
            try:
                self.compile(text, gen)
            except CompileError:
                pass


@dataclass
class GenResult:
    """One module compiled for one generation."""

    error: str = ""  # "" when it compiled
    compile_ms: float | None = None
    vmem_min: int | None = None  # smallest scoped VMEM limit that compiles (bytes)
    vmem_note: str = ""  # why vmem_min is missing or a bound
    e1001_size: int | None = None  # the size libtpu's E1001 named at the largest refused limit
    vmem_probes: int = 0
    memory: dict[str, int] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    # XLA ops of the compiled entry computation besides the kernels (opcode -> count; bitcasts,
    # tuples, parameters and constants left out): what the module does around its custom calls.
    outside: Counter[str] | None = None


MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "temp_size_in_bytes",
    "generated_code_size_in_bytes",
)


_HLO_OPCODE = re.compile(r"^\s*(?:ROOT )?%[\w.-]+ = .*?\s([a-z][\w-]*)\(")
_FREE_OPCODES = {"parameter", "bitcast", "tuple", "get-tuple-element", "constant", "custom-call"}


def outside_ops(exe: Any) -> Counter[str] | None:
    """The opcodes of the compiled module's entry computation other than its custom calls and
    the free ones (bitcast, tuple, ...), or None when the executable does not show its HLO."""
    try:
        text = exe.hlo_modules()[0].to_string()
    except Exception as e:
        log(f"  compiled HLO not available: {first_line(e)}")
        return None
    counts: Counter[str] = Counter()
    in_entry = False
    for line in text.splitlines():
        if line.startswith("ENTRY "):
            in_entry = True
        elif in_entry and line.startswith("}"):
            break
        elif in_entry and (m := _HLO_OPCODE.match(line)) and m.group(1) not in _FREE_OPCODES:
            counts[m.group(1)] += 1
    return counts


def executable_stats(exe: Any) -> tuple[dict[str, int], dict[str, float]]:
    """What the compiled executable reports: memory stats and cost analysis (empty when not
    reported)."""
    memory: dict[str, int] = {}
    try:
        stats = exe.get_compiled_memory_stats()
        memory = {f: int(getattr(stats, f)) for f in MEMORY_FIELDS if hasattr(stats, f)}
    except Exception as e:  # not every client reports it
        log(f"  memory stats not reported: {first_line(e)}")
    cost: dict[str, float] = {}
    try:
        raw = exe.cost_analysis()
        raw = raw[0] if isinstance(raw, list) else raw
        cost = {k: float(v) for k, v in (raw or {}).items()}
    except Exception as e:
        log(f"  cost analysis not reported: {first_line(e)}")
    return memory, cost


def bisect_vmem(compiler: Compiler, text: str, gen: str, result: GenResult) -> None:
    """Sets `result.vmem_min` to the smallest scoped VMEM limit (a multiple of VMEM_STEP, at most
    VMEM_MAX) at which `text` compiles for `gen`, guided by the sizes libtpu's E1001 errors name;
    other failures end the search with a note."""
    lo, hi = 0, None  # lo: largest refused limit; hi: smallest accepted one
    hint: int | None = None
    tried: set[int] = set()

    def probe(limit: int) -> bool:
        nonlocal lo, hi, hint
        tried.add(limit)
        result.vmem_probes += 1
        try:
            compiler.compile(with_scoped_vmem(text, limit), gen)
        except CompileError as e:
            msg = str(e)
            if not is_vmem_oom(msg):
                raise
            lo = max(lo, limit)
            size = e1001_size(msg)
            if size is not None and limit == lo:
                result.e1001_size = size
                if size > limit:
                    hint = math.ceil(size / VMEM_STEP) * VMEM_STEP
            return False
        hi = limit if hi is None else min(hi, limit)
        return True

    try:
        if probe(VMEM_STEP):
            result.vmem_min = VMEM_STEP
            result.vmem_note = "at most"
            return
        check_below: int | None = None  # after a hint compiles: try one step below it
        while hi is None or hi - lo > VMEM_STEP:
            if hint is not None and lo < hint <= VMEM_MAX and (hi is None or hint < hi) and hint not in tried:
                limit = hint
            elif check_below is not None and lo < check_below and check_below not in tried:
                limit = check_below
            elif hi is None:
                if lo >= VMEM_MAX:
                    result.vmem_note = f"refused at {fmt_bytes(VMEM_MAX)}"
                    return
                limit = min(VMEM_MAX, 2 * lo)
            else:
                limit = (lo + hi) // 2 // VMEM_STEP * VMEM_STEP
            check_below = None
            if probe(limit) and limit == hint:
                check_below = limit - VMEM_STEP
        result.vmem_min = hi
    except CompileError as e:
        result.vmem_note = f"bisection stopped: {first_line(str(e))}"


def measure(compiler: Compiler, text: str, gen: str, repeats: int = 3, vmem: bool = True) -> GenResult:
    """Compiles `text` for `gen` `repeats` times (median time), reads the executable's stats and
    bisects its scoped VMEM need. A failure is recorded, never raised."""
    result = GenResult()
    compiler.warm_up(text, gen)
    times = []
    exe = None
    for _ in range(max(1, repeats)):
        try:
            exe, seconds = compiler.compile(text, gen)
        except CompileError as e:
            result.error = first_line(str(e))
            return result
        times.append(seconds)
    result.compile_ms = statistics.median(times) * 1e3
    result.memory, result.cost = executable_stats(exe)
    result.outside = outside_ops(exe)
    if vmem:
        bisect_vmem(compiler, text, gen, result)
    return result


# ---------------------------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------------------------

@dataclass
class Built:
    """One side's module for one case, or why there is none."""

    text: str | None = None
    error: str = ""
    body_lines: int | None = None
    spec_lines: int | None = None
    source_note: str = ""


@dataclass
class Case:
    family: str
    label: str  # what the row is, as "f32 causal"
    shape: str  # the job, as the table states it
    ours: tuple[str, str] | None  # (kernel, signature) for tk.emit
    pallas: Callable[[], Built] | None
    note: str = ""


def _jax() -> Any:
    import jax

    return jax


def _export_tpu(fn: Callable[..., Any], *args: Any) -> str:
    jax = _jax()
    return jax.export.export(jax.jit(fn), platforms=["tpu"])(*args).mlir_module()


def _pallas(build: Callable[[], str], body: Callable[[], list[Any]], spec: Callable[[], list[Any]]) -> Callable[[], Built]:
    """A Pallas side: `build` exports the module; `body`/`spec` list the functions counted."""

    def make() -> Built:
        out = Built()
        try:
            out.text = build()
        except Exception as e:  # the export refuses: recorded as the row's result
            out.error = first_line(e)
        try:
            b, s = body(), spec()
            out.body_lines, out.spec_lines = python_lines(b), python_lines(s)
            out.source_note = ", ".join(f.__name__ for f in b)
        except Exception as e:
            out.source_note = f"source not counted: {first_line(e)}"
        return out

    return make


def _sds(shape: tuple[int, ...], dtype: str) -> Any:
    jax = _jax()
    return jax.ShapeDtypeStruct(shape, getattr(jax.numpy, dtype))


_DT = {"f32": "float32", "bf16": "bfloat16"}


def flash_forward_cases(b: int = 1, h: int = 8, l: int = 1024, e: int = 128) -> list[Case]:
    cases = []
    for dt in ("f32", "bf16"):
        for causal in (False, True):
            shape = f"{dt}[{b},{h},{l},{e}]"

            def build(dt: str = dt, causal: bool = causal) -> str:
                from jax.experimental.pallas.ops.tpu import flash_attention as fa

                s = _sds((b, h, l, e), _DT[dt])
                return _export_tpu(lambda q, k, v: fa.flash_attention(q, k, v, causal=causal, sm_scale=e**-0.5), s, s, s)

            def body() -> list[Any]:
                from jax.experimental.pallas.ops.tpu import flash_attention as fa

                block_k = fa.BlockSizes.get_default(b, h, l, l, e).block_k
                inner = fa._flash_attention_kernel_single_batch_single_step if block_k == l else fa._flash_attention_kernel_single_batch
                return [fa._flash_attention_kernel, inner, fa.below_or_on_diag]

            def spec() -> list[Any]:
                from jax.experimental.pallas.ops.tpu import flash_attention as fa

                return [fa._flash_attention_impl]

            cases.append(
                Case(
                    "flash attention forward",
                    f"{dt} {'causal' if causal else 'full'}",
                    f"q, k, v {shape}",
                    ("tiled_sdpa_flash", f"{shape}, {shape}, {shape}; is_causal={str(causal).lower()}"),
                    _pallas(build, body, spec),
                )
            )
    return cases


def flash_backward_cases(b: int = 1, h: int = 8, l: int = 1024, e: int = 128) -> list[Case]:
    cases = []
    for causal in (False, True):
        shape = f"f32[{b},{h},{l},{e}]"

        def build(causal: bool = causal) -> str:
            from jax.experimental.pallas.ops.tpu import flash_attention as fa

            jax = _jax()
            s = _sds((b, h, l, e), "float32")
            blocks = fa.BlockSizes.get_default(b, h, l, l, e)
            scale = e**-0.5
            # The residuals the forward saves for jax.vjp (out, row sum l, row max m).
            o, lsum, mx = jax.eval_shape(
                lambda q, k, v: fa._flash_attention(q, k, v, None, None, True, causal, scale, blocks, False), s, s, s
            )

            def bwd(q: Any, k: Any, v: Any, o: Any, lsum: Any, mx: Any, do: Any) -> Any:
                # the custom_vjp's backward rule: di = rowsum(o * do), then the dkv and dq kernels
                return fa._flash_attention_bwd(False, causal, scale, blocks, False, (q, k, v, None, None, o, lsum, mx), do)[:3]

            return _export_tpu(bwd, s, s, s, o, lsum, mx, s)

        def body() -> list[Any]:
            from jax.experimental.pallas.ops.tpu import flash_attention as fa

            return [fa._flash_attention_dkv_kernel, fa._flash_attention_dq_kernel, fa.below_or_on_diag]

        def spec() -> list[Any]:
            from jax.experimental.pallas.ops.tpu import flash_attention as fa

            return [fa._flash_attention_bwd, fa._flash_attention_bwd_dkv, fa._flash_attention_bwd_dq]

        lse = f"f32[{b},{h},{l}]"
        cases.append(
            Case(
                "flash attention backward",
                f"f32 {'causal' if causal else 'full'}",
                f"q, k, v, out, grad_out {shape}",
                ("tiled_sdpa_flash_backward", f"{shape}, {shape}, {shape}, {shape}, {shape}, {lse}; is_causal={str(causal).lower()}"),
                _pallas(build, body, spec),
            )
        )
    return cases


def matmul_cases(n: int = 1024, blocks: tuple[int, int, int] = (256, 256, 512)) -> list[Case]:
    bm, bn, bk = blocks
    cases = []
    for dt in ("f32", "bf16"):

        def build(dt: str = dt) -> str:
            from jax.experimental.pallas.ops.tpu import matmul as mm

            s = _sds((n, n), _DT[dt])
            return _export_tpu(lambda x, y: mm.matmul(x, y, block_shape=(bm, bn), block_k=bk), s, s)

        def body() -> list[Any]:
            from jax.experimental.pallas.ops.tpu import matmul as mm

            return [mm.matmul_kernel]

        def spec() -> list[Any]:
            from jax.experimental.pallas.ops.tpu import matmul as mm

            return [mm.matmul]

        shape = f"{dt}[{n},{n}]"
        cases.append(
            Case(
                "matmul",
                dt,
                f"{shape} @ {shape}",
                ("tiled_matmul_act", f"{shape}, {shape}; activation=none"),
                _pallas(build, body, spec),
                note=f"Pallas given ours' tiles: block_shape=({bm},{bn}), block_k={bk}",
            )
        )
    return cases


def norm_cases(rows: tuple[int, int] = (4, 1024), d: int = 1024) -> list[Case]:
    x = f"f32[{rows[0]},{rows[1]},{d}]"
    w = f"f32[{d}]"
    cases = []
    for name, kernel, sig in (
        ("layer_norm", "tiled_layer_norm", f"{x}, {w}, {w}"),
        ("rms_norm", "tiled_rms_norm", f"{x}, {w}"),
    ):

        def build(name: str = name) -> str:
            import importlib
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # the GPU norms point to tokamax
                module = importlib.import_module(f"jax.experimental.pallas.ops.gpu.{name}")
            s, v = _sds((*rows, d), "float32"), _sds((d,), "float32")
            fn = getattr(module, name)
            return _export_tpu(lambda x, w, b: fn(x, w, b), s, v, v)

        def body(name: str = name) -> list[Any]:
            import importlib

            return [getattr(importlib.import_module(f"jax.experimental.pallas.ops.gpu.{name}"), f"{name}_forward_kernel")]

        def spec(name: str = name) -> list[Any]:
            import importlib

            return [getattr(importlib.import_module(f"jax.experimental.pallas.ops.gpu.{name}"), name)]

        cases.append(
            Case(
                "norms",
                name,
                f"x {x}, weight{' and bias' if name == 'layer_norm' else ''} {w}",
                (kernel, sig),
                _pallas(build, body, spec),
                note=f"Pallas: jax.experimental.pallas.ops.gpu.{name} (jax has no TPU norm kernel), exported for tpu",
            )
        )
    return cases


def ours_only_cases(entries: Sequence[tuple[str, str]] = ()) -> list[Case]:
    return [Case("ours only", kernel, sig.split(";")[0], (kernel, sig), None) for kernel, sig in entries]


FAMILIES: dict[str, Callable[[], list[Case]]] = {
    "flash_forward": flash_forward_cases,
    "flash_backward": flash_backward_cases,
    "matmul": matmul_cases,
    "norms": norm_cases,
}


def build_ours(kernel: str, signature: str) -> Built:
    """Our side: the kernel's TPU module from the extension (`tk.emit`)."""
    out = Built()
    try:
        src = rust_lines(kernel)
        if src is not None:
            out.body_lines, out.spec_lines = src.body, src.spec
            out.source_note = f"{src.file}: {kernel}" + (f" + {', '.join(src.helpers)}" if src.helpers else "")
        else:
            out.source_note = f"{kernel} not found under {KERNELS_SRC.relative_to(ROOT)}"
    except Exception as e:
        out.source_note = f"source not counted: {first_line(e)}"
    try:
        import tpu_kernels as tk
    except Exception as e:
        out.error = f"tpu_kernels cannot be imported: {first_line(e)}"
        return out
    try:
        out.text = tk.emit(kernel, signature, "tpu")
    except Exception as e:
        out.error = f"emit failed: {first_line(e)}"
    return out


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------

@dataclass
class SideRow:
    case: Case
    side: str  # "ours" or "Pallas"
    built: Built
    kernels: list[MosaicKernel] = field(default_factory=list)
    mosaic_error: str = ""
    gens: dict[str, GenResult] = field(default_factory=dict)


def measure_side(compiler: Compiler, case: Case, side: str, built: Built, gens: Sequence[str], repeats: int, vmem: bool = True) -> SideRow:
    row = SideRow(case, side, built)
    if built.text is None:
        return row
    try:
        for call in custom_calls(built.text):
            row.kernels += parse_mosaic(call.config, call.operands)
        if not row.kernels:
            row.mosaic_error = "no tpu_custom_call with a Mosaic kernel in the module"
    except Exception as e:  # a body jaxlib cannot parse: counted as not available
        row.mosaic_error = f"Mosaic body not parsed: {first_line(e)}"
    for gen in gens:
        log(f"  {side} {case.label} on {gen}")
        row.gens[gen] = measure(compiler, built.text, gen, repeats, vmem)
    return row


def run_cases(compiler: Compiler, cases: Sequence[Case], gens: Sequence[str], repeats: int, vmem: bool = True) -> list[SideRow]:
    rows = []
    for case in cases:
        log(f"{case.family}: {case.label}")
        if case.ours is not None:
            rows.append(measure_side(compiler, case, "ours", build_ours(*case.ours), gens, repeats, vmem))
        if case.pallas is not None:
            rows.append(measure_side(compiler, case, "Pallas", case.pallas(), gens, repeats, vmem))
    return rows


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------

def fmt_bytes(n: int | float | None) -> str:
    if n is None:
        return "—"
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}" if v >= 10 else f"{v:.2f} {unit}"
    return f"{int(n)} B"


def _si(x: float) -> str:
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.3g}{unit}"
    return f"{x:.3g}"


def _dims(xs: Sequence[int]) -> str:
    return "x".join(map(str, xs))


def _runs(items: list[str]) -> str:
    """Consecutive repeats as "a ×3"."""
    out: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j < len(items) and items[j] == items[i]:
            j += 1
        out.append(items[i] + (f" ×{j - i}" if j - i > 1 else ""))
        i = j
    return ", ".join(out)


def blocks_cell(k: MosaicKernel) -> str:
    ins = _runs([_dims(w) for w in k.windows[: k.inputs]])
    outs = _runs([_dims(w) for w in k.windows[k.inputs :]])
    grid = f"({', '.join(map(str, k.grid))})" if k.grid else "none"
    cell = f"grid {grid}; in {ins or '—'} → out {outs or '—'}"
    if k.scratch:
        cell += f"; scratch {_runs(k.scratch)}"
    return cell


def _per_gen(row: SideRow, gens: Sequence[str], fn: Callable[[GenResult], str]) -> str:
    """`fn`'s value per generation, joined with " / " (the header names the order)."""
    return " / ".join(fn(row.gens[g]) if g in row.gens else "—" for g in gens)


def _per_gen_compound(row: SideRow, gens: Sequence[str], fn: Callable[[GenResult], str]) -> str:
    """A cell of several values: one when every generation agrees, else "v5e: ...; v6e: ..."."""
    values = [fn(row.gens[g]) if g in row.gens else "—" for g in gens]
    if len(set(values)) == 1:
        return values[0]
    return "; ".join(f"{g}: {v}" for g, v in zip(gens, values))


def _vmem(r: GenResult) -> str:
    if r.error:
        return "—"
    if r.vmem_min is None:
        return r.vmem_note or "not measured"
    return ("≤ " if r.vmem_note == "at most" else "") + fmt_bytes(r.vmem_min)


def _cost(r: GenResult) -> str:
    if r.error:
        return "—"
    c = r.cost
    flops = _si(c["flops"]) if "flops" in c else "n/r"
    trans = _si(c["transcendentals"]) if "transcendentals" in c else "n/r"
    if "bytes accessed" in c:
        nbytes = fmt_bytes(c["bytes accessed"])
    else:
        parts = [v for k, v in c.items() if k.startswith("bytes accessed")]
        nbytes = f"{fmt_bytes(sum(parts))}*" if parts else "n/r"
    return f"{flops} / {trans} / {nbytes}"


def _memory(r: GenResult) -> str:
    if r.error or not r.memory:
        return "—" if r.error else "n/r"
    m = r.memory
    shown = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "generated_code_size_in_bytes")
    return " / ".join(fmt_bytes(m.get(f)) for f in shown)


def _outside(r: GenResult) -> str:
    if r.error:
        return "—"
    if r.outside is None:
        return "n/r"
    return ", ".join(f"{op} ×{n}" if n > 1 else op for op, n in sorted(r.outside.items())) or "none"


def _compile(r: GenResult) -> str:
    return f"FAIL: {r.error}" if r.error else f"ok {r.compile_ms:.0f}"


def table_rows(rows: Sequence[SideRow], gens: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    header = [
        "case",
        "side",
        "kernel(s)",
        f"compile, ms ({' / '.join(gens)})",
        "grid; blocks; scratch",
        f"min scoped VMEM ({' / '.join(gens)})",
        "E1001 size",
        "cost: flops / transc. / bytes",
        "exe: arg / out / temp / code",
        "XLA ops besides the kernel",
        "Mosaic ops",
        *[c for c, _ in KEY_OPS],
        "src lines body + spec",
    ]
    out = []
    for row in rows:
        b = row.built
        if b.text is None:
            kernels = "—"
            compile_cell = f"FAIL: {b.error}"
        else:
            kernels = ", ".join(k.name for k in row.kernels) or row.mosaic_error or "—"
            compile_cell = _per_gen(row, gens, _compile)
        blocks = "; ".join(blocks_cell(k) if len(row.kernels) == 1 else f"{k.name}: {blocks_cell(k)}" for k in row.kernels) or "—"
        ops: Counter[str] = Counter()
        for k in row.kernels:
            ops.update(k.ops)
        key = [str(sum(ops[n] for n in names)) if row.kernels else "—" for _, names in KEY_OPS]
        e1001 = _per_gen(row, gens, lambda r: fmt_bytes(r.e1001_size) if r.e1001_size else "—") if row.gens else "—"
        src = f"{b.body_lines} + {b.spec_lines}" if b.body_lines is not None else "—"
        out.append(
            [
                f"{row.case.label}: {row.case.shape}",
                row.side,
                kernels,
                compile_cell,
                blocks,
                _per_gen(row, gens, _vmem) if row.gens else "—",
                e1001,
                _per_gen_compound(row, gens, _cost) if row.gens else "—",
                _per_gen_compound(row, gens, _memory) if row.gens else "—",
                _per_gen_compound(row, gens, _outside) if row.gens else "—",
                str(sum(ops.values())) if row.kernels else "—",
                *key,
                src,
            ]
        )
    return header, out


def _cell(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    num = re.compile(r"^(-?\d|—$|≤)")
    align = ["l"] + ["r" if all(num.match(str(r[i])) for r in rows) and rows else "l" for i in range(1, len(header))]
    out = ["| " + " | ".join(map(_cell, header)) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return out


def methods(gens: Sequence[str], repeats: int) -> list[str]:
    versions = []
    for dist in ("jax", "jaxlib", "libtpu"):
        try:
            import importlib.metadata as md

            versions.append(f"{dist} {md.version(dist)}")
        except Exception:
            pass
    return [
        "## Pallas vs ours: libtpu compile of the same jobs",
        "",
        "jax's own Pallas TPU kernels (`jax.experimental.pallas.ops.tpu`, exported with "
        "`jax.export(..., platforms=['tpu'])`) and this project's tiled kernels (`tpu_kernels.emit(kernel, "
        f"signature, 'tpu')`) compiled by libtpu compile-only for {' and '.join(gens)} (1x1 topologies, no TPU; "
        f"{', '.join(versions)}), each module as a whole (the kernel's custom call and whatever XLA ops the "
        f"module has around it). Cells with a generation list in their header give one value per generation "
        f"({' / '.join(gens)}); the cost, exe and XLA-ops cells give one value where the generations agree, "
        f"else one per generation. **compile**: ok and the median of {repeats} compiles of the module as "
        "emitted (ms; parsing excluded, one uncounted warm-up compile per generation), or the first line of "
        "the error. **grid; blocks**: the Mosaic kernel's `iteration_bounds` and its windows' `window_bounds` "
        "(inputs → outputs), then its scratch buffers. **min scoped VMEM**: the smallest "
        "`scoped_memory_configs` limit (VMEM, memory space 1, written into every kernel's backend_config as "
        f"our wrapper writes `vmem_limit_bytes`) at which libtpu compiles the module, bisected to "
        f"{VMEM_STEP // 1024} KiB and guided by E1001's sizes (libtpu's defaults: 16 MiB v5e, 32 MiB v6e); for "
        "a module with two kernels it is the larger need. **E1001 size**: the size libtpu's "
        "`CompileTimeScopedVmemOom` names at the largest refused limit (the allocation that did not fit; at "
        "small limits it names a partial one). **cost**: the compiled executable's `cost_analysis()`. libtpu "
        "does not analyse a Mosaic kernel: a custom call counts only the `cost_estimate` its backend_config "
        "declares (Pallas's flash forward declares one; n/r: nothing reported), so the flops, transcendentals "
        "and bytes are that estimate plus XLA's count for the module's other ops (the next column); bytes "
        "marked * are, when no total is reported, the sum of libtpu's per-operand `bytes accessed` (the "
        "operand and result sizes). **exe**: `get_compiled_memory_stats()` argument / output / temp / "
        "generated code sizes. **XLA ops besides the kernel**: the opcodes of the compiled entry computation "
        "other than the custom calls, bitcasts, tuples and parameters (a `reduce` there is XLA relaying out "
        "a kernel result; a `fusion`, other work). **Mosaic ops**: ops in the kernel function's body (nested "
        "ones included; index maps not counted), parsed with jaxlib's TPU dialect after "
        "`mosaic-serde{serialize=false}`, the same way for both sides; vld/vst are vector loads/stores "
        "(`vector.load`, `tpu.load`; `tpu.vector_store`, `vector.store`, `tpu.store`). **src lines**: "
        "non-blank, non-comment lines (docstrings excluded); body = the kernel function(s) and the helpers "
        "they call (Pallas: the Python functions given to `pallas_call`, via `inspect.getsource`; ours: the "
        "Rust `fn` and the same file's fns it calls), spec = what sets up grid and blocks (Pallas: the "
        "function(s) building the `pallas_call`; ours: the `#[tpu_kernel(...)]` attribute).",
        "",
    ]


def family_section(family: str, rows: Sequence[SideRow], gens: Sequence[str]) -> list[str]:
    header, trs = table_rows(rows, gens)
    L = [f"### {family}", "", *md_table(header, trs), ""]
    notes = []
    for row in rows:
        if row.case.note and row.case.note not in notes:
            notes.append(row.case.note)
    for row in rows:
        if row.built.source_note:
            notes.append(f"{row.side} source counted: {row.built.source_note}")
        if row.mosaic_error and row.built.text is not None:
            notes.append(f"{row.side} {row.case.label}: {row.mosaic_error}")
    if family == "flash attention forward":
        notes.append(
            "Pallas's public `flash_attention` writes `out` only; ours writes `out` and `logsumexp` "
            "(`[B,H,L]` f32, as aten's flash op returns it). Block sizes: Pallas's default BlockSizes (128), ours 128."
        )
    if family == "flash attention backward":
        notes.append(
            "Pallas: the custom_vjp backward rule (`di = rowsum(out * grad_out)` in XLA, then its dkv and dq "
            "kernels), exported from the residuals the forward saves (out, row sum l and row max m, each "
            "`[B,H,L]`); ours takes `logsumexp` and computes `delta` in the kernel."
        )
    L += [f"- {n}" for n in dict.fromkeys(notes)]
    return [*L, ""] if notes else L


def section(
    generations: Sequence[str] = GENERATIONS,
    families: Sequence[str] | None = None,
    repeats: int = 3,
    ours_only: Sequence[tuple[str, str]] = OURS_ONLY,
    vmem: bool = True,
) -> list[str]:
    """The Markdown section (lines): a methods paragraph and one table per family. `families`:
    keys of :data:`FAMILIES` (default all), plus "ours_only" for `ours_only`'s rows."""
    families = list(FAMILIES) + ["ours_only"] if families is None else list(families)
    start = time.perf_counter()
    try:
        compiler = Compiler(generations)
    except Exception as e:
        return [*methods(generations, repeats), f"**Not run**: libtpu's compile-only client is unavailable: {first_line(e)}", ""]
    L = methods(generations, repeats)
    for fam in families:
        cases = ours_only_cases(ours_only) if fam == "ours_only" else FAMILIES[fam]()
        if not cases:
            continue
        rows = run_cases(compiler, cases, generations, repeats, vmem)
        L += family_section(cases[0].family if fam != "ours_only" else "ours only (no Pallas TPU counterpart)", rows, generations)
    L.append(f"Run time {time.perf_counter() - start:.0f} s, {compiler.compiles} libtpu compiles.")
    L.append("")
    return L


def main(argv: list[str] | None = None) -> int:
    # No TPU here: jax's own backend is the CPU (libtpu is reached compile-only).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="write the section here (default: stdout)")
    p.add_argument("--generations", default=",".join(GENERATIONS), help="comma-separated (default v5e,v6e)")
    p.add_argument("--families", help=f"comma-separated, of {','.join([*FAMILIES, 'ours_only'])} (default: all)")
    p.add_argument("--repeats", type=int, default=3, help="compiles timed per module and generation (default 3)")
    p.add_argument("--no-vmem", action="store_true", help="skip the scoped VMEM bisection")
    args = p.parse_args(argv)
    gens = [g.strip() for g in args.generations.split(",") if g.strip()]
    families = None
    if args.families:
        families = [f.strip() for f in args.families.split(",") if f.strip()]
        if unknown := set(families) - {*FAMILIES, "ours_only"}:
            p.error(f"unknown famil(ies) {', '.join(sorted(unknown))}; known: {', '.join([*FAMILIES, 'ours_only'])}")
    text = "\n".join(section(gens, families, args.repeats, vmem=not args.no_vmem)).rstrip() + "\n"
    if args.out:
        args.out.write_text(text)
        log(f"wrote {args.out}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
