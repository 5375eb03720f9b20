"""Native outputs as torch tensors."""

from __future__ import annotations

import torch


def as_tensor(o) -> torch.Tensor:
    """A native output: already a torch tensor (made through torch's DLPack exchange table, no
    copy), or a DLPack capsule (converted here, no copy)."""
    return o if isinstance(o, torch.Tensor) else torch.from_dlpack(o)
