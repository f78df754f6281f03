"""Free-path APIs engines call (0.5.23 and newer SGLang) and the default-mode checks that need
no device->host sync: errors name the caller's argument and a failed call changes nothing."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mem_cache_allocator import (
    BaseTokenToKVPoolAllocator,
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from mem_cache_allocator.swa import SWATokenToKVPoolAllocator

F16 = torch.float16
PS = 4


def t(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def paged(need_sort: bool = False) -> PagedTokenToKVPoolAllocator:
    return PagedTokenToKVPoolAllocator(64 * PS, PS, F16, "cpu", None, need_sort)


def _state(a: Any) -> tuple[list[int], int]:
    return a.free_pages_tensor().tolist(), a.available_size()


# ------------------------------------------------------------------ free_segment(s)
def test_alloc_free_segment_matches_unique_over_every_alignment() -> None:
    """SGLang HEAD's sweep: every (start, end) releases exactly unique(row[start:end] // ps)."""
    for num_tokens in (1, PS, PS + 1, 3 * PS - 1):
        for start in range(num_tokens):
            for end in range(start + 1, num_tokens + 1):
                a = paged()
                row = a.alloc(-(-num_tokens // PS) * PS)
                assert row is not None
                row = row[:num_tokens]
                before = len(a.free_pages)
                a.free_segment(row[start:end], start_pos=start)
                freed = a.free_pages[: len(a.free_pages) - before]
                expected = torch.unique(row[start:end] // PS)
                assert torch.equal(torch.sort(freed).values, expected), (num_tokens, start, end)


@pytest.mark.parametrize(
    ("num_tokens", "spans"),
    [
        (11, [(0, 6), (6, 11)]),
        (11, [(0, 5), (7, 11)]),
        (7, [(0, 5), (5, 7)]),
        (12, [(0, 4), (4, 12)]),
    ],
)
def test_alloc_free_segments_release_a_shared_page_once(
    num_tokens: int, spans: list[tuple[int, int]]
) -> None:
    a = paged()
    row = a.alloc(-(-num_tokens // PS) * PS)
    assert row is not None
    row = row[:num_tokens]
    before = len(a.free_pages)
    a.free_segments([(row[x:y], x) for x, y in spans])
    freed = a.free_pages[: len(a.free_pages) - before]
    reference = torch.unique(torch.cat([row[x:y] for x, y in spans]) // PS)
    assert torch.equal(torch.sort(freed).values, reference)


def test_alloc_free_segments_reject_overlap_and_bad_pairs() -> None:
    a = paged()
    row = a.alloc(8)
    assert row is not None
    with pytest.raises(ValueError, match="ascending and disjoint"):
        a.free_segments([(row[2:6], 2), (row[4:8], 4)])
    with pytest.raises(TypeError, match=r"segments\[0\]"):
        a.free_segments([row])  # type: ignore[list-item]
    assert a.available_size() == 62 * PS


def test_alloc_free_segments_in_a_group_defer_and_dedup_with_free() -> None:
    a = paged()
    row = a.alloc(2 * PS)
    assert row is not None
    before = a.available_size()
    a.free_group_begin()
    a.free(row)
    a.free_segment(row, start_pos=0)  # the same pages by both kinds: released once
    assert a.available_size() == before
    a.free_group_end()
    assert a.available_size() == before + 2 * PS


def test_alloc_base_free_segments_fallback_trims_the_boundary_page() -> None:
    class Recording(BaseTokenToKVPoolAllocator):
        def __init__(self) -> None:
            super().__init__(64 * PS, PS, F16, "cpu", None, False)
            self.freed: list[set[int]] = []

        def alloc(self, need_size: int) -> torch.Tensor | None:
            raise NotImplementedError

        def clear(self) -> None:
            pass

        def free(self, free_index: torch.Tensor) -> None:
            self.freed.append(set((free_index // PS).tolist()))

    a = Recording()  # SGLang's base accepts this subclass: so does ours
    row = torch.arange(11)
    a.free_segments([(row[0:6], 0), (row[6:11], 6)])
    assert a.freed == [{0, 1}, {2}]
    a.free_full(row[:1])
    assert a.freed[-1] == {0}
    with pytest.raises(NotImplementedError):
        a.available_size()
    with pytest.raises(NotImplementedError):
        a.backup_state()
    assert a.uses_legacy_real_length_alloc is False


# ------------------------------------------------------------------ SGLang attribute views
def test_alloc_sglang_views() -> None:
    a = paged(need_sort=True)
    x = a.alloc(2 * PS)
    assert x is not None
    assert a.free_pages.tolist() == list(range(3, 65))
    assert a.release_pages.numel() == 0 and a.is_not_in_free_group and a.free_group is None
    a.free(x[:PS])
    assert a.release_pages.tolist() == [1]
    a.free_group_begin()
    a.free(x[PS:])
    assert not a.is_not_in_free_group and a.free_group is not None and len(a.free_group) == 1
    a.free_group_end()
    assert sorted(a.release_pages.tolist()) == [1, 2]
    assert PagedTokenToKVPoolAllocator.uses_legacy_real_length_alloc is False
    assert SWATokenToKVPoolAllocator.uses_legacy_real_length_alloc is False


# ------------------------------------------------------------------ default-mode free checks
@pytest.mark.parametrize("kind", ["paged", "token", "swa"])
@pytest.mark.parametrize("grouped", [False, True])
def test_alloc_free_rejects_bad_slots_without_state_change(kind: str, grouped: bool) -> None:
    a: Any
    if kind == "paged":
        a = paged()
    elif kind == "token":
        a = TokenToKVPoolAllocator(64, F16, "cpu", None)
    else:
        a = SWATokenToKVPoolAllocator(64 * PS, 32 * PS, PS, F16, "cpu", None)
    ps = a.page_size
    x = a.alloc(4 * ps) if kind != "swa" else a.alloc_extend(t(0), t(0), t(8), t(8), t(-1), 8)
    assert x is not None
    before = a.available_size()
    with pytest.raises(TypeError, match="free_index"):
        a.free([1, 2])
    with pytest.raises(TypeError, match="free_index"):  # a wrong dtype is a type mistake
        a.free(x.to(torch.float32))
    limit = (64 + 1) * ps
    for bad, what in (
        (t(int(x[0]), -1), "out-of-range"),
        (t(int(x[0]), limit), "out-of-range"),
        (t(0, int(x[0])), "padding page 0"),
    ):
        if grouped:
            a.free_group_begin()
            try:
                a.free(bad)
            except ValueError as e:  # the SWA window side checks at call time
                assert what in str(e)
            else:
                with pytest.raises(ValueError, match=what):
                    a.free_group_end()
                assert not a.is_not_in_free_group  # the group stays open: nothing changed
            a._free_group = None  # drop the rejected group (test-only reset)
            if hasattr(a, "full_attn_allocator"):
                a.full_attn_allocator._free_group = None
                a._swa_group = []
        else:
            with pytest.raises(ValueError, match=what):
                a.free(bad)
        assert a.available_size() == before
    a.free(x)
    assert a.available_size() == before + x.numel() // ps * ps


def test_alloc_swa_free_out_of_range_changes_nothing() -> None:
    a = SWATokenToKVPoolAllocator(16 * PS, 16 * PS, PS, F16, "cpu", None)
    x = a.alloc_extend(t(0), t(0), t(8), t(8), t(-1), 8)
    assert x is not None
    mapping = a.full_to_swa_index_mapping.clone()
    sizes = (a.full_available_size(), a.swa_available_size())
    with pytest.raises(ValueError, match="out-of-range"):
        a.free(torch.cat([x, t(10_000)]))
    assert (a.full_available_size(), a.swa_available_size()) == sizes
    assert torch.equal(a.full_to_swa_index_mapping, mapping)


@pytest.mark.parametrize("grouped", [False, True])
def test_alloc_double_free_above_capacity_raises(grouped: bool) -> None:
    a = paged()
    x = a.alloc(64 * PS)
    assert x is not None
    a.free(x[: 63 * PS])
    if grouped:
        a.free_group_begin()
        a.free(x)  # page 64 is live, pages 1..63 are free already
        with pytest.raises(ValueError, match="double free"):
            a.free_group_end()
        a._free_group = None
    else:
        with pytest.raises(ValueError, match="double free"):
            a.free(x)
    assert a.available_size() == 63 * PS


# ------------------------------------------------------------------ default-mode alloc checks
def test_alloc_extend_host_checks_name_the_argument_and_change_nothing() -> None:
    a = paged(need_sort=True)
    x = a.alloc(60 * PS)
    assert x is not None
    a.free(x[:PS])  # staged: a merge would be a state change
    state = _state(a), a.release_pages.tolist()
    with pytest.raises(ValueError, match="prefix_lens_cpu"):
        a.alloc_extend(t(5), t(5), t(3), t(3), t(0), -2)
    with pytest.raises(ValueError, match="last_loc"):
        a.alloc_extend(t(2), t(2), t(50), t(50), t(-1), 48)  # -1 with a non-empty prefix
    with pytest.raises(ValueError, match="seq_lens must equal seq_lens_cpu"):
        a.alloc_extend(t(0), t(0), t(9), t(8), t(-1), 8)
    with pytest.raises(ValueError, match="seq_lens_cpu must be >= 1"):
        a.alloc_decode(t(0), t(0), t(-1))
    assert (_state(a), a.release_pages.tolist()) == state


# ------------------------------------------------------------------ SWA additions
def test_alloc_swa_free_full_after_free_swa() -> None:
    a = SWATokenToKVPoolAllocator(16 * PS, 16 * PS, PS, F16, "cpu", None)
    x = a.alloc_extend(t(0), t(0), t(8), t(8), t(-1), 8)
    assert x is not None
    a.free_swa(x)
    assert a.swa_available_size() == 16 * PS and a.full_available_size() == 14 * PS
    a.free_full(x)
    assert a.available_size() == 16 * PS


def test_alloc_swa_tail_end_maps_only_the_tail_before_padding() -> None:
    a = SWATokenToKVPoolAllocator(16 * PS, 16 * PS, PS, F16, "cpu", None)
    full = a.alloc_extend_swa_tail(t(0), t(0), t(12), t(12), t(-1), 12, 3, swa_tail_end=10)
    assert full is not None
    window = a.translate_loc_from_full_to_swa(full)
    assert (window[:7] == 0).all() and (window[7:10] > 0).all() and (window[10:] == 0).all()
    with pytest.raises(ValueError, match="swa_tail_end"):
        a.alloc_extend_swa_tail(t(0), t(0), t(4), t(4), t(-1), 4, 1, swa_tail_end=5)


def test_alloc_free_unaligned_is_a_deprecated_alias_of_free() -> None:
    a, b = paged(), paged()
    slots_a, slots_b = a.alloc(12), b.alloc(12)
    assert slots_a is not None and slots_b is not None
    freed = torch.cat([slots_a[5:7], slots_a[:1]])
    with pytest.warns(DeprecationWarning, match="free_unaligned is deprecated"):
        a.free_unaligned(freed)
    b.free(torch.cat([slots_b[5:7], slots_b[:1]]))
    assert _state(a) == _state(b)


@pytest.mark.parametrize("ps", [2, 4, 16])
def test_free_segment_host_pages_equal_the_tensor_path(ps: int) -> None:
    """A small CPU segment's page ids on lists equal the tensor path's for every start offset
    and length; a page outside [1, num_pages] gives None (the tensor path raises naming it),
    and a segment over SMALL_BATCH pages takes the tensor path."""
    from mem_cache_kernels.checks import SMALL_BATCH

    a = PagedTokenToKVPoolAllocator(128 * ps, ps, F16, "cpu", None)
    row = a.alloc(100 * ps)
    assert row is not None
    for start in range(2 * ps + 1):
        for n in (1, ps - 1, ps, ps + 1, 3 * ps + 2):
            idx = row[start : start + n]
            got = a._segment_pages_host(idx, start)
            want = a._segment_pages(idx, start)
            assert got is not None and got.dtype == torch.int64, (start, n)
            assert torch.equal(got, want), (start, n)
    assert a._segment_pages_host(t(0, 1), 0) is None  # the padding page
    assert a._segment_pages_host(t(129 * ps), 0) is None  # past the last page
    assert SMALL_BATCH < 100 and a._segment_pages_host(row[: (SMALL_BATCH + 1) * ps], 0) is None
    before = _state(a)
    with pytest.raises(ValueError, match="free_segment: free of the padding page 0"):
        a.free_segment(t(1), start_pos=1)
    with pytest.raises(ValueError, match="free_segment has out-of-range page ids"):
        a.free_segments([(t(129 * ps), 0)])
    assert _state(a) == before
