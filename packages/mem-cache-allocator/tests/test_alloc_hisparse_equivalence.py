"""Randomised equivalence of both HiSparse allocators with SGLang 0.5.23-semantics models.

Streams follow the HiSparse coordinator's call patterns: prefill ``alloc_extend`` (new requests
and chunked continuations, also right after logical-only decode tokens), ``alloc_decode`` of
logical-only tokens, ``alloc_device_buffer`` (HiSparse: the request's logical slots; DeepSeek-V4:
its compressed logical slots), ``free_hisparse`` then ``free`` of finished requests, buffer
release through ``free_hisparse_indices``, free groups, and (HiSparse, page size 1) ``alloc``.
After every call the returned slots, the mapping, the free lists and the capacities must equal
the model's (``tests/_hisparse_reference.py``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import _hisparse_reference as _ref
import pytest
import torch
from _allocator_reference import ReferenceSWAAllocator

from mem_cache_allocator.deepseek_v4_hisparse import DeepSeekV4HiSparseTokenToKVPoolAllocator
from mem_cache_allocator.hisparse import HiSparseTokenToKVPoolAllocator
from mem_cache_allocator.paged import PagedTokenToKVPoolAllocator
from mem_cache_allocator.swa import SWATokenToKVPoolAllocator
from mem_cache_pool.deepseek_v4 import DeepSeekV4TokenToKVPool
from mem_cache_pool.hisparse import HiSparseDSATokenToKVPool

RefPaged = _ref.RefPaged
RefHiSparse = _ref.RefHiSparse
RefDeepSeekV4HiSparse = _ref.RefDeepSeekV4HiSparse

I64 = torch.int64
FP8 = torch.float8_e4m3fn


def t(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=I64)


@dataclass
class Req:
    slots: list[int] = field(default_factory=list)
    buffer: list[int] | None = None


def _lists(x: torch.Tensor | None) -> list[int] | None:
    return None if x is None else [int(v) for v in x.tolist()]


def _free_list(a: PagedTokenToKVPoolAllocator) -> list[int]:
    return [int(v) for v in a.free_pages_tensor().tolist()]


def _same_paged(ours: PagedTokenToKVPoolAllocator, ref: object) -> None:
    assert _free_list(ours) == ref.free_list()  # type: ignore[attr-defined]
    assert ours.available_size() == ref.available_size()  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- drivers


class _Driver:
    """Runs one coordinator-shaped call on both sides and compares."""

    compressed = False

    def __init__(self, ours: object, ref: object, rng: random.Random, ps: int) -> None:
        self.ours = ours
        self.ref = ref
        self.rng = rng
        self.ps = ps
        self.reqs: list[Req] = []
        self.in_group = False

    # state checks -----------------------------------------------------------------
    def check(self) -> None:
        o, r = self.ours, self.ref
        _same_paged(o.logical_attn_allocator, r.logical)  # type: ignore[attr-defined]
        _same_paged(o.hisparse_attn_allocator, r.device)  # type: ignore[attr-defined]
        mapping = o.full_to_hisparse_device_index_mapping.tolist()  # type: ignore[attr-defined]
        assert mapping == r.mapping  # type: ignore[attr-defined]
        assert o.available_size() == r.available_size()  # type: ignore[attr-defined]

    # calls ----------------------------------------------------------------------------
    def extend(self) -> None:
        rng = self.rng
        batch: list[Req] = []
        pre: list[int] = []
        seq: list[int] = []
        for _ in range(rng.randint(1, 3)):
            live = [q for q in self.reqs if q.buffer is None and q not in batch]
            # a chunked continuation (maybe right after decode tokens) or a new request
            req = rng.choice(live) if live and rng.random() < 0.4 else Req()
            batch.append(req)
            pre.append(len(req.slots))
            seq.append(len(req.slots) + rng.randint(1, 3 * self.ps + 5))
        last = [q.slots[-1] if q.slots else -1 for q in batch]
        got = self.ours.alloc_extend(  # type: ignore[attr-defined]
            t(pre), t(pre), t(seq), t(seq), t(last), sum(seq) - sum(pre)
        )
        want = self.ref.alloc_extend(pre, seq, last)  # type: ignore[attr-defined]
        assert _lists(got) == want
        if want is not None:
            pos = 0
            for q, p, s in zip(batch, pre, seq, strict=True):
                q.slots += want[pos : pos + s - p]
                pos += s - p
                if q not in self.reqs:
                    self.reqs.append(q)

    def decode(self) -> None:
        live = [q for q in self.reqs if q.slots]
        if not live:
            return
        batch = self.rng.sample(live, min(len(live), self.rng.randint(1, 3)))
        seq = [len(q.slots) + 1 for q in batch]
        last = [q.slots[-1] for q in batch]
        got = self.ours.alloc_decode(t(seq), t(seq), t(last))  # type: ignore[attr-defined]
        want = self.ref.alloc_decode(seq, last)  # type: ignore[attr-defined]
        assert _lists(got) == want
        if want is not None:
            for q, s in zip(batch, want, strict=True):
                q.slots.append(s)

    def _buffer_args(self, req: Req) -> list[int]:
        if not self.compressed:
            return req.slots
        return [s // 4 for s in req.slots if (s + 1) % 4 == 0]

    def device_buffer(self, dev_page: int) -> None:
        live = [q for q in self.reqs if q.buffer is None and q.slots]
        if not live:
            return
        req = self.rng.choice(live)
        need = dev_page * self.rng.randint(1, 3)
        args = self._buffer_args(req)
        got = self.ours.alloc_device_buffer(t(args), need)  # type: ignore[attr-defined]
        want = self.ref.alloc_device_buffer(args, need)  # type: ignore[attr-defined]
        assert _lists(got) == want
        if want is not None:
            assert len(set(want)) == len(want)  # never the same slot twice
            req.buffer = want

    def finish(self) -> None:
        """One or more finished requests: the coordinator's device release (maybe), buffer
        release, then one ``free`` of their slots -- shuffled, reversed, int32 or several
        requests concatenated, as engines pass them (set semantics)."""
        if not self.reqs:
            return
        rng = self.rng
        done = [self.reqs.pop(rng.randrange(len(self.reqs)))]
        while self.reqs and rng.random() < 0.3:
            done.append(self.reqs.pop(rng.randrange(len(self.reqs))))
        slots: list[int] = []
        for req in done:
            if rng.random() < 0.5:
                self.ours.free_hisparse(t(req.slots))  # type: ignore[attr-defined]
                self.ref.free_hisparse(req.slots)  # type: ignore[attr-defined]
            if req.buffer is not None:
                self.ours.free_hisparse_indices(t(req.buffer))  # type: ignore[attr-defined]
                self.ref.free_hisparse_indices(req.buffer)  # type: ignore[attr-defined]
            slots += req.slots
        shape = rng.random()
        if shape < 0.25:
            rng.shuffle(slots)
        elif shape < 0.4:
            slots.reverse()
        index = t(slots).to(torch.int32) if rng.random() < 0.3 else t(slots)
        self.ours.free(index)  # type: ignore[attr-defined]
        self.ref.free(slots)  # type: ignore[attr-defined]

    def group(self, on: bool) -> None:
        if on and not self.in_group:
            self.ours.free_group_begin()  # type: ignore[attr-defined]
            self.ref.free_group_begin()  # type: ignore[attr-defined]
            self.in_group = True
        elif not on and self.in_group:
            self.ours.free_group_end()  # type: ignore[attr-defined]
            self.ref.free_group_end()  # type: ignore[attr-defined]
            self.in_group = False


def _run(driver: _Driver, steps: int, dev_page: int, alloc_block: bool) -> None:
    rng = driver.rng
    for _ in range(steps):
        op = rng.random()
        if op < 0.3:
            driver.extend()
        elif op < 0.5:
            driver.decode()
        elif op < 0.62:
            driver.device_buffer(dev_page)
        elif op < 0.85:
            driver.finish()
        elif op < 0.93:
            driver.group(not driver.in_group)
        elif alloc_block:
            n = rng.randint(0, 40)
            got = driver.ours.alloc(n)  # type: ignore[attr-defined]
            want = driver.ref.alloc(n)  # type: ignore[attr-defined]
            assert _lists(got) == want
            if want is not None:
                driver.ours.free(t(want))  # type: ignore[attr-defined]
                driver.ref.free(want)  # type: ignore[attr-defined]
        driver.check()
    driver.group(False)
    while driver.reqs:
        driver.finish()
        driver.check()


# ----------------------------------------------------------------------------- HiSparse


def _hisparse(size: int, ps: int, need_sort: bool, debug: bool) -> HiSparseTokenToKVPoolAllocator:
    pool = HiSparseDSATokenToKVPool(
        size, ps, torch.bfloat16, 16, 8, 1, "cpu", index_buf_size=2 * size
    )
    return HiSparseTokenToKVPoolAllocator(
        size, ps, torch.bfloat16, "cpu", pool, need_sort, 2, debug=debug
    )


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("need_sort", [False, True])
@pytest.mark.parametrize("ps", [1, 16])
def test_hisparse_matches_sglang_model(ps: int, need_sort: bool, seed: int) -> None:
    size = 64 if ps == 1 else 256
    rng = random.Random(seed * 31 + ps + need_sort)
    ours = _hisparse(size, ps, need_sort, debug=seed % 2 == 0)
    ref = RefHiSparse(size, ps, need_sort)
    driver = _Driver(ours, ref, rng, ps)
    _run(driver, 120, ps if ps > 1 else 4, alloc_block=ps == 1)
    assert ours.available_size() == min(2 * size, size)


def test_hisparse_failing_alloc_merges_staged_frees_first() -> None:
    # issue 19 item 1: need_sort, page size 1
    a = _hisparse(8, 1, True, debug=False)
    x = a.alloc(4)
    assert x is not None
    a.free(x)
    assert a.alloc(17) is None
    got = a.alloc(2)
    assert got is not None and got.tolist() == [1, 2]  # as SGLang (was [5, 6])


def test_hisparse_extend_after_logical_only_decode_never_hands_out_padding() -> None:
    # issue 19 item 7, page size 16: SGLang maps the new tokens to device slots 1, 2, ...
    for debug in (False, True):
        a = _hisparse(256, 16, False, debug=debug)
        p0, s0 = t([0]), t([5])
        out = a.alloc_extend(p0, p0, s0, s0, t([-1]), 5)
        assert out is not None
        s1 = t([6])
        dec = a.alloc_decode(s1, s1, out[-1:])  # logical only: device slot unmapped
        assert dec is not None
        p2, s2 = t([6]), t([9])
        more = a.alloc_extend(p2, p2, s2, s2, dec, 3)
        assert more is not None
        dev = a.full_to_hisparse_device_index_mapping[more]
        assert bool((dev >= 16).all()), dev  # never the padding page
        assert dev.tolist() == [38, 39, 40]  # fresh page 2, in-page offsets 6..8
        model = RefHiSparse(256, 16, False, fresh_page=False)  # SGLang's own answer
        lo = model.alloc_extend([0], [5], [-1])
        assert lo is not None
        d = model.alloc_decode([6], [lo[-1]])
        assert d is not None
        m2 = model.alloc_extend([6], [9], d)
        assert m2 is not None and [model.mapping[s] for s in m2] == [1, 2, 3]


# ----------------------------------------------------------------------------- DeepSeek-V4


def _deepseek_v4(ps: int, need_sort: bool, debug: bool) -> DeepSeekV4HiSparseTokenToKVPoolAllocator:
    if ps == 16:  # logical 256 tokens (16 pages); c4 device 64 slots (16 pages of 4)
        ratios, c4, c128 = [0, 4], 64, 0
    else:  # page 128: logical 1024 tokens (8 pages); c4 device 128 slots (4 pages of 32)
        ratios, c4, c128 = [0, 4, 128], 128, 8
    pool = DeepSeekV4TokenToKVPool(
        2, 16, c4, c128, 2, 2, ps, 4, FP8, torch.float32, torch.float32,
        448, 64, 16, len(ratios), "cpu", False, ratios, enable_hisparse=True, state_dim=8,
    )  # fmt: skip
    logical = PagedTokenToKVPoolAllocator(pool.size, ps, FP8, "cpu", pool, need_sort, debug=debug)
    return DeepSeekV4HiSparseTokenToKVPoolAllocator(logical, debug=debug)


class _DeepSeekV4Driver(_Driver):
    compressed = True

    def check(self) -> None:
        super().check()
        o, r = self.ours, self.ref
        assert o.full_available_size() == r.full_available_size()  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("need_sort", [False, True])
@pytest.mark.parametrize("ps", [16, 128])
def test_deepseek_v4_hisparse_matches_sglang_model(ps: int, need_sort: bool, seed: int) -> None:
    rng = random.Random(seed * 17 + ps + need_sort)
    ours = _deepseek_v4(ps, need_sort, debug=seed % 2 == 0)
    c4 = ours.hisparse_attn_allocator.size
    ref = RefDeepSeekV4HiSparse(ours.logical_attn_allocator.size, ps, c4, need_sort)
    driver = _DeepSeekV4Driver(ours, ref, rng, ps)
    _run(driver, 120, ps // 4, alloc_block=False)
    assert ours.hisparse_attn_allocator.available_size() == c4


# ----------------------------------------------------------------------------- DeepSeek-V4 stack


class _SWALogicalModel:
    """The package's SGLang-0.5.23 SWA reference behind the list interface of the models."""

    def __init__(self, size: int, size_swa: int, ps: int, need_sort: bool) -> None:
        self.r = ReferenceSWAAllocator(size, size_swa, ps, need_sort=need_sort)

    def available_size(self) -> int:
        return int(self.r.available_size())

    def full_available_size(self) -> int:
        return int(self.r.full_available_size())

    def swa_available_size(self) -> int:
        return int(self.r.swa_available_size())

    def alloc_extend(self, pre: list[int], seq: list[int], last: list[int]) -> list[int] | None:
        p, q = t(pre), t(seq)
        return _lists(self.r.alloc_extend(p, p, q, q, t(last), sum(seq) - sum(pre)))

    def alloc_decode(self, seq: list[int], last: list[int]) -> list[int] | None:
        q = t(seq)
        return _lists(self.r.alloc_decode(q, q, t(last)))

    def free(self, slots: list[int]) -> None:
        self.r.free(t(slots))


def _ref_free_list(r: Any) -> list[int]:
    return [int(v) for v in torch.cat([r.free_pages, *r.staged]).tolist()]


class _DeepSeekV4StackDriver(_DeepSeekV4Driver):
    def check(self) -> None:
        o, r = self.ours, self.ref
        swa, model = o.logical_attn_allocator, r.logical.r  # type: ignore[attr-defined]
        assert _free_list(swa.full_attn_allocator) == _ref_free_list(model.full)
        assert _free_list(swa.swa_attn_allocator) == _ref_free_list(model.swa)
        assert torch.equal(swa.full_to_swa_index_mapping, model.mapping)
        _same_paged(o.hisparse_attn_allocator, r.device)  # type: ignore[attr-defined]
        mapping = o.full_to_hisparse_device_index_mapping.tolist()  # type: ignore[attr-defined]
        assert mapping == r.mapping  # type: ignore[attr-defined]
        assert o.available_size() == r.available_size()  # type: ignore[attr-defined]
        assert o.full_available_size() == r.full_available_size()  # type: ignore[attr-defined]
        assert o.swa_available_size() == r.logical.swa_available_size()  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("need_sort", [False, True])
@pytest.mark.parametrize("ps", [16, 128])
def test_deepseek_v4_stack_matches_sglang_model(ps: int, need_sort: bool, seed: int) -> None:
    """The stack as SGLang builds it: SWA allocator over the pool, HiSparse over that."""
    rng = random.Random(seed * 13 + ps + need_sort)
    if ps == 16:
        ratios, c4, c128, swa_size = [0, 4], 64, 0, 128
    else:
        ratios, c4, c128, swa_size = [0, 4, 128], 128, 8, 512
    pool = DeepSeekV4TokenToKVPool(
        2, swa_size, c4, c128, 2, 2, ps, 4, FP8, torch.float32, torch.float32,
        448, 64, 16, len(ratios), "cpu", False, ratios, enable_hisparse=True, state_dim=8,
    )  # fmt: skip
    swa = SWATokenToKVPoolAllocator(pool.size, swa_size, ps, FP8, "cpu", pool, need_sort)
    ours = DeepSeekV4HiSparseTokenToKVPoolAllocator(swa, debug=seed % 2 == 0)
    logical = _SWALogicalModel(pool.size, swa_size, ps, need_sort)
    ref = RefDeepSeekV4HiSparse(pool.size, ps, c4, need_sort, logical=logical)
    driver = _DeepSeekV4StackDriver(ours, ref, rng, ps)
    _run(driver, 100, ps // 4, alloc_block=False)
    assert ours.hisparse_attn_allocator.available_size() == c4
    assert ours.swa_available_size() == swa_size
    assert ours.full_available_size() == min(pool.size, 4 * c4)
