"""DeepSeekV4HiSparseTokenToKVPoolAllocator: conformance kit, hand-worked slots, accounting."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from mem_cache_allocator.deepseek_v4_hisparse import DeepSeekV4HiSparseTokenToKVPoolAllocator
from mem_cache_allocator.paged import PagedTokenToKVPoolAllocator
from mem_cache_allocator.testing import allocator_state_machine
from mem_cache_pool.deepseek_v4 import DeepSeekV4TokenToKVPool

FP8 = torch.float8_e4m3fn
I64 = torch.int64


def _pool(
    ratios: tuple[int, ...], *, page_size: int, c4_size: int, c128_size: int, hisparse: bool = True
) -> DeepSeekV4TokenToKVPool:
    return DeepSeekV4TokenToKVPool(
        2, 16, c4_size, c128_size, 2, 2, page_size, 4, FP8, torch.float32, torch.float32,
        448, 64, 16, len(ratios), "cpu", False, list(ratios), enable_hisparse=hisparse,
        state_dim=8,
    )  # fmt: skip


def _alloc(debug: bool = True) -> DeepSeekV4HiSparseTokenToKVPoolAllocator:
    """Logical 512 tokens (4 pages of 128); c4 device 64 slots (2 pages of 32)."""
    pool = _pool((0, 4, 128), page_size=128, c4_size=64, c128_size=4)
    logical = PagedTokenToKVPoolAllocator(pool.size, 128, FP8, "cpu", pool, debug=debug)
    return DeepSeekV4HiSparseTokenToKVPoolAllocator(logical, debug=debug)


def _extend(
    a: DeepSeekV4HiSparseTokenToKVPoolAllocator, prefix: list[int], seq: list[int], last: list[int]
) -> torch.Tensor | None:
    p, s = torch.tensor(prefix, dtype=I64), torch.tensor(seq, dtype=I64)
    return a.alloc_extend(p, p, s, s, torch.tensor(last, dtype=I64), int((s - p).sum()))


def _mapped(a: DeepSeekV4HiSparseTokenToKVPoolAllocator) -> dict[int, int]:
    m = a.full_to_hisparse_device_index_mapping
    return {i: int(m[i]) for i in torch.nonzero(m[:-1]).reshape(-1).tolist()}


# ----------------------------------------------------------------------------- conformance kit


def _kit_factory(need_sort: bool) -> DeepSeekV4HiSparseTokenToKVPoolAllocator:
    # logical 64 tokens in pages of 16; c4 device 16 slots in pages of 4 (as many pages)
    pool = _pool((0, 4), page_size=16, c4_size=16, c128_size=0)
    logical = PagedTokenToKVPoolAllocator(pool.size, 16, FP8, "cpu", pool, need_sort, debug=True)
    return DeepSeekV4HiSparseTokenToKVPoolAllocator(logical, debug=True)


@pytest.mark.parametrize("need_sort", [False, True])
def test_conformance_kit(need_sort: bool) -> None:
    # need_sort reorders logical pages: a prefix ending on a page boundary then has its last
    # compressed entry on a non-adjacent page (regression: the device last_loc placeholder)
    machine = allocator_state_machine(lambda: _kit_factory(need_sort), decode=False)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=10,
            stateful_step_count=15,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


# ----------------------------------------------------------------------------- hand-worked


def test_construction_and_capacity() -> None:
    a = _alloc()
    assert (a.page_size, a.hisparse_page_size, a.size, a.size_hisparse) == (128, 32, 512, 64)
    assert a.compress_ratio == 4 and a.c4_logical_size == 128
    m = a.full_to_hisparse_device_index_mapping
    assert m.shape == (128 + 32 + 1,) and int(m[-1]) == -1 and int(m[:-1].abs().sum()) == 0
    pool = a.get_kvcache()
    assert isinstance(pool, DeepSeekV4TokenToKVPool)
    assert pool.c4_kv_pool.full_to_hisparse_device_index_mapping is m  # type: ignore[union-attr]
    # min(logical 512, 4 x device 64)
    assert a.available_size() == 256
    with pytest.raises(TypeError, match="HiSparseC4DevicePool"):
        plain = _pool((0, 4), page_size=16, c4_size=16, c128_size=0, hisparse=False)
        DeepSeekV4HiSparseTokenToKVPoolAllocator(
            PagedTokenToKVPoolAllocator(plain.size, 16, FP8, "cpu", plain)
        )
    with pytest.raises(TypeError, match="DeepSeekV4TokenToKVPool"):
        DeepSeekV4HiSparseTokenToKVPoolAllocator(
            PagedTokenToKVPoolAllocator(64, 16, FP8, "cpu", None)
        )


def test_compressed_last_loc_translation() -> None:
    a = _alloc()
    last = torch.tensor([-1, 3, 6, 7, 8, 131], dtype=I64)
    assert a.get_last_loc_compressed(last).tolist() == [-1, 0, 0, 1, 1, 32]
    assert a.get_last_loc_hisparse_device(torch.tensor([-1])).tolist() == [-1]


def test_alloc_extend_hand_worked_slots_and_mapping() -> None:
    a = _alloc()
    taken = a.hisparse_attn_allocator.alloc(32)  # device page 1 busy: logical/device diverge
    assert taken is not None and taken[0] == 32
    # req0: 9 tokens -> logical page 1 (128..136), entries at positions 3, 7 -> c4 32, 33
    # req1: 3 tokens -> logical page 2 (256..258), no complete entry
    out = _extend(a, [0, 0], [9, 3], [-1, -1])
    assert out is not None
    assert out.tolist() == [*range(128, 137), 256, 257, 258]
    assert _mapped(a) == {32: 64, 33: 65}  # device page 2
    assert a.logical_attn_allocator.available_size() == 512 - 2 * 128
    assert a.hisparse_attn_allocator.available_size() == 0
    assert a.available_size() == 0  # 4 x device 0
    # req0 continues: positions 9..19, compressed prefix 2 ends mid device page -> 66, 67, 68
    out2 = _extend(a, [9], [20], [136])
    assert out2 is not None and out2.tolist() == list(range(137, 148))
    assert _mapped(a) == {32: 64, 33: 65, 34: 66, 35: 67, 36: 68}
    # a new request needs a device page: none left -> None, nothing changed
    before = (a.logical_attn_allocator.available_size(), _mapped(a))
    assert _extend(a, [0], [8], [-1]) is None
    assert (a.logical_attn_allocator.available_size(), _mapped(a)) == before
    # ... but 3 tokens need no compressed slot
    assert _extend(a, [0], [3], [-1]) is not None


def test_extend_after_a_prefix_without_complete_entry() -> None:
    a = _alloc()  # debug: the device allocator checks last_loc == -1 iff its prefix is empty
    first = _extend(a, [0], [1], [-1])
    assert first is not None and _mapped(a) == {}
    second = _extend(a, [1], [2], [int(first[0])])  # compressed prefix still empty
    assert second is not None and _mapped(a) == {}
    third = _extend(a, [2], [9], [int(second[0])])
    assert third is not None and _mapped(a) == {32: 32, 33: 33}


def test_extend_from_a_page_boundary_after_a_non_adjacent_page() -> None:
    a = _kit_factory(need_sort=False)  # logical pages of 16, device pages of 4, debug
    r0 = _extend(a, [0], [16], [-1])  # logical page 1, entries 4..7 -> device page 1
    r1 = _extend(a, [0], [2], [-1])  # logical page 2, no entry
    assert r0 is not None and r1 is not None
    r0b = _extend(a, [16], [17], [int(r0[-1])])  # logical page 3 (slot 48)
    assert r0b is not None and r0b.tolist() == [48]
    # prefix 17: L = 48 sits at a page start; (L - 3) // 4 = 11 names page 2's (unmapped)
    # entry, yet the device side must continue fine: entries at positions 19, 23 -> page 2
    r0c = _extend(a, [17], [24], [48])
    assert r0c is not None and r0c.tolist() == list(range(49, 56))
    assert _mapped(a) == {4: 4, 5: 5, 6: 6, 7: 7, 12: 8, 13: 9}


@pytest.mark.parametrize("debug", [False, True])
def test_extend_after_logical_only_entry_gets_a_fresh_device_page(debug: bool) -> None:
    # issue 19 item 7: SGLang continues from the unmapped last entry (device slot 0) and hands
    # out slot 1 of the padding page; here the request gets a fresh device page instead
    a = _alloc(debug)
    p, s = torch.tensor([0]), torch.tensor([6])
    out = a.alloc_logical_only(p, p, s, s, torch.tensor([-1]), 6)  # entry at position 3 unmapped
    assert out is not None and _mapped(a) == {}
    more = _extend(a, [6], [10], [int(out[-1])])
    assert more is not None and more.tolist() == [134, 135, 136, 137]
    assert _mapped(a) == {33: 33}  # entry at position 7: device page 1, in-page offset 1
    assert a.hisparse_attn_allocator.available_size() == 32
    a.free(torch.cat([out, more]))
    assert a.available_size() == 256 and a.hisparse_attn_allocator.available_size() == 64


def test_free_releases_both_sides_and_clears_mapping() -> None:
    a = _alloc()
    full = a.available_size()
    out = _extend(a, [0, 0], [40, 17], [-1, -1])
    assert out is not None and len(_mapped(a)) == 10 + 4
    a.free(out[:40])
    assert _mapped(a) == {64 + k: 64 + k for k in range(4)}  # req1: logical page 2, device page 2
    a.free_hisparse(out[40:])  # the coordinator's free first ...
    assert _mapped(a) == {}
    a.free(out[40:])  # ... then the logical free: no double free of device slots
    assert a.available_size() == full
    assert a.hisparse_attn_allocator.available_size() == 64


def test_alloc_decode_is_logical_only() -> None:
    a = _alloc()
    out = _extend(a, [0], [7], [-1])
    assert out is not None
    dev_before = a.hisparse_attn_allocator.available_size()
    s = torch.tensor([8])
    dec = a.alloc_decode(s, s, out[-1:])
    assert dec is not None and dec.tolist() == [int(out[-1]) + 1]
    assert a.hisparse_attn_allocator.available_size() == dev_before
    assert _mapped(a) == {32: 32}  # the decode token completes entry 33: no device slot yet


def _compressed(full: torch.Tensor) -> torch.Tensor:
    """What SGLang's coordinator passes to alloc_device_buffer: the logical compressed slots."""
    return full[3::4] // 4


def test_alloc_device_buffer_grows_from_compressed_indices() -> None:
    a = _alloc()
    out = _extend(a, [0], [20], [-1])  # 5 entries (compressed 32..36) -> device slots 32..36
    assert out is not None
    buf = a.alloc_device_buffer(_compressed(out), 64)  # two device pages
    assert buf is not None and buf.tolist() == list(range(32, 96))  # rest of page 1, page 2
    assert _mapped(a) == {}  # the buffer owns the device slots now
    assert a.hisparse_attn_allocator.available_size() == 0
    # nothing of the request is mapped any more and the device is full: no second buffer
    assert a.alloc_device_buffer(_compressed(out), 32) is None
    a.free(out)
    assert a.hisparse_attn_allocator.available_size() == 0  # buffers are the coordinator's
    a.free_hisparse_indices(buf)
    assert a.available_size() == 256 and a.hisparse_attn_allocator.available_size() == 64


def test_alloc_device_buffer_puts_the_newest_entry_at_need_minus_c4_page() -> None:
    a = _alloc()
    out = _extend(a, [0], [256], [-1])  # 64 entries -> device pages 1 and 2 (slots 32..95)
    assert out is not None
    buf = a.alloc_device_buffer(_compressed(out), 32)
    # 0.5.23: the newest (95) is swapped into index need - c4_page = 0; both pages hold buffer
    # slots, so neither is freed
    assert buf is not None and buf.tolist() == [95, *range(33, 64)]
    assert a.hisparse_attn_allocator.available_size() == 0 and _mapped(a) == {}
    a.free_hisparse_indices(buf)  # frees every page the buffer touches
    assert a.hisparse_attn_allocator.available_size() == 64
    with pytest.raises(ValueError, match="multiple of the c4 page size 32"):
        a.alloc_device_buffer(_compressed(out), 16)


def test_alloc_device_buffer_swap_and_pad_never_repeat_a_slot() -> None:
    # SGLang 0.5.23 pads from the last listed slot, which the swap made an older one:
    # [4, 5, 6, 7, 9, 8, 9, 10] (slot 9 twice). Here the pad follows the newest entry.
    a = _kit_factory(False)  # c4 page 4, device pages 1..4
    out = _extend(a, [0], [24], [-1])  # 6 entries -> device slots 4..9
    assert out is not None and sorted(_mapped(a).values()) == list(range(4, 10))
    buf = a.alloc_device_buffer(_compressed(out), 8)
    assert buf is not None and buf.tolist() == [4, 5, 6, 7, 9, 8, 10, 11]
    assert a.hisparse_attn_allocator.available_size() == 8  # pages 1 and 2 are the buffer's


def test_alloc_device_buffer_out_of_pages_changes_nothing() -> None:
    a = _alloc()
    out = _extend(a, [0], [8], [-1])
    other = _extend(a, [0], [4], [-1])
    assert out is not None and other is not None
    before = (_mapped(a), a.hisparse_attn_allocator.available_size())
    assert a.alloc_device_buffer(_compressed(out), 64) is None  # needs 1 extra page
    assert (_mapped(a), a.hisparse_attn_allocator.available_size()) == before


def test_alloc_block_and_backup_restore() -> None:
    a = _alloc()
    state = a.backup_state()
    blk = a.alloc(128)
    assert blk is not None and blk.tolist() == list(range(128, 256))
    assert _mapped(a) == {32 + k: 32 + k for k in range(32)}
    a.restore_state(state)
    assert _mapped(a) == {} and a.available_size() == 256
    with pytest.raises(ValueError, match="multiple of page_size=128"):
        a.alloc(64)


def test_random_cycles_do_not_leak() -> None:
    rng = random.Random(7)
    a = _alloc(debug=False)
    cap_logical = a.logical_attn_allocator.available_size()
    cap_device = a.hisparse_attn_allocator.available_size()
    reqs: list[torch.Tensor] = []
    buffers: list[torch.Tensor] = []
    for _ in range(60):
        op = rng.random()
        if op < 0.45:
            out = _extend(a, [0], [rng.randint(1, 200)], [-1])
            if out is not None:
                reqs.append(out)
        elif op < 0.65 and reqs:
            buf = a.alloc_device_buffer(_compressed(reqs[rng.randrange(len(reqs))]), 32)
            if buf is not None:
                buffers.append(buf)
        elif op < 0.85 and reqs:
            a.free(reqs.pop(rng.randrange(len(reqs))))
        elif buffers:
            a.free_hisparse_indices(buffers.pop(rng.randrange(len(buffers))))
        # accounting: device pages in use are exactly those of mapped entries and buffers
        live = set(_mapped(a).values()) | {int(s) for b in buffers for s in b}
        pages = {s // 32 for s in live}
        assert a.hisparse_attn_allocator.available_size() + 32 * len(pages) == cap_device
        assert len(live) == len(_mapped(a)) + sum(b.numel() for b in buffers)  # no sharing
    for out in reqs:
        a.free(out)
    for buf in buffers:
        a.free_hisparse_indices(buf)
    assert _mapped(a) == {}
    assert a.logical_attn_allocator.available_size() == cap_logical
    assert a.hisparse_attn_allocator.available_size() == cap_device
