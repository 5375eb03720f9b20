"""Listeners told when the process's kernel registry changed from Python (a kernel registered
by `register_jax` / `jax_kernel` / `load_library`, or removed by `unregister`), once the change
is complete (its new op, if any, defined in torch). The "tpu" device binds the ops of new
kernels at its dispatch key this way, so they serve the device from the next call."""

from __future__ import annotations

from typing import Callable

_listeners: list[Callable[[], None]] = []


def on_registry_change(listener: Callable[[], None]) -> None:
    _listeners.append(listener)


def registry_changed() -> None:
    for listener in list(_listeners):
        listener()
