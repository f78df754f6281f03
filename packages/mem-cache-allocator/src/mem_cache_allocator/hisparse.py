"""``HiSparseTokenToKVPoolAllocator``: a logical KV space larger than the device pool (DSA/MLA).

Two paged allocators: a *logical* one over ``size * host_to_device_ratio`` tokens (host-backed;
the ids requests see) and a *device* one over the ``size`` slots of the
``HiSparseDSATokenToKVPool``. ``full_to_hisparse_device_index_mapping`` (int64,
``size * ratio + page_size + 1`` entries, 0 = no device slot, trailing -1) maps logical slots to
device slots; it is registered into the pool (``kvcache.register_mapping``), which translates
logical locs through it on every read/write.

* ``alloc_extend`` takes logical and device slots in step (capacity of both checked on the host
  first); ``alloc_logical_only`` / ``alloc_decode`` take logical slots only (the HiSparse
  coordinator assigns device slots later, e.g. via ``alloc_device_buffer``).
* ``free`` releases logical pages and the mapped device slots and clears the mapping at once;
  free groups therefore apply frees immediately (they only check nesting).

Importing this module imports no pool module at run time (the pool type is for type checking).
Device-slot frees go through the paged allocator's ``free_unaligned`` (the mapped device slots
form an arbitrary set), which syncs once per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from mem_cache_allocator._composite import check_need_size, make_inner, new_mapping
from mem_cache_allocator._page_allocator import PageAllocatorState
from mem_cache_allocator._paired import PairedAllocators, check_own_state
from mem_cache_allocator.base import BaseTokenToKVPoolAllocator

__all__ = ["HiSparseAllocatorState", "HiSparseTokenToKVPoolAllocator"]


class _MappingPool(Protocol):
    def register_mapping(self, mapping: torch.Tensor) -> None: ...


@dataclass(frozen=True, slots=True)
class HiSparseAllocatorState:
    """Opaque result of :meth:`HiSparseTokenToKVPoolAllocator.backup_state`."""

    owner: int
    logical: PageAllocatorState
    device: PageAllocatorState
    mapping: torch.Tensor


class HiSparseTokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """``HiSparseTokenToKVPoolAllocator(size, page_size, dtype, device, kvcache, need_sort=False,
    host_to_device_ratio=2, *, debug=False)``; ``size`` is the device pool's slot count."""

    def __init__(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        device: str | torch.device,
        kvcache: Any,
        need_sort: bool = False,
        host_to_device_ratio: int = 2,
        *,
        debug: bool = False,
    ) -> None:
        if (
            isinstance(host_to_device_ratio, bool)
            or not isinstance(host_to_device_ratio, int)
            or host_to_device_ratio < 1
        ):
            raise ValueError(
                f"host_to_device_ratio must be a positive int, got {host_to_device_ratio!r}"
            )
        super().__init__(size * host_to_device_ratio, page_size, dtype, device, kvcache, need_sort)
        self._size_hisparse = size
        self.host_to_device_ratio = host_to_device_ratio
        self.compress_ratio = 1
        self.logical_attn_allocator = make_inner(
            self.size, page_size, dtype, self.device, kvcache, need_sort, debug, paged_only=True
        )
        self.hisparse_attn_allocator = make_inner(
            size, page_size, dtype, self.device, kvcache, need_sort, debug, paged_only=True
        )
        self.full_to_hisparse_device_index_mapping = new_mapping(self.size + page_size, self.device)
        self._pair = PairedAllocators(
            self.logical_attn_allocator,
            self.hisparse_attn_allocator,
            self.full_to_hisparse_device_index_mapping,
            self.get_last_loc_hisparse_device,
        )
        if kvcache is not None:
            pool: _MappingPool = kvcache
            pool.register_mapping(self.full_to_hisparse_device_index_mapping)

    # ------------------------------------------------------------------ capacity
    @property
    def size_hisparse(self) -> int:
        return self._size_hisparse

    def available_size(self) -> int:
        return self._pair.available_size()

    def get_last_loc_hisparse_device(self, last_locs: torch.Tensor) -> torch.Tensor:
        """Device slots of logical ``last_locs`` (-1 stays -1)."""
        return self.full_to_hisparse_device_index_mapping[last_locs]

    # ------------------------------------------------------------------ allocation
    def alloc(self, need_size: int) -> torch.Tensor | None:
        """Logical and device slots in step (whole pages); returns the logical slots."""
        return self._pair.alloc(need_size)

    def alloc_extend(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Logical and device slots in step; the device ``last_loc`` is the mapped one."""
        lens = (prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu)
        return self._pair.alloc_extend(lens, last_loc, extend_num_tokens)

    def alloc_logical_only(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Logical slots only (KV written straight to host memory; mapping stays 0)."""
        return self.logical_attn_allocator.alloc_extend(
            prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens
        )

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        """Logical slots only: the coordinator assigns device slots for decode tokens."""
        return self.logical_attn_allocator.alloc_decode(seq_lens, seq_lens_cpu, last_loc)

    def alloc_device_buffer(
        self, allocated_indices: torch.Tensor, need_size: int
    ) -> torch.Tensor | None:
        """Turn a request's device slots into a buffer of exactly ``need_size`` device slots.

        Takes the device slots mapped from logical ``allocated_indices`` (in order; unmapped ones
        are skipped) and clears those mapping entries. With at least ``need_size`` of them, the
        first ``need_size`` are the buffer and the rest are freed; otherwise the last partial
        page is claimed whole and new pages are allocated for the remainder. ``need_size`` must
        be a multiple of page_size. Returns ``None`` (nothing changed) when the device allocator
        cannot supply the extra pages. Syncs (the number of mapped slots is data-dependent).
        """
        ps = self.page_size
        check_need_size(need_size)
        if need_size % ps:
            raise ValueError(f"need_size must be a multiple of page_size={ps}, got {need_size}")
        mapping = self.full_to_hisparse_device_index_mapping
        dev = mapping[allocated_indices]
        dev = dev[dev > 0]
        n = int(dev.shape[0])
        if n >= need_size:
            mapping[allocated_indices] = 0
            buffer = dev[:need_size]
            self.free_hisparse_indices(dev[need_size:])
            return buffer
        residual = n % ps
        if residual:
            last = int(dev[-1])
            pad = torch.arange(last + 1, last + 1 + ps - residual, dtype=torch.int64)
            dev = torch.cat([dev, pad.to(self.device)])
        extra_size = need_size - int(dev.shape[0])
        if extra_size // ps > self.hisparse_attn_allocator.free_page_count():
            return None
        extra = self.hisparse_attn_allocator.alloc(extra_size)
        if extra is None:  # pragma: no cover - the check above guarantees room
            return None
        mapping[allocated_indices] = 0
        return torch.cat([dev, extra])

    # ------------------------------------------------------------------ free
    def free(self, free_index: torch.Tensor) -> None:
        """Free logical slots (paged ``free`` contract) and their device slots; clear mapping."""
        if free_index.numel() == 0:
            return
        self.logical_attn_allocator.free(free_index)
        self.free_hisparse(free_index)

    def free_hisparse(self, free_indices: torch.Tensor) -> None:
        """Release the device slots mapped from logical ``free_indices`` and clear the mapping."""
        if free_indices.numel() == 0:
            return
        self._pair.release(free_indices)

    def free_hisparse_indices(self, buffer_indices: torch.Tensor) -> None:
        """Release device slots directly (entries <= 0 are ignored); never deferred."""
        self._pair.free_secondary(buffer_indices)

    def free_group_begin(self) -> None:
        """Checks nesting only: HiSparse frees must clear the mapping at once."""
        super().free_group_begin()

    def free_group_end(self) -> None:
        super().free_group_end()

    # ------------------------------------------------------------------ state
    def merge_and_sort_free(self) -> None:
        self._pair.merge_and_sort_free()

    def clear(self) -> None:
        self._pair.clear()
        self._free_group = None

    def backup_state(self) -> HiSparseAllocatorState:
        logical, dev, mapping = self._pair.snapshot()
        return HiSparseAllocatorState(owner=id(self), logical=logical, device=dev, mapping=mapping)

    def restore_state(self, state: Any) -> None:
        own = check_own_state(state, HiSparseAllocatorState, self)
        self._pair.restore(own.logical, own.device, own.mapping)

    def get_cpu_copy(self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None) -> Any:
        raise NotImplementedError("HiSparseTokenToKVPoolAllocator does not support CPU copies")

    def load_cpu_copy(
        self, kv_cache_cpu: Any, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> Any:
        raise NotImplementedError("HiSparseTokenToKVPoolAllocator does not support CPU copies")

    def debug_print(self) -> str:
        return self._pair.describe("logical", "hisparse")
