"""Helpers shared by the composite allocators (SWA, HiSparse): inner allocators, mappings and
argument checks (the in-step bookkeeping itself is :mod:`mem_cache_allocator._paired`)."""

from __future__ import annotations

from typing import Any

import torch

from mem_cache_allocator.page_allocator import PageAllocatorCore
from mem_cache_allocator.paged import PagedTokenToKVPoolAllocator
from mem_cache_allocator.token import TokenToKVPoolAllocator
from mem_cache_kernels.checks import check_int

__all__ = ["check_need_size", "make_inner", "new_mapping", "slots_of_pages_touched"]


def check_need_size(need_size: object) -> int:
    """``need_size`` as a non-negative int (``TypeError`` for a non-int, ``bool`` included;
    ``ValueError`` below 0)."""
    return check_int("need_size", need_size, minimum=0)


def make_inner(  # noqa: PLR0917 - mirrors the allocator constructors
    size: int,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device,
    kvcache: Any,
    need_sort: bool,
    debug: bool,
    *,
    paged_only: bool = False,
) -> PageAllocatorCore:
    """The token allocator for page size 1 (unless ``paged_only``), the paged one otherwise."""
    if page_size == 1 and not paged_only:
        return TokenToKVPoolAllocator(size, dtype, device, kvcache, need_sort, debug=debug)
    return PagedTokenToKVPoolAllocator(
        size, page_size, dtype, device, kvcache, need_sort, debug=debug
    )


def new_mapping(num_slots: int, device: torch.device) -> torch.Tensor:
    """An int64 mapping of ``num_slots + 1`` entries: zeros (unmapped) and a trailing -1.

    ``num_slots`` is ``size + page_size`` of the source space, so every slot (page 0 included)
    has an entry and ``mapping[-1] == -1`` translates ``last_loc == -1`` to -1.
    """
    mapping = torch.zeros(num_slots + 1, dtype=torch.int64, device=device)
    mapping[-1] = -1
    return mapping


def slots_of_pages_touched(index: torch.Tensor, page_size: int) -> torch.Tensor:
    """Every slot of every page any entry of ``index`` touches (``torch.unique``: syncs)."""
    idx = index.to(torch.int64)
    if page_size == 1:
        return idx
    pages: torch.Tensor = torch.unique(idx // page_size)
    offsets = torch.arange(page_size, dtype=torch.int64, device=idx.device)
    return (pages[:, None] * page_size + offsets).reshape(-1)
