"""Argument validation shared by the pools (private).

Every check raises ``TypeError`` (wrong kind of object or dtype) or ``ValueError`` (wrong value,
shape or device) with a message naming the argument, the expected and the actual value. Checks
that would read device memory (value ranges of a GPU tensor) only run when ``full`` is true: the
pools pass ``full = tensor is on the CPU or the pool is in debug mode``, so the hot path never
synchronises with the device.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

__all__ = [
    "DEBUG_ENV_VAR",
    "INDEX_DTYPES",
    "check_device_arg",
    "check_distinct",
    "check_index",
    "check_int",
    "check_mapping",
    "check_rows",
    "debug_from_env",
]

DEBUG_ENV_VAR = "MEM_CACHE_DEBUG"
INDEX_DTYPES = (torch.int32, torch.int64)


def debug_from_env() -> bool:
    """True when ``MEM_CACHE_DEBUG`` is set to something other than ``""``/``"0"``."""
    return os.environ.get(DEBUG_ENV_VAR, "0") not in ("", "0")


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` as an ``int`` ``>= minimum``; bools and non-integers are a ``TypeError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_device_arg(name: str, device: object) -> torch.device:
    """``device`` (a ``torch.device`` or a device string) as a ``torch.device``."""
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"{name} must be a torch.device or a str, got {type(device).__name__}")
    try:
        return torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"{name} must name a torch device (e.g. 'cpu', 'cuda:0'), got {device!r}"
        ) from None


def _check_device(name: str, tensor: torch.Tensor, device: torch.device) -> None:
    if not _same_device(tensor.device, device):
        raise ValueError(f"{name} must be on device {device}, got {tensor.device}")


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    # "cuda" and "cuda:0" name the same device when the current device is 0; compare indices only
    # when both are explicit
    return a.index is None or b.index is None or a.index == b.index


def check_index(
    name: str,
    loc: object,
    device: torch.device,
    limit: int,
    *,
    full: bool,
    length: int | None = None,
) -> torch.Tensor:
    """Validate a 1-D int32/int64 slot tensor on ``device`` whose values lie in ``[0, limit)``.

    The value range is checked only when ``full`` is true (or the tensor is on the CPU, where the
    check costs no device synchronisation). ``length``, when given, is the required element count.
    """
    if not isinstance(loc, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(loc).__name__}")
    if loc.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {loc.dtype}")
    if loc.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(loc.shape)}")
    if length is not None and loc.numel() != length:
        raise ValueError(f"{name} must have {length} elements, got {loc.numel()}")
    _check_device(name, loc, device)
    if (full or loc.device.type == "cpu") and loc.numel() > 0:
        lo, hi = int(loc.min()), int(loc.max())
        if lo < 0 or hi >= limit:
            raise ValueError(f"{name} values must lie in [0, {limit}), got min {lo}, max {hi}")
    return loc


def check_distinct(name: str, loc: torch.Tensor, *, full: bool) -> None:
    """``ValueError`` if a validated slot tensor repeats a value (checked when ``full`` or on
    the CPU, like value ranges)."""
    if (full or loc.device.type == "cpu") and loc.numel() > 1:
        distinct = int(torch.unique(loc).numel())
        if distinct != loc.numel():
            raise ValueError(
                f"{name} must not repeat a slot, got {loc.numel() - distinct} repeated entries"
            )


def check_rows(
    name: str,
    value: object,
    shape: Sequence[int],
    device: torch.device,
    *,
    dtypes: Sequence[torch.dtype] | None = None,
) -> torch.Tensor:
    """Validate a tensor of exactly ``shape`` on ``device``.

    ``dtypes``: the accepted dtypes; ``None`` accepts any floating-point dtype (the pool casts).
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if dtypes is None:
        if not value.dtype.is_floating_point:
            raise TypeError(f"{name} must have a floating-point dtype, got {value.dtype}")
    elif value.dtype not in dtypes:
        expected = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must have dtype {expected}, got {value.dtype}")
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(value.shape)}")
    _check_device(name, value, device)
    return value


def check_mapping(
    name: str,
    mapping: object,
    device: torch.device,
    length: int,
    *,
    full: bool,
    targets: int | None = None,
) -> torch.Tensor:
    """Validate a slot mapping: int64 ``[length]`` on ``device`` with ``mapping[-1] == -1`` and,
    when ``targets`` is given, every other value in ``[0, targets)``.

    The values (a device read) are checked when ``full`` or on the CPU.
    """
    if not isinstance(mapping, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mapping).__name__}")
    if mapping.dtype != torch.int64:
        raise TypeError(f"{name} must be int64, got {mapping.dtype}")
    if mapping.dim() != 1 or mapping.numel() != length:
        raise ValueError(f"{name} must have shape ({length},), got {tuple(mapping.shape)}")
    _check_device(name, mapping, device)
    if full or mapping.device.type == "cpu":
        last = int(mapping[-1])
        if last != -1:
            raise ValueError(f"{name}[-1] must be the sentinel -1, got {last}")
        if targets is not None and length > 1:
            lo, hi = int(mapping[:-1].min()), int(mapping[:-1].max())
            if lo < 0 or hi >= targets:
                raise ValueError(
                    f"{name}[:-1] values must lie in [0, {targets}) (0 = unmapped), got min "
                    f"{lo}, max {hi}"
                )
    return mapping
