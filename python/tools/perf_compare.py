"""Before and after in one run: two commits built side by side, one benchmark run on each in turn.

One invocation builds both commits, then runs the same benchmark script on each, alternately, so
drift on a noisy machine hits both alike.

    eval "$(scripts/dev env)"
    python python/tools/perf_compare.py BEFORE AFTER [--rounds 5] [--work DIR] [-- SCRIPT ARGS]
    python python/tools/perf_compare.py 0e2daf4 HEAD --dry-run    # the plan, nothing built or run

For each commit: a git worktree (`git worktree add --detach WORK/<sha>/src <sha>`), its own cargo
target directory (`WORK/<sha>/target`), its Python package built as a wheel there (`maturin build
--release`) and installed into `WORK/<sha>/site` (`pip install --no-deps --target`), never into
the venv. A commit already built under WORK is reused (`--rebuild` builds it again). Builds run
one after the other, never two at once.

Then ROUNDS rounds; each runs the script once per commit, in alternating order (A B, then B A,
...), with that commit's package first on PYTHONPATH (checked: `tpu_kernels` must import from
`WORK/<sha>/site`). The script is one file for both commits (default: this checkout's
`python/tools/bench_torch.py`, `--quick` unless SCRIPT ARGS are given), so both are measured by
the same code; its output must have bench_torch.py's form: `N. caption (unit)` headings, then
`label value` lines (`label NOT OURS: reason` for a path whose kernels did not run).

Prints, per measurement, the median over rounds for each commit with min-max, after / before,
and a verdict: "within noise" when the two commits' min-max ranges overlap, else faster or
slower. The eager PyTorch rows run the same PyTorch code for both commits: their after / before
is the run's drift, the yardstick for the other rows.

bench_torch.py checks each timed path with `tpu_kernels.testing.no_fallbacks`; a commit whose
package predates it shows those paths as NOT OURS (not compared). For such a commit, pass a
script that does not need it with `--script`.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SCRIPT = ROOT / "python" / "tools" / "bench_torch.py"
NUM = r"-?\d+(?:\.\d+)?"


def log(msg: str) -> None:
    print(f"[perf_compare] {msg}", file=sys.stderr, flush=True)


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def resolve(rev: str) -> str:
    try:
        return git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"perf_compare: {rev!r} is not a commit of {ROOT}") from None


class Build:
    """One commit's worktree, target directory and installed package, under `work`."""

    def __init__(self, label: str, sha: str, work: Path) -> None:
        self.label, self.sha = label, sha
        self.base = work / sha[:12]
        self.src, self.target, self.wheels, self.site = (self.base / d for d in ("src", "target", "wheels", "site"))
        self.marker = self.site / ".perf_compare-built"

    def steps(self) -> list[tuple[list[str], dict[str, str], Path]]:
        """(command, extra environment, working directory) of each build step."""
        py = sys.executable
        return [
            (["git", "worktree", "add", "--detach", str(self.src), self.sha], {}, ROOT),
            (
                ["maturin", "build", "--release", "-i", py, "-m", str(self.src / "pallas_bridge" / "Cargo.toml"),
                 "--target-dir", str(self.target), "--out", str(self.wheels)],
                {"CARGO_TARGET_DIR": str(self.target)},
                self.src,
            ),
            ([py, "-m", "pip", "install", "--no-deps", "--upgrade", "--target", str(self.site), f"{self.wheels}/*.whl"], {}, self.src),
        ]

    def env(self) -> dict[str, str]:
        path = os.environ.get("PYTHONPATH", "")
        return {**os.environ, "PYTHONPATH": str(self.site) + (os.pathsep + path if path else ""), "NO_COLOR": "1"}

    def build(self, rebuild: bool) -> None:
        if self.marker.exists() and not rebuild:
            log(f"{self.label} {self.sha[:12]}: built already ({self.site})")
            return
        for cmd, extra, cwd in self.steps():
            if cmd[:3] == ["git", "worktree", "add"] and self.src.exists():
                continue
            if "--target" in cmd:  # pip: the wheel's name is only known now
                wheels = sorted(self.wheels.glob("*.whl"), key=lambda p: p.stat().st_mtime)
                if not wheels:
                    raise SystemExit(f"perf_compare: no wheel in {self.wheels}")
                cmd = [*cmd[:-1], str(wheels[-1])]
            log(f"{self.label} {self.sha[:12]}: {shlex.join(cmd)}")
            subprocess.run(cmd, cwd=cwd, env={**os.environ, **extra}, check=True)
        self.marker.write_text(self.sha + "\n")

    def check_import(self) -> None:
        where = subprocess.run(
            [sys.executable, "-c", "import tpu_kernels; print(tpu_kernels.__file__)"],
            env=self.env(), capture_output=True, text=True, check=True,
        ).stdout.strip()
        if not Path(where).resolve().is_relative_to(self.site.resolve()):
            raise SystemExit(f"perf_compare: {self.label} imports tpu_kernels from {where}, not from {self.site}")


def parse(out: str) -> dict[str, float | None]:
    """bench_torch.py-style output: `section: label` -> value (None: NOT OURS)."""
    values: dict[str, float | None] = {}
    caption = ""
    for line in out.splitlines():
        head = re.match(r"^\d+\.\s+(.*)$", line)
        if head:
            caption = head.group(1).strip()
            continue
        if not caption or re.match(r"^\s+(=>|cited)", line):
            continue
        bad = re.match(r"^\s+(.*?)\s+NOT OURS:", line)
        if bad:
            values[f"{caption}: {bad.group(1).strip()}"] = None
            continue
        m = re.match(rf"^\s+(.*?)\s+({NUM})\s*$", line)
        if m:
            values[f"{caption}: {m.group(1).strip()}"] = float(m.group(2))
    return values


def order(rounds: int) -> list[tuple[int, int]]:
    """(round, commit index) in the order run: A B, B A, A B, ..."""
    return [(r, i if r % 2 == 0 else 1 - i) for r in range(rounds) for i in (0, 1)]


def compare(samples: list[dict[str, list[float | None]]], labels: tuple[str, str]) -> list[str]:
    """The table: per measurement, each commit's median (min-max) over rounds, after / before,
    and the verdict."""
    keys = list(dict.fromkeys([*samples[0], *samples[1]]))
    rows = [f"{'measurement':<72} {labels[0]:>20} {labels[1]:>20} {'after/before':>12}  verdict"]
    for k in keys:
        a, b = ([v for v in s.get(k, []) if v is not None] for s in samples)
        missing = [lab for lab, s in zip(labels, samples, strict=True) if None in s.get(k, [None])]
        if missing or not a or not b:
            rows.append(f"{k:<72} {'':>20} {'':>20} {'':>12}  not compared: not measured (or NOT OURS) for {', '.join(missing)}")
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        overlap = min(b) <= max(a) and min(a) <= max(b)
        ratio = mb / ma if ma else float("nan")
        v = "within noise (ranges overlap)" if overlap else ("lower" if mb < ma else "higher") + " (ranges apart)"
        if k.split(": ")[-1].startswith("eager"):
            v += "; control: same PyTorch code in both"
        cell = lambda m, xs: f"{m:.2f} ({min(xs):.2f}-{max(xs):.2f})"  # noqa: E731
        rows.append(f"{k:<72} {cell(ma, a):>20} {cell(mb, b):>20} {ratio:>11.2f}x  {v}")
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    script_args = argv[argv.index("--") + 1 :] if "--" in argv else None
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", help="the commit before the change (any revision git knows)")
    p.add_argument("after", help="the commit after the change")
    p.add_argument("--rounds", type=int, default=5, help="rounds, each running the script once per commit (default 5)")
    p.add_argument("--work", type=Path, default=ROOT / "target" / "perf-compare",
                   help="where the worktrees, target directories and packages go (default target/perf-compare)")
    p.add_argument("--script", type=Path, default=DEFAULT_SCRIPT, help="the benchmark script (default bench_torch.py)")
    p.add_argument("--rebuild", action="store_true", help="build a commit again even if WORK has it")
    p.add_argument("--timeout", type=float, default=900, help="seconds per script run (default 900)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (builds, then runs), build and run nothing")
    args = p.parse_args(own)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    script = args.script.resolve()
    if not script.is_file():
        p.error(f"--script {args.script} is not a file")
    if script_args is None:
        script_args = ["--quick"] if script == DEFAULT_SCRIPT else []
    shas = resolve(args.before), resolve(args.after)
    if shas[0] == shas[1]:
        p.error(f"{args.before} and {args.after} are the same commit {shas[0][:12]}")
    work = args.work.resolve()
    builds = [Build(label, sha, work) for label, sha in zip(("before", "after"), shas, strict=True)]
    run_cmd = [sys.executable, str(script), *script_args]

    if args.dry_run:
        for b in builds:
            print(f"{b.label}: {b.sha} ({'built already' if b.marker.exists() else 'to build'} under {b.base})")
            for cmd, extra, cwd in b.steps():
                env = " ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items())
                print(f"  (cd {shlex.quote(str(cwd))} && {env + ' ' if env else ''}{shlex.join(cmd)})")
        for r, i in order(args.rounds):
            b = builds[i]
            print(f"round {r + 1}: {b.label}: PYTHONPATH={b.site} {shlex.join(run_cmd)}")
        return 0

    for b in builds:  # one build at a time
        b.build(args.rebuild)
        b.check_import()
    samples: list[dict[str, list[float | None]]] = [{}, {}]
    for r, i in order(args.rounds):
        b = builds[i]
        log(f"round {r + 1}/{args.rounds}: {b.label} {b.sha[:12]}")
        p_ = subprocess.run(run_cmd, cwd=ROOT, env=builds[i].env(), capture_output=True, text=True, timeout=args.timeout)
        if p_.returncode not in (0, 1):  # 1: bench_torch.py's "a path was NOT OURS", still parsed
            raise SystemExit(f"perf_compare: {shlex.join(run_cmd)} exited {p_.returncode} for {b.label}:\n{p_.stderr[-2000:]}")
        for k, v in parse(p_.stdout).items():
            samples[i].setdefault(k, []).append(v)
    print(f"before {shas[0][:12]} ({args.before}), after {shas[1][:12]} ({args.after}): {args.rounds} rounds, "
          f"alternating, in one run of {shlex.join(['python', os.path.relpath(script, ROOT), *script_args])}")
    print("\n".join(compare(samples, (f"before {shas[0][:7]}", f"after {shas[1][:7]}"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
