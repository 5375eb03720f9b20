"""`tpu_kernels.report()`: what ran where.

Merges the native counters (per-op eager calls, substitutions, fallbacks with reasons, kernels,
time in kernels, compile-cache hits, graph programs) with the Python-side ones (fallbacks
decided before reaching the native side, fused flushes, `torch.compile` partitions and the
nodes left to PyTorch).
"""

from __future__ import annotations

import sys
import threading
from collections import defaultdict
from dataclasses import dataclass, field

from ._native import native


@dataclass
class _Local:
    lock: threading.Lock = field(default_factory=threading.Lock)
    # op -> category -> count, op -> (clock tick, last message) (fallbacks decided in Python).
    fallbacks: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    last: dict = field(default_factory=dict)
    fused_flushes: int = 0
    fused_ops: int = 0
    fused_native_ops: int = 0
    fused_reasons: dict = field(default_factory=lambda: defaultdict(int))
    compiled_graphs: list = field(default_factory=list)
    # Runs of compiled graphs' programs through the backend, the seconds they took from the
    # backend's entry to its return (the program's run, argument and output handling), and the
    # part of those the program's run took (`graphs["run_time_s"]` counts every graph program's
    # runs, fused mode's included).
    graph_calls: int = 0
    graph_call_time_s: float = 0.0
    graph_run_time_s: float = 0.0
    eager_nodes: dict = field(default_factory=lambda: defaultdict(int))
    eager_reasons: dict = field(default_factory=dict)
    # Sharded steps compiled (`distributed.compile_step`): name, devices, collectives, kernels.
    sharded_steps: list = field(default_factory=list)


LOCAL = _Local()
# The trace cache's counters before fused mode was first used.
_NO_TRACES = {
    "hits": 0,
    "misses": 0,
    "miss_reasons": {},
    "last_miss": "",
    "entries": 0,
    "evicted": 0,
    "last_eviction": "",
    "lifted": [],
    "kept_constant": [],
    "output_type_runs": 0,
    "scalar_reads_replayed": 0,
    "scalar_read_ops_replayed": 0,
}

# Why something ran in PyTorch instead of a kernel or a program, in two classes.
#
# Declined: no kernel takes the call (its dtype, shape, device, layout or a static value is
# outside every kernel's guards, the kernel body refused the case (`unsupported`), or the op's
# binding was refused; a fused program replayed because a recorded node is one no kernel takes
# and no default lowering covers: `unlowerable`; a native fused trace whose shapes keep changing
# replayed rather than compile past the recompile limit: `recompile_limit`). Expected; counted.
DECLINED = frozenset({"no_kernel", "unsupported", "bad_input", "schema_refused", "unlowerable", "recompile_limit"})
# Errors: a kernel or this package's own code failed. `build`, `compile`, `execute`: a kernel
# selected for the call could not be built, compiled or run. `internal`: an exception in the
# binding code. `replay`: a fused program or a compiled graph could not run and its ops ran in
# PyTorch. `lower`: a graph could not be lowered for a reason that names no node. Counted, and
# raised under the "raise" error policy (`tpu_kernels.set_error_policy`).
ERRORS = frozenset({"build", "compile", "execute", "internal", "replay", "lower"})


def record_fallback(op: str, category: str, message: str) -> None:
    """Counts a fallback decided on the Python side; an error-class one raises `InternalError`
    under the "raise" policy (after it is counted)."""
    # Ticked on the registry's clock, so `report()` shows whichever record is the latest.
    seq = native().next_fallback_seq()
    with LOCAL.lock:
        LOCAL.fallbacks[op][category] += 1
        LOCAL.last[op] = (seq, message)
    if category in ERRORS:
        raise_if_policy(message)


def raise_if_policy(message: str) -> None:
    """Raises `InternalError(message)` under the "raise" error policy; for failures already
    counted elsewhere (by the native dispatcher)."""
    if native().raise_errors():
        from ..errors import InternalError

        raise InternalError(message)


def record_fused_flush(n_ops: int, reason: str, native_ops: int = 0) -> None:
    """A fused program's flush: `n_ops` recorded ops, `native_ops` of them by the native
    handler."""
    with LOCAL.lock:
        LOCAL.fused_flushes += 1
        LOCAL.fused_ops += n_ops
        LOCAL.fused_native_ops += native_ops
        LOCAL.fused_reasons[reason] += 1


def record_graph_call(seconds: float, run_seconds: float) -> None:
    """A compiled graph's call: its time in the backend, and the part its program's run took."""
    with LOCAL.lock:
        LOCAL.graph_calls += 1
        LOCAL.graph_call_time_s += seconds
        LOCAL.graph_run_time_s += run_seconds


def record_graph(name: str, kernels: list[str], n_nodes: int, eager: dict[str, str]) -> None:
    with LOCAL.lock:
        LOCAL.compiled_graphs.append({"name": name, "kernels": list(kernels), "nodes": n_nodes})
        for op, why in eager.items():
            LOCAL.eager_nodes[op] += 1
            LOCAL.eager_reasons[op] = why


def record_sharded_step(
    name: str, devices: int, collectives: dict, kernels: list[str], per_shard: list[str], notes: list[str]
) -> None:
    with LOCAL.lock:
        LOCAL.sharded_steps.append({
            "name": name,
            "devices": devices,
            "collectives": dict(collectives),
            "kernels": list(kernels),
            "per_shard": list(per_shard),
            "notes": list(notes),
        })


@dataclass
class Report:
    """A snapshot of the counters; `str()` renders a table.

    Fallback categories fall in two classes: :data:`DECLINED` (no kernel takes the call) and
    :data:`ERRORS` (a kernel or this package failed; the op, program or graph ran in PyTorch).
    Fused programs record theirs under the op ``"fused"``, compiled graphs under
    ``"graph:NAME"``."""

    ops: dict
    kernel_time_s: float
    prepare_time_s: float
    cache: dict
    graphs: dict
    fused: dict
    compiled: dict
    # The "tpu" device's counters once `tpu_kernels.device` is imported (else None): its PJRT
    # platform, its allocator (`memory`), and the calls that ran in its CPU fallback, by op
    # (`fallbacks`; ops no kernel binds run there as planned, so they are not counted as
    # fallbacks of `ops`). Declines of bound ops are merged into `ops` like any other.
    device: dict | None = None
    # How long torch's OpenMP workers spin after each parallel op (see tpu_kernels._openmp):
    # `spin` is "shortened", "user", "kept" or "default", `detail` says it in words.
    openmp: dict | None = None
    # Sharded steps (`tpu_kernels.torch.distributed`): `steps` compiled, each with its devices,
    # the collectives XLA's partitioner inserted and the kernels inlined; `runs` and `run_time_s`
    # of their programs (the run on every device, shards uploaded, outputs back).
    sharded: dict | None = None
    # Where the shared PJRT CPU client runs a program: "calling thread" (the default) or
    # "worker thread" (`TPUK_CPU_ASYNC=1`, the plugin's own default).
    cpu_execution: str = "calling thread"
    # How the C allocator serves large blocks (programs' temporaries, PyTorch's CPU tensors):
    # `policy` is "retained" (tpu_kernels raised glibc's mmap and trim thresholds), "user" (the
    # user set them), "kept" (`TPUK_MALLOC=keep`), "unsupported", or "pending" before the first
    # CPU client; `detail` says it in words.
    malloc: dict | None = None
    # XLA options the shared PJRT CPU client compiles every program with, beyond the process's
    # `XLA_FLAGS`: `xla_cpu_prefer_vector_width=512` on a host with AVX-512 (XLA's default is
    # 256), unless `XLA_FLAGS` names that flag.
    cpu_compile_options: dict = field(default_factory=dict)

    def substituted(self, op: str | None = None) -> int:
        if op is None:
            return sum(o["substituted"] for o in self.ops.values())
        return self.ops.get(op, {}).get("substituted", 0)

    def fallbacks(self, op: str | None = None, category: str | None = None) -> int:
        """Fallbacks of `op` (every op, fused programs and compiled graphs when None), of
        `category` (every category when None)."""
        items = self.ops.values() if op is None else [self.ops.get(op, {"fallbacks": {}})]
        return sum(n for o in items for c, n in o["fallbacks"].items() if category is None or c == category)

    def errors(self) -> int:
        """Fallbacks caused by a failure of a kernel or of tpu_kernels' code (:data:`ERRORS`)."""
        return sum(n for o in self.ops.values() for c, n in o["fallbacks"].items() if c in ERRORS)

    def declined(self) -> int:
        """Fallbacks of calls no kernel takes (:data:`DECLINED`)."""
        return sum(n for o in self.ops.values() for c, n in o["fallbacks"].items() if c not in ERRORS)

    def kernels_ran(self) -> dict[str, int]:
        """How many times each kernel ran: eager calls, plus one per inlined call in each run of
        a graph program (fused or compiled). Counted when they run, not when they are lowered."""
        out: dict[str, int] = defaultdict(int)
        for o in self.ops.values():
            for k, n in o["kernels"].items():
                out[k] += n
        for k, n in self.graphs.get("kernels_run", {}).items():
            out[k] += n
        return dict(out)

    def __str__(self) -> str:
        lines = ["tpu_kernels report", "eager ops (calls / substituted / fallbacks):"]
        for op, o in sorted(self.ops.items()):
            fb = ", ".join(f"{k}={v}" for k, v in sorted(o["fallbacks"].items())) or "-"
            ks = ", ".join(f"{k}x{v}" for k, v in sorted(o["kernels"].items())) or "-"
            lines.append(f"  {op:<45} {o['calls']:>6} {o['substituted']:>6}  fallbacks: {fb}  kernels: {ks}")
            if o.get("updated_in_place") or o.get("updated_by_copy"):
                lines.append(
                    f"      arguments updated: {o.get('updated_in_place', 0)} in their own memory (donated), "
                    f"{o.get('updated_by_copy', 0)} through a copy"
                )
            if o.get("outputs_pooled") or o.get("outputs_pool_missed"):
                lines.append(
                    f"      outputs written into reused memory from the caching allocator: {o.get('outputs_pooled', 0)}"
                    + (f" ({o['outputs_pool_missed']} written elsewhere)" if o.get("outputs_pool_missed") else "")
                )
            if o.get("last_fallback"):
                lines.append(f"      last fallback: {o['last_fallback'].splitlines()[0][:160]}")
        lines.append(f"time in kernels: {self.kernel_time_s * 1e3:.2f} ms (first-call preparation {self.prepare_time_s * 1e3:.1f} ms)")
        c = self.cache
        lines.append(
            f"compile cache: {c.get('memory_hits', 0)} memory hits, {c.get('disk_hits', 0)} disk hits, "
            f"{c.get('misses', 0)} misses, {c.get('compiles', 0)} compiles ({c.get('compile_time_s', 0.0):.2f} s)"
        )
        if c.get("untrusted"):
            lines.append(
                f"  {c['untrusted']} disk-cache loads refused: the cache directory or an entry is not this "
                "user's alone (owner, or group/other write permission); compiled instead"
            )
        g = self.graphs
        lines.append(
            f"graph programs: {g.get('compiled', 0)} compiled, {g.get('memo_hits', 0)} reused by fingerprint, "
            f"{g.get('runs', 0)} runs ({g.get('run_time_s', 0.0) * 1e3:.2f} ms), {g.get('lower_errors', 0)} lowering errors"
        )
        if g.get("kernels"):
            lines.append("  kernels inlined: " + ", ".join(f"{k}x{v}" for k, v in sorted(g["kernels"].items())))
        if g.get("kernels_run"):
            lines.append("  kernels run in programs: " + ", ".join(f"{k}x{v}" for k, v in sorted(g["kernels_run"].items())))
        d = self.device
        if d is not None:
            m = d["memory"]
            lines.append(
                f"tpu device (PJRT platform {d['platform']}): {m['allocated_bytes']} bytes allocated "
                f"(peak {m['peak_allocated_bytes']}), {m['reserved_bytes']} reserved, {m['cached_bytes']} cached; "
                f"{m['allocs']} allocations, {m['cache_hits']} from the cache"
            )
            r = d.get("recorder") or {}
            if r.get("recorded") or r.get("flushes"):
                reasons = ", ".join(f"{k}={v}" for k, v in sorted(r["reasons"].items())) or "-"
                lines.append(
                    f"  fused mode, native recorder: {r['recorded']} ops recorded, {r['flushes']} flushes "
                    f"(by: {reasons}), {r['programs_run']} programs run; trace cache: {r['hits']} hits, "
                    f"{r['misses']} misses, {r['entries']} programs kept"
                )
                if r["replays"] or r["evictions"] or r["scalar_reads"]:
                    lines.append(
                        f"    {r['replays']} traces replayed in PyTorch ({r['replayed_calls']} calls), "
                        f"{r['evictions']} programs evicted after failing to run, {r['scalar_reads']} scalar reads "
                        "answered by replaying integer ops"
                        + (f"; last eviction: {r['last_eviction'][:160]}" if r["last_eviction"] else "")
                        + (f"; last limit: {r['last_limit'][:160]}" if r["last_limit"] else "")
                    )
                if r["declined"]:
                    # op -> (calls, why the last one was declined)
                    top = sorted(r["declined"].items(), key=lambda kv: -kv[1][0])
                    lines.append(
                        "    calls not recorded (run as in strict mode after a flush): "
                        + ", ".join(f"{op} x{n} ({why[:80]})" for op, (n, why) in top[:8])
                        + (f", ... ({len(top) - 8} more ops)" if len(top) > 8 else "")
                    )
            if d["fallbacks"]:
                top = sorted(d["fallbacks"].items(), key=lambda kv: -kv[1])
                lines.append(
                    f"  {sum(d['fallbacks'].values())} calls ran in the CPU fallback (no kernel binds the op): "
                    + ", ".join(f"{op} x{n}" for op, n in top[:12])
                    + (f", ... ({len(top) - 12} more ops)" if len(top) > 12 else "")
                )
        if self.cpu_execution != "calling thread":
            lines.append(f"PJRT CPU client: programs run on a {self.cpu_execution} (TPUK_CPU_ASYNC=1)")
        if self.cpu_compile_options:
            opts = ", ".join(f"{k}={v}" for k, v in sorted(self.cpu_compile_options.items()))
            lines.append(f"PJRT CPU client: programs compiled with {opts} (XLA_FLAGS naming a flag overrides it)")
        if self.malloc and self.malloc.get("policy") not in ("retained", "pending"):
            lines.append(f"C allocator: {self.malloc['detail']}")
        if self.openmp and self.openmp.get("spin") == "default":
            lines.append(f"OpenMP: {self.openmp['detail']}")
        if self.errors():
            lines.append(f"errors (a kernel or tpu_kernels failed; see the fallbacks above): {self.errors()}")
        f = self.fused
        if f["flushes"]:
            reasons = ", ".join(f"{k}={v}" for k, v in sorted(f["reasons"].items()))
            lines.append(
                f"fused: {f['flushes']} programs run over {f['ops']} recorded ops, {f['native_ops']} of them by the "
                f"native handler (materialised by: {reasons})"
            )
            tc = f["trace_cache"]
            why = ", ".join(f"{k}={v}" for k, v in sorted(tc["miss_reasons"].items()))
            lines.append(
                f"  trace cache: {tc['hits']} hits, {tc['misses']} misses ({why or '-'}), {tc['entries']} programs kept, "
                f"{tc['output_type_runs']} meta-kernel runs for output types, "
                f"{tc['scalar_reads_replayed']} scalar reads replayed ({tc['scalar_read_ops_replayed']} integer or boolean ops)"
                + (f"; last miss: {tc['last_miss'][:160]}" if tc["last_miss"] else "")
            )
            if tc["lifted"]:
                lines.append(f"  float arguments lifted into program inputs: {', '.join(tc['lifted'][:12])}")
            if tc["evicted"]:
                lines.append(f"  {tc['evicted']} programs evicted after failing to run; last: {tc['last_eviction'][:160]}")
        cg = self.compiled
        if cg["graphs"]:
            lines.append(f"torch.compile: {len(cg['graphs'])} graphs lowered")
            if cg["calls"]:
                handling = cg["call_time_s"] - cg["run_time_s"]
                lines.append(
                    f"  {cg['calls']} program calls, {cg['call_time_s'] * 1e3:.2f} ms in the backend: "
                    f"{cg['run_time_s'] * 1e3:.2f} ms running programs (PJRT: inputs viewed, execution, "
                    f"outputs), {handling * 1e3:.2f} ms handling arguments and outputs "
                    f"({handling / cg['calls'] * 1e6:.0f} us a call)"
                )
            for gr in cg["graphs"]:
                lines.append(f"  {gr['name']}: {gr['nodes']} nodes, kernels: {', '.join(gr['kernels']) or '-'}")
            if cg["eager_nodes"]:
                lines.append("  nodes run in PyTorch:")
                for op, n in sorted(cg["eager_nodes"].items()):
                    lines.append(f"    {op} x{n}: {cg['eager_reasons'][op][:160]}")
        sh = self.sharded
        if sh and sh["steps"]:
            lines.append(
                f"sharded steps: {len(sh['steps'])} compiled, {sh['runs']} runs, {sh['run_time_s'] * 1e3:.2f} ms running"
            )
            for st in sh["steps"]:
                coll = ", ".join(f"{k} x{v}" for k, v in sorted(st["collectives"].items())) or "none"
                lines.append(
                    f"  {st['name']}: {st['devices']} devices, collectives: {coll}; kernels: {', '.join(st['kernels']) or '-'}"
                )
                if st["per_shard"]:
                    lines.append(f"    per shard (manually sharded region): {', '.join(st['per_shard'])}")
                for note in st["notes"]:
                    lines.append(f"    {note[:200]}")
        return "\n".join(lines)


def report() -> Report:
    """The counters since the process started."""
    s = native().stats()
    ops = {op: dict(o, fallbacks=dict(o["fallbacks"]), kernels=dict(o["kernels"])) for op, o in s["ops"].items()}
    with LOCAL.lock:
        for op, cats in LOCAL.fallbacks.items():
            o = ops.setdefault(op, {"calls": 0, "substituted": 0, "fallbacks": {}, "last_fallback": None, "kernels": {}})
            for cat, n in cats.items():
                o["fallbacks"][cat] = o["fallbacks"].get(cat, 0) + n
                o["calls"] += n
            seq, message = LOCAL.last.get(op, (0, None))
            if message is not None and seq > o.get("last_fallback_seq", 0):
                o["last_fallback"] = message
        fused = {
            "flushes": LOCAL.fused_flushes,
            "ops": LOCAL.fused_ops,
            # Of the ops, those the native handler recorded (the rest, the Python handler).
            "native_ops": LOCAL.fused_native_ops,
            "reasons": dict(LOCAL.fused_reasons),
        }
    fused_module = sys.modules.get("tpu_kernels.torch.fused")
    fused["trace_cache"] = fused_module.trace_cache_stats() if fused_module is not None else _NO_TRACES
    with LOCAL.lock:
        compiled = {
            "graphs": list(LOCAL.compiled_graphs),
            "calls": LOCAL.graph_calls,
            "call_time_s": LOCAL.graph_call_time_s,
            "run_time_s": LOCAL.graph_run_time_s,
            "eager_nodes": dict(LOCAL.eager_nodes),
            "eager_reasons": dict(LOCAL.eager_reasons),
        }
    device = None
    dev = sys.modules.get("tpu_kernels.device")
    if dev is not None and dev.is_installed():
        from tpu_kernels import _native

        d = _native.device_stats()
        for op, cats in d.pop("declined").items():
            o = ops.setdefault(op, {"calls": 0, "substituted": 0, "fallbacks": {}, "last_fallback": None, "kernels": {}})
            for cat, (n, message, seq) in cats.items():
                o["fallbacks"][cat] = o["fallbacks"].get(cat, 0) + n
                o["calls"] += n
                if seq > o.get("last_fallback_seq", 0):
                    o["last_fallback"] = message
                    o["last_fallback_seq"] = seq
        rec = d["recorder"]
        # Traces of the native recorder that ran on PyTorch's CPU kernels instead of a program,
        # fallbacks of the fused mode as the Python recorder's replays are: a program that failed
        # (`replay`), and misses of a trace whose shapes keep changing, past the recompile limit
        # (`recompile_limit`).
        for category, count, why in (
            ("replay", rec["replays"], rec["last_eviction"]),
            ("recompile_limit", rec["limit_replays"], rec["last_limit"]),
        ):
            if not count:
                continue
            o = ops.setdefault(
                "tpu_fused_native", {"calls": 0, "substituted": 0, "fallbacks": {}, "last_fallback": None, "kernels": {}}
            )
            o["fallbacks"][category] = o["fallbacks"].get(category, 0) + count
            o["calls"] += count
            o["last_fallback"] = f"native fused trace replayed on PyTorch: {why[:300]}"
        device = dict(d, platform=dev.platform())
    from tpu_kernels import _openmp

    runs, nanos = native().sharded_stats()
    with LOCAL.lock:
        sharded = {"steps": list(LOCAL.sharded_steps), "runs": runs, "run_time_s": nanos / 1e9}
    return Report(
        sharded=sharded,
        cpu_execution=s["cpu_execution"],
        malloc=dict(s["cpu_malloc"]),
        cpu_compile_options=dict(s["cpu_compile_options"]),
        openmp=_openmp.state(),
        device=device,
        ops=ops,
        kernel_time_s=s["kernel_time_s"],
        prepare_time_s=s["prepare_time_s"],
        cache=dict(s["cache"]),
        graphs=dict(s["graphs"]),
        fused=fused,
        compiled=compiled,
    )
