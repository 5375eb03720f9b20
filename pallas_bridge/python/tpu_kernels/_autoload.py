"""The "tpu" device at ``import torch``: PyTorch's device-backend autoloading calls :func:`load`
through this package's ``torch.backends`` entry point, so ``model.to("tpu")`` needs no import of
tpu_kernels. Loading the device then also comes before any backward pass, which it must: the
autograd engine sizes its device queues once, at the first backward.

``TPUK_DEVICE=0`` (or PyTorch's ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) turns it off; ``import
tpu_kernels.device`` then registers the device later."""

from __future__ import annotations

import os
import warnings


def load() -> None:
    if os.environ.get("TPUK_DEVICE", "1") == "0":
        return
    try:
        from . import device  # noqa: F401  (registers the device)
    except Exception as e:
        # A TPU the user required is missing: `import torch` fails with the reason. Anything
        # else (the shim not built, or built for another torch or runtime) must not break
        # torch: it stays usable, with a warning that says why the device is not there.
        if os.environ.get("TPUK_REQUIRE_TPU") == "1":
            raise
        warnings.warn(f"the tpu device is not available: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)
