"""Raw memory views of (pointer, byte count) ranges (host memory only)."""

from __future__ import annotations

import ctypes

__all__ = ["copy_from_bytes", "view"]


def view(ptr: int, nbytes: int) -> memoryview:
    """A writable byte view of ``nbytes`` at host address ``ptr`` (the caller owns the memory)."""
    if nbytes == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_ubyte * nbytes).from_address(ptr)).cast("B")


def copy_from_bytes(ptr: int, data: bytes | memoryview) -> None:
    """Copy ``data`` to host address ``ptr``."""
    n = len(data)
    if n:
        ctypes.memmove(ptr, bytes(data) if isinstance(data, memoryview) else data, n)
