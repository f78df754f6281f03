"""The SGLang-in-the-loop workload: a seeded multi-turn serving run through SGLang 0.5.23's own
scheduler memory paths, traced step by step, over one side's memory layer.

:class:`Engine` is one engine (:class:`~tools.sglang_ref.radix_loop.RadixLoop` over a
:class:`~tools.sglang_ref.radix_loop.Side`); :func:`run_workload` drives it. Every call that
touches memory is SGLang's own code, loaded from its wheel:

- admission: the allocator's ``create_prefill_budget`` (``check_prefill``,
  ``can_allocate_prefill``, ``reserve``), then SGLang's ``common.match_kv_cache`` and the tree
  lock the ``PrefillAdder`` takes;
- prefill (chunked): ``allocation.alloc_for_extend``; an unfinished chunk is published with
  ``common.checkpoint_kv_cache`` (the scheduler's ``stash_chunked_request``);
- decode: ``ScheduleBatch.check_decode_mem`` (retracting the last request while it fails),
  ``allocation.alloc_for_decode`` (which runs ``ScheduleBatch.maybe_evict_swa``: the window's
  ``free_swa_segment`` on a sliding-window tree);
- finish: ``common.release_kv_cache(checkpoint=True)`` (the tree's ``checkpoint``, row free,
  unlock, overallocation free), the whole batch in one free group;
- retraction: the allocator's ``get_cpu_copy(..., req_pool_index=)`` as ``Req.offload_kv_cache``
  calls it, then ``release_kv_cache(checkpoint=False)`` as ``release_req`` does; re-admission
  restores it with ``load_cpu_copy(..., req_pool_index=)``.

K/V: every token's K and V are written through the pool's ``set_kv_buffer(layer, ...)`` (MLA:
``set_kv_buffer`` for prefill, ``set_mla_kv_buffer`` for decode) with a layer object, as an
attention backend writes them, with a value that is a function of the token's prefix; at every
prefix hit, every later chunk and every restore the request's row is read back through
``get_key_buffer`` / ``get_value_buffer`` and must equal the values of the prefix it is matched
for (sliding-window layers: the slots the window still maps, which must cover the window).

The trace records matches, allocated slots (and their window slots), admission answers,
evictions, finishes, retractions and the sizes after every step; two engines over different
sides running the same seed must produce equal traces.
"""

from __future__ import annotations

import random
import sys
import types
from dataclasses import dataclass
from typing import Any

import torch

from tools.sglang_ref.radix_loop import RadixLoop, Req, Side

__all__ = ["Engine", "LoopReq", "run_workload"]

_HEAD_DIM = 2


def _value(tokens: list[int], pos: int) -> float:
    """The K value of position ``pos`` of a sequence: a function of its prefix (exact in fp32)."""
    h = 0
    for t in tokens[: pos + 1]:
        h = (h * 131 + t + 7) % 1_000_003
    return float(h)


@dataclass
class LoopReq(Req):
    """The driver's request plus this workload's progress."""

    extend_done: int = 0  # positions already prefilled (chunked prefill)
    decoded: int = 0
    backup: Any = None


class Engine:
    """One engine over ``side``: SGLang's tree (a ``window`` makes it the SWA tree) and the
    trace of every memory step. ``kind`` is the side's pool family (``mha``, ``mla``, ``swa``).
    """

    def __init__(self, sgl: types.SimpleNamespace, side: Side, page_size: int, kind: str,
                 window: int | None = None) -> None:
        self.sgl, self.ps, self.kind, self.window = sgl, page_size, kind, window
        self.allocator, self.rtp, self.kv = side.allocator, side.req_to_token_pool, side.kv_pool
        self.write_loc_cls = side.write_loc
        self.loop = RadixLoop(sgl, self.allocator, self.rtp, page_size, window=window)
        self.tree = self.loop.tree
        #: (layer id, reads through the full->window mapping) of every layer written and checked
        self.layers = ((0, False), (1, True)) if kind == "swa" else ((0, False),)
        self.trace: list[Any] = []
        self.evicted = 0
        self.kv_checks = 0
        self.swa_freed = 0
        # the tree's eviction entry the allocator reaches (RadixCache: evict_for_alloc calls
        # evict; UnifiedRadixCache: evict_for_alloc walks its own components)
        entry = "evict_for_alloc" if kind == "swa" else "evict"
        evict = getattr(self.tree, entry)

        def counting_evict(params: Any, **kwargs: Any) -> Any:
            before = self.tree.evictable_size()
            result = evict(params, **kwargs)
            self.evicted += before - self.tree.evictable_size()
            self.trace.append(("evict", params.num_tokens, getattr(params, "swa_num_tokens", 0),
                               result.num_tokens_evicted,
                               getattr(result, "swa_num_tokens_evicted", None), self.sizes()))
            return result

        setattr(self.tree, entry, counting_evict)
        if kind == "swa":
            free_swa = self.allocator.free_swa_segment
            own_file = sys.modules[type(self.allocator).__module__].__file__

            def counting_free_swa(free_index: Any, *args: Any, **kwargs: Any) -> Any:
                # recorded when SGLang's code calls it (the window's slide in
                # free_swa_out_of_window_slots, the SWA component's tombstoning), not when the
                # allocator calls itself (its free_segment: an implementation detail)
                if sys._getframe(1).f_code.co_filename != own_file:
                    self.swa_freed += int(free_index.numel())
                    self.trace.append(("free_swa", free_index.tolist(), args, kwargs))
                return free_swa(free_index, *args, **kwargs)

            self.allocator.free_swa_segment = counting_free_swa

    # ------------------------------------------------------------------ observation
    def sizes(self) -> tuple[int, ...]:
        out = [self.allocator.available_size(), self.tree.evictable_size(),
               self.tree.protected_size()]
        if self.kind == "swa":
            out += [self.allocator.full_available_size(), self.allocator.swa_available_size(),
                    self.tree.swa_evictable_size(), self.tree.swa_protected_size()]
        return tuple(out)

    def slots(self, loc: torch.Tensor) -> Any:
        """What a step's slots are recorded as: the full slots (and, SWA, their window slots)."""
        if self.kind != "swa":
            return loc.tolist()
        return loc.tolist(), self.allocator.translate_loc_from_full_to_swa(loc).tolist()

    # ------------------------------------------------------------------ K/V
    def _layer(self, layer_id: int) -> Any:
        return types.SimpleNamespace(layer_id=layer_id, k_scale=None, v_scale=None)

    def write_kv(self, req: LoopReq, start: int, end: int, loc: torch.Tensor,
                 decode: bool = False) -> None:
        tokens = req.fill_ids
        vals = torch.tensor([_value(tokens, p) for p in range(start, end)])
        if self.kind == "swa":
            # the backend translates the step's slots to window slots once per forward
            loc = self.write_loc_cls(loc, self.kv.translate_loc_from_full_to_swa(loc))
        for layer_id, _ in self.layers:
            k = (vals + layer_id)[:, None, None].expand(-1, 1, _HEAD_DIM).contiguous()
            if self.kind != "mla":
                self.kv.set_kv_buffer(self._layer(layer_id), loc, k, -k)
            elif decode:  # MLA backends' decode write: the two halves, no concatenation
                self.kv.set_mla_kv_buffer(self._layer(layer_id), loc, k, -k)
            else:
                self.kv.set_kv_buffer(self._layer(layer_id), loc, torch.cat([k, -k], -1), None)

    def check_kv(self, req: LoopReq, n: int, restored: bool = False) -> None:
        """Read the row's first ``n`` positions back. Sliding-window layers: every slot the
        window still maps, which must cover the last ``window`` positions; after a restore
        only those (positions the window had left were backed up from no slot)."""
        if n == 0:
            return
        row = self.rtp.req_to_token[req.kv.req_pool_idx, :n].to(torch.int64)
        tokens = req.fill_ids
        want = torch.tensor([_value(tokens, p) for p in range(n)])
        for layer_id, windowed in self.layers:
            loc, exp = row, want + layer_id
            if windowed:  # only the window's slots are kept: check the mapped ones
                loc = self.allocator.translate_loc_from_full_to_swa(row).to(torch.int64)
                live = loc > 0
                tail = min(n, self.window or 0)
                assert bool(live[n - tail:].all()), f"window not live, req {req.rid}"
                if restored:
                    live[: n - tail] = False
                loc, exp = loc[live], exp[live]
            k = self.kv.get_key_buffer(layer_id)[loc]
            v = self.kv.get_value_buffer(layer_id)[loc]
            wk = exp[:, None, None].expand(-1, 1, _HEAD_DIM)
            if self.kind == "mla":  # a latent row is [nope | rope]; the value is nope
                assert torch.equal(k, torch.cat([wk, -wk], -1)), f"K, req {req.rid}"
                assert torch.equal(v, wk), f"V, req {req.rid}"
            else:
                assert torch.equal(k, wk), f"K, req {req.rid} layer {layer_id}"
                assert torch.equal(v, -wk), f"V, req {req.rid} layer {layer_id}"
        self.kv_checks += 1

    # ------------------------------------------------------------------ steps
    def match(self, req: LoopReq) -> None:
        self.loop.match(req)
        req.extend_done = req.prefix_len
        self.trace.append(("match", req.rid, req.prefix_len, req.kv.cache_protected_len,
                           self.sizes()))

    def extend(self, reqs: list[LoopReq], chunk: int) -> list[LoopReq]:
        """One prefill batch (each request at most ``chunk`` tokens); returns those done."""
        ends = [min(r.seqlen, r.extend_done + chunk) for r in reqs]
        b = self.loop.extend_batch(reqs, [r.extend_done for r in reqs], ends)
        for r, e in zip(reqs, ends, strict=True):
            r.prefix_len, r.extend_end = r.extend_done, e
        loc, _, idx_cpu = self.sgl.allocation.alloc_for_extend(b)
        self.trace.append(("extend", self.slots(loc), idx_cpu.tolist(), self.sizes()))
        pt = 0
        done = []
        for r, start, end in zip(reqs, b.prefix_lens, ends, strict=True):
            self.write_kv(r, start, end, loc[pt : pt + end - start])
            pt += end - start
            if start > 0:
                # the prefix hit (or the earlier chunks) reads back its prefix's values
                self.check_kv(r, start)
            r.extend_done = end
            if end == r.seqlen:
                done.append(r)
            else:  # the scheduler's stash_chunked_request
                self.sgl.common.checkpoint_kv_cache(r, self.tree)
                self.trace.append(("checkpoint", r.rid, r.kv.cache_protected_len, self.sizes()))
        return done

    def decode(self, reqs: list[LoopReq], rng: random.Random) -> None:
        b = self.loop.decode_batch(reqs, [r.seqlen for r in reqs])
        loc = self.sgl.allocation.alloc_for_decode(b, 1)
        self.trace.append(("decode", self.slots(loc), self.sizes()))
        for r, slot in zip(reqs, loc.tolist(), strict=True):
            r.decode_batch_idx += 1
            r.output_ids.append(rng.randrange(1000) if r.rid % 3 else 5)
            r.decoded += 1
            self.write_kv(r, r.seqlen - 1, r.seqlen, torch.tensor([slot]), decode=True)

    def check_decode(self, reqs: list[LoopReq]) -> bool:
        batch: Any = self.loop.batch(reqs)  # SGLang's check_decode_mem is bound on its class
        ok = bool(batch.check_decode_mem())
        self.trace.append(("check_decode", ok, self.sizes()))
        return ok

    def finish(self, reqs: list[LoopReq]) -> None:
        """SGLang's finished-request release, the whole batch in one free group."""
        self.allocator.free_group_begin()
        for r in reqs:
            self.sgl.common.release_kv_cache(r, self.tree, checkpoint=True)
            self.trace.append(("finish", r.rid, self.sizes()))
        self.allocator.free_group_end()
        self.trace.append(("finished", self.sizes()))

    def retract(self, r: LoopReq) -> None:
        """CPU-tensor retraction: ``get_cpu_copy(..., req_pool_index=)`` as
        ``Req.offload_kv_cache``, then SGLang's release without caching."""
        idx = self.rtp.req_to_token[r.kv.req_pool_idx, : r.seqlen - 1].to(torch.int64)
        r.backup = self.allocator.get_cpu_copy(
            idx, mamba_indices=None, req_pool_index=r.kv.req_pool_idx
        )
        self.sgl.common.release_kv_cache(r, self.tree, checkpoint=False)
        r.kv.cache_protected_len = 0
        r.kv.component_evicted_seqlens.clear()
        r.decode_batch_idx = 0
        r.drop_last_token()  # the last token's KV was not written yet in SGLang; recompute it
        self.trace.append(("retract", r.rid, self.sizes()))

    def restore(self, r: LoopReq) -> None:
        """``load_cpu_copy(..., req_pool_index=)`` into the re-admitted row, as
        ``Req.load_kv_cache``; the K/V read back must be the retracted values."""
        idx = self.rtp.req_to_token[r.kv.req_pool_idx, : r.seqlen].to(torch.int64)
        self.allocator.load_cpu_copy(
            r.backup, idx, mamba_indices=None, req_pool_index=r.kv.req_pool_idx
        )
        r.backup = None
        self.check_kv(r, r.seqlen, restored=True)
        self.trace.append(("restore", r.rid, self.sizes()))


def run_workload(run: Engine, seed: int, steps: int) -> int:
    """The seeded multi-turn workload (sessions sharing system prompts, next turns of earlier
    sessions, chunked prefill, decode under pressure with retraction); returns the steps run.

    Runs with SGLang's parallel context stating one decode-context-parallel rank (what a
    single-GPU server publishes; SGLang's MLA write asserts it)."""
    with run.sgl.rc.get_parallel().override(attn_dcp_size=1, attn_dcp_rank=0, dcp_enabled=False):
        return _workload(run, seed, steps)


def _workload(run: Engine, seed: int, steps: int) -> int:
    rng = random.Random(seed)
    u = max(run.ps, 8)
    systems = [[rng.randrange(1000) for _ in range(2 * u + 3)] for _ in range(2)]
    sessions: list[list[int]] = []
    waiting: list[LoopReq] = []
    running: list[LoopReq] = []
    chunked: list[LoopReq] = []
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
            waiting.append(LoopReq(rid, history + turn, run.sgl.sched.ReqKvInfo(),
                                   max_new=max_new))
            rid += 1
        # admission through the allocator's prefill budget (SGLang's PrefillAdder's questions)
        budget = run.allocator.create_prefill_budget(run.tree)
        # what the running and the chunked requests will still take (PrefillAdder's offsets)
        # (generation scaled by a new-token ratio of 1/4, as SGLang's, so decode can run short)
        budget.total_offset += sum((r.max_new - r.decoded) // 4 for r in running)
        rest = sum(r.seqlen - r.extend_done + run.ps for r in chunked)
        budget.total_offset += rest + sum(r.max_new for r in chunked)
        budget.current_offset += rest
        admit: list[LoopReq] = []
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
