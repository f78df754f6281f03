"""SGLang 0.5.23's scheduler-facing allocator hooks (issue 24): the answers SGLang's base and SWA
allocators give, over a minimal prefix cache that records what it is asked to evict."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from mem_cache_allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from mem_cache_allocator._prefill_budget import (
    PrefillBudget,
    SWAPrefillBudget,
    estimate_swa_kv_tokens,
)
from mem_cache_allocator.swa import SWATokenToKVPoolAllocator

FP = torch.float32


class _Cache:
    """Prefix cache stand-in: holds ``slots`` evictable; evicting frees them via the allocator."""

    def __init__(self, allocator: Any, slots: torch.Tensor, window: int | None = None) -> None:
        self.allocator, self.slots, self.asked = allocator, slots, []
        self.sliding_window_size = window

    def supports_prefix_sharing(self) -> bool:
        return True

    def supports_mamba(self) -> bool:
        return False

    def evictable_size(self) -> int:
        return int(self.slots.numel())

    full_evictable_size = swa_evictable_size = evictable_size

    def evict(self, params: Any) -> Any:
        self.asked.append((params.num_tokens, params.swa_num_tokens))
        n = max(params.num_tokens, params.swa_num_tokens)
        take, self.slots = self.slots[:n], self.slots[n:]
        if take.numel():
            self.allocator.free(take)
        return types.SimpleNamespace(num_tokens_evicted=int(take.numel()))

    evict_for_alloc = evict


def _paged(size: int = 64, ps: int = 4) -> PagedTokenToKVPoolAllocator:
    return PagedTokenToKVPoolAllocator(size, ps, FP, "cpu", None)


def test_evict_and_check_decode_capacity_as_sglang_base() -> None:
    a = _paged()
    held = a.alloc(64)
    assert held is not None and a.available_size() == 0
    cache = _Cache(a, held[:32])
    assert a.evict_to_free_tokens(cache, 8) is None
    assert cache.asked == [(8, 0)] and a.available_size() == 8
    assert a.evict_to_free_tokens(cache, 8) is None and cache.asked == [(8, 0)]  # no shortfall
    assert a.check_decode_capacity(num_tokens=20, tree_cache=cache) is True
    assert cache.asked[-1] == (12, 0)
    assert a.check_decode_capacity(num_tokens=64, tree_cache=cache) is False  # 32 locked
    assert a.evict_to_free_tokens(None, 100) is None  # no cache: nothing to evict
    with pytest.raises(TypeError, match="tree_cache"):
        a.evict_to_free_tokens(object(), 4)
    with pytest.raises(ValueError, match="num_tokens"):
        a.check_decode_capacity(num_tokens=-1, tree_cache=None)


def test_static_pool_answers() -> None:
    a = TokenToKVPoolAllocator(32, FP, "cpu", None)
    assert a.request_slot_reserve(has_req_pool_slot=False, prefill_tokens=9) == 0
    assert a.prealloc_fits_assumes_reclaim() is False
    assert a.prealloc_ceiling_fits(10, 0) is None
    assert a.prealloc_fits(None, 10, 3, full_budget_tokens=10) is True
    assert a.prealloc_fits(None, 10, 3, full_budget_tokens=10, swa_budget_tokens=2) is False
    assert a.verify_byte_accounting() == [] and a.mamba_full_cache_donor() is None
    kv = torch.tensor([3, 1])
    assert a.translate_kv_indices_for_transfer(kv) is kv
    lens = torch.tensor([0, 4])
    demand = a.get_extend_allocation_demand(
        lens, lens + 3, conservative_num_tokens=17, shard_size=1
    )
    assert demand == 17
    p = _paged(64, 16)
    # SGLang's clip: capacity - prompt in whole pages - a page - the padding slot
    kw = {"token_capacity": 64, "sliding_window_size": None, "chunk_size": None}
    assert p.max_new_tokens_for_memory(17, 100, **kw) == 64 - 32 - 16 - 1
    assert p.max_new_tokens_for_memory(17, 5, **kw) == 5
    assert p.max_new_tokens_for_memory(60, 5, **kw) == 0
    with pytest.raises(TypeError, match="event"):
        p.set_hicache_transfer_done_event((1, "write"), object())
    p.set_hicache_transfer_done_event((1, "write"), types.SimpleNamespace(query=lambda: True))


def test_get_all_free_pages_and_staging_views() -> None:
    a = PagedTokenToKVPoolAllocator(32, 4, FP, "cpu", None, need_sort=True)
    out = a.alloc(16)
    assert out is not None
    a.free(out[:8])
    assert a.num_staged_pages == 2 and [t.tolist() for t in a.staged_pages] == [[1, 2]]
    assert a.get_all_free_pages().tolist() == [5, 6, 7, 8, 1, 2]
    a.free_group_begin()
    a.free_segment(out[8:], start_pos=0)
    assert [t.tolist() for t in a.free_page_ids_group] == [[3, 4]]
    a.free_group_end()
    assert a.free_page_ids_group == [] and a.available_size() == 32
    assert a.debug_mode is False and a.use_triton_kernels is False


def test_resize_rebuilds_and_clears() -> None:
    a = _paged(64, 4)
    assert a.alloc(16) is not None
    a.resize(types.SimpleNamespace(max_total_num_tokens=128))
    assert (a.size, a.num_pages, a.available_size()) == (128, 32, 128)
    got = a.alloc(128)
    assert got is not None and got.tolist() == list(range(4, 132))
    with pytest.raises(TypeError, match="config"):
        a.resize(object())
    assert a.available_size() == 0  # the failed resize changed nothing


def test_cpu_copy_forwards_req_pool_index_only_when_given() -> None:
    calls: list[Any] = []

    class Pool:
        def get_cpu_copy(self, indices: torch.Tensor, **kw: Any) -> str:
            calls.append(kw)
            return "copy"

        def load_cpu_copy(self, data: Any, indices: torch.Tensor, **kw: Any) -> None:
            calls.append(kw)

    a = PagedTokenToKVPoolAllocator(32, 4, FP, "cpu", Pool())  # type: ignore[arg-type]
    idx = torch.tensor([4, 5])
    assert a.get_cpu_copy(idx) == "copy"
    assert a.get_cpu_copy(idx, mamba_indices=None, req_pool_index=3) == "copy"
    a.load_cpu_copy("copy", idx, None, 3)
    assert calls == [{}, {"req_pool_index": 3}, {"req_pool_index": 3}]


def test_prefill_budget_arithmetic() -> None:
    a = _paged(64, 4)
    held = a.alloc(16)
    assert held is not None
    cache = _Cache(a, held[:8])
    b = a.create_prefill_budget(cache, num_mixed_decode_tokens=2)
    assert isinstance(b, PrefillBudget)
    assert (b.remaining_total, b.remaining_current) == (48 + 8 - 2, 48 + 8 - 2)
    assert b.check_prefill(
        extend_input_len=10,
        total_tokens=20,
        max_new_tokens=10,
        input_tokens=10,
        swa_host_hit_length=0,
        chunk_limit=7,
    ) == (True, 7)
    b.reserve(10, 6)  # 12 (pages) + 4 (a page) now, 6 later
    assert (b.total_offset, b.current_offset) == (2 + 16 + 6, 2 + 16)
    assert b.check_prefill(
        extend_input_len=10,
        total_tokens=40,
        max_new_tokens=0,
        input_tokens=10,
        swa_host_hit_length=0,
        chunk_limit=None,
    ) == (False, None)
    assert (b.remaining_total, b.remaining_current) == (56 - 24, 56 - 18)
    assert b.available_chunk_tokens(100) == 32
    kw = {"extend_input_len": 0, "max_new_tokens": 0, "chunk_limit": None}
    assert b.can_allocate_prefill(paged_input=32, **kw)
    assert not b.can_allocate_prefill(paged_input=33, **kw)
    with pytest.raises(TypeError, match="tree_cache"):
        a.create_prefill_budget(object())


def test_estimate_swa_kv_tokens() -> None:
    assert estimate_swa_kv_tokens(10, 5, sliding_window_size=None, page_size=4) == 19
    # tail out of the window + one window of live tokens + a page
    assert estimate_swa_kv_tokens(100, 5, sliding_window_size=32, page_size=4) == 68 + 32 + 4
    assert (
        estimate_swa_kv_tokens(
            100, 5, sliding_window_size=32, page_size=4, allocation_limit=40, host_hit_length=5
        )
        == 8 + 32 + 4 + 8
    )


def test_swa_hooks_as_sglang() -> None:
    a = SWATokenToKVPoolAllocator(64, 32, 4, FP, "cpu", None)
    out = a.alloc(32)
    assert out is not None
    assert a.new_pages_available(8, 0) and not a.new_pages_available(0, 1)
    cache = _Cache(a, out[:16], window=8)
    a.evict_to_free_tokens(cache, 8)
    assert cache.asked == [(0, 8)]  # only the window side was short
    assert (a.full_available_size(), a.swa_available_size()) == (40, 8)
    assert a.reclaim_for_prealloc(cache, 0, 16) is None and cache.asked[-1] == (0, 8)
    assert a.reclaim_for_prealloc(cache, 0, 32) is not None  # nothing left to evict
    assert a.swa_capacity_and_available(full_capacity=7, swa_capacity=5) == ((7, 48), (5, 16))
    b = a.create_prefill_budget(cache)
    assert isinstance(b, SWAPrefillBudget) and b.remaining_swa == 16
    assert (a.swa_req_ring, a.swa_ring_cost_tokens) == (False, 0)
    rest = out[16:]
    assert a.translate_swa_indices_for_transfer(rest).tolist() == rest.tolist()
    a.free_swa_segment(rest[:8], start_pos=16)  # window pages go, full slots stay
    assert (a.full_available_size(), a.swa_available_size()) == (48, 24)
    a.free_full_segment(rest[:8], start_pos=16)
    assert a.full_available_size() == 56
    a.clear_full_to_swa_mapping(rest[8:])
    assert a.translate_loc_from_full_to_swa(rest[8:]).tolist() == [0] * 8
    a.resize(types.SimpleNamespace(full_max_total_num_tokens=32, swa_max_total_num_tokens=16))
    assert (a.size_full, a.size_swa, a.available_size()) == (32, 16, 16)
    with pytest.raises(ValueError, match="full_max_total_num_tokens"):
        a.resize(types.SimpleNamespace(full_max_total_num_tokens=128, swa_max_total_num_tokens=8))
    assert (a.size_full, a.size_swa) == (32, 16)
