"""Access to the extension's `torch_bridge` submodule."""

from __future__ import annotations

import functools


@functools.cache
def native():
    from tpu_kernels import _native

    return _native.torch_bridge
