"""The private ``PairedAllocators`` component: in-step transactions, mapping, capacity, state."""

from __future__ import annotations

import pytest
import torch

from mem_cache_allocator._composite import check_need_size, new_mapping
from mem_cache_allocator._paired import PairedAllocators, check_own_state, free_page_count
from mem_cache_allocator.paged import PagedTokenToKVPoolAllocator
from mem_cache_allocator.swa import SWATokenToKVPoolAllocator

F16 = torch.float16
CPU = torch.device("cpu")


def t(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def paged(size: int, ps: int = 4) -> PagedTokenToKVPoolAllocator:
    return PagedTokenToKVPoolAllocator(size, ps, F16, CPU, None, debug=True)


def pair(size: int = 32, size2: int = 16, ps: int = 4) -> PairedAllocators:
    return PairedAllocators(paged(size, ps), paged(size2, ps), new_mapping(size + ps, CPU))


def counts(p: PairedAllocators) -> tuple[int, int]:
    return p.primary.available_size(), p.secondary.available_size()


def test_alloc_paired_alloc_maps_in_step_and_checks_both_sides() -> None:
    p = pair()
    first = p.alloc(8)
    assert first is not None and first.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert p.mapping[first].tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert p.mapping[-1] == -1 and int(p.mapping[:4].abs().sum()) == 0
    assert counts(p) == (24, 8)
    assert p.alloc(12) is None  # the secondary has 2 pages left: nothing changes
    assert counts(p) == (24, 8)
    with pytest.raises(ValueError, match="need_size must be >= 0, got -1"):
        p.alloc(-1)


@pytest.mark.parametrize("outcome", ["none", "raise"])
def test_alloc_paired_run_in_step_restores_both_sides(outcome: str) -> None:
    p = pair()
    before = counts(p)

    def second() -> torch.Tensor | None:
        assert p.secondary.alloc(4) is not None  # a partial change the rollback must undo
        if outcome == "raise":
            raise RuntimeError("secondary broke")
        return None

    if outcome == "raise":
        with pytest.raises(RuntimeError, match="secondary broke"):
            p.run_in_step(lambda: p.primary.alloc(8), second)
    else:
        assert p.run_in_step(lambda: p.primary.alloc(8), second) is None
    assert counts(p) == before
    again = p.alloc(8)  # the same slots as if nothing had happened
    assert again is not None and again.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]


def test_alloc_paired_primary_failure_skips_the_secondary() -> None:
    p = pair()
    calls: list[str] = []

    def second() -> torch.Tensor | None:
        calls.append("secondary")
        return t(4)

    assert p.run_in_step(lambda: None, second) is None
    assert calls == [] and counts(p) == (32, 16)


def test_alloc_paired_extend_and_decode_translate_last_loc_through_the_hook() -> None:
    seen: list[list[int]] = []
    primary, secondary = paged(32), paged(32)
    mapping = new_mapping(36, CPU)

    def hook(last_loc: torch.Tensor) -> torch.Tensor:
        seen.append(last_loc.tolist())
        return mapping[last_loc]

    p = PairedAllocators(primary, secondary, mapping, hook)
    secondary.alloc(4)  # shift the secondary so the two sides' slots differ
    lens = (t(0), t(0), t(3), t(3))
    first = p.alloc_extend(lens, t(-1), 3)
    assert first is not None and first.tolist() == [4, 5, 6]
    assert mapping[first].tolist() == [8, 9, 10]
    dec = p.alloc_decode(t(4), t(4), first[-1:])
    assert dec is not None and dec.tolist() == [7] and int(mapping[7]) == 11
    assert seen == [[-1], [6]]
    with pytest.raises(ValueError, match="prefix_lens_cpu must have 1 elements"):
        p.alloc_extend((t(0, 0), t(0, 0), t(3), t(3)), t(-1), 3)


def test_alloc_paired_release_frees_mapped_slots_and_clears_entries() -> None:
    p = pair()
    first = p.alloc(8)
    assert first is not None
    p.release(torch.cat([first[:4], t(20)]))  # slot 20 is unmapped (0): ignored
    assert p.mapping[first].tolist() == [0, 0, 0, 0, 8, 9, 10, 11]
    assert counts(p) == (24, 12)
    p.free_secondary(t(0, -1, 8, 9, 10, 11))
    assert counts(p) == (24, 16)


def test_alloc_paired_snapshot_restore_clear_and_owner_check() -> None:
    p = pair()
    snap = p.snapshot()
    p.alloc(8)
    p.restore(*snap)
    assert counts(p) == (32, 16) and int(p.mapping[:-1].abs().sum()) == 0
    p.alloc(8)
    p.clear()
    assert counts(p) == (32, 16) and int(p.mapping[:-1].abs().sum()) == 0
    assert p.mapping[-1] == -1
    assert p.describe("a", "b") == "#a-available-size: 32, #b-available-size: 16, "
    other = SWATokenToKVPoolAllocator(16, 16, 4, F16, "cpu", None)
    state = other.backup_state()
    assert check_own_state(state, type(state), other) is state
    with pytest.raises(ValueError, match="got SWAAllocatorState"):
        check_own_state(state, type(state), p)
    with pytest.raises(ValueError, match="got int"):
        check_own_state(3, type(state), other)


def test_alloc_paired_capacity_of_a_composite_primary() -> None:
    inner = SWATokenToKVPoolAllocator(32, 8, 4, F16, "cpu", None)  # no free_page_count
    assert free_page_count(inner) == 2 and free_page_count(paged(32)) == 8
    p = PairedAllocators(inner, paged(64), new_mapping(36, CPU))
    assert p.fits(2, 16) and not p.fits(3, 1) and not p.fits(1, 17)
    assert p.available_size(4) == 8 and p.available_size() == 8
    check_need_size(0)
    with pytest.raises(TypeError, match="need_size must be an int, got bool"):
        check_need_size(True)


def _swa_sizes(a: SWATokenToKVPoolAllocator) -> tuple[int, int]:
    return a.full_available_size(), a.swa_available_size()


def test_alloc_paired_swa_group_end_full_side_failure_releases_nothing() -> None:
    """The full side's group end fails (a double free its count sees): the window slots queued
    beside it stay allocated and both groups stay open (PairedAllocators.end_free_group)."""
    a = SWATokenToKVPoolAllocator(8, 8, 1, F16, "cpu", None)
    x = a.alloc(8)
    assert x is not None
    before, mapping = _swa_sizes(a), a.full_to_swa_index_mapping.clone()
    a.free_group_begin()
    a.free(x)
    a.free(x)  # the token allocator appends without dedup: 16 slots > capacity 8
    with pytest.raises(ValueError, match="double free"):
        a.free_group_end()
    assert _swa_sizes(a) == before
    assert not a.is_not_in_free_group and a.full_attn_allocator.free_group is not None
    assert a.free_group is not None and len(a.free_group) == 2  # the window queue is kept
    assert int(a.full_to_swa_index_mapping[x].abs().sum()) == 0  # cleared at queue time
    assert mapping[x].tolist() == list(range(1, 9))


def test_alloc_paired_swa_group_end_window_side_failure_releases_nothing() -> None:
    """The window side fails validation (its pages are free already): the full side's group is
    not ended, nothing is released, both groups stay open."""
    a = SWATokenToKVPoolAllocator(16, 8, 4, F16, "cpu", None)
    x = a.alloc(8)
    assert x is not None
    window = a.translate_loc_from_full_to_swa(x).clone()
    a.free_swa(x)  # the window pages go back; the full slots stay allocated
    a.set_full_to_swa_mapping(x, window)  # a stale mapping: those window pages are free
    before = _swa_sizes(a)
    a.free_group_begin()
    a.free(x)
    with pytest.raises(ValueError, match="double free"):
        a.free_group_end()
    assert _swa_sizes(a) == before
    assert not a.is_not_in_free_group and a.full_attn_allocator.free_group is not None
