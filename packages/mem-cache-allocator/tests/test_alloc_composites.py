"""SWA, HiSparse and Mamba-slot allocators: mappings registered into real pools, rollback."""

from __future__ import annotations

import pytest
import torch

from mem_cache_allocator.hisparse import HiSparseTokenToKVPoolAllocator
from mem_cache_allocator.mamba import MambaSlotAllocator
from mem_cache_allocator.swa import SWATokenToKVPoolAllocator

F16 = torch.float16


def t(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def extend(a, pre: list[int], seq: list[int], last: list[int]):  # type: ignore[no-untyped-def]
    return a.alloc_extend(
        torch.tensor(pre),
        torch.tensor(pre),
        torch.tensor(seq),
        torch.tensor(seq),
        torch.tensor(last),
        sum(seq) - sum(pre),
    )


def swa_pool(size: int = 64, size_swa: int = 32, ps: int = 4):  # type: ignore[no-untyped-def]
    from mem_cache_pool.swa import SWAKVPool

    return SWAKVPool(size, size_swa, ps, F16, 1, 8, [0], [1], "cpu")


def swa(size: int = 64, size_swa: int = 32, ps: int = 4, pool: bool = True):  # type: ignore[no-untyped-def]
    kv = swa_pool(size, size_swa, ps) if pool else None
    return SWATokenToKVPoolAllocator(size, size_swa, ps, F16, "cpu", kv, debug=True)


# ------------------------------------------------------------------ SWA
def test_alloc_swa_mapping_is_registered_and_in_step() -> None:
    a = swa()
    pool = a.get_kvcache()
    assert pool is not None
    m = a.full_to_swa_index_mapping
    assert m.dtype == torch.int64 and m.shape == (64 + 4 + 1,) and int(m[-1]) == -1
    assert a.size_full == 64 and a.size_swa == 32 and a.size == 32
    full = extend(a, [0, 0], [6, 3], [-1, -1])
    assert full is not None
    win = a.translate_loc_from_full_to_swa(full)
    assert torch.equal(win % 4, full % 4)  # same in-page offsets
    assert bool((win > 0).all())
    assert torch.equal(pool.translate_loc_from_full_to_swa(full), win)  # the pool reads it
    assert a.available_size() == min(64 - 12, 32 - 12)
    # continue request 0 (prefix 6, last_loc = full[5]); the window side continues its page
    more = extend(a, [6], [9], [int(full[5])])
    assert more is not None
    assert a.translate_loc_from_full_to_swa(more).tolist()[0] == int(win[5]) + 1


def test_alloc_swa_decode_rolls_back_full_side_when_window_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = swa()
    full = extend(a, [0], [4], [-1])
    assert full is not None
    before_full = a.full_attn_allocator.free_pages_tensor()
    before_avail = a.full_available_size()
    monkeypatch.setattr(a.swa_attn_allocator, "alloc_decode", lambda *args: None)
    assert a.alloc_decode(t(5), t(5), t(int(full[-1]))) is None
    assert a.full_available_size() == before_avail
    assert torch.equal(a.full_attn_allocator.free_pages_tensor(), before_full)


def test_alloc_swa_shortage_on_window_side_changes_nothing() -> None:
    a = swa(64, 16, 4)  # 4 window pages
    assert extend(a, [0], [12], [-1]) is not None  # 3 pages each side
    before = (a.full_available_size(), a.swa_available_size())
    assert extend(a, [0], [8], [-1]) is None  # window has 1 page left
    assert a.alloc(8) is None
    assert (a.full_available_size(), a.swa_available_size()) == before


def test_alloc_swa_free_and_free_swa_clear_mapping() -> None:
    a = swa()
    full = extend(a, [0], [10], [-1])  # 3 pages, last one partial
    assert full is not None
    a.free_swa(full[:4])  # the first page left the window
    assert a.swa_available_size() == 32 - 8
    assert a.full_available_size() == 64 - 12
    assert a.translate_loc_from_full_to_swa(full[:4]).tolist() == [0, 0, 0, 0]
    a.free(full)
    assert a.full_available_size() == 64 and a.swa_available_size() == 32
    assert int(a.full_to_swa_index_mapping[:-1].abs().sum()) == 0
    assert int(a.full_to_swa_index_mapping[-1]) == -1


def test_alloc_swa_free_group_defers_both_sides() -> None:
    a = swa()
    x = extend(a, [0, 0], [4, 8], [-1, -1])
    assert x is not None
    a.free_group_begin()
    with pytest.raises(RuntimeError, match="free group is open"):
        a.free_group_begin()
    view = x.clone()
    a.free(view[:4])
    a.free(view[4:])
    view.fill_(0)
    assert a.available_size() == 32 - 12
    a.free_group_end()
    assert a.available_size() == 32 and a.full_available_size() == 64


def test_alloc_swa_tail_maps_only_the_tail() -> None:
    a = swa()
    full = a.alloc_extend_swa_tail(t(0), t(0), t(10), t(10), t(-1), 10, 3)
    assert full is not None and full.numel() == 10
    win = a.translate_loc_from_full_to_swa(full)
    assert win[:7].tolist() == [0] * 7 and bool((win[7:] > 0).all())
    assert a.swa_available_size() == 32 - 4 and a.full_available_size() == 64 - 12
    with pytest.raises(ValueError, match="one request"):
        a.alloc_extend_swa_tail(t(0, 0), t(0, 0), t(1, 1), t(1, 1), t(-1, -1), 2, 1)


def test_alloc_swa_backup_restore_and_clear() -> None:
    a = swa(pool=False)
    state = a.backup_state()
    x = extend(a, [0], [5], [-1])
    assert x is not None
    a.restore_state(state)
    assert a.available_size() == 32
    assert int(a.full_to_swa_index_mapping[:-1].abs().sum()) == 0
    assert extend(a, [0], [5], [-1]) is not None
    a.clear()
    assert a.available_size() == 32 and int(a.full_to_swa_index_mapping[-1]) == -1


def test_alloc_swa_page_size_one_uses_token_allocators() -> None:
    a = SWATokenToKVPoolAllocator(16, 8, 1, F16, "cpu", swa_pool(16, 8, 1))
    x = a.alloc(3)
    assert x is not None and x.tolist() == [1, 2, 3]
    assert a.translate_loc_from_full_to_swa(x).tolist() == [1, 2, 3]
    d = a.alloc_decode(t(4), t(4), t(3))
    assert d is not None and a.available_size() == 4
    a.free(x)
    assert a.swa_available_size() == 7 and a.full_available_size() == 15


# ------------------------------------------------------------------ HiSparse
def hisparse_pool(size: int = 32, ps: int = 4, ratio: int = 2):  # type: ignore[no-untyped-def]
    from mem_cache_pool.hisparse import HiSparseDSATokenToKVPool

    return HiSparseDSATokenToKVPool(
        size, ps, torch.bfloat16, 16, 8, 1, "cpu", index_buf_size=size * ratio
    )


def hisparse(pool: bool = True) -> HiSparseTokenToKVPoolAllocator:
    kv = hisparse_pool() if pool else None
    return HiSparseTokenToKVPoolAllocator(32, 4, torch.bfloat16, "cpu", kv, debug=True)


def test_alloc_hisparse_extend_maps_logical_to_device() -> None:
    a = hisparse()
    assert a.size == a.size_full == 64 and a.size_hisparse == 32
    m = a.full_to_hisparse_device_index_mapping
    assert m.shape == (64 + 4 + 1,) and int(m[-1]) == -1
    logical = extend(a, [0], [6], [-1])
    assert logical is not None
    dev = m[logical]
    assert bool((dev > 0).all()) and torch.equal(dev % 4, logical % 4)
    from mem_cache_pool.hisparse import HiSparseDSATokenToKVPool

    pool = a.get_kvcache()
    assert isinstance(pool, HiSparseDSATokenToKVPool)
    assert torch.equal(pool.translate_loc_to_device(logical), dev)
    assert a.available_size() == min(64 - 8, 32 - 8)
    dec = a.alloc_decode(t(7), t(7), t(int(logical[-1])))  # logical only
    assert dec is not None and int(m[dec]) == 0
    assert a.hisparse_attn_allocator.available_size() == 24


def test_alloc_hisparse_rollback_and_shortage() -> None:
    a = hisparse(pool=False)
    assert extend(a, [0], [24], [-1]) is not None  # 6 of 8 device pages
    before = (a.logical_attn_allocator.available_size(), a.hisparse_attn_allocator.available_size())
    assert extend(a, [0], [12], [-1]) is None  # device side short
    assert a.alloc(12) is None
    assert before == (
        a.logical_attn_allocator.available_size(),
        a.hisparse_attn_allocator.available_size(),
    )
    a.hisparse_attn_allocator.alloc_extend = lambda *args: None  # type: ignore[method-assign]
    assert extend(a, [0], [4], [-1]) is None  # inner failure: logical side rolled back
    assert a.logical_attn_allocator.available_size() == before[0]


def test_alloc_hisparse_device_buffer_shrinks_and_grows() -> None:
    a = hisparse(pool=False)
    m = a.full_to_hisparse_device_index_mapping
    logical = extend(a, [0], [10], [-1])  # 3 device pages (10 slots mapped)
    assert logical is not None
    dev = m[logical].clone()
    buf = a.alloc_device_buffer(logical, 8)  # shrink: keep 8, free the surplus page
    assert buf is not None and torch.equal(buf, dev[:8])
    assert int(m[logical].abs().sum()) == 0
    assert a.hisparse_attn_allocator.available_size() == 32 - 8
    logical2 = extend(a, [0], [6], [-1])  # 2 pages, 6 slots mapped
    assert logical2 is not None
    dev2 = m[logical2].clone()
    buf2 = a.alloc_device_buffer(logical2, 12)  # pad the partial page, one extra page
    assert buf2 is not None and buf2.numel() == 12
    assert buf2[:8].tolist() == [*dev2.tolist(), int(dev2[-1]) + 1, int(dev2[-1]) + 2]
    assert a.alloc_device_buffer(logical2, 64) is None  # nothing mapped any more, too big
    with pytest.raises(ValueError, match="multiple of page_size"):
        a.alloc_device_buffer(logical2, 6)


def test_alloc_hisparse_free_clears_mapping_and_groups_do_not_defer() -> None:
    a = hisparse(pool=False)
    logical = extend(a, [0], [8], [-1])
    assert logical is not None
    a.free_group_begin()
    with pytest.raises(RuntimeError, match="free group is open"):
        a.free_group_begin()
    a.free(logical)
    assert a.available_size() == 32  # applied at once
    a.free_group_end()
    assert int(a.full_to_hisparse_device_index_mapping[:-1].abs().sum()) == 0
    with pytest.raises(RuntimeError, match="no kvcache"):  # built without a pool
        a.get_cpu_copy(logical)


# ------------------------------------------------------------------ Mamba
def test_alloc_mamba_group_and_order() -> None:
    m = MambaSlotAllocator(6, "cpu")
    m.alloc_group_begin(3)  # pre-allocates [1, 2, 3]
    assert m.available_size() == 3
    a1, a2 = m.alloc(1), m.alloc(1)
    assert a1 is not None and a2 is not None and (a1.tolist(), a2.tolist()) == ([1], [2])
    m.alloc_group_end()  # slot 3 returned (appended)
    with pytest.raises(RuntimeError, match="alloc group is open"):
        m.alloc_group_begin(1)
        m.alloc_group_begin(1)
    m.alloc_group_end()
    rest = m.alloc(4)
    assert rest is not None and rest.tolist() == [5, 6, 3, 4]  # 4 left the aborted group last
    m.free(t(2, 1))
    assert m.alloc(3) is None
    last = m.alloc(2)
    assert last is not None and last.tolist() == [2, 1]
    m.alloc_group_begin(5)  # does not fit: the group is empty, alloc(1) falls through
    assert m.alloc(1) is None
    m.alloc_group_end()
    m.clear()
    assert m.available_size() == 6
