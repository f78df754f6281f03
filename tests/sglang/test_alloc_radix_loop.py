"""SGLang-in-the-loop: SGLang 0.5.23's RadixCache and scheduler memory paths over our allocators.

One seeded multi-turn workload (chat sessions sharing system prompts, chunked prefill, eviction
under pressure, decode-capacity checks with retraction to CPU and re-admission, free groups) is
driven through SGLang's own code: ``RadixCache`` (match / insert / lock / evict / free_kv_row),
``allocation.alloc_for_extend`` / ``alloc_for_decode`` (which call the allocator's
``get_extend_allocation_demand``, ``evict_to_free_tokens``, ``alloc_extend`` / ``alloc_decode``
/ ``alloc``), ``ScheduleBatch.check_decode_mem`` (``check_decode_capacity``), the allocator's
``create_prefill_budget`` for admission, and ``get_cpu_copy`` / ``load_cpu_copy`` with
``req_pool_index=`` for retraction, as ``Req.offload_kv_cache`` calls them.

It runs twice per case, over (a) SGLang's own allocator and (b) ours, both with SGLang's
``ReqToTokenPool`` and ``MHATokenToKVPool``, and asserts the two traces (matches, slots,
evictions, admission answers, available sizes after every step) are identical. K/V bytes are
checked at every prefix hit and after every re-admission: every token's K/V is written through
the pool's ``set_kv_buffer(layer, ...)`` with a value determined by its token prefix, so a
cached slot must read back exactly the value of the prefix it is matched for.

The stand-ins for SGLang's ``Req`` and ``ScheduleBatch``, the tree and the batches are the
radix-loop driver's (``tools/sglang_ref/radix_loop.py``, shared with the scheduler-step
benchmark ``tools/bench/sglang_step.py``).
"""

from __future__ import annotations

import random
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from mem_cache_allocator import PagedTokenToKVPoolAllocator as OurPaged
from mem_cache_allocator import TokenToKVPoolAllocator as OurToken
from tools.sglang_ref.radix_loop import RadixLoop, Req, load_modules

_HEAD_DIM = 2


@pytest.fixture(scope="module")
def sgl(sglang_load: Callable[..., list[types.ModuleType]]) -> types.SimpleNamespace:
    return load_modules(sglang_load)


def _value(tokens: list[int], pos: int) -> float:
    """The K value of position ``pos`` of a sequence: a function of its prefix (exact in fp32)."""
    h = 0
    for t in tokens[: pos + 1]:
        h = (h * 131 + t + 7) % 1_000_003
    return float(h)


@dataclass
class _Req(Req):
    """The driver's request plus this workload's progress."""

    extend_done: int = 0  # positions already prefilled (chunked prefill)
    decoded: int = 0
    backup: Any = None


class _Run:
    """One engine: SGLang's pools and radix cache over the given allocator."""

    #: (layer id, reads through the full->window mapping) of every layer written and checked
    layers: tuple[tuple[int, bool], ...] = ((0, False),)

    def __init__(self, sgl: Any, ps: int, need_sort: bool, ours: bool, size: int) -> None:
        self.sgl, self.ps = sgl, ps
        self.rtp = sgl.mp.ReqToTokenPool(
            size=8, max_context_len=size + 2 * ps, device="cpu", enable_memory_saver=False
        )
        self.kv, self.allocator, self.tree = self.build(need_sort, ours, size)
        evict = self.tree.evict

        def counting_evict(params: Any) -> Any:
            before = self.tree.evictable_size()
            result = evict(params)
            self.evicted += before - self.tree.evictable_size()
            self.trace.append(("evict", params.num_tokens, result.num_tokens_evicted))
            return result

        self.tree.evict = counting_evict  # SGLang's evict_for_alloc calls self.evict
        self.evicted = 0
        self.trace: list[Any] = []
        self.kv_checks = 0

    def build(self, need_sort: bool, ours: bool, size: int) -> tuple[Any, Any, Any]:
        """(KV pool, allocator, tree): SGLang's MHA pool and RadixCache over the allocator (the
        driver's, which also makes the batches)."""
        sgl, ps = self.sgl, self.ps
        kv = sgl.mp.MHATokenToKVPool(
            size=size,
            page_size=ps,
            dtype=torch.float32,
            head_num=1,
            head_dim=_HEAD_DIM,
            layer_num=1,
            device="cpu",
            enable_memory_saver=False,
        )
        if ps == 1:
            cls = OurToken if ours else sgl.alloc.TokenToKVPoolAllocator
            allocator = cls(size, torch.float32, "cpu", kv, need_sort)
        else:
            cls = OurPaged if ours else sgl.alloc.PagedTokenToKVPoolAllocator
            allocator = cls(size, ps, torch.float32, "cpu", kv, need_sort)
        self.loop = RadixLoop(sgl, allocator, self.rtp, ps)
        return kv, allocator, self.loop.tree

    # ------------------------------------------------------------------ helpers
    def sizes(self) -> tuple[int, int, int]:
        return (
            self.allocator.available_size(),
            self.tree.evictable_size(),
            self.tree.protected_size(),
        )

    def write_loc(self, loc: torch.Tensor) -> Any:
        """The ``loc_info`` the attention backend hands ``set_kv_buffer`` (a bare loc here)."""
        return loc

    def write_kv(self, req: _Req, start: int, end: int, loc: torch.Tensor) -> None:
        tokens = req.fill_ids
        vals = torch.tensor([_value(tokens, p) for p in range(start, end)])
        for layer_id, _ in self.layers:
            k = (vals + layer_id)[:, None, None].expand(-1, 1, _HEAD_DIM).contiguous()
            layer = types.SimpleNamespace(layer_id=layer_id, k_scale=None, v_scale=None)
            self.kv.set_kv_buffer(layer, self.write_loc(loc), k, -k)

    def check_kv(self, req: _Req, n: int) -> None:
        if n == 0:
            return
        row = self.rtp.req_to_token[req.kv.req_pool_idx, :n].to(torch.int64)
        tokens = req.fill_ids
        want = torch.tensor([_value(tokens, p) for p in range(n)])
        for layer_id, windowed in self.layers:
            loc, exp = row, want
            if windowed:  # only the window's slots are kept: check the mapped ones
                loc = self.allocator.translate_loc_from_full_to_swa(row)
                loc, exp = loc[loc > 0], want[loc > 0]
            k = self.kv.get_key_buffer(layer_id)[loc][:, 0, 0]
            v = self.kv.get_value_buffer(layer_id)[loc][:, 0, 0]
            assert torch.equal(k, exp + layer_id), f"K mismatch, req {req.rid} layer {layer_id}"
            assert torch.equal(v, -(exp + layer_id)), f"V mismatch, req {req.rid} layer {layer_id}"
        self.kv_checks += 1

    # ------------------------------------------------------------------ steps
    def match(self, req: _Req) -> None:
        self.loop.match(req, self.loop.key(req.fill_ids))
        req.extend_done = req.prefix_len
        self.trace.append(("match", req.rid, req.prefix_len, self.sizes()))

    def extend(self, reqs: list[_Req], chunk: int) -> list[_Req]:
        """One prefill batch (each request at most ``chunk`` tokens); returns those done."""
        ends = [min(r.seqlen, r.extend_done + chunk) for r in reqs]
        b = self.loop.extend_batch(reqs, [r.extend_done for r in reqs], ends)
        for r in reqs:
            r.prefix_len = r.extend_done
        loc, _, idx_cpu = self.sgl.allocation.alloc_for_extend(b)
        self.trace.append(("extend", loc.tolist(), idx_cpu.tolist(), self.sizes()))
        pt = 0
        for r, start, end in zip(reqs, b.prefix_lens, ends, strict=True):
            self.write_kv(r, start, end, loc[pt : pt + end - start])
            pt += end - start
            if start > 0:
                # the prefix hit (or the earlier chunks) reads back its prefix's values
                self.check_kv(r, start)
            r.extend_done = end
        return [r for r, e in zip(reqs, ends, strict=True) if e == r.seqlen]

    def decode(self, reqs: list[_Req], rng: random.Random) -> None:
        b = self.loop.decode_batch(reqs, [r.seqlen for r in reqs])
        loc = self.sgl.allocation.alloc_for_decode(b, 1)
        self.trace.append(("decode", loc.tolist(), self.sizes()))
        for r, slot in zip(reqs, loc.tolist(), strict=True):
            r.output_ids.append(rng.randrange(1000) if r.rid % 3 else 5)
            r.decoded += 1
            self.write_kv(r, r.seqlen - 1, r.seqlen, torch.tensor([slot]))

    def check_decode(self, reqs: list[_Req]) -> bool:
        ok = bool(self.loop.batch(reqs).check_decode_mem())
        self.trace.append(("check_decode", ok, self.sizes()))
        return ok

    def finish(self, reqs: list[_Req]) -> None:
        """SGLang's finished-request release: insert the page-aligned KV into the tree, free the
        duplicates it exposed and the rest of the row (``free_kv_row``), unlock, free the row;
        the whole batch in one free group, as the scheduler does."""
        self.allocator.free_group_begin()
        for r in reqs:
            row = self.rtp.req_to_token[r.kv.req_pool_idx, : r.seqlen]
            key = self.loop.key(r.fill_ids).page_aligned(self.ps)
            values = row[: len(key)].to(dtype=torch.int64, copy=True)
            res = self.tree.insert(self.sgl.bpc.InsertParams(key=key, value=values))
            protected = r.kv.cache_protected_len
            ranges = []
            if res.prefix_len > protected:
                self.allocator.free_segment(row[protected : res.prefix_len], start_pos=protected)
            if r.seqlen > len(key):
                ranges.append((len(key), r.seqlen))
            if ranges:
                self.tree.free_kv_row(r.kv, ranges)
            self.tree.unlock(r.lock)
            r.lock = None
            self.trace.append(("finish", r.rid, res.prefix_len, len(key)))
            self.rtp.free(r)
            r.kv.mark_kv_released()
        self.allocator.free_group_end()
        self.trace.append(("finished", self.sizes()))

    def retract(self, r: _Req) -> None:
        """CPU-tensor retraction: ``get_cpu_copy(..., req_pool_index=)`` as
        ``Req.offload_kv_cache``, then the row goes back without caching."""
        idx = self.rtp.req_to_token[r.kv.req_pool_idx, : r.seqlen - 1].to(torch.int64)
        r.backup = self.allocator.get_cpu_copy(
            idx, mamba_indices=None, req_pool_index=r.kv.req_pool_idx
        )
        protected = r.kv.cache_protected_len
        self.tree.free_kv_row(r.kv, [(protected, r.seqlen)])
        self.tree.unlock(r.lock)
        r.lock = None
        self.rtp.free(r)
        r.kv.mark_kv_released()
        r.kv.cache_protected_len = 0
        r.drop_last_token()  # the last token's KV was not written yet in SGLang; recompute it
        self.trace.append(("retract", r.rid, self.sizes()))

    def restore(self, r: _Req) -> None:
        """``load_cpu_copy(..., req_pool_index=)`` into the re-admitted row, as
        ``Req.load_kv_cache``; the K/V read back must be the retracted values."""
        idx = self.rtp.req_to_token[r.kv.req_pool_idx, : r.seqlen].to(torch.int64)
        self.allocator.load_cpu_copy(
            r.backup, idx, mamba_indices=None, req_pool_index=r.kv.req_pool_idx
        )
        r.backup = None
        self.check_kv(r, r.seqlen)
        self.trace.append(("restore", r.rid, self.sizes()))


def _workload(run: _Run, seed: int, steps: int) -> int:
    """The seeded multi-turn workload; returns the steps run."""
    rng = random.Random(seed)
    u = max(run.ps, 8)
    systems = [[rng.randrange(1000) for _ in range(2 * u + 3)] for _ in range(2)]
    sessions: list[list[int]] = []
    waiting: list[_Req] = []
    running: list[_Req] = []
    chunked: list[_Req] = []
    rid = 0
    for _step in range(steps):
        # new turns: a new session, or the next turn of an existing one (shared prefixes)
        if len(waiting) < 3 and rng.random() < 0.6:
            if sessions and rng.random() < 0.6:
                history = list(rng.choice(sessions))
            else:
                history = list(rng.choice(systems))
            turn = [rng.randrange(1000) for _ in range(rng.randrange(1, 2 * u))]
            max_new = rng.randrange(1, 3 * min(u, 24))
            waiting.append(_Req(rid, history + turn, run.sgl.sched.ReqKvInfo(), max_new=max_new))
            rid += 1
        # admission through the allocator's prefill budget (SGLang's PrefillAdder's questions)
        budget = run.allocator.create_prefill_budget(run.tree)
        # what the running and the chunked requests will still take (PrefillAdder's offsets)
        # (generation scaled by a new-token ratio of 1/4, as SGLang's, so decode can run short)
        budget.total_offset += sum((r.max_new - r.decoded) // 4 for r in running)
        rest = sum(r.seqlen - r.extend_done + run.ps for r in chunked)
        budget.total_offset += rest + sum(r.max_new for r in chunked)
        budget.current_offset += rest
        admit: list[_Req] = []
        for r in list(waiting):
            if len(running) + len(chunked) + len(admit) >= 3:
                break
            ok, _ = budget.check_prefill(
                extend_input_len=r.seqlen,
                total_tokens=r.seqlen + r.max_new,
                max_new_tokens=r.max_new,
                input_tokens=r.seqlen,
                swa_host_hit_length=0,
                chunk_limit=None,
            )
            ok = ok and budget.can_allocate_prefill(
                paged_input=-(-r.seqlen // run.ps) * run.ps + run.ps,
                extend_input_len=r.seqlen,
                max_new_tokens=r.max_new,
                chunk_limit=None,
            )
            run.trace.append(("admit?", r.rid, ok, budget.remaining_total))
            if not ok:
                break
            budget.reserve(r.seqlen, r.max_new // 4)
            waiting.remove(r)
            admit.append(r)
        for r in admit:
            run.match(r)
        prefill = chunked + admit
        if prefill:
            done = run.extend(prefill, chunk=3 * u)
            chunked = [r for r in prefill if r not in done]
            for r in done:
                if r.backup is not None:
                    run.restore(r)
            running.extend(done)
            continue
        if not running:
            continue
        while running and not run.check_decode(running):
            victim = running.pop()
            run.retract(victim)
            waiting.insert(0, victim)
        if not running:
            continue
        run.decode(running, rng)
        finished = [r for r in running if r.decoded >= r.max_new]
        if finished:
            for r in finished:
                running.remove(r)
                sessions.append(r.fill_ids)
            run.finish(finished)
    return steps


_CASES = [(ps, need_sort) for ps in (1, 16, 64) for need_sort in (False, True)]
_IDS = [f"ps{p}-sort{int(s)}" for p, s in _CASES]


@pytest.mark.parametrize(("ps", "need_sort"), _CASES, ids=_IDS)
def test_radix_loop_same_trace_as_sglang(
    sgl: types.SimpleNamespace, ps: int, need_sort: bool
) -> None:
    size = 12 * max(ps, 8)
    theirs = _Run(sgl, ps, need_sort, ours=False, size=size)
    ours = _Run(sgl, ps, need_sort, ours=True, size=size)
    steps = _workload(theirs, seed=ps * 10 + need_sort, steps=150)
    _workload(ours, seed=ps * 10 + need_sort, steps=150)
    kinds = {k[0] for k in theirs.trace}
    for want in ("match", "extend", "decode", "finish", "check_decode"):
        assert want in kinds, f"the workload never ran {want}"
    assert theirs.trace == ours.trace
    assert theirs.kv_checks == ours.kv_checks and ours.kv_checks > 0
    assert theirs.evicted == ours.evicted and ours.evicted > 0, "no eviction under pressure"
    print(
        f"ps={ps} need_sort={need_sort}: steps={steps} events={len(ours.trace)} "
        f"kv_checks={ours.kv_checks} evicted_tokens={ours.evicted} "
        f"retractions={sum(k[0] == 'retract' for k in ours.trace)} "
        f"restores={sum(k[0] == 'restore' for k in ours.trace)} "
        f"identical=True"
    )
