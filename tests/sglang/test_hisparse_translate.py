"""HiSparse page-table translation: our HiSparse allocator + pool against SGLang 0.5.23's, loaded
from its wheel on CPU, on the same seeded call stream.

SGLang's callers of the translation (read in the wheel): the DSA attention backend translates
its 2-D top-k page table (logical token locations, ``-1`` padding, int32) with
``token_to_kv_pool.translate_loc_to_hisparse_device(page_table).to(torch.int32)`` before the
sparse kernels; the HiSparse coordinator translates 1-D logical locations
(``translate_loc_from_full_to_hisparse_device``), asks the allocator for device buffers
(``alloc_device_buffer``), returns device slots (``free_hisparse_indices``) and writes the
latest token's device slot straight into the pool's ``full_to_hisparse_device_index_mapping``.
Running the coordinator itself needs CUDA streams and host pools, so this test makes those
calls in the coordinator's order on both sides (SGLang's ``HiSparseDSATokenToKVPool`` +
``HiSparseTokenToKVPoolAllocator`` and ours, same constructor arguments) and asserts after
every step: the same slots returned, the same logical -> device mapping, and the same
translation (every entry, dtype after the backend's int32 cast) of a 2-D page table of
allocated, unallocated and ``-1`` padded entries, and of the same 1-D locations.
"""

from __future__ import annotations

import random
import types
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import mem_cache_allocator as oa
import mem_cache_pool as op

PS = 64  # SGLang's DSA pools require 64-token pages
SIZE = 8 * PS  # device slots; the logical space is twice that (host_to_device_ratio=2)
STEPS = 120
BUF = 2 * PS  # device-buffer tokens per request (the coordinator's device_buffer_size)


@pytest.fixture(scope="module")
def sgl(sglang_load: Callable[..., list[types.ModuleType]]) -> types.SimpleNamespace:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmp, hal, rc = sglang_load("sglang.srt.mem_cache.hisparse_memory_pool",
                                   "sglang.srt.mem_cache.allocator.hisparse",
                                   "sglang.srt.runtime_context")
    return types.SimpleNamespace(hmp=hmp, hal=hal, rc=rc)


def _sides(sgl: types.SimpleNamespace) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    args = (SIZE, PS, 16, torch.bfloat16, 8, 2, "cpu", 128, False, 24)
    with sgl.rc.get_parallel().override(attn_dcp_size=1, attn_dcp_rank=0, dcp_enabled=False):
        s_pool = sgl.hmp.HiSparseDSATokenToKVPool(*args)
    s_alloc = sgl.hal.HiSparseTokenToKVPoolAllocator(SIZE, PS, torch.bfloat16, "cpu", s_pool,
                                                     False)
    o_pool = op.HiSparseDSATokenToKVPool(*args)
    o_alloc = oa.HiSparseTokenToKVPoolAllocator(SIZE, PS, torch.bfloat16, "cpu", o_pool, False)
    return (s_alloc, s_pool), (o_alloc, o_pool)


def _mapping(pool: Any) -> torch.Tensor:
    mapping: torch.Tensor = pool.full_to_hisparse_device_index_mapping[:]  # SGLang's: a proxy
    return mapping


def _page_table(rng: random.Random, rows: list[list[int]], space: int) -> torch.Tensor:
    """A top-k page table: per request up to 24 of its logical locations, a few never
    allocated ones, then ``-1`` padding (int32, as the DSA backend builds it)."""
    width = 24
    table = torch.full((max(1, len(rows)), width), -1, dtype=torch.int32)
    for i, row in enumerate(rows or [[]]):
        picks = rng.sample(row, min(len(row), rng.randrange(0, width - 3)))
        picks += [rng.randrange(PS, space) for _ in range(rng.randrange(0, 3))]
        table[i, : len(picks)] = torch.tensor(picks, dtype=torch.int32)
    return table


class _Driver:
    """The scheduler's and the coordinator's calls, made identically on both sides."""

    def __init__(self, sides: tuple[tuple[Any, Any], tuple[Any, Any]]) -> None:
        self.sides = sides
        self.rows: list[list[int]] = []  # each running request's logical locations
        self.buffers: list[list[int]] = []  # each request's device buffer (device slots)
        self.log: list[Any] = []

    def both(self, call: Callable[[Any, Any], Any]) -> Any:
        (sa, sp), (oa_, opl) = self.sides
        theirs, ours = call(sa, sp), call(oa_, opl)
        if isinstance(theirs, torch.Tensor) or isinstance(ours, torch.Tensor):
            assert theirs is not None and ours is not None, (theirs, ours)
            assert torch.equal(theirs, ours), (theirs, ours)
        else:
            assert theirs == ours, (theirs, ours)
        assert torch.equal(_mapping(sp), _mapping(opl))
        assert sa.available_size() == oa_.available_size()
        return theirs

    def prefill(self, rng: random.Random) -> None:
        lens = [rng.randrange(1, 3 * PS) for _ in range(rng.randrange(1, 3))]
        n = len(lens)
        zeros = torch.zeros(n, dtype=torch.int64)
        seq = torch.tensor(lens, dtype=torch.int64)
        last = torch.full((n,), -1, dtype=torch.int64)
        out = self.both(lambda a, p: a.alloc_extend(zeros, zeros, seq, seq, last, sum(lens)))
        if out is None:
            self.log.append(("prefill-full", lens))
            return
        pt = 0
        for ln in lens:
            row = out[pt : pt + ln].tolist()
            pt += ln
            # the coordinator's admission: the request's device buffer (its tokens, page
            # aligned, at most the buffer size), reusing its prefill slots
            need = min(-(-ln // PS) * PS, BUF)
            def admit(a: Any, p: Any, r: list[int] = row, n: int = need) -> Any:
                return a.alloc_device_buffer(torch.tensor(r), n)

            buf = self.both(admit)
            self.rows.append(row)
            self.buffers.append(buf.tolist())
        self.log.append(("prefill", lens))

    def decode(self) -> None:
        if not self.rows:
            return
        seq = torch.tensor([len(r) + 1 for r in self.rows], dtype=torch.int64)
        last = torch.tensor([r[-1] for r in self.rows], dtype=torch.int64)
        out = self.both(lambda a, p: a.alloc_decode(seq, seq, last))
        if out is None:
            self.log.append(("decode-full",))
            return
        for i, loc in enumerate(out.tolist()):
            self.rows[i].append(loc)
        # the coordinator's map_last_loc_to_buffer (page size > 1): the new token's logical
        # location maps straight to a slot of the request's device buffer, written into the
        # pool's mapping attribute
        slots = torch.tensor([b[(len(r) - 1) % len(b)] for r, b in zip(self.rows, self.buffers)])

        def remap(a: Any, p: Any) -> None:
            compressed = a.get_last_loc_compressed(out)
            p.full_to_hisparse_device_index_mapping[compressed] = slots

        self.both(remap)
        self.log.append(("decode", len(self.rows)))

    def finish(self, rng: random.Random) -> None:
        if not self.rows:
            return
        i = rng.randrange(len(self.rows))
        row, buf = self.rows.pop(i), self.buffers.pop(i)
        # the coordinator's request_finished: the device buffer back, the row's mapping
        # entries cleared through the pool's mapping attribute; then the scheduler's release
        # frees the logical row
        locs = torch.tensor(row)

        def finished(a: Any, p: Any) -> None:
            a.free_hisparse_indices(torch.unique(torch.tensor(buf)))
            p.full_to_hisparse_device_index_mapping[
                p.translate_loc_from_full_to_compressed(locs)] = 0

        self.both(finished)
        self.both(lambda a, p: a.free(locs))
        self.log.append(("finish", len(row)))

    def translate(self, rng: random.Random) -> int:
        """The DSA backend's 2-D page-table translation and the coordinator's 1-D one."""
        space = 2 * SIZE
        table = _page_table(rng, self.rows, space)
        got = self.both(lambda a, p: p.translate_loc_to_hisparse_device(table).to(torch.int32))
        assert got.shape == table.shape and bool((got[table < 0] == -1).all())
        flat = table.reshape(-1).to(torch.int64)
        self.both(lambda a, p: p.translate_loc_from_full_to_hisparse_device(flat))
        live = flat[flat >= 0]
        # ours names SGLang's private 1-D gather translate_loc_to_device
        (_, sp), (_, opl) = self.sides
        assert torch.equal(opl.translate_loc_to_device(live),
                           sp._translate_loc_to_hisparse_device(live))
        return int((got > 0).sum())


def test_hisparse_translation_same_as_sglang(sgl: types.SimpleNamespace) -> None:
    drv = _Driver(_sides(sgl))
    rng = random.Random(24)
    mapped = 0
    for _ in range(STEPS):
        r = rng.random()
        if r < 0.3 or not drv.rows:
            drv.prefill(rng)
        elif r < 0.85:
            drv.decode()
        else:
            drv.finish(rng)
        mapped += drv.translate(rng)
    kinds = {k[0] for k in drv.log}
    assert {"prefill", "decode", "finish"} <= kinds, kinds
    assert mapped > 0  # the tables hit mapped device slots, not only padding
    counts = {k: sum(e[0] == k for e in drv.log) for k in sorted(kinds)}
    print(f"hisparse: steps={STEPS} {counts} translated_mapped_entries={mapped} identical=True")
