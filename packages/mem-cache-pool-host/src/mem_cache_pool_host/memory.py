"""Host memory for host KV pools: exact-size, mmap-backed, optionally registered with CUDA.

Why not ``torch.empty(..., pin_memory=True)``: PyTorch's caching host allocator rounds every
pinned request up to the next power of two (a 33 GiB pool pins 64 GiB) and one huge
``cudaHostAlloc`` fails above a few GiB on some drivers. Here every buffer is an anonymous
``mmap`` of *exactly* the requested byte count, wrapped zero-copy by ``torch.frombuffer``; when
CUDA is present the range is registered with ``cudaHostRegister`` in bounded chunks (one giant
registration fails regardless of free memory) and unregistered by ``close()``.

The allocator is pluggable: anything with ``allocate_bytes(nbytes) -> HostAllocation``
(:class:`HostBytesAllocator`; for example a storage backend handing out memory it registered with
its own transfer engine) can back a host pool, and so can an allocator with SGLang's interface
only (``allocate(dims, dtype, device) -> Tensor``, :class:`HostTensorAllocator`).
"""

from __future__ import annotations

import math
import mmap
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import torch

from mem_cache_kernels.checks import check_bool, check_int
from mem_cache_pool_host.registration import (
    DEFAULT_REGISTER_CHUNK_BYTES,
    HostRegistrar,
    cuda_registrar,
    register_chunked,
)

__all__ = [
    "HostAllocation",
    "HostBytesAllocator",
    "HostTensorAllocator",
    "HugePages",
    "MmapHostAllocation",
    "MmapHostTensorAllocator",
    "default_host_tensor_allocator",
]

HugePages = Literal["none", "transparent", "hugetlb"]
_MAP_HUGETLB = 0x40000  # Linux; not exported by Python's mmap module
_HUGETLB_PAGE_BYTES = 2 * 1024 * 1024


@runtime_checkable
class HostAllocation(Protocol):
    """One host buffer of exactly ``nbytes`` bytes.

    ``tensor`` is a flat, contiguous ``uint8`` CPU tensor of ``nbytes`` elements. ``pinned`` is
    true when devices may DMA to/from it (registered or page-locked). ``close()`` releases what the
    allocation holds beyond plain memory (driver registration); it is idempotent. The memory itself
    lives as long as any tensor viewing it, so closing never leaves a dangling view.
    """

    @property
    def tensor(self) -> torch.Tensor: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def pinned(self) -> bool: ...

    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...


@runtime_checkable
class HostBytesAllocator(Protocol):
    """What a host pool needs from its memory supplier: ``allocate_bytes(nbytes)`` returns a
    :class:`HostAllocation` of exactly ``nbytes`` (a positive int). Failure raises
    (``MemoryError``/``RuntimeError``) and leaves nothing allocated."""

    def allocate_bytes(self, nbytes: int) -> HostAllocation: ...


class HostTensorAllocator:
    """SGLang 0.5.23's host-memory allocator interface, and the base of ours.

    ``allocate(dims, dtype, device)`` returns a CPU tensor of exactly ``dims`` and ``dtype``
    (SGLang's; it records both in :attr:`dims` / :attr:`dtype`, as SGLang's does, for backends
    that read them back). Subclasses supply the memory through :meth:`allocate_bytes` (see
    :class:`HostBytesAllocator`); the allocations that back returned tensors are kept in
    :attr:`allocations` so their owner can ``close()`` them.
    """

    def __init__(self) -> None:
        self.dims: tuple[int, ...] | None = None
        self.dtype: torch.dtype | None = None
        self.allocations: list[HostAllocation] = []

    def allocate_bytes(self, nbytes: int) -> HostAllocation:
        """``nbytes`` bytes of host memory (subclasses implement it)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement allocate_bytes")

    def allocate(
        self, dims: Sequence[int], dtype: torch.dtype = torch.uint8, device: str = "cpu"
    ) -> torch.Tensor:
        """A CPU tensor of shape ``dims`` and ``dtype`` backed by :meth:`allocate_bytes` (a
        zero-element shape gets an empty tensor). ``device`` must be ``"cpu"`` (``ValueError``;
        SGLang asserts the same). ``TypeError``/``ValueError`` naming ``dims``/``dtype`` for a
        bad shape or dtype, before anything is allocated."""
        if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence):
            raise TypeError(f"dims must be a sequence of ints, got {type(dims).__name__}")
        shape = tuple(check_int(f"dims[{i}]", d, minimum=0) for i, d in enumerate(dims))
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
        if device != "cpu" and not (isinstance(device, torch.device) and device.type == "cpu"):
            raise ValueError(f"device must be 'cpu' (host memory), got {device!r}")
        numel = math.prod(shape)
        if numel == 0:
            tensor = torch.empty(shape, dtype=dtype)
        else:
            alloc = self.allocate_bytes(numel * torch.empty((), dtype=dtype).element_size())
            self.allocations.append(alloc)
            tensor = alloc.tensor.view(dtype).view(shape)
        self.dims = shape
        self.dtype = dtype
        return tensor


@dataclass(eq=False)
class MmapHostAllocation:
    """An anonymous mmap of exactly ``nbytes`` bytes (see :class:`HostAllocation`)."""

    _map: mmap.mmap | None
    _tensor: torch.Tensor | None
    _nbytes: int
    _registrar: HostRegistrar | None
    _registered: tuple[tuple[int, int], ...]
    _lock: threading.Lock

    @property
    def tensor(self) -> torch.Tensor:
        if self._tensor is None:
            raise RuntimeError("host allocation is closed")
        return self._tensor

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def pinned(self) -> bool:
        return bool(self._registered)

    @property
    def closed(self) -> bool:
        return self._tensor is None

    @property
    def registered_chunks(self) -> tuple[tuple[int, int], ...]:
        """``(address, nbytes)`` of every chunk registered with the driver (empty on CPU)."""
        return self._registered

    def close(self) -> None:
        """Unregister every chunk and drop this allocation's references (idempotent).

        The mapping is not unmapped explicitly: ``torch.frombuffer`` views keep the mmap object
        alive, and it is unmapped when the last view is garbage collected.
        """
        with self._lock:
            if self._tensor is None:
                return
            if self._registrar is not None:
                for ptr, _ in reversed(self._registered):
                    self._registrar.unregister(ptr)
            self._registered = ()
            self._tensor = None
            self._map = None


class MmapHostTensorAllocator(HostTensorAllocator):
    """Default :class:`HostTensorAllocator`: anonymous mmap, optional huge pages and registration.

    ``huge_pages``: ``"none"``; ``"transparent"`` (``madvise(MADV_HUGEPAGE)``, a hint); or
    ``"hugetlb"`` (``MAP_HUGETLB``: the mapping is rounded up to whole 2 MiB huge pages as the
    kernel requires; the tensor is still exactly ``nbytes``; raises if the system has no free
    huge pages). ``populate`` pre-faults the pages (``MAP_POPULATE``). ``register``: ``"auto"``
    registers with CUDA when ``torch.cuda.is_available()``, ``True`` requires it, ``False`` never.
    ``registrar`` overrides how registration is done (tests, other runtimes); chunks are at most
    ``register_chunk_bytes``.
    """

    def __init__(
        self,
        *,
        huge_pages: HugePages = "none",
        populate: bool = False,
        register: bool | Literal["auto"] = "auto",
        registrar: HostRegistrar | None = None,
        register_chunk_bytes: int = DEFAULT_REGISTER_CHUNK_BYTES,
    ) -> None:
        super().__init__()
        if huge_pages not in ("none", "transparent", "hugetlb"):
            raise ValueError(
                f"huge_pages must be 'none', 'transparent' or 'hugetlb', got {huge_pages!r}"
            )
        if register not in (True, False, "auto"):
            raise ValueError(f"register must be True, False or 'auto', got {register!r}")
        check_int("register_chunk_bytes", register_chunk_bytes, minimum=1)
        self.huge_pages: HugePages = huge_pages
        self.populate = populate
        self.register_chunk_bytes = register_chunk_bytes
        if registrar is None and register is not False:
            registrar = cuda_registrar()
            if registrar is None and register is True:
                raise RuntimeError("register=True but CUDA is not available for cudaHostRegister")
        self.registrar: HostRegistrar | None = None if register is False else registrar

    def allocate_bytes(self, nbytes: int) -> MmapHostAllocation:
        """An anonymous mmap of exactly ``nbytes`` (>= 1) bytes, registered when configured."""
        check_int("nbytes", nbytes, minimum=1)
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        if self.populate:
            flags |= getattr(mmap, "MAP_POPULATE", 0)
        length = nbytes
        if self.huge_pages == "hugetlb":
            flags |= _MAP_HUGETLB
            length = -(-nbytes // _HUGETLB_PAGE_BYTES) * _HUGETLB_PAGE_BYTES
        try:
            mapping = mmap.mmap(-1, length, flags=flags)
        except OSError as exc:
            raise MemoryError(
                f"mmap of {length} bytes (huge_pages={self.huge_pages!r}) failed: {exc}"
            ) from exc
        if self.huge_pages == "transparent" and hasattr(mmap, "MADV_HUGEPAGE"):
            mapping.madvise(mmap.MADV_HUGEPAGE)
        tensor = torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes)
        registered: tuple[tuple[int, int], ...] = ()
        if self.registrar is not None:
            registered = register_chunked(
                self.registrar, tensor.data_ptr(), nbytes, self.register_chunk_bytes
            )
        return MmapHostAllocation(
            _map=mapping,
            _tensor=tensor,
            _nbytes=nbytes,
            _registrar=self.registrar,
            _registered=registered,
            _lock=threading.Lock(),
        )


@dataclass(eq=False)
class _TensorAllocation:
    """A :class:`HostAllocation` over a tensor an SGLang-interface allocator returned."""

    _tensor: torch.Tensor | None
    _nbytes: int
    _pinned: bool

    @property
    def tensor(self) -> torch.Tensor:
        if self._tensor is None:
            raise RuntimeError("host allocation is closed")
        return self._tensor

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def pinned(self) -> bool:
        return self._pinned

    @property
    def closed(self) -> bool:
        return self._tensor is None

    def close(self) -> None:
        self._tensor = None


def uses_bytes_interface(allocator: object) -> bool:
    """Whether ``allocator`` supplies memory through ``allocate_bytes`` (ours) rather than only
    SGLang's ``allocate(dims, dtype, device)``."""
    if isinstance(allocator, HostTensorAllocator):
        return type(allocator).allocate_bytes is not HostTensorAllocator.allocate_bytes
    return callable(getattr(allocator, "allocate_bytes", None))


def allocate_for_pool(allocator: object, nbytes: int) -> HostAllocation:
    """``nbytes`` of host memory from ``allocator``: through ``allocate_bytes`` when it has one,
    else through SGLang's ``allocate((nbytes,), torch.uint8, "cpu")`` (the tensor must be a
    contiguous CPU tensor of exactly ``nbytes`` bytes: ``ValueError`` otherwise; it is pinned
    when ``tensor.is_pinned()``)."""
    if uses_bytes_interface(allocator):
        return allocator.allocate_bytes(nbytes)  # type: ignore[attr-defined, no-any-return]
    tensor = allocator.allocate((nbytes,), torch.uint8, "cpu")  # type: ignore[attr-defined]
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"allocator.allocate must return a torch.Tensor, got {type(tensor).__name__}"
        )
    size = tensor.numel() * tensor.element_size()
    if tensor.device.type != "cpu" or not tensor.is_contiguous() or size != nbytes:
        raise ValueError(
            f"allocator.allocate must return a contiguous CPU tensor of {nbytes} bytes, got "
            f"{size} bytes on {tensor.device} (contiguous={tensor.is_contiguous()})"
        )
    flat = tensor.reshape(-1).view(torch.uint8)
    return _TensorAllocation(_tensor=flat, _nbytes=nbytes, _pinned=bool(tensor.is_pinned()))


def default_host_tensor_allocator(pin_memory: bool = True) -> MmapHostTensorAllocator:
    """The allocator host pools use when none is given.

    ``pin_memory=True`` registers with CUDA when it is available (plain memory on CPU-only
    machines); ``False`` never registers.
    """
    check_bool("pin_memory", pin_memory)
    return MmapHostTensorAllocator(register="auto" if pin_memory else False)
