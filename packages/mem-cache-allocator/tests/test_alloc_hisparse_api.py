"""HiSparse / DeepSeek-V4 / Mamba calls SGLang 0.5.23's scheduler and coordinator make, the
DeepSeek-V4 stack built as SGLang builds it, and the CPU-copy pass-through over real pools."""

from __future__ import annotations

import pytest
import torch

from mem_cache_allocator.deepseek_v4_hisparse import DeepSeekV4HiSparseTokenToKVPoolAllocator
from mem_cache_allocator.hisparse import HiSparseTokenToKVPoolAllocator
from mem_cache_allocator.mamba import MambaSlotAllocator
from mem_cache_allocator.paged import PagedTokenToKVPoolAllocator
from mem_cache_allocator.swa import SWATokenToKVPoolAllocator
from mem_cache_allocator.token import TokenToKVPoolAllocator
from mem_cache_pool.deepseek_v4 import DeepSeekV4TokenToKVPool
from mem_cache_pool.dsa import DSATokenToKVPool
from mem_cache_pool.hisparse import HiSparseDSATokenToKVPool
from mem_cache_pool.mha import MHATokenToKVPool
from mem_cache_pool.mla import MLATokenToKVPool
from mem_cache_pool.swa import SWAKVPool

I64 = torch.int64
FP8 = torch.float8_e4m3fn


def t(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=I64)


def _extend(a: object, pre: list[int], seq: list[int], last: list[int]) -> torch.Tensor | None:
    p, s = torch.tensor(pre, dtype=I64), torch.tensor(seq, dtype=I64)
    out: torch.Tensor | None = a.alloc_extend(  # type: ignore[attr-defined]
        p, p, s, s, torch.tensor(last, dtype=I64), int((s - p).sum())
    )
    return out


# ----------------------------------------------------------------------------- DeepSeek-V4 stack


def _deepseek_v4_pool() -> DeepSeekV4TokenToKVPool:
    """Logical 256 tokens (page 16), window 64, c4 device 64 slots (16 pages of 4)."""
    return DeepSeekV4TokenToKVPool(
        2, 64, 64, 0, 2, 2, 16, 16, FP8, torch.float32, torch.float32,
        448, 64, 16, 2, "cpu", False, [0, 4], enable_hisparse=True, state_dim=8,
    )  # fmt: skip


def _deepseek_v4_stack(need_sort: bool = False) -> DeepSeekV4HiSparseTokenToKVPoolAllocator:
    """SGLang's construction: the SWA allocator over the composite pool, HiSparse over it."""
    pool = _deepseek_v4_pool()
    swa = SWATokenToKVPoolAllocator(pool.size, 64, 16, FP8, "cpu", pool, need_sort)
    return DeepSeekV4HiSparseTokenToKVPoolAllocator(swa, debug=True)


def test_deepseek_v4_stack_builds_as_sglang_builds_it() -> None:
    # issue 19 item 2: the SWA allocator reads kvcache.full_kv_pool (None for DeepSeek-V4)
    pool = _deepseek_v4_pool()
    assert pool.full_kv_pool is None
    swa = SWATokenToKVPoolAllocator(pool.size, 64, 16, FP8, "cpu", pool, False)
    assert swa.full_attn_allocator.get_kvcache() is None
    assert swa.swa_attn_allocator.get_kvcache() is pool.swa_kv_pool
    a = DeepSeekV4HiSparseTokenToKVPoolAllocator(swa)
    assert (a.size, a.size_full, a.size_swa) == (64, 256, 64)
    assert a.full_to_swa_index_mapping is swa.full_to_swa_index_mapping
    out = _extend(a, [0], [20], [-1])
    assert out is not None and out.tolist() == list(range(16, 36))
    assert a.translate_loc_from_full_to_swa(out).tolist() == list(range(16, 36))
    assert a.swa_capacity_and_available() == ((256, 224), (64, 32))
    a.free(out)
    # SGLang's answer: the scheduler's capacities, the allocator's available sizes
    assert a.swa_capacity_and_available(full_capacity=1, swa_capacity=1) == ((1, 256), (1, 64))
    with pytest.raises(ValueError, match="full_capacity"):
        a.swa_capacity_and_available(full_capacity=-1)


def test_deepseek_v4_full_available_size_counts_the_device() -> None:
    # issue 19 item 3: min(logical full side, 4 x device available)
    a = _deepseek_v4_stack()
    out = _extend(a, [0], [16], [-1])  # 4 entries -> one device page
    assert out is not None
    buf = a.alloc_device_buffer(out[3::4] // 4, 60)  # 15 of the 16 device pages of 4
    assert buf is not None and a.hisparse_attn_allocator.available_size() == 4
    assert a.logical_attn_allocator.full_available_size() == 240  # type: ignore[attr-defined]
    assert a.full_available_size() == 16 and a.available_size() == 16
    a.free_hisparse_indices(buf)
    a.free(out)
    assert a.full_available_size() == 256


def test_deepseek_v4_free_group_defers_to_group_end() -> None:
    # issue 19 item 4: frees inside a group are applied at free_group_end, as one free
    a = _deepseek_v4_stack()
    r0 = _extend(a, [0], [16], [-1])
    r1 = _extend(a, [0], [16], [-1])
    assert r0 is not None and r1 is not None
    assert (r0.tolist()[0], r1.tolist()[0]) == (16, 32)
    before = (a.available_size(), a.full_available_size())
    a.free_group_begin()
    a.free(r0)
    a.free(r1)  # applied at once, page 2 would be reused first
    a.free_full(t(*range(0)))
    assert (a.available_size(), a.full_available_size()) == before  # nothing released yet
    a.free_group_end()
    assert a.available_size() == 64 and a.full_available_size() == 256
    nxt = _extend(a, [0], [16], [-1])
    assert nxt is not None and nxt.tolist()[0] == 16  # page 1: one sorted free of both


def test_deepseek_v4_free_full_is_queued_in_a_group() -> None:
    a = _deepseek_v4_stack()
    out = _extend(a, [0], [32], [-1])
    assert out is not None
    a.free_swa(out)
    logical = a.logical_attn_allocator
    assert a.swa_available_size() == 64 and logical.full_available_size() == 224  # type: ignore[attr-defined]
    a.free_group_begin()
    a.free_full(out)
    assert logical.full_available_size() == 224  # type: ignore[attr-defined]
    a.free_group_end()
    assert logical.full_available_size() == 256  # type: ignore[attr-defined]
    assert a.full_available_size() == 224  # the c4 entries stay mapped: 4 x 56 device slots
    a.free_hisparse(out)
    assert a.full_available_size() == 256


def test_deepseek_v4_alloc_extend_swa_tail_forwards_to_the_logical_allocator() -> None:
    # issue 12 item 6
    a = _deepseek_v4_stack()
    p, s = t(0), t(32)
    out = a.alloc_extend_swa_tail(p, p, s, s, t(-1), 32, swa_tail_len=16)
    assert out is not None and out.tolist() == list(range(16, 48))
    assert a.translate_loc_from_full_to_swa(out).tolist() == [0] * 16 + list(range(16, 32))
    assert a.hisparse_attn_allocator.available_size() == 64  # no c4 device slots
    paged = DeepSeekV4HiSparseTokenToKVPoolAllocator(
        PagedTokenToKVPoolAllocator(256, 16, FP8, "cpu", _deepseek_v4_pool())
    )
    with pytest.raises(AttributeError, match="alloc_extend_swa_tail"):
        paged.alloc_extend_swa_tail(p, p, s, s, t(-1), 32, swa_tail_len=16)


def test_deepseek_v4_scheduler_hooks() -> None:
    a = _deepseek_v4_stack()
    # SGLang 0.5.23: no workspace until the HiSparse coordinator configures one
    assert a.request_slot_reserve(has_req_pool_slot=False) == 0
    assert a.request_slot_reserve(has_req_pool_slot=True, prefill_tokens=40) == 0
    a.configure_spec_scratch(32, device_buffer_size=64)
    # buffer slots the prefill (whole pages) does not cover, plus scratch without a row
    assert a.request_slot_reserve(has_req_pool_slot=False, prefill_tokens=20) == 32 + 32
    assert a.request_slot_reserve(has_req_pool_slot=True, prefill_tokens=100) == 0
    with pytest.raises(ValueError, match="capacity"):
        a.configure_spec_scratch(-16)
    with pytest.raises(ValueError, match="device_buffer_size"):
        a.configure_spec_scratch(16, device_buffer_size=3)
    with pytest.raises(ValueError, match="prefill_tokens"):
        a.request_slot_reserve(has_req_pool_slot=False, prefill_tokens=-1)


def test_deepseek_v4_lookups_out_of_range_name_the_argument() -> None:
    a = _deepseek_v4_stack()
    with pytest.raises(ValueError, match="allocated_indices"):
        a.alloc_device_buffer(t(64 + 4 + 1), 4)
    with pytest.raises(ValueError, match="free_index"):
        a.free(t(10_000))
    with pytest.raises(ValueError, match="last_loc"):
        a.get_last_loc_hisparse_device(t(-5))


# ----------------------------------------------------------------------------- HiSparse


def _hisparse(
    size: int = 32, ps: int = 4, need_sort: bool = False
) -> HiSparseTokenToKVPoolAllocator:
    pool = HiSparseDSATokenToKVPool(
        size, ps, torch.bfloat16, 16, 8, 1, "cpu", index_buf_size=2 * size
    )
    return HiSparseTokenToKVPoolAllocator(size, ps, torch.bfloat16, "cpu", pool, need_sort)


def test_hisparse_scheduler_hooks() -> None:
    a = _hisparse()
    assert a.get_last_loc_compressed(t(5, -1)).tolist() == [5, -1]
    assert a.request_slot_reserve(has_req_pool_slot=False) == 0
    a.configure_spec_scratch(8, device_buffer_size=12)
    assert a.request_slot_reserve(has_req_pool_slot=False, prefill_tokens=5) == (12 - 8) + 8
    assert a.request_slot_reserve(has_req_pool_slot=True, prefill_tokens=5) == 4
    a.configure_spec_scratch(0, device_buffer_size=12)  # no scratch: the buffer is off too
    assert a.request_slot_reserve(has_req_pool_slot=False) == 0


def test_hisparse_device_short_alloc_frees_logical_as_sglang() -> None:
    # the logical side succeeds, the device side is short: SGLang frees the logical slots again
    a = _hisparse(8, 1, need_sort=True)
    assert a.alloc(8) is not None  # device full, logical 8 of 16 left
    assert a.alloc(4) is None
    assert a.logical_attn_allocator.available_size() == 8
    assert a.logical_attn_allocator.free_pages_tensor().tolist() == [13, 14, 15, 16, 9, 10, 11, 12]


def test_hisparse_lookups_out_of_range_name_the_argument() -> None:
    a = _hisparse()
    state = a.backup_state()
    with pytest.raises(ValueError, match="allocated_indices"):
        a.alloc_device_buffer(t(64 + 4 + 1), 4)
    with pytest.raises(ValueError, match="free_index"):
        a.free(t(1, 500))
    with pytest.raises(ValueError, match="free_indices"):
        a.free_hisparse(t(-2))
    with pytest.raises(ValueError, match="last_locs"):
        a.get_last_loc_hisparse_device(t(69))
    with pytest.raises(ValueError, match="buffer_indices"):
        a.free_hisparse_indices(t(40))
    after = a.backup_state()
    assert after.logical.free == state.logical.free and torch.equal(after.mapping, state.mapping)


def test_swa_lookup_out_of_range_names_the_argument() -> None:
    a = SWATokenToKVPoolAllocator(16, 8, 2, torch.float32, "cpu", None)
    with pytest.raises(ValueError, match="kv_indices"):
        a.translate_loc_from_full_to_swa(t(100))


# ----------------------------------------------------------------------------- Mamba


def test_mamba_schedulable_available_size() -> None:
    m = MambaSlotAllocator(6, "cpu")
    assert m.schedulable_available_size() == 6
    got = m.alloc(2)
    assert got is not None and m.schedulable_available_size() == 4 == m.available_size()


@pytest.mark.parametrize("debug", [False, True])
def test_mamba_backup_in_group_restore_after_group_end_keeps_every_slot(debug: bool) -> None:
    # issue 13 item 6: the group's pre-allocated slots leaked (2 of 8)
    m = MambaSlotAllocator(8, "cpu", debug=debug)
    m.alloc_group_begin(3)
    first = m.alloc(1)
    assert first is not None
    state = m.backup_state()
    second = m.alloc(1)
    assert second is not None
    m.alloc_group_end()
    m.restore_state(state)
    assert m.available_size() == 7  # only `first` is live
    got = m.alloc(7)
    assert got is not None and sorted(got.tolist()) == [2, 3, 4, 5, 6, 7, 8]
    m.free(got)
    m.free(first)
    assert m.available_size() == 8


def test_mamba_restore_inside_the_group_empties_it() -> None:
    m = MambaSlotAllocator(4, "cpu", debug=True)
    state = m.backup_state()
    m.alloc_group_begin(2)
    m.restore_state(state)
    assert m.available_size() == 4
    assert m.alloc(1) is not None  # falls through to the free list
    m.alloc_group_end()  # returns nothing twice
    assert m.available_size() == 3


def test_mamba_debug_names_never_allocated_slots() -> None:
    # issue 13 item 7: a never-allocated slot is not a "double free"
    m = MambaSlotAllocator(4, "cpu", debug=True)
    with pytest.raises(ValueError, match="never-allocated slots"):
        m.free(t(3))
    got = m.alloc(1)
    assert got is not None
    m.free(got)
    with pytest.raises(ValueError, match="double free"):
        m.free(got)


# ----------------------------------------------------------------------------- CPU copies


def _real_pools() -> list[tuple[str, object, bool]]:
    """``(name, pool, supports CPU copies)`` over every real pool class."""
    swa = SWAKVPool(
        size=16, size_swa=16, page_size=2, dtype=torch.float32, head_num=2, head_dim=4,
        swa_attention_layer_ids=[1], full_attention_layer_ids=[0], device="cpu",
    )  # fmt: skip
    return [
        ("mha-bf16", MHATokenToKVPool(16, 2, torch.bfloat16, 2, 4, 2, "cpu"), True),
        ("mha-fp8", MHATokenToKVPool(16, 2, FP8, 2, 4, 2, "cpu"), True),
        ("mla", MLATokenToKVPool(16, 2, torch.bfloat16, 16, 4, 2, "cpu"), True),
        ("dsa", DSATokenToKVPool(16, 2, torch.bfloat16, 16, 4, 2, "cpu"), True),
        ("swa", swa, True),
        (
            "hisparse",
            HiSparseDSATokenToKVPool(16, 2, torch.bfloat16, 16, 4, 2, "cpu", index_buf_size=32),
            False,
        ),
        ("deepseek_v4", _deepseek_v4_pool(), False),
    ]


@pytest.mark.parametrize("case", range(7))
@pytest.mark.parametrize("page_size", [1, 2])
def test_cpu_copy_passes_through_to_every_real_pool(case: int, page_size: int) -> None:
    # issue 13 item 1: mamba_indices was forwarded to pools that do not take it (TypeError)
    name, pool, supported = _real_pools()[case]
    if page_size == 1:
        a: object = TokenToKVPoolAllocator(16, torch.bfloat16, "cpu", pool)  # type: ignore[arg-type]
    else:
        a = PagedTokenToKVPoolAllocator(16, 2, torch.bfloat16, "cpu", pool)  # type: ignore[arg-type]
    idx = t(2, 3)
    if not supported:
        with pytest.raises(NotImplementedError, match=type(pool).__name__):
            a.get_cpu_copy(idx)  # type: ignore[attr-defined]
        return
    if name == "swa":
        mapping = torch.zeros(16 + 2 + 1, dtype=I64)
        mapping[-1] = -1
        mapping[2:4] = t(2, 3)
        pool.register_mapping(mapping)  # type: ignore[attr-defined]
    copy = a.get_cpu_copy(idx)  # type: ignore[attr-defined]
    a.load_cpu_copy(copy, t(4, 5))  # type: ignore[attr-defined]
    back = a.get_cpu_copy(t(4, 5)) if name != "swa" else None  # type: ignore[attr-defined]
    if back is not None:
        for role, layers in copy.items():
            for x, y in zip(layers, back[role], strict=True):
                assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), (name, role)


def test_hisparse_allocators_forward_cpu_copies_to_their_pools() -> None:
    # the pools do not support CPU copies: their own NotImplementedError, not a TypeError
    for a in (_hisparse(), _deepseek_v4_stack()):
        with pytest.raises(NotImplementedError, match="does not support get_cpu_copy"):
            a.get_cpu_copy(t(4))
        with pytest.raises(NotImplementedError, match="does not support load_cpu_copy"):
            a.load_cpu_copy({}, t(4))


def test_debug_rejects_releasing_a_device_page_other_slots_still_map_into() -> None:
    # SGLang frees every page a slot touches; releasing part of a request's device page would
    # hand the rest out again while still mapped. Debug mode refuses, before any change.
    hs = HiSparseTokenToKVPoolAllocator(
        32, 4, torch.bfloat16, "cpu", _hisparse().get_kvcache(), debug=True
    )
    out = _extend(hs, [0], [8], [-1])
    assert out is not None
    with pytest.raises(ValueError, match="still map into"):
        hs.free_hisparse(out[:2])
    assert hs.hisparse_attn_allocator.available_size() == 24
    hs.free_hisparse(out)  # the whole request: fine
    ds = _deepseek_v4_stack()
    out = _extend(ds, [0], [32], [-1])  # 8 entries on two device pages of 4
    assert out is not None
    with pytest.raises(ValueError, match="still map into"):
        ds.free_compressed(out[3:12:4] // 4)  # 3 of the 4 entries of device page 1
    ds.free_hisparse(out)
    assert ds.hisparse_attn_allocator.available_size() == 64


@pytest.mark.parametrize("grouped", [False, True])
def test_deepseek_v4_free_segments_releases_every_entry_of_a_shared_page(grouped: bool) -> None:
    a = _deepseek_v4_stack()
    out = _extend(a, [0], [40], [-1])  # logical pages 1..3; 10 entries on 3 device pages
    assert out is not None
    if grouped:
        a.free_group_begin()
    a.free_segments([(out[:20], 0), (out[20:], 20)])  # both segments touch logical page 2
    if grouped:
        a.free_group_end()
    assert a.full_available_size() == 256 and a.swa_available_size() == 64
    assert a.hisparse_attn_allocator.available_size() == 64
    assert not bool(a.full_to_hisparse_device_index_mapping[:-1].any())


def test_hisparse_free_segments_releases_every_device_slot() -> None:
    a = HiSparseTokenToKVPoolAllocator(
        32, 4, torch.bfloat16, "cpu", _hisparse().get_kvcache(), debug=True
    )
    out = _extend(a, [0], [10], [-1])
    assert out is not None
    a.free_segments([(out[:6], 0), (out[6:], 6)])  # both touch page 2 (positions 4..7)
    assert a.available_size() == 32 and a.hisparse_attn_allocator.available_size() == 32
    assert not bool(a.full_to_hisparse_device_index_mapping[:-1].any())
    with pytest.raises(ValueError):
        a.free_segments([(out[6:], 6), (out[:6], 0)])  # descending
