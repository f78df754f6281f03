"""Same slots, sizes and free lists as the SGLang-0.5.23-semantics reference, engine-shaped frees.

Frees are generated the way engines and SGLang's own tests make them: shuffled, reversed, int32,
partial last pages, several requests concatenated, the same page twice in one free group
(prefix-cache insertion freeing a finished request's duplicate pages, then its tail), speculative
decoding's rejected drafts (the draft slots past the accepted ones, when they leave the request's
pages), retraction of a running request, SWA window frees (``free_swa`` of a request's old pages).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from _allocator_reference import ReferenceAllocator, ReferenceSWAAllocator

from mem_cache_allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from mem_cache_allocator.swa import SWATokenToKVPoolAllocator

F16 = torch.float16


def _t(values: list[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def _shape_free(rng: random.Random, slots: list[int], dups: bool = True) -> torch.Tensor:
    """The same slot set the way a caller may pass it: shuffled / reversed / int32 / duplicated
    (``dups``: page allocators deduplicate; the token allocator, as SGLang's, does not)."""
    out = list(slots)
    mode = rng.randrange(5 if dups else 3)
    if mode == 1:
        rng.shuffle(out)
    elif mode == 2:
        out.reverse()
    elif mode == 3 and out:
        out += rng.sample(out, min(len(out), 3))  # duplicates
        rng.shuffle(out)
    dtype = torch.int32 if rng.random() < 0.4 else torch.int64
    return _t(out, dtype)


class _Engine:
    """Drives two allocators (ours, reference) with identical calls and compares everything."""

    def __init__(self, ours: object, ref: object, ps: int, rng: random.Random, swa: bool) -> None:
        self.a, self.r, self.ps, self.rng, self.swa = ours, ref, ps, rng, swa
        self.dups = ps > 1 or not (swa or isinstance(ours, TokenToKVPoolAllocator))
        self.reqs: list[list[int]] = []
        self.window_start: list[int] = []  # SWA: positions below this had their window freed

    def both(self, name: str, *args: object) -> object:
        o1 = getattr(self.a, name)(*args)
        o2 = getattr(self.r, name)(*args)
        assert (o1 is None) == (o2 is None), f"{name}: {o1} vs {o2}"
        if isinstance(o1, torch.Tensor):
            assert isinstance(o2, torch.Tensor)
            assert torch.equal(o1, o2), f"{name}: {o1.tolist()} vs {o2.tolist()}"
        self.check()
        return o1

    def check(self) -> None:
        assert self.a.available_size() == self.r.available_size()  # type: ignore[attr-defined]
        if self.swa:
            assert self.a.swa_available_size() == self.r.swa_available_size()  # type: ignore[attr-defined]

    def extend(self) -> None:
        rng, ps = self.rng, self.ps
        bs = rng.randint(1, 3)
        chosen = (
            rng.sample(range(len(self.reqs)), min(bs, len(self.reqs))) if rng.random() < 0.5 else []
        )
        pre = [len(self.reqs[i]) for i in chosen] + [0] * (bs - len(chosen))
        seq = [p + rng.randint(1, 3 * ps + 3) for p in pre]
        last = [self.reqs[i][-1] for i in chosen] + [-1] * (bs - len(chosen))
        args = (_t(pre), _t(pre), _t(seq), _t(seq), _t(last), sum(seq) - sum(pre))
        out = (
            self.both("alloc", args[-1])
            if ps == 1 and not self.swa
            else self.both("alloc_extend", *args)
        )
        if out is None:
            return
        assert isinstance(out, torch.Tensor)
        off = 0
        for target, p, s in zip(chosen + [None] * (bs - len(chosen)), pre, seq):
            new = out[off : off + s - p].tolist()
            off += s - p
            if target is None:
                self.reqs.append(new)
                self.window_start.append(0)
            else:
                self.reqs[target].extend(new)

    def decode(self, draft: int = 1) -> None:
        if not self.reqs:
            return
        idx = self.rng.sample(range(len(self.reqs)), self.rng.randint(1, len(self.reqs)))
        for _ in range(draft):
            seq = [len(self.reqs[i]) + 1 for i in idx]
            last = [self.reqs[i][-1] for i in idx]
            out = self.both("alloc_decode", _t(seq), _t(seq), _t(last))
            if out is None:
                return
            assert isinstance(out, torch.Tensor)
            for i, s in zip(idx, out.tolist()):
                self.reqs[i].append(s)
        if draft > 1:  # speculative decoding: reject drafts past the accepted tokens
            for i in idx:
                row = self.reqs[i]
                accepted = len(row) - self.rng.randint(0, draft)
                keep_to = -(-accepted // self.ps) * self.ps  # pages of accepted tokens stay
                if keep_to < len(row):
                    rejected = row[keep_to:]
                    del row[keep_to:]
                    self.both("free", _shape_free(self.rng, rejected, self.dups))

    def pop(self) -> list[int]:
        k = self.rng.randrange(len(self.reqs))
        self.window_start.pop(k)
        return self.reqs.pop(k)

    def free_some(self) -> None:
        rng = self.rng
        if not self.reqs:
            return
        group = rng.random() < 0.6
        if group:
            self.both("free_group_begin")
        kind = rng.randrange(4)
        if kind == 0:  # several finished requests concatenated (partial last pages)
            rows = [self.pop() for _ in range(min(len(self.reqs), rng.randint(1, 3)))]
            self.both("free", _shape_free(rng, [s for r in rows for s in r], self.dups))
        elif kind == 1 and group:  # prefix insertion frees duplicate pages, then the tail
            row = self.pop()
            cut = rng.randint(0, len(row) // self.ps) * self.ps
            overlap = self.ps if self.dups else 0  # the same page twice in the group
            self.both("free", _shape_free(rng, row[: cut + overlap], self.dups))
            self.both("free", _shape_free(rng, row[cut:], self.dups))
        elif kind == 2 and self.swa:  # window frees of old pages, then the request
            k = rng.randrange(len(self.reqs))
            row = self.reqs[k]
            start = self.window_start[k]
            end = ((len(row) - 1) // self.ps - 1) * self.ps  # keep the last page and a margin
            if end > start:
                self.both("free_swa", _shape_free(rng, row[start:end], self.dups))
                self.window_start[k] = end
            if rng.random() < 0.5:
                self.both("free", _shape_free(rng, self.pop(), self.dups))
        else:  # retraction of one running request (reversed row, as engines pass it)
            self.both("free", _t(self.pop()[::-1]))
        if group:
            self.both("free_group_end")


def _run(ours: Any, ref: Any, ps: int, seed: int, *, swa: bool, steps: int = 120) -> None:
    rng = random.Random(seed)
    eng = _Engine(ours, ref, ps, rng, swa)
    for _ in range(steps):
        op = rng.random()
        if op < 0.35:
            eng.extend()
        elif op < 0.6:
            eng.decode()
        elif op < 0.7:
            eng.decode(draft=rng.randint(2, 4))
        else:
            eng.free_some()
    while eng.reqs:
        eng.both("free", _t(eng.pop()))
    full_ref = ref.full if swa else ref
    full_ours = ours.full_attn_allocator if swa else ours
    full_ref.merge_and_sort_free()
    full_ours.merge_and_sort_free()
    ref_free = torch.cat([full_ref.free_pages, *full_ref.staged])
    assert torch.equal(full_ours.free_pages_tensor(), ref_free)


@pytest.mark.parametrize("need_sort", [False, True])
@pytest.mark.parametrize("ps", [1, 4, 16])
@pytest.mark.parametrize("seed", range(8))
def test_alloc_paged_matches_sglang_0_5_23_with_engine_shaped_frees(
    ps: int, need_sort: bool, seed: int
) -> None:
    size = 96 * ps if ps > 1 else 160
    ours: object
    if ps == 1 and seed % 2:
        ours = TokenToKVPoolAllocator(size, F16, "cpu", None, need_sort)
        ref = ReferenceAllocator(size, 1, need_sort=need_sort, token=True)
    else:
        ours = PagedTokenToKVPoolAllocator(size, ps, F16, "cpu", None, need_sort, debug=seed < 2)
        ref = ReferenceAllocator(size, ps, need_sort=need_sort)
    _run(ours, ref, ps, seed, swa=False)


@pytest.mark.parametrize("need_sort", [False, True])
@pytest.mark.parametrize("ps", [1, 4, 16])
@pytest.mark.parametrize("seed", range(5))
def test_alloc_swa_matches_sglang_0_5_23_with_engine_shaped_frees(
    ps: int, need_sort: bool, seed: int
) -> None:
    size, size_swa = 96 * ps, 64 * ps
    ours = SWATokenToKVPoolAllocator(
        size, size_swa, ps, F16, "cpu", None, need_sort, debug=seed < 2
    )
    ref = ReferenceSWAAllocator(size, size_swa, ps, need_sort=need_sort)
    _run(ours, ref, ps, seed, swa=True)


def test_alloc_issue_example_partial_page_concatenated() -> None:
    """``free([76, 77, 156, 78, 79])`` releases pages 19 and 39 (not page 19 twice)."""
    a = PagedTokenToKVPoolAllocator(256, 4, F16, "cpu", None)
    x = a.alloc(256)
    assert x is not None
    a.free(_t([76, 77, 156, 78, 79]))
    assert a.free_pages.tolist() == [19, 39]
    a.free_group_begin()
    a.free(x[8:16])
    a.free(x[8:16])  # the same slots twice in one group: released once
    a.free_group_end()
    assert a.available_size() == 16


def test_alloc_swa_free_swa_in_group_is_queued_and_sorted() -> None:
    ours = SWATokenToKVPoolAllocator(64, 32, 4, F16, "cpu", None)
    ref = ReferenceSWAAllocator(64, 32, 4)
    for a in (ours, ref):
        x = a.alloc_extend(_t([0]), _t([0]), _t([16]), _t([16]), _t([-1]), 16)
        assert x is not None
        a.free_group_begin()
        a.free_swa(x[:8])
        assert a.swa_available_size() == 16  # queued: nothing released yet
        a.free_group_end()
        assert a.swa_available_size() == 24
    y1 = ours.alloc_extend(_t([0]), _t([0]), _t([8]), _t([8]), _t([-1]), 8)
    y2 = ref.alloc_extend(_t([0]), _t([0]), _t([8]), _t([8]), _t([-1]), 8)
    assert y1 is not None and y2 is not None and torch.equal(y1, y2)
    assert torch.equal(ours.translate_loc_from_full_to_swa(y1), ref.mapping[y2])


def test_alloc_swa_decode_precheck_merges_staged_frees_first() -> None:
    ours = SWATokenToKVPoolAllocator(32, 32, 4, F16, "cpu", None, need_sort=True)
    ref = ReferenceSWAAllocator(32, 32, 4, need_sort=True)
    for a in (ours, ref):
        x = a.alloc_extend(_t([0]), _t([0]), _t([28]), _t([28]), _t([-1]), 28)  # 7 pages
        assert x is not None
        a.free(x[:4])  # page 1 staged on both sides
        z = a.alloc_extend(_t([0]), _t([0]), _t([4]), _t([4]), _t([-1]), 4)  # merge + 1 page
        assert z is not None
        a.free(z)  # staged again
        # three requests each starting a page need 3 pages, 2 are free or staged: None ...
        last = int(x[3])
        out = a.alloc_decode(_t([5, 5, 5]), _t([5, 5, 5]), _t([last, last, last]))
        assert out is None
    # ... after both sides merged their staged pages, as SGLang's inner decode calls do
    assert ours.full_attn_allocator.free_pages.tolist() == ref.full.free_pages.tolist() == [1, 8]
    assert ours.swa_attn_allocator.free_pages.tolist() == ref.swa.free_pages.tolist()
