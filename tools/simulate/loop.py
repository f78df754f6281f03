"""The simulated continuous-batching engine loop (no model: K/V rows are deterministic content).

The loop is the same for every model; what it writes, verifies, allocates on the host and checks
goes through a :class:`~tools.simulate.model.ModelAdapter` (``engine.py``: mha/mla,
``deepseek_v4.py``: DeepSeek-V4). One ``step()``:

1. arrivals: first turns whose arrival step has come, and later turns whose think time passed,
   join the FCFS ready queue;
2. admission: the head request looks up its session's cached prefix (device hit, host hit or
   miss), reserves its whole future footprint (prefix + prompt + output, in pages) by evicting
   least recently used device prefixes to the host when the device pool is short, loads a
   host-hit prefix back layer by layer, and takes a ``ReqToTokenPool`` row;
3. prefill: one ``alloc_extend`` (``alloc`` for page size 1) for the admitted batch,
   ``write_req_to_token`` for their rows, every layer's records of the new tokens;
4. decode: one token for every request admitted earlier (``get_last_loc`` + ``alloc_decode``, or
   a one-token ``alloc_extend`` where the model asks for it); with ``spec_draft`` N, speculative
   decoding: ``1 + N`` slots per request (``alloc_extend``), a deterministic number accepted,
   the slots of the rejected drafts that leave the request's pages freed in one shuffled
   ``free`` of all requests' rejected slots (partial pages);
5. finish: requests that decoded their whole answer verify one layer of their sequence, hand the
   page-aligned part of it to the prefix store and free the rest (the partial last page) inside
   one free group; with ``shared_prefix_tokens`` the page-aligned part that the shared-prefix
   cache already holds is inserted radix-style: the duplicate pages the request computed are
   freed in the same group and its session entry borrows the cache's pages
   (``shared_prefix.py``; a request without a cached session prefix matches them at admission);
   with ``retract_after`` N, a queue head that waited N steps for memory makes the running
   request with the most output left retract (its slots freed, its turn queued again);
6. the slot-conservation check.

Moving cached prefixes between the device, the host and the storage tier (L3) is
``tiers.py``'s; ``restart_at`` flushes every cached prefix to L3 mid-run.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import Generic

import torch

from mem_cache_allocator import TokenToKVPoolAllocator
from mem_cache_kernels import get_last_loc, write_req_to_token
from tools.simulate.integrity import owned_slots
from tools.simulate.model import H, ModelAdapter, Req
from tools.simulate.prefix_store import PrefixEntry
from tools.simulate.stats import SimStats
from tools.simulate.storage_tier import StorageTier
from tools.simulate.tiers import CacheTiers
from tools.simulate.workload import SessionId, SessionSpec, Workload

__all__ = ["EngineLoop"]

_Lens = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class EngineLoop(Generic[H]):
    """Drives one model's memory stack through a ``Workload``; see the module docstring.

    ``follow_ups=False``: no arrivals of its own; turns come from :meth:`submit` and a finished
    turn queues nothing (a multi-instance driver routes each turn to an instance), and there is
    no shared-prefix cache (that driver frees and moves session entries itself).
    """

    def __init__(
        self, workload: Workload, model: ModelAdapter[H], stats: SimStats,
        l3: StorageTier | None = None, *, follow_ups: bool = True,
    ) -> None:
        self.model = model
        self.cfg = cfg = model.cfg
        self.stats = stats
        self.ps = model.page_size
        self.tiers = CacheTiers(model, stats, cfg.shared_prefix_tokens if follow_ups else 0, l3)
        self.store = self.tiers.store  # the cached prefixes
        self.shared = self.tiers.shared  # the shared-prefix cache
        self.l3 = l3  # the storage tier (L3), or None
        self.running: list[Req] = []
        self.ready: deque[tuple[SessionSpec, int]] = deque()
        self._later: list[tuple[int, SessionId, int]] = []  # (ready step, session, turn)
        self._sessions = {s.session: s for s in workload.sessions}
        self.follow_ups = follow_ups
        self._arrivals = deque(
            sorted(workload.sessions, key=lambda s: s.arrival_step) if follow_ups else ()
        )
        self.total_requests = workload.requests
        self.device = model.device
        self._token_alloc = isinstance(model.allocator, TokenToKVPoolAllocator)
        self._blocked = 0  # steps the queue head has waited for memory
        self._shuffle = torch.Generator().manual_seed(cfg.seed)

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def _arange(self, start: int, end: int) -> torch.Tensor:
        return torch.arange(start, end, dtype=torch.int64, device=self.device)

    # ----------------------------------------------------------------- loop
    def done(self) -> bool:
        return not (self.running or self.ready or self._later or self._arrivals)

    def step(self) -> None:
        now = self.stats.steps
        if now == self.cfg.restart_at:
            self.restart()
        while self._arrivals and self._arrivals[0].arrival_step <= now:
            self.ready.append((self._arrivals.popleft(), 0))
        while self._later and self._later[0][0] <= now:
            _, session, turn = heapq.heappop(self._later)
            self.ready.append((self._sessions[session], turn))
        admitted = self._admit()
        decoding = list(self.running)
        if admitted:
            self._extend(admitted, prefill=True)
        if decoding:
            if self.cfg.spec_draft:
                self._decode_spec(decoding)
            else:
                self._extend(decoding, prefill=False)
        self.running.extend(admitted)
        self.stats.peak_running = max(self.stats.peak_running, len(self.running))
        self._finish()
        self.stats.steps += 1
        if self.stats.steps % self.cfg.check_every == 0:
            self.check()

    def submit(self, spec: SessionSpec, turn: int) -> None:
        """Queue turn ``turn`` of ``spec`` now (its earlier turns ran, here or elsewhere)."""
        self.ready.append((spec, turn))

    def check(self) -> None:
        """Slot conservation on every pool (the model's check)."""
        self.model.check(self.running, self.store, self.shared.tokens_held)

    def leak_check(self) -> None:
        """Record every pool's (available, capacity) after :meth:`drain`."""
        self.model.leak_check()

    def close(self) -> None:
        self.model.close()

    def restart(self) -> None:
        """A graceful engine restart (``CacheTiers.restart``): every cached prefix is flushed
        to the storage tier and dropped. Running requests carry on."""
        self.tiers.restart()

    def drain(self) -> None:
        """Free every cached prefix (after the last request finished)."""
        if self.running:
            raise RuntimeError(f"drain() with {len(self.running)} requests still running")
        self.tiers.drain()

    # ------------------------------------------------------------ admission
    def _pages(self, tokens: int) -> int:
        return owned_slots(tokens, self.ps)

    def _margin(self) -> int:
        """Slots a speculative step may take past a request's final length."""
        draft = self.cfg.spec_draft
        return self._pages(draft + 1) + self.ps if draft else 0

    def _retract(self) -> None:
        """Retract the running request with the most output left (SGLang under memory pressure):
        its whole row is freed, its turn goes back to the queue (recomputed on re-admission)."""
        victim = max(self.running, key=lambda r: (r.final_len - r.seq_len, r.row))
        self.running.remove(victim)
        req_pool = self.model.req_pool
        slots = req_pool.req_to_token[victim.row, : victim.seq_len].to(torch.int64)
        self.tiers.free_owned(slots, victim.shared, reverse=True)
        req_pool.free(victim.row)
        self.ready.append((victim.spec, victim.turn))
        self.stats.retractions += 1

    def _admit(self) -> list[Req]:
        admitted: list[Req] = []
        model = self.model
        after = self.cfg.retract_after
        if after and self._blocked >= after and self.running:
            self._retract()
            self._blocked = 0
        # future growth every running request has been promised (decodes never fail)
        margin = self._margin()
        reserve = sum(model.future_tokens(r.seq_len, r.final_len) + margin for r in self.running)
        while self.ready and len(self.running) + len(admitted) < self.cfg.max_running:
            spec, turn = self.ready[0]
            t = spec.turns[turn]
            history = spec.history_len(turn)
            input_len = history + t.prompt_len
            final_len = input_len + t.output_len
            entry = self.store.take(spec.session)
            on_device = entry.length if entry is not None and entry.tier == "device" else 0
            need = self._pages(final_len) - on_device + margin
            if not self.tiers.make_room(reserve + need):
                if entry is not None:
                    self.store.put(entry)
                self._blocked += 1
                if not self.running and not admitted:
                    raise RuntimeError(
                        f"cannot admit session {spec.session} turn {turn} ({final_len} tokens) "
                        f"into an idle engine: {model.capacity_name} {model.device_capacity}"
                    )
                break
            self.ready.popleft()
            self._blocked = 0
            prefix, shared = self._prefix_slots(spec, turn, history, input_len, entry)
            rows = model.req_pool.alloc(1)
            if rows is None:
                raise RuntimeError("ReqToTokenPool has no free row below max_running requests")
            req = Req(spec, turn, rows[0], prefix.numel(), prefix, input_len, final_len,
                      shared=shared)
            admitted.append(req)
            reserve += self._pages(final_len) - req.prefix_len + margin
        return admitted

    def _prefix_slots(
        self, spec: SessionSpec, turn: int, history: int, input_len: int,
        entry: PrefixEntry | None,
    ) -> tuple[torch.Tensor, int]:
        """Device slots of the request's cached prefix and how many of them are borrowed from
        the shared-prefix cache: the session's entry (loaded from the host or L3 if needed),
        else the shared prefix's match."""
        prefix = self.tiers.session_prefix(spec, turn, history, entry)
        if prefix is not None:
            return prefix
        shared = self.shared.match(input_len)
        if shared is None:
            return self._arange(0, 0), 0
        self.stats.shared_prefix_hits += 1
        self.stats.shared_prefix_hit_tokens += shared.numel()
        return shared, shared.numel()

    # ------------------------------------------------------- forward passes
    def _alloc(
        self, n: int, labels: tuple[str, str], lens: _Lens, last_loc: Callable[[], torch.Tensor],
        *, decode: bool = False,
    ) -> torch.Tensor | None:
        """``n`` slots for one batch: ``alloc(n)`` on a token allocator (timed as
        ``labels[0]``), else ``alloc_extend`` (``alloc_decode`` with ``decode``) with the last
        slots ``last_loc()`` (timed as ``labels[1]``)."""
        allocator, stats = self.model.allocator, self.stats
        if self._token_alloc:
            with stats.timed(labels[0], n):
                return allocator.alloc(n)
        last = last_loc()
        with stats.timed(labels[1], n):
            if decode:
                return allocator.alloc_decode(lens[2], lens[3], last)
            return allocator.alloc_extend(*lens, last, n)

    def _extend(self, reqs: list[Req], *, prefill: bool) -> None:
        """Prefill (``prefill``: the prompt tokens after the cached prefix) or decode (one token)
        for ``reqs``: one allocation, the request table, every layer's records."""
        stats, model = self.stats, self.model
        if prefill:
            pre = [r.prefix_len for r in reqs]
            seq = [r.input_len for r in reqs]
        else:
            pre = [r.seq_len for r in reqs]
            seq = [r.seq_len + 1 for r in reqs]
        pre_cpu = torch.tensor(pre, dtype=torch.int64)
        seq_cpu = torch.tensor(seq, dtype=torch.int64)
        n = int((seq_cpu - pre_cpu).sum())
        prefix_lens, seq_lens = pre_cpu.to(self.device), seq_cpu.to(self.device)
        lens = (prefix_lens, pre_cpu, seq_lens, seq_cpu)
        rows = self._tensor([r.row for r in reqs])
        table = model.req_pool.req_to_token
        if prefill:
            out = self._alloc(n, ("alloc (extend)", "alloc_extend"), lens, lambda: self._tensor(
                [int(r.prefix_slots[-1]) if r.prefix_len else -1 for r in reqs]
            ))
        else:
            by_extend = model.decode_by_extend
            label = "alloc_extend (decode)" if by_extend else "alloc_decode"
            out = self._alloc(n, ("alloc (decode)", label), lens,
                              lambda: get_last_loc(table, rows, prefix_lens), decode=not by_extend)
        if out is None:
            what = "prefill" if prefill else "decode"
            raise RuntimeError(f"{what} of {n} tokens failed despite the reservation")
        if prefill:
            prefix_slots = torch.cat([r.prefix_slots for r in reqs])
            write_req_to_token(table, rows, prefix_lens, seq_lens, out, prefix_slots=prefix_slots)
        else:
            write_req_to_token(table, rows, prefix_lens, seq_lens, out)
        counts = seq_lens - prefix_lens
        session_ids = self._tensor([int(r.spec.session) for r in reqs])
        sessions = torch.repeat_interleave(session_ids, counts)
        starts = torch.cumsum(counts, 0) - counts
        positions = self._arange(0, n) + torch.repeat_interleave(prefix_lens - starts, counts)
        model.write(out, sessions, positions)
        for r, s in zip(reqs, seq):
            if prefill and r.turn > 0:  # history a cache could have served but did not
                stats.recomputed_tokens += r.spec.history_len(r.turn) - r.prefix_len
            r.seq_len = s
        if prefill:
            stats.prefill_tokens += n
        else:
            stats.decode_tokens += n

    def _decode_spec(self, reqs: list[Req]) -> None:
        """Speculative decoding: ``1 + spec_draft`` slots per request, some accepted, the slots
        of rejected drafts past the accepted tokens' pages freed (one shuffled ``free``)."""
        stats, ps = self.stats, self.ps
        n = 1 + self.cfg.spec_draft
        bs = len(reqs)
        rows = self._tensor([r.row for r in reqs])
        before_cpu = torch.tensor([r.seq_len for r in reqs], dtype=torch.int64)
        after_cpu = before_cpu + n
        before, after = before_cpu.to(self.device), after_cpu.to(self.device)
        req_to_token = self.model.req_pool.req_to_token
        out = self._alloc(bs * n, ("alloc (decode)", "alloc_extend"),
                          (before, before_cpu, after, after_cpu),
                          lambda: get_last_loc(req_to_token, rows, before))
        if out is None:
            raise RuntimeError(f"speculative decode of {bs} x {n} failed despite the reservation")
        grid = out.view(bs, n)
        accepted = [
            min(r.final_len - r.seq_len, 1 + (int(r.spec.session) * 7 + r.seq_len) % n)
            for r in reqs
        ]
        acc_cpu = torch.tensor(accepted, dtype=torch.int64)
        keep = torch.arange(n).expand(bs, n) < acc_cpu[:, None]
        acc_slots = grid[keep.to(self.device)]
        write_req_to_token(req_to_token, rows, before, before + acc_cpu.to(self.device), acc_slots)
        sessions = torch.repeat_interleave(self._tensor([int(r.spec.session) for r in reqs]),
                                           acc_cpu.to(self.device))
        starts = torch.cumsum(acc_cpu, 0) - acc_cpu
        positions = torch.arange(int(acc_cpu.sum())) + torch.repeat_interleave(
            before_cpu - starts, acc_cpu
        )
        self.model.write(acc_slots, sessions, positions.to(self.device))
        rejected = []
        for i, r in enumerate(reqs):
            r.seq_len += accepted[i]
            first_free = -(-r.seq_len // ps) * ps - (r.seq_len - accepted[i])  # local index
            if first_free < n:
                rejected.append(grid[i, first_free:])
        stats.decode_tokens += sum(accepted)
        stats.draft_tokens += bs * n
        if rejected:
            flat = torch.cat(rejected)
            stats.rejected_draft_tokens += flat.numel()
            order = torch.randperm(flat.numel(), generator=self._shuffle).to(self.device)
            self.tiers.free_device(flat[order])

    # --------------------------------------------------------------- finish
    def _finish(self) -> None:
        done = [r for r in self.running if r.seq_len >= r.final_len]
        if not done:
            return
        self.running = [r for r in self.running if r.seq_len < r.final_len]
        stats, ps = self.stats, self.ps
        req_pool, allocator = self.model.req_pool, self.model.allocator
        allocator.free_group_begin()
        try:
            for r in done:
                slots = req_pool.req_to_token[r.row, : r.seq_len].to(torch.int64)
                self._verify_sequence(r, slots)
                aligned = r.seq_len // ps * ps
                shared, duplicates = self.shared.insert(slots, aligned, r.shared)
                if duplicates is not None:  # pages the shared-prefix cache already holds
                    with stats.timed("free", duplicates.numel()):
                        allocator.free(duplicates)
                    stats.duplicate_pages_freed += duplicates.numel() // ps
                if aligned:
                    cached = slots[:aligned].clone()
                    if shared:
                        cached[:shared] = self.shared.cached_slots(shared)
                    entry = PrefixEntry(r.spec.session, aligned, "device", cached, shared)
                    self.store.put(entry)
                if aligned < r.seq_len:  # the partial last page
                    tail = self.model.tail_slots(slots, aligned)
                    with stats.timed("free", tail.numel()):
                        allocator.free(tail)
                req_pool.free(r.row)
                stats.requests_done += 1
                if self.follow_ups and r.turn + 1 < len(r.spec.turns):
                    heapq.heappush(
                        self._later,
                        (stats.steps + self.cfg.think_steps, r.spec.session, r.turn + 1),
                    )
        finally:
            with stats.timed("free_group_end"):
                allocator.free_group_end()

    def _verify_sequence(self, r: Req, slots: torch.Tensor) -> None:
        """Check one layer (rotating) of the finished sequence: catches slots handed out twice."""
        layer = (int(r.spec.session) + r.turn) % self.model.layer_num
        positions = self._arange(0, r.seq_len)
        sessions = torch.full_like(positions, int(r.spec.session))
        bad = self.model.verify_layer(layer, slots, sessions, positions)
        self.stats.sequences_verified += 1
        if bad:
            what = self.model.mismatch_text(bad, r.seq_len)
            self.stats.fail(
                f"session {r.spec.session} turn {r.turn}: {what} of layer {layer} differ from "
                "their content"
            )
