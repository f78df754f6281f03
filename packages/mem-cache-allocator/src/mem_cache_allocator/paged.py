"""``PagedTokenToKVPoolAllocator``: page-granular slots, freed pages reused first.

Same slots as SGLang's allocator for the same sequence of calls: the free list starts as pages
``1..num_pages``; allocations consume its prefix (``alloc_extend``/``alloc_decode`` in request
order, see :mod:`mem_cache_kernels` for the exact per-request layout); a free puts its page ids,
ascending, in front of the free list (with ``need_sort``: staged, then merged and sorted when an
allocation finds the free list short).

``free`` releases ``unique(free_index // page_size)`` exactly as SGLang does (any order, int32,
partial pages, duplicates, concatenated requests); ``free_segment`` / ``free_segments`` are the
explicit sync-free release of known segments. Differences (all documented in the package README):
the capacity check runs before any kernel; frees and allocations are O(pages touched), never
O(free list); a debug mode checks ownership.
"""

from __future__ import annotations

from mem_cache_allocator.page_allocator import PageAllocatorCore, PageAllocatorState

__all__ = ["PageAllocatorState", "PagedTokenToKVPoolAllocator"]


class PagedTokenToKVPoolAllocator(PageAllocatorCore):
    """Slots in pages of ``page_size``; ``size // page_size`` pages, page 0 reserved.

    ``PagedTokenToKVPoolAllocator(size, page_size, dtype, device, kvcache, need_sort=False,
    *, debug=False)``.
    """

    _FREE_TO_FRONT = True
    _SORT_FREES = True
