"""Argument checks of the host pools that :mod:`mem_cache_kernels.checks` does not hold.

All follow its exception rule (``TypeError`` for the wrong kind of thing, ``ValueError`` for a
wrong value, the message naming the argument, the expected and the actual value) and are built on
its primitives. :func:`check_index_device` is the host pools' own device rule.
"""

from __future__ import annotations

import torch

__all__ = ["check_index_device"]


def check_index_device(name: str, idx: torch.Tensor, device: torch.device) -> None:
    """A transfer index lives on the CPU or on the device pool's device *type* (an index on
    another GPU of that type is moved to the pool's), else ``ValueError``."""
    if idx.device.type not in ("cpu", device.type):
        raise ValueError(
            f"{name} must be on the CPU or on the device pool's device {device}, got {idx.device}"
        )
