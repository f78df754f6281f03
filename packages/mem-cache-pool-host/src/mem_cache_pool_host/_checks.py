"""Argument checks of the host pools that :mod:`mem_cache_kernels.checks` does not hold.

All follow its exception rule (``TypeError`` for the wrong kind of thing, ``ValueError`` for a
wrong value, the message naming the argument, the expected and the actual value) and are built on
its primitives. :func:`check_number` and :func:`check_choice` are generic (candidates for
``mem_cache_kernels.checks``); :func:`check_index_device` is the host pools' own device rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels.checks import check_int

__all__ = ["check_choice", "check_index_device", "check_number"]


def check_number(name: str, value: object) -> float:
    """``value`` (an ``int`` or a ``float``, never a ``bool``) as a float, else ``TypeError``."""
    if isinstance(value, float):
        return value
    try:
        return float(check_int(name, value))
    except TypeError:
        raise TypeError(f"{name} must be a number, got {type(value).__name__}") from None


def check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    """``value`` if it is one of the strings ``choices``: ``TypeError`` for a non-``str``,
    ``ValueError`` for another string."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {tuple(choices)}, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def check_index_device(name: str, idx: torch.Tensor, device: torch.device) -> None:
    """A transfer index lives on the CPU or on the device pool's device *type* (an index on
    another GPU of that type is moved to the pool's), else ``ValueError``."""
    if idx.device.type not in ("cpu", device.type):
        raise ValueError(
            f"{name} must be on the CPU or on the device pool's device {device}, got {idx.device}"
        )
