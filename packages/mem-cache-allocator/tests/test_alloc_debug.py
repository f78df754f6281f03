"""Debug mode: ownership errors name the offending slots/pages and change nothing."""

from __future__ import annotations

import pytest
import torch

from mem_cache_allocator import (
    AllocatorDebugError,
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from mem_cache_allocator.mamba import MambaSlotAllocator

F16 = torch.float16


def t(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def paged(debug: bool = True) -> PagedTokenToKVPoolAllocator:
    return PagedTokenToKVPoolAllocator(64, 4, F16, "cpu", None, debug=debug)


def test_alloc_debug_flag_and_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEM_CACHE_DEBUG", raising=False)
    assert not paged(debug=False).debug
    assert paged(debug=True).debug
    monkeypatch.setenv("MEM_CACHE_DEBUG", "1")
    assert paged(debug=False).debug
    assert TokenToKVPoolAllocator(8, F16, "cpu", None).debug


def test_alloc_debug_double_free_names_slots() -> None:
    a = paged()
    x = a.alloc(8)
    assert x is not None
    a.free(x[:4])
    before = a.free_pages_tensor()
    with pytest.raises(ValueError, match=r"double free of slots \[4, 5, 6, 7\]"):
        a.free(x[:4])
    assert torch.equal(a.free_pages_tensor(), before)


def test_alloc_debug_double_free_inside_one_call_and_token_allocator() -> None:
    tok = TokenToKVPoolAllocator(8, F16, "cpu", None, debug=True)
    x = tok.alloc(3)
    assert x is not None
    with pytest.raises(ValueError, match=r"double free: slots \[2\]"):
        tok.free(t(2, 2))
    tok.free(x[:1])
    with pytest.raises(ValueError, match=r"double free of slots \[1\]"):
        tok.free(t(1))


def test_alloc_debug_never_handed_out() -> None:
    a = paged()
    with pytest.raises(ValueError, match=r"slots \[20, 21, 22, 23\] .*never handed out"):
        a.free(t(20, 21, 22, 23))


def test_alloc_debug_slot_zero() -> None:
    a = paged()
    with pytest.raises(ValueError, match=r"padding page 0: \[0, 1\]"):
        a.free(t(0, 1))
    with pytest.raises(ValueError, match="padding page 0"):
        a.free_page_ids(t(0))


def test_alloc_debug_partial_page_still_in_use() -> None:
    a = paged()
    out = a.alloc_extend(t(0), t(0), t(4), t(4), t(-1), 4)  # page 1 (slots 4..7)
    assert out is not None and out.tolist() == [4, 5, 6, 7]
    with pytest.raises(ValueError, match=r"part of page\(s\) \[1\].*slots \[6, 7\]"):
        a.free(out[:2])
    assert a.available_size() == 60


def test_alloc_debug_free_is_set_shaped_but_rejects_a_live_partial_page() -> None:
    a = paged()
    x = a.alloc(12)  # slots 4..15
    assert x is not None
    # pages 1 and 3 only partly listed while their other slots are live: that would hand
    # live slots out again, so debug mode raises (naming them) and nothing changes
    with pytest.raises(AllocatorDebugError, match=r"part of page\(s\) \[1, 3\]"):
        a.free(t(4, 5, 8, 9, 10, 11, 12, 13))
    assert a.available_size() == 52
    # any order, duplicates: set semantics
    a.free(t(15, 4, 5, 8, 9, 10, 11, 12, 13, 6, 7, 14, 9, 4))
    assert a.available_size() == 64


def test_alloc_debug_free_segment_checks_the_stated_structure() -> None:
    a = paged()
    x = a.alloc(8)  # slots 4..11
    assert x is not None
    with pytest.raises(AllocatorDebugError, match="free_segment expects"):
        a.free_segment(t(4, 5, 6, 8, 7, 9, 10, 11), start_pos=0)  # not position order
    assert a.available_size() == 56
    with pytest.raises(AllocatorDebugError, match=r"part of page\(s\) \[1\].*slots \[4\]"):
        a.free_segment(x[1:], start_pos=1)  # releases page 1 whole while slot 4 is live
    a.free_segments([(x[:1], 0), (x[1:], 1)])  # page 1 shared by both segments: once
    assert a.available_size() == 64


def test_alloc_debug_errors_are_value_and_assertion_errors() -> None:
    a = paged()
    x = a.alloc(4)
    assert x is not None
    a.free(x)
    with pytest.raises(AssertionError):
        a.free(x)
    assert issubclass(AllocatorDebugError, ValueError)
    assert issubclass(AllocatorDebugError, AssertionError)


def test_alloc_debug_same_page_twice_in_a_group_is_one_release() -> None:
    a = paged()
    x = a.alloc(8)
    assert x is not None
    a.free_group_begin()
    a.free(x[:5])
    a.free(x[3:])
    a.free_group_end()
    assert a.available_size() == 64


def test_alloc_debug_misaligned_extend_and_decode() -> None:
    a = paged()
    out = a.alloc_extend(t(0), t(0), t(3), t(3), t(-1), 3)
    assert out is not None and out.tolist() == [4, 5, 6]
    with pytest.raises(
        ValueError, match=r"misaligned alloc_extend.*requests \[0\].*last_loc=\[5\]"
    ):
        a.alloc_extend(t(3), t(3), t(5), t(5), t(5), 2)  # position 2 is slot 6, not 5
    with pytest.raises(ValueError, match=r"misaligned alloc_decode.*last_loc=\[4\]"):
        a.alloc_decode(t(4), t(4), t(4))
    with pytest.raises(ValueError, match="misaligned alloc_extend"):
        a.alloc_extend(t(0), t(0), t(2), t(2), t(6), 2)  # empty prefix needs last_loc -1
    assert a.available_size() == 60
    ok = a.alloc_decode(t(4), t(4), t(6))
    assert ok is not None and ok.tolist() == [7]


def test_alloc_debug_handing_out_a_live_slot() -> None:
    a = paged()
    out = a.alloc_extend(t(0), t(0), t(2), t(2), t(-1), 2)  # slots 4, 5
    assert out is not None
    # aligned but wrong last_loc: position 2 at slot 6 belongs to page 1 (ours) - fine once
    b = a.alloc_decode(t(3), t(3), t(5))
    assert b is not None and b.tolist() == [6]
    with pytest.raises(ValueError, match=r"already in use"):
        a.alloc_decode(t(3), t(3), t(5))  # slot 6 again
    with pytest.raises(ValueError, match=r"pages this caller does not own"):
        a.alloc_decode(t(3), t(3), t(41))  # page 10 is free


def test_alloc_debug_mamba_double_free() -> None:
    m = MambaSlotAllocator(4, "cpu", debug=True)
    x = m.alloc(2)
    assert x is not None
    m.free(x[:1])
    with pytest.raises(ValueError, match=r"double free of slots \[1\]"):
        m.free(x[:1])
    with pytest.raises(ValueError, match=r"invalid slots \[0\]"):
        m.free(t(0))


def test_alloc_debug_state_restore_keeps_tracking_consistent() -> None:
    a = paged()
    state = a.backup_state()
    x = a.alloc(4)
    assert x is not None
    a.restore_state(state)
    y = a.alloc(4)  # the same page again: debug must not call it "already in use"
    assert y is not None and torch.equal(x, y)
    a.free(y)
