"""``TokenToKVPoolAllocator``: page size 1, freed slots appended (reused last).

Same slots as SGLang's token allocator for the same calls: the free list starts as slots
``1..size``, ``alloc(n)`` takes its prefix, ``free(slots)`` appends the slots in the given order
(no dedup; debug mode rejects duplicates and double frees), ``need_sort`` stages frees and merges
them sorted when an allocation finds the free list short. ``alloc_extend``/``alloc_decode`` are
provided too (with page size 1 they hand out the free-list prefix, exactly like ``alloc``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mem_cache_allocator.page_allocator import PageAllocatorCore, PageAllocatorState

if TYPE_CHECKING:
    from mem_cache_pool.base import KVCache

__all__ = ["PageAllocatorState", "TokenToKVPoolAllocator"]


class TokenToKVPoolAllocator(PageAllocatorCore):
    """One slot per token; slots ``1..size`` (slot 0 reserved).

    ``TokenToKVPoolAllocator(size, dtype, device, kvcache, need_sort=False, *, debug=False)``.
    """

    _FREE_TO_FRONT = False
    _SORT_FREES = False

    def __init__(
        self,
        size: int,
        dtype: torch.dtype,
        device: str | torch.device,
        kvcache: KVCache | None,
        need_sort: bool = False,
        *,
        debug: bool = False,
    ) -> None:
        super().__init__(size, 1, dtype, device, kvcache, need_sort, debug=debug)
