"""Token and paged allocators: SGLang's slot order, worked examples, failure atomicity, groups."""

from __future__ import annotations

import random

import pytest
import torch
from _allocator_reference import ReferenceAllocator as NaiveAllocator

from mem_cache_allocator import (
    BaseTokenToKVPoolAllocator,
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    page_allocator,
)

F16 = torch.float16


def t(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def paged(size: int = 64, ps: int = 4, need_sort: bool = False, debug: bool = False):  # type: ignore[no-untyped-def]
    return PagedTokenToKVPoolAllocator(size, ps, F16, "cpu", None, need_sort, debug=debug)


def extend(a, pre: list[int], seq: list[int], last: list[int]):  # type: ignore[no-untyped-def]
    return a.alloc_extend(
        torch.tensor(pre),
        torch.tensor(pre),
        torch.tensor(seq),
        torch.tensor(seq),
        torch.tensor(last),
        sum(seq) - sum(pre),
    )


# ------------------------------------------------------------------ constructors
def test_alloc_constructor_signatures_match_sglang() -> None:
    tok = TokenToKVPoolAllocator(16, F16, "cpu", None, True)
    assert (tok.size, tok.page_size, tok.need_sort, tok.get_kvcache()) == (16, 1, True, None)
    pg = PagedTokenToKVPoolAllocator(
        size=64, page_size=8, dtype=F16, device="cpu", kvcache=None, need_sort=False
    )
    assert (pg.size, pg.page_size, pg.num_pages, pg.size_full) == (64, 8, 8, 64)
    assert isinstance(pg, BaseTokenToKVPoolAllocator)
    assert pg.available_size() == 64 and tok.available_size() == 16


@pytest.mark.parametrize("ps", [0, 3, -4])
def test_alloc_rejects_non_power_of_two_page_size(ps: int) -> None:
    with pytest.raises(ValueError, match="page_size"):
        PagedTokenToKVPoolAllocator(64, ps, F16, "cpu", None)


# ------------------------------------------------------------------ worked examples (ref doc B.5)
def test_alloc_extend_worked_example_partial_prefix() -> None:
    a = paged()
    assert a.alloc(8) is not None  # pages 1, 2 -> the free list now starts [3, 4, ...]
    out = extend(a, [2], [11], [1])
    assert out is not None
    assert out.tolist() == [2, 3, 12, 13, 14, 15, 16, 17, 18]
    assert out.dtype == torch.int64 and out.device.type == "cpu"


def test_alloc_extend_worked_example_empty_prefix() -> None:
    a = paged()
    assert a.alloc(16) is not None  # pages 1..4 -> free list starts [5, 6, ...]
    out = extend(a, [0], [8], [-1])
    assert out is not None and out.tolist() == list(range(20, 28))


def test_alloc_extend_batch_consumes_pages_in_request_order() -> None:
    a = paged()
    # (0 -> 5): pages 1, 2; (0 -> 4): page 3; (3 -> 6, last_loc 62): slot 63, then page 4
    out = extend(a, [0, 0, 3], [5, 4, 6], [-1, -1, 62])
    assert out is not None
    assert out.tolist() == [4, 5, 6, 7, 8, 12, 13, 14, 15, 63, 16, 17]
    assert a.available_size() == 64 - 16


def test_alloc_decode_takes_new_pages_only_at_page_starts() -> None:
    a = paged()
    out = a.alloc_decode(t(5, 3, 9), t(5, 3, 9), t(7, 13, 27))
    # seq 5 -> position 4 starts a page (page 1 -> slot 4); seq 3 -> 14; seq 9 -> page 2 -> 8
    assert out is not None and out.tolist() == [4, 14, 8]
    assert a.available_size() == 64 - 8


# ------------------------------------------------------------------ free-list order (SGLang)
def test_alloc_paged_free_prepends_sorted_pages() -> None:
    a = paged()
    x = a.alloc(12)  # pages 1, 2, 3
    assert x is not None
    a.free(torch.cat([x[8:12], x[0:4]]))  # pages 3 and 1 in that order
    # reused first, ascending (torch.unique order)
    assert a.alloc(8) is not None and a.free_pages_tensor()[:2].tolist() == [4, 5]
    b = paged()
    y = b.alloc(12)
    assert y is not None
    b.free(torch.cat([y[8:12], y[0:4]]))
    assert b.free_pages_tensor()[:3].tolist() == [1, 3, 4]


def test_alloc_token_free_appends_in_given_order() -> None:
    a = TokenToKVPoolAllocator(8, F16, "cpu", None)
    x = a.alloc(4)
    assert x is not None and x.tolist() == [1, 2, 3, 4]
    a.free(t(3, 1))
    assert a.free_pages_tensor().tolist() == [5, 6, 7, 8, 3, 1]
    assert a.alloc(5) is not None
    y = a.alloc(1)
    assert y is not None and y.tolist() == [1]


def test_alloc_need_sort_stages_frees_and_merges_sorted_when_short() -> None:
    a = TokenToKVPoolAllocator(8, F16, "cpu", None, need_sort=True)
    x = a.alloc(6)
    assert x is not None
    a.free(t(5, 2))
    assert a.available_size() == 4  # staged frees count as available
    y = a.alloc(2)  # free list [7, 8] suffices: no merge
    assert y is not None and y.tolist() == [7, 8]
    z = a.alloc(2)  # short -> merge -> sorted [2, 5]
    assert z is not None and z.tolist() == [2, 5]


def test_alloc_paged_need_sort_merge_trigger_matches_sglang_extend_bound() -> None:
    a = paged(64, 4, need_sort=True)  # 16 pages
    x = a.alloc(56)  # 14 pages -> 2 left: [15, 16]
    assert x is not None
    a.free(x[:8])  # pages 1, 2 staged
    # extend 4 tokens, bs 1: bound 4//4 + 1 + 1 = 3 > 2 -> merge -> [1, 2, 15, 16]
    out = extend(a, [0], [4], [-1])
    assert out is not None and out.tolist() == [4, 5, 6, 7]


def test_alloc_matches_naive_sglang_baseline_on_random_calls() -> None:
    """Same slots as an independent SGLang-0.5.14-like allocator for the same calls."""
    rng = random.Random(7)
    for ps, need_sort in [(1, False), (1, True), (4, False), (4, True), (16, False)]:
        ours = (
            TokenToKVPoolAllocator(512, F16, "cpu", None, need_sort)
            if ps == 1
            else paged(512, ps, need_sort)
        )
        ref = NaiveAllocator(512, ps, need_sort=need_sort, token=ps == 1)
        reqs: list[list[int]] = []
        for _ in range(150):
            op = rng.random()
            if op < 0.4:
                bs = rng.randint(1, 3)
                chosen = (
                    rng.sample(range(len(reqs)), min(bs, len(reqs))) if rng.random() < 0.5 else []
                )
                pre = [len(reqs[i]) for i in chosen] + [0] * (bs - len(chosen))
                seq = [p + rng.randint(1, 20) for p in pre]
                last = [reqs[i][-1] for i in chosen] + [-1] * (bs - len(chosen))
                args = (t(*pre), t(*pre), t(*seq), t(*seq), t(*last), sum(seq) - sum(pre))
                if ps == 1:
                    o1, o2 = ours.alloc(args[-1]), ref.alloc(args[-1])
                else:
                    o1, o2 = ours.alloc_extend(*args), ref.alloc_extend(*args)
                assert (o1 is None) == (o2 is None)
                if o1 is None or o2 is None:
                    continue
                assert torch.equal(o1, o2)
                off = 0
                targets = chosen + [None] * (bs - len(chosen))
                for target, p, s in zip(targets, pre, seq):
                    new = o1[off : off + s - p].tolist()
                    off += s - p
                    if target is None:
                        reqs.append(new)
                    else:
                        reqs[target].extend(new)
            elif op < 0.65 and reqs:
                seq = [len(r) + 1 for r in reqs]
                last = [r[-1] for r in reqs]
                if ps == 1:
                    o1, o2 = ours.alloc(len(reqs)), ref.alloc(len(reqs))
                else:
                    o1 = ours.alloc_decode(t(*seq), t(*seq), t(*last))
                    o2 = ref.alloc_decode(t(*seq), t(*seq), t(*last))
                assert (o1 is None) == (o2 is None)
                if o1 is not None and o2 is not None:
                    assert torch.equal(o1, o2)
                    for r, s in zip(reqs, o1.tolist()):
                        r.append(s)
            elif reqs:
                group = rng.random() < 0.5
                if group:
                    ours.free_group_begin()
                    ref.free_group_begin()
                for _ in range(rng.randint(1, 3)):
                    if not reqs:
                        break
                    r = reqs.pop(rng.randrange(len(reqs)))
                    ours.free(t(*r))
                    ref.free(t(*r))
                if group:
                    ours.free_group_end()
                    ref.free_group_end()
            assert ours.available_size() == ref.available_size()


# ------------------------------------------------------------------ failures change nothing
def test_alloc_shortage_returns_none_without_state_change_and_without_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = paged(32, 4)  # 8 pages
    x = a.alloc(24)  # 6 pages
    assert x is not None
    before = a.free_pages_tensor()

    def boom(*args: object, **kw: object) -> None:
        raise AssertionError("kernel launched despite a shortage")

    monkeypatch.setattr(page_allocator, "pick", lambda op, backend, *tensors: boom)
    assert extend(a, [0], [9], [-1]) is None  # 3 pages needed, 2 free
    assert a.alloc(12) is None
    assert a.alloc_decode(t(1, 5, 9), t(1, 5, 9), t(-1, 7, 11)) is None  # 3 new pages
    assert torch.equal(a.free_pages_tensor(), before)
    assert a.available_size() == 8


def test_alloc_page_counts_are_exact_for_page_size_one() -> None:
    tok = TokenToKVPoolAllocator(4, F16, "cpu", None)
    # every decode token needs a new slot with page size 1 (SGLang's seq % ps == 1 says 0)
    assert tok.alloc_decode(t(3, 4, 5, 6, 7), t(3, 4, 5, 6, 7), t(1, 2, 3, 4, 5)) is None
    out = tok.alloc_decode(t(3, 4), t(3, 4), t(9, 9))
    assert out is not None and out.tolist() == [1, 2] and tok.available_size() == 2
    p1 = PagedTokenToKVPoolAllocator(4, 1, F16, "cpu", None)
    assert p1.alloc_decode(t(2, 2, 2, 2, 2), t(2, 2, 2, 2, 2), t(1, 1, 1, 1, 1)) is None
    out = p1.alloc_decode(t(2, 2), t(2, 2), t(1, 1))
    assert out is not None and out.tolist() == [1, 2]


def test_alloc_extend_rejects_wrong_extend_num_tokens_and_device_lengths() -> None:
    a = paged()
    with pytest.raises(ValueError, match="extend_num_tokens"):
        a.alloc_extend(t(0), t(0), t(8), t(8), t(-1), 7)
    with pytest.raises(ValueError, match=r"seq_lens must have 1 elements, got 2"):
        a.alloc_extend(t(0), t(0), t(8, 8), t(8), t(-1), 8)
    with pytest.raises(ValueError, match="need_size must be a multiple"):
        a.alloc(3)
    assert a.available_size() == 64


# ------------------------------------------------------------------ groups and state
def test_alloc_free_group_copies_queued_views_and_applies_once() -> None:
    a = paged()
    x = a.alloc(16)
    assert x is not None
    row = x.clone()
    a.free_group_begin()
    a.free(row[:8])
    row[:8] = 0  # the caller rewrites its row before the group closes
    a.free(row[8:])
    assert a.available_size() == 48  # deferred
    a.free_group_end()
    assert a.available_size() == 64
    assert a.free_pages_tensor()[:4].tolist() == [1, 2, 3, 4]


def test_alloc_free_group_nesting_and_unbalanced_end_raise() -> None:
    a = TokenToKVPoolAllocator(8, F16, "cpu", None)
    a.free_group_begin()
    with pytest.raises(RuntimeError, match="free group is open"):
        a.free_group_begin()
    a.free_group_end()
    with pytest.raises(RuntimeError, match="without free_group_begin"):
        a.free_group_end()


def test_alloc_backup_restore_roundtrip() -> None:
    a = paged(need_sort=True)
    x = a.alloc(8)
    assert x is not None
    a.free(x[:4])
    state = a.backup_state()
    snapshot = a.free_pages_tensor()
    y = a.alloc(60)
    assert y is not None and a.available_size() == 0
    a.free(x[4:])
    a.restore_state(state)
    assert a.available_size() == 60 and torch.equal(a.free_pages_tensor(), snapshot)
    with pytest.raises(ValueError, match="backup_state"):
        a.restore_state(paged().backup_state())


def test_alloc_free_page_ids_segment_and_unaligned() -> None:
    a = paged()
    x = a.alloc(16)  # pages 1..4 (slots 4..19)
    assert x is not None
    a.free_page_ids(t(4))
    a.free_segment(x[0:2], start_pos=0)  # slots 4, 5: a partial page is released whole
    with pytest.raises(ValueError, match="start_pos"):
        a.free_segment(x[8:10], start_pos=-2)
    a.free_segment(x[9:10], start_pos=1)  # starts inside page 3: releases it
    assert a.free_pages_tensor()[:4].tolist() == [3, 1, 4, 5]
    assert a.available_size() == 64 - 4


def test_alloc_free_accepts_int32_and_merge_is_noop_without_staged() -> None:
    a = paged()
    x = a.alloc(8)
    assert x is not None
    a.free(x.to(torch.int32))
    assert a.available_size() == 64
    a.merge_and_sort_free()
    assert a.free_pages_tensor()[:2].tolist() == [1, 2]
    a.clear()
    assert a.free_pages_tensor().tolist() == list(range(1, 17))


def test_alloc_cpu_copy_forwards_to_the_pool() -> None:
    class Pool:
        def get_cpu_copy(self, indices: torch.Tensor, mamba_indices: object = None) -> str:
            return f"copy {indices.tolist()}"

        def load_cpu_copy(
            self, data: object, indices: torch.Tensor, mamba_indices: object = None
        ) -> str:
            return f"load {data}"

    a = PagedTokenToKVPoolAllocator(16, 4, F16, "cpu", Pool())  # type: ignore[arg-type]
    assert a.get_cpu_copy(t(4)) == "copy [4]"
    assert a.load_cpu_copy("x", t(4)) == "load x"
    with pytest.raises(RuntimeError, match="no kvcache"):
        paged().get_cpu_copy(t(4))
