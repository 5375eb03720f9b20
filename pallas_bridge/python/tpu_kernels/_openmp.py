"""PyTorch's OpenMP workers and XLA:CPU's threads on the same cores.

After each parallel ATen op, the workers of the OpenMP runtime torch bundles (libgomp) spin,
waiting for the next op, before they sleep: with neither ``OMP_WAIT_POLICY`` nor
``GOMP_SPINCOUNT`` set, 300000 rounds, which last milliseconds. A kernel that runs right after
such an op finds its cores taken: XLA:CPU's threads share them with the spinning workers. On the
2-core machine of docs/perf-log.md, ``silu`` on f32[1024, 4096] took 1.56-1.60 ms alone and
3.08-3.27 ms right after an eager op; with the spin cut to :data:`SPIN_COUNT` rounds, 1.65-1.79
ms, and torch's own ops took the time they took before (a chain of mid-size ops: 4.28 ms either
way).

libgomp reads its settings once, when it is loaded, which is when torch is imported. So
``import tpu_kernels`` before torch sets ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT`, unless the
user set ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` (theirs is kept) or ``TPUK_KEEP_OPENMP_SPIN=1``.
Imported after torch, it changes nothing; :func:`state` (and ``report()``) says which applies.
"""

from __future__ import annotations

import os
import sys

from ._native import OPENMP_SPIN_COUNT

#: The spin ``import tpu_kernels`` gives torch's OpenMP workers (libgomp's rounds).
SPIN_COUNT = str(OPENMP_SPIN_COUNT)

_state: dict[str, str] = {}


def _libgomp_loaded() -> bool:
    """Whether an OpenMP runtime is already mapped into the process (it has read its settings)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return any("libgomp" in line or "libiomp" in line for line in maps)
    except OSError:
        return "torch" in sys.modules


def configure() -> dict[str, str]:
    """Shortens the OpenMP workers' spin if it is still possible and the user has no say on it
    (see the module documentation); idempotent. Returns :func:`state`."""
    if _state:
        return _state
    user = {k: os.environ[k] for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY") if k in os.environ}
    if user:
        setting = ", ".join(f"{k}={v}" for k, v in sorted(user.items()))
        _state.update(spin="user", detail=f"set by the user ({setting})")
    elif os.environ.get("TPUK_KEEP_OPENMP_SPIN") == "1":
        _state.update(spin="kept", detail="left at libgomp's default (TPUK_KEEP_OPENMP_SPIN=1)")
    elif _libgomp_loaded():
        _state.update(
            spin="default",
            detail=(
                "libgomp's default: torch was imported before tpu_kernels, so its OpenMP workers "
                "spin after each parallel op and share the cores of kernels that follow; import "
                f"tpu_kernels first, or set GOMP_SPINCOUNT={SPIN_COUNT} before starting Python"
            ),
        )
    else:
        os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
        _state.update(spin="shortened", detail=f"GOMP_SPINCOUNT={SPIN_COUNT}, set by tpu_kernels before torch loaded")
    return _state


def state() -> dict[str, str]:
    """How long torch's OpenMP workers spin: ``spin`` is ``shortened`` (by tpu_kernels),
    ``user`` (the user's setting), ``kept`` (``TPUK_KEEP_OPENMP_SPIN=1``) or ``default`` (torch
    was imported first); ``detail`` says it in words."""
    return dict(configure())
