"""``HiSparseTokenToKVPoolAllocator``: a logical KV space larger than the device pool (DSA/MLA).

Two paged allocators: a *logical* one over ``size * host_to_device_ratio`` tokens (host-backed;
the ids requests see) and a *device* one over the ``size`` slots of the
``HiSparseDSATokenToKVPool``. ``full_to_hisparse_device_index_mapping`` (int64,
``size * ratio + page_size + 1`` entries, 0 = no device slot, trailing -1) maps logical slots to
device slots; it is registered into the pool (``kvcache.register_mapping``), which translates
logical locs through it on every read/write.

* ``alloc`` (SGLang: page size 1 only; here whole pages): logical first, then device; a short
  device frees the logical slots again (SGLang's order, so the free lists stay equal).
* ``alloc_extend`` takes logical and device slots in step (capacity of both checked on the host
  first); ``alloc_logical_only`` / ``alloc_decode`` take logical slots only (the HiSparse
  coordinator assigns device slots later, via ``alloc_device_buffer``). A request continuing a
  partial page whose last token has no device slot gets a fresh device page (SGLang: slots of
  the padding page; see the package README).
* ``free`` releases logical pages and the mapped device pages (set semantics) and clears the
  mapping at once; free groups therefore apply frees immediately (they only check nesting).
* ``alloc_device_buffer`` frees only surplus pages that hold no buffer slot and pads inside the
  last slot's page (SGLang frees and pads past what the buffer owns).

Importing this module imports no pool module at run time (the pool type is for type checking).
Device frees resolve the mapped device pages with ``torch.unique`` (one sync per call).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from mem_cache_allocator._composite import check_need_size, make_inner, new_mapping
from mem_cache_allocator._hisparse_common import HiSparseAllocatorCommon
from mem_cache_allocator._hisparse_device import check_slots, lookup
from mem_cache_allocator._paired import PairedAllocators, check_own_state
from mem_cache_allocator.base import check_index_tensor, check_segments_iterable
from mem_cache_allocator.page_allocator import PageAllocatorCore, PageAllocatorState
from mem_cache_kernels.checks import check_int
from mem_cache_kernels.pages import trim_segments

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


class HiSparseTokenToKVPoolAllocator(HiSparseAllocatorCommon):
    """``HiSparseTokenToKVPoolAllocator(size, page_size, dtype, device, kvcache, need_sort=False,
    host_to_device_ratio=2, *, debug=False)``; ``size`` is the device pool's slot count."""

    logical_attn_allocator: PageAllocatorCore

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
        check_int("host_to_device_ratio", host_to_device_ratio, minimum=1)
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
        self._device_page_size = page_size
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
        """Capacity of the device (hisparse) side in tokens, as given at construction."""
        return self._size_hisparse

    @property
    def _buffer_index_limit(self) -> int:
        return self._size_hisparse + self.page_size

    @property
    def debug(self) -> bool:
        """Whether checked (debug) mode is on: the logical allocator's ``debug``."""
        return self.logical_attn_allocator.debug

    def available_size(self) -> int:
        return self._pair.available_size()

    def get_last_loc_compressed(self, last_locs: torch.Tensor) -> torch.Tensor:
        """``last_locs`` unchanged (no compression; SGLang's coordinator calls it on both
        HiSparse allocators)."""
        upper = self.full_to_hisparse_device_index_mapping.shape[0] - 1
        check_slots(last_locs, "last_locs", upper, check=False)
        return last_locs

    def get_last_loc_hisparse_device(self, last_locs: torch.Tensor) -> torch.Tensor:
        """Device slots of logical ``last_locs`` (-1 stays -1, 0 = no device slot)."""
        return lookup(
            self.full_to_hisparse_device_index_mapping, last_locs, "last_locs", check=self.debug
        )

    # ------------------------------------------------------------------ allocation
    def alloc(self, need_size: int) -> torch.Tensor | None:
        """Logical and device slots in step (whole pages); returns the logical slots.

        SGLang's order: the logical allocation first (a short ``need_sort`` free list merges its
        staged frees before giving up), then the device one; when the device is short, the
        logical slots are freed again (as SGLang does, so the free lists stay equal).
        """
        check_need_size(need_size)
        logical = self.logical_attn_allocator.alloc(need_size)
        if logical is None:
            return None
        dev = self.hisparse_attn_allocator.alloc(need_size)
        if dev is None:
            self.logical_attn_allocator.free(logical)
            return None
        self.full_to_hisparse_device_index_mapping[logical] = dev
        return logical

    def alloc_extend(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Logical and device slots in step; the device ``last_loc`` is the mapped one.

        Capacity of both sides is checked on the host first (SGLang's pre-check: staged frees
        count, nothing merges when it fails). A request whose prefix ends inside a page on a
        token without device slot (a logical-only decode token) gets a fresh device page; SGLang
        hands out slots of the padding page there (see the package README).
        """
        return self._alloc_extend_in_step(
            prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens, 1
        )

    def _device_extend_last_loc(
        self, prefix_lens: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor:
        return self.get_last_loc_hisparse_device(last_loc)

    def alloc_device_buffer(
        self, allocated_indices: torch.Tensor, need_size: int
    ) -> torch.Tensor | None:
        """Turn a request's device slots into a buffer of exactly ``need_size`` device slots.

        Takes the device slots mapped from logical ``allocated_indices`` (in order; unmapped ones
        are skipped) and clears those mapping entries. With at least ``need_size`` of them, the
        first ``need_size`` are the buffer and the pages of the rest that hold no buffer slot
        are freed; otherwise the rest of the last slot's page pads the buffer and new pages are
        allocated for the remainder. ``need_size`` must be a multiple of page_size. Returns
        ``None`` (nothing changed) when the device allocator cannot supply the extra pages
        (SGLang asserts). Syncs (the number of mapped slots is data-dependent).
        """
        ps = self.page_size
        check_need_size(need_size)
        if need_size % ps:
            raise ValueError(f"need_size must be a multiple of page_size={ps}, got {need_size}")
        return self._take_device_buffer(allocated_indices, need_size, None)

    # ------------------------------------------------------------------ free
    def free(self, free_index: torch.Tensor) -> None:
        """Free logical slots and their device slots and clear the mapping (``free_hisparse``),
        with SGLang 0.5.23's set semantics on both sides (the pages of the given slots: any
        order, several requests concatenated, partial pages). Syncs once (the device side is
        data-dependent anyway). Never deferred: free groups only check nesting."""
        check_index_tensor("free_index", free_index, self.device)
        if free_index.numel() == 0:
            return
        dev_pages = self._device_pages_of(free_index, "free_index")
        self.logical_attn_allocator.free(free_index)
        self._release(free_index, dev_pages)

    def free_segments(self, segments: Iterable[tuple[torch.Tensor, int]]) -> None:
        """Free ascending ``(slots, start_pos)`` segments of one request: one :meth:`free` of all
        their slots (set semantics release a page two segments share once, and every slot's
        device page goes -- trimming the shared page's slots would leave them mapped)."""
        check_segments_iterable(segments)
        segs = list(segments)
        trim_segments(segs, self.page_size)  # validates the segments
        if segs:
            self.free(torch.cat([idx.to(self.device, torch.int64).reshape(-1) for idx, _ in segs]))

    def free_hisparse(self, free_indices: torch.Tensor) -> None:
        """Release the device pages mapped from logical ``free_indices`` and clear the mapping
        (SGLang's set-semantics ``free`` of the mapped device slots)."""
        check_index_tensor("free_indices", free_indices, self.device)
        if free_indices.numel() == 0:
            return
        self._release(free_indices, self._device_pages_of(free_indices, "free_indices"))

    # ------------------------------------------------------------------ state
    def backup_state(self) -> HiSparseAllocatorState:
        logical, dev, mapping = self._pair.snapshot()
        return HiSparseAllocatorState(owner=id(self), logical=logical, device=dev, mapping=mapping)

    def restore_state(self, state: Any) -> None:
        own = check_own_state(state, HiSparseAllocatorState, self)
        self._pair.restore(own.logical, own.device, own.mapping)
