"""Registering host memory with a device runtime (``cudaHostRegister``) in bounded chunks.

One registration call over a very large range fails regardless of free memory (reported at
>= 512 GiB), and a failed call leaves a sticky runtime error that later surfaces as a bogus
out-of-memory. :func:`register_chunked` therefore registers ``chunk_bytes`` at a time, rolls back
every chunk already registered when one fails, and clears the runtime's last error.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Protocol, runtime_checkable

import torch

from mem_cache_kernels.checks import check_int

__all__ = [
    "DEFAULT_REGISTER_CHUNK_BYTES",
    "CudaHostRegistrar",
    "HostRegistrar",
    "cuda_registrar",
    "register_chunked",
]

DEFAULT_REGISTER_CHUNK_BYTES = 16 * 1024**3
_CUDA_HOST_REGISTER_DEFAULT = 0


@runtime_checkable
class HostRegistrar(Protocol):
    """Makes host memory device-accessible: ``register(ptr, nbytes)`` raises ``RuntimeError`` on
    failure (and leaves that range unregistered); ``unregister(ptr)`` undoes one ``register``."""

    def register(self, ptr: int, nbytes: int) -> None: ...

    def unregister(self, ptr: int) -> None: ...


class CudaHostRegistrar:
    """:class:`HostRegistrar` over ``torch.cuda.cudart()`` (``cudaHostRegister``)."""

    def __init__(self) -> None:
        self._cudart: Any = torch.cuda.cudart()  # type: ignore[no-untyped-call]

    def register(self, ptr: int, nbytes: int) -> None:
        err = int(self._cudart.cudaHostRegister(ptr, nbytes, _CUDA_HOST_REGISTER_DEFAULT))
        if err != 0:
            _clear_last_cuda_error()
            raise RuntimeError(
                f"cudaHostRegister(ptr={ptr:#x}, nbytes={nbytes}) failed with cudaError {err}; "
                "an unregistered host buffer would make device transfers slow or stale"
            )

    def unregister(self, ptr: int) -> None:
        err = int(self._cudart.cudaHostUnregister(ptr))
        if err != 0:
            _clear_last_cuda_error()
            raise RuntimeError(f"cudaHostUnregister(ptr={ptr:#x}) failed with cudaError {err}")


def cuda_registrar() -> CudaHostRegistrar | None:
    """A CUDA registrar when CUDA is available (not on ROCm, where pinning differs), else None."""
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None):
        return None
    return CudaHostRegistrar()


def register_chunked(
    registrar: HostRegistrar, ptr: int, nbytes: int, chunk_bytes: int
) -> tuple[tuple[int, int], ...]:
    """Register ``[ptr, ptr + nbytes)`` in chunks of at most ``chunk_bytes``.

    Returns the ``(address, nbytes)`` chunks in order. If any chunk fails, the chunks already
    registered are unregistered and the error propagates (nothing stays registered).
    """
    check_int("chunk_bytes", chunk_bytes, minimum=1)
    done: list[tuple[int, int]] = []
    offset = 0
    try:
        while offset < nbytes:
            n = min(chunk_bytes, nbytes - offset)
            registrar.register(ptr + offset, n)
            done.append((ptr + offset, n))
            offset += n
    except BaseException:
        for addr, _ in reversed(done):
            registrar.unregister(addr)
        raise
    return tuple(done)


def _clear_last_cuda_error() -> None:
    """Best effort ``cudaGetLastError()`` so a failed call does not poison later launches."""
    names = (
        "libcudart.so.13",
        "libcudart.so.12",
        "libcudart.so",
        ctypes.util.find_library("cudart"),
    )
    for name in names:
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaGetLastError()
        return
