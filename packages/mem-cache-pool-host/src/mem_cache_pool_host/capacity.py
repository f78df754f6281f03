"""Host pool sizing: capacity in whole pages and a preflight check of available host memory."""

from __future__ import annotations

import os
from dataclasses import dataclass

from mem_cache_kernels.checks import check_int, check_number, check_optional_int

__all__ = [
    "DEFAULT_HOST_TO_DEVICE_RATIO",
    "HostCapacity",
    "available_host_memory",
    "default_reserve_bytes",
    "plan_host_capacity",
    "preflight_host_memory",
]

DEFAULT_HOST_TO_DEVICE_RATIO = 2.0
_RESERVE_CAP_BYTES = 10 * 1024**3


@dataclass(frozen=True, slots=True)
class HostCapacity:
    """A host pool's size: ``num_pages`` pages of ``page_size`` slots, ``nbytes`` in total."""

    num_pages: int
    page_size: int
    bytes_per_token: int

    @property
    def size(self) -> int:
        """Number of host slots (``num_pages * page_size``)."""
        return self.num_pages * self.page_size

    @property
    def nbytes(self) -> int:
        return self.size * self.bytes_per_token


def plan_host_capacity(
    *,
    device_size: int,
    bytes_per_token: int,
    page_size: int,
    host_to_device_ratio: float = DEFAULT_HOST_TO_DEVICE_RATIO,
    host_size_bytes: int | None = None,
) -> HostCapacity:
    """Size a host pool in whole pages (rounded down; never an extra page).

    ``host_size_bytes`` (if given and > 0) wins: as many whole pages as fit in that many bytes.
    Otherwise ``device_size * host_to_device_ratio`` tokens, rounded down to whole pages. Raises
    ``ValueError`` naming the argument when the result would hold no page.
    """
    for name, value in (
        ("device_size", device_size),
        ("bytes_per_token", bytes_per_token),
        ("page_size", page_size),
    ):
        check_int(name, value)
    check_optional_int("host_size_bytes", host_size_bytes)
    if page_size <= 0:
        raise ValueError(f"page_size must be > 0, got {page_size}")
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token must be > 0, got {bytes_per_token}")
    if host_size_bytes is not None and host_size_bytes < 0:
        raise ValueError(f"host_size_bytes must be >= 0 or None, got {host_size_bytes}")
    page_bytes = bytes_per_token * page_size
    if host_size_bytes:
        num_pages = host_size_bytes // page_bytes
        if num_pages == 0:
            raise ValueError(
                f"host_size_bytes={host_size_bytes} holds no page; "
                f"one page needs {page_bytes} bytes"
            )
    else:
        check_number("host_to_device_ratio", host_to_device_ratio)
        if not host_to_device_ratio > 0:
            raise ValueError(f"host_to_device_ratio must be > 0, got {host_to_device_ratio}")
        tokens = int(device_size * host_to_device_ratio)
        num_pages = tokens // page_size
        if num_pages == 0:
            raise ValueError(
                f"host_to_device_ratio={host_to_device_ratio} x device size {device_size} = "
                f"{tokens} tokens holds no page of {page_size} tokens"
            )
    return HostCapacity(num_pages=num_pages, page_size=page_size, bytes_per_token=bytes_per_token)


def available_host_memory() -> int | None:
    """Bytes of host memory available for new allocations, or None when unknown.

    Reads ``MemAvailable`` from ``/proc/meminfo`` (Linux), falling back to
    ``os.sysconf('SC_AVPHYS_PAGES') * SC_PAGE_SIZE``.
    """
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _total_host_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def default_reserve_bytes() -> int:
    """Memory left free for the rest of the process: 10% of RAM, at most 10 GiB."""
    total = _total_host_memory()
    if total is None:
        return _RESERVE_CAP_BYTES
    return min(_RESERVE_CAP_BYTES, total // 10)


def preflight_host_memory(
    requested_bytes: int, *, reserve_bytes: int | None = None, available: int | None = None
) -> None:
    """Fail with ``ValueError`` before allocating if ``requested_bytes`` would not fit.

    Fits when ``requested_bytes <= available - reserve_bytes`` (``available`` defaults to
    :func:`available_host_memory`, ``reserve_bytes`` to :func:`default_reserve_bytes`). When the
    available amount cannot be determined the check passes.
    """
    check_int("requested_bytes", requested_bytes)
    check_optional_int("reserve_bytes", reserve_bytes)
    check_optional_int("available", available)
    if reserve_bytes is None:
        reserve_bytes = default_reserve_bytes()
    if reserve_bytes < 0:
        raise ValueError(f"reserve_bytes must be >= 0, got {reserve_bytes}")
    if available is None:
        available = available_host_memory()
    if available is None:
        return
    usable = available - reserve_bytes
    if requested_bytes > usable:
        gib = 1024**3
        raise ValueError(
            f"host KV pool needs {requested_bytes} bytes ({requested_bytes / gib:.2f} GiB) "
            "but only "
            f"{max(usable, 0)} bytes ({max(usable, 0) / gib:.2f} GiB) are available "
            f"({available} available minus a reserve of {reserve_bytes}); lower "
            "host_to_device_ratio / host_size_bytes or reserve_bytes"
        )
