"""SWA window pages released by segment frees come back in SGLang 0.5.23's order.

SGLang's ``SWATokenToKVPoolAllocator.free_swa_segment`` (and ``free_segment``, which calls it)
releases one window page per full page of the segment, in position order, with
``free_page_ids`` (no dedup, no sort: in front of the free list); ``free_swa`` / ``free`` of a
slot set release sorted unique pages. In a free group the segment pages are released first and
the set pages in front of them. The next allocation shows the order (need_sort off). The
SGLang-in-the-loop test ``tests/sglang/test_swa_radix_loop.py`` compares this against SGLang's
own class; these cases pin it without the wheel.
"""

from __future__ import annotations

import torch

from mem_cache_allocator import SWATokenToKVPoolAllocator
from mem_cache_pool import SWAKVPool

PS = 4


def _alloc() -> SWATokenToKVPoolAllocator:
    kv = SWAKVPool(64, 64, PS, torch.float32, 1, 2, [1], [0], "cpu")
    return SWATokenToKVPoolAllocator(64, 64, PS, torch.float32, "cpu", kv, False)


def _extend(a: SWATokenToKVPoolAllocator, n: int) -> torch.Tensor:
    z = torch.zeros(1, dtype=torch.int64)
    s = torch.tensor([n])
    out = a.alloc_extend(z, z, s, s, torch.tensor([-1]), n)
    assert out is not None
    return out


def _window_pages(a: SWATokenToKVPoolAllocator, slots: torch.Tensor) -> list[int]:
    return (a.translate_loc_from_full_to_swa(slots)[::PS] // PS).tolist()


def _row_with_descending_pages(a: SWATokenToKVPoolAllocator) -> torch.Tensor:
    r1, r2 = _extend(a, 8), _extend(a, 8)  # window pages 1, 2 and 3, 4
    a.free(r1)
    a.free(r2)  # set frees: [3, 4] in front of [1, 2]
    row = _extend(a, 16)
    assert _window_pages(a, row) == [3, 4, 1, 2]
    return row


def test_free_swa_segment_releases_pages_in_position_order() -> None:
    a = _alloc()
    row = _row_with_descending_pages(a)
    a.free_swa_segment(row, start_pos=0)
    assert _window_pages(a, _extend(a, 16)) == [3, 4, 1, 2]


def test_free_segment_releases_both_sides_in_position_order() -> None:
    a = _alloc()
    row = _row_with_descending_pages(a)
    a.free_segment(row, start_pos=0)
    nxt = _extend(a, 16)
    assert (nxt[::PS] // PS).tolist() == [3, 4, 1, 2]  # full side: free_segment's order
    assert _window_pages(a, nxt) == [3, 4, 1, 2]


def test_group_end_puts_set_pages_in_front_of_segment_pages() -> None:
    a = _alloc()
    row = _row_with_descending_pages(a)
    other = _extend(a, 8)  # window pages 5, 6
    a.free_group_begin()
    a.free_swa_segment(row, start_pos=0)
    a.free_swa(other)
    assert len(a.swa_page_ids_group) == 1 and len(a.swa_free_group) == 1
    a.free_group_end()
    assert _window_pages(a, _extend(a, 24)) == [5, 6, 3, 4, 1, 2]
