"""The simulated continuous-batching engine loop (no model: K/V rows are deterministic content).

One ``step()``:

1. arrivals: first turns whose arrival step has come, and later turns whose think time passed,
   join the FCFS ready queue;
2. admission: the head request looks up its session's cached prefix (device hit, host hit or
   miss), reserves its whole future footprint (prefix + prompt + output, in pages) by evicting
   least recently used device prefixes to the host pool when the device pool is short, loads a
   host-hit prefix back layer by layer, and takes a ``ReqToTokenPool`` row;
3. prefill: one ``alloc_extend`` (``alloc`` for page size 1) for the admitted batch,
   ``write_req_to_token`` for their rows, ``set_kv_buffer`` of every layer for the new tokens;
4. decode: one token for every request admitted earlier (``get_last_loc`` + ``alloc_decode``);
   with ``spec_draft`` N, speculative decoding: ``1 + N`` slots per request (``alloc_extend``),
   a deterministic number accepted, the slots of the rejected drafts that leave the request's
   pages freed in one shuffled ``free`` of all requests' rejected slots (partial pages);
5. finish: requests that decoded their whole answer verify one layer of their sequence, hand the
   page-aligned part of it to the prefix store and free the unshared tail (the partial last
   page's slots) inside one free group;
   with ``retract_after`` N, a queue head that waited N steps for memory makes the running
   request with the most output left retract (its slots freed, its turn queued again);
6. the slot-conservation check.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

import torch

from mem_cache_allocator import TokenToKVPoolAllocator
from mem_cache_kernels import get_last_loc, write_req_to_token
from tools.simulate.faults import FaultInjector
from tools.simulate.hicache import HostTransfers
from tools.simulate.integrity import check_conservation, owned_slots
from tools.simulate.prefix_store import PrefixEntry, PrefixStore
from tools.simulate.stack import MemoryStack
from tools.simulate.stats import SimStats
from tools.simulate.storage_tier import StorageTier
from tools.simulate.workload import SessionId, SessionSpec, Workload

__all__ = ["Engine", "Req"]


@dataclass(slots=True)
class Req:
    """A running turn. ``seq_len`` tokens have KV; it finishes at ``final_len``."""

    spec: SessionSpec
    turn: int
    row: int
    prefix_len: int
    prefix_slots: torch.Tensor
    input_len: int
    final_len: int
    seq_len: int = 0


class Engine:
    """Drives one ``MemoryStack`` through a ``Workload``; see the module docstring."""

    def __init__(
        self, workload: Workload, stack: MemoryStack, stats: SimStats, faults: FaultInjector,
        l3: StorageTier | None = None, *, follow_ups: bool = True,
    ) -> None:
        self.cfg = stack.cfg
        self.stack = stack
        self.stats = stats
        self.ps = stack.page_size
        self.store = PrefixStore()
        self.transfers = HostTransfers(stack, stats, faults)
        self.l3 = l3  # the storage tier (L3), or None
        self.running: list[Req] = []
        self.ready: deque[tuple[SessionSpec, int]] = deque()
        self._later: list[tuple[int, SessionId, int]] = []  # (ready step, session, turn)
        self._sessions = {s.session: s for s in workload.sessions}
        # follow_ups=False: no arrivals of their own; turns come from submit() and a finished
        # turn queues nothing (a multi-instance driver routes each turn to an instance)
        self.follow_ups = follow_ups
        self._arrivals = deque(
            sorted(workload.sessions, key=lambda s: s.arrival_step) if follow_ups else ()
        )
        self.total_requests = workload.requests
        self.device = stack.device
        self._blocked = 0  # steps the queue head has waited for memory
        self._shuffle = torch.Generator().manual_seed(stack.cfg.seed)

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
            self._prefill(admitted)
        if decoding:
            self._decode(decoding)
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
        check_conservation(self.stack, self.store, (r.seq_len for r in self.running), self.stats)

    def close(self) -> None:
        self.transfers.close()

    def restart(self) -> None:
        """A graceful engine restart: every cached prefix is flushed to the storage tier (host
        entries directly, device entries through a device->host backup) and then dropped; the
        storage tier reopens its directory. Running requests carry on."""
        host = self.stack.host_pool
        device_entries: list[PrefixEntry] = []
        for session in self.store.sessions():
            entry = self.store.take(session)
            if entry is None:
                continue
            if entry.tier == "device":
                device_entries.append(entry)
                continue
            if self.l3 is not None:
                self.l3.on_host_drop(entry)
            host.free(entry.slots)
        for entry in device_entries:
            staging = host.alloc(entry.length) if self.l3 is not None else None
            if staging is not None:
                if self.transfers.backup(entry.slots, staging) and self.l3 is not None:
                    self.l3.on_host_drop(PrefixEntry(entry.session, entry.length, "host", staging))
                host.free(staging)
            self._free_device(entry.slots)
        if self.l3 is not None:
            self.l3.restart()

    def drain(self) -> None:
        """Free every cached prefix (after the last request finished)."""
        if self.running:
            raise RuntimeError(f"drain() with {len(self.running)} requests still running")
        for session in self.store.sessions():
            entry = self.store.take(session)
            if entry is None:
                continue
            if entry.tier == "device":
                self._free_device(entry.slots)
            else:
                self.stack.host_pool.free(entry.slots)

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
        slots = self.stack.req_pool.req_to_token[victim.row, : victim.seq_len].to(torch.int64)
        self._free_device(slots.flip(0))
        self.stack.req_pool.free(victim.row)
        self.ready.append((victim.spec, victim.turn))
        self.stats.retractions += 1

    def _admit(self) -> list[Req]:
        admitted: list[Req] = []
        after = self.cfg.retract_after
        if after and self._blocked >= after and self.running:
            self._retract()
            self._blocked = 0
        # future growth every running request has been promised (decodes never fail)
        margin = self._margin()
        reserve = sum(
            self._pages(r.final_len) - self._pages(r.seq_len) + margin for r in self.running
        )
        while self.ready and len(self.running) + len(admitted) < self.cfg.max_running:
            spec, turn = self.ready[0]
            t = spec.turns[turn]
            history = spec.history_len(turn)
            input_len = history + t.prompt_len
            final_len = input_len + t.output_len
            entry = self.store.take(spec.session)
            on_device = entry.length if entry is not None and entry.tier == "device" else 0
            need = self._pages(final_len) - on_device + margin
            if not self._make_room(reserve + need):
                if entry is not None:
                    self.store.put(entry)
                self._blocked += 1
                if not self.running and not admitted:
                    raise RuntimeError(
                        f"cannot admit session {spec.session} turn {turn} ({final_len} tokens) "
                        f"into an idle engine: device capacity {self.stack.device_capacity}"
                    )
                break
            self.ready.popleft()
            self._blocked = 0
            prefix = self._prefix_slots(spec, turn, history, entry)
            rows = self.stack.req_pool.alloc(1)
            if rows is None:
                raise RuntimeError("ReqToTokenPool has no free row below max_running requests")
            req = Req(spec, turn, rows[0], prefix.numel(), prefix, input_len, final_len)
            admitted.append(req)
            reserve += self._pages(final_len) - req.prefix_len + margin
        return admitted

    def _prefix_slots(
        self, spec: SessionSpec, turn: int, history: int, entry: PrefixEntry | None
    ) -> torch.Tensor:
        """Device slots of the session's cached prefix (loading it from the host if needed)."""
        stats = self.stats
        if turn > 0:
            stats.returning_turns += 1
            stats.reusable_tokens += history
        empty = self._arange(0, 0)
        from_l3 = entry is None and turn > 0 and self.l3 is not None
        if from_l3 and self.l3 is not None:  # L1 and L2 missed: prefetch from storage
            entry = self.l3.fetch(spec.session, history, self._make_host_room)
        if entry is None:
            stats.misses += turn > 0
            return empty
        if entry.tier == "device":
            stats.device_hits += 1
            stats.device_hit_tokens += entry.length
            return entry.slots
        with stats.timed("alloc", entry.length):
            device_slots = self.stack.allocator.alloc(entry.length)
        if device_slots is None:
            raise RuntimeError(f"alloc({entry.length}) failed after room was made for it")
        positions = self._arange(0, entry.length)
        sessions = torch.full_like(positions, int(spec.session))
        ok = self.transfers.load(entry.slots, device_slots, sessions, positions)
        self.stack.host_pool.free(entry.slots)  # consumed on success, dropped on failure
        if not ok:
            self._free_device(device_slots)
            stats.misses += 1
            if from_l3 and self.l3 is not None:
                self.l3.record_load_failure()
            return empty
        if from_l3 and self.l3 is not None:
            self.l3.record_hit(entry.length)
        else:
            stats.host_hits += 1
            stats.host_hit_tokens += entry.length
        return device_slots

    def _make_room(self, tokens: int) -> bool:
        """Evict LRU device prefixes until ``tokens`` slots are free; ``False`` if impossible."""
        while self.stack.allocator.available_size() < tokens:
            if not self._evict_one():
                return False
        return True

    def _evict_one(self) -> bool:
        entry = self.store.oldest("device")
        if entry is None:
            return False
        host_slots = self._reserve_host(entry.length)
        if host_slots is not None and self.transfers.backup(entry.slots, host_slots):
            self._free_device(self.store.move_to_host(entry.session, host_slots))
            self.stats.evictions_to_host += 1
            if self.l3 is not None:
                self.l3.on_host_insert(entry)
            return True
        if host_slots is not None:  # the backup failed: its host slots hold garbage
            self.stack.host_pool.free(host_slots)
        self.store.take(entry.session)
        self._free_device(entry.slots)
        self.stats.device_drops += 1
        return True

    def _reserve_host(self, tokens: int) -> torch.Tensor | None:
        if not self._make_host_room(tokens):
            return None
        return self.stack.host_pool.alloc(tokens)

    def _make_host_room(self, tokens: int) -> bool:
        """Drop LRU host entries (written back to L3 first) until ``tokens`` host slots are free."""
        host = self.stack.host_pool
        while host.available_size() < tokens:
            victim = self.store.oldest("host")
            if victim is None:
                return False
            self.store.take(victim.session)
            if self.l3 is not None:
                self.l3.on_host_drop(victim)
            host.free(victim.slots)
            self.stats.host_drops += 1
        return True

    def _free_device(self, slots: torch.Tensor) -> None:
        with self.stats.timed("free", slots.numel()):
            self.stack.allocator.free(slots)

    # ------------------------------------------------------- forward passes
    def _prefill(self, reqs: list[Req]) -> None:
        stack, stats = self.stack, self.stats
        prefix_cpu = torch.tensor([r.prefix_len for r in reqs], dtype=torch.int64)
        seq_cpu = torch.tensor([r.input_len for r in reqs], dtype=torch.int64)
        extend = int((seq_cpu - prefix_cpu).sum())
        prefix_lens, seq_lens = prefix_cpu.to(self.device), seq_cpu.to(self.device)
        rows = self._tensor([r.row for r in reqs])
        prefix_slots = torch.cat([r.prefix_slots for r in reqs])
        allocator = stack.allocator
        if isinstance(allocator, TokenToKVPoolAllocator):
            with stats.timed("alloc (extend)", extend):
                out = allocator.alloc(extend)
        else:
            last_loc = self._tensor([int(r.prefix_slots[-1]) if r.prefix_len else -1 for r in reqs])
            with stats.timed("alloc_extend", extend):
                out = allocator.alloc_extend(
                    prefix_lens, prefix_cpu, seq_lens, seq_cpu, last_loc, extend
                )
        if out is None:
            raise RuntimeError(f"prefill of {extend} tokens failed despite the reservation")
        write_req_to_token(
            stack.req_pool.req_to_token, rows, prefix_lens, seq_lens, out,
            prefix_slots=prefix_slots,
        )
        counts = seq_lens - prefix_lens
        session_ids = self._tensor([int(r.spec.session) for r in reqs])
        sessions = torch.repeat_interleave(session_ids, counts)
        starts = torch.cumsum(counts, 0) - counts
        positions = self._arange(0, extend) + torch.repeat_interleave(prefix_lens - starts, counts)
        stack.write_kv(out, sessions, positions)
        for r in reqs:
            r.seq_len = r.input_len
            if r.turn > 0:  # history a cache could have served but did not
                stats.recomputed_tokens += r.spec.history_len(r.turn) - r.prefix_len
        stats.prefill_tokens += extend

    def _decode(self, reqs: list[Req]) -> None:
        if self.cfg.spec_draft:
            self._decode_spec(reqs)
            return
        stack, stats = self.stack, self.stats
        bs = len(reqs)
        rows = self._tensor([r.row for r in reqs])
        before_cpu = torch.tensor([r.seq_len for r in reqs], dtype=torch.int64)
        after_cpu = before_cpu + 1
        before, after = before_cpu.to(self.device), after_cpu.to(self.device)
        allocator = stack.allocator
        req_to_token = stack.req_pool.req_to_token
        if isinstance(allocator, TokenToKVPoolAllocator):
            with stats.timed("alloc (decode)", bs):
                out = allocator.alloc(bs)
        else:
            last_loc = get_last_loc(req_to_token, rows, before)
            with stats.timed("alloc_decode", bs):
                out = allocator.alloc_decode(after, after_cpu, last_loc)
        if out is None:
            raise RuntimeError(f"decode of {bs} requests failed despite the reservation")
        write_req_to_token(req_to_token, rows, before, after, out)
        sessions = self._tensor([int(r.spec.session) for r in reqs])
        stack.write_kv(out, sessions, before)
        for r in reqs:
            r.seq_len += 1
        stats.decode_tokens += bs

    def _decode_spec(self, reqs: list[Req]) -> None:
        """Speculative decoding: ``1 + spec_draft`` slots per request, some accepted, the slots
        of rejected drafts past the accepted tokens' pages freed (one shuffled ``free``)."""
        stack, stats, ps = self.stack, self.stats, self.ps
        n = 1 + self.cfg.spec_draft
        bs = len(reqs)
        rows = self._tensor([r.row for r in reqs])
        before_cpu = torch.tensor([r.seq_len for r in reqs], dtype=torch.int64)
        after_cpu = before_cpu + n
        before, after = before_cpu.to(self.device), after_cpu.to(self.device)
        allocator = stack.allocator
        req_to_token = stack.req_pool.req_to_token
        if isinstance(allocator, TokenToKVPoolAllocator):
            with stats.timed("alloc (decode)", bs * n):
                out = allocator.alloc(bs * n)
        else:
            last_loc = get_last_loc(req_to_token, rows, before)
            with stats.timed("alloc_extend", bs * n):
                out = allocator.alloc_extend(before, before_cpu, after, after_cpu, last_loc, bs * n)
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
        stack.write_kv(acc_slots, sessions, positions.to(self.device))
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
            self._free_device(flat[order])

    # --------------------------------------------------------------- finish
    def _finish(self) -> None:
        done = [r for r in self.running if r.seq_len >= r.final_len]
        if not done:
            return
        self.running = [r for r in self.running if r.seq_len < r.final_len]
        stack, stats, ps = self.stack, self.stats, self.ps
        allocator = stack.allocator
        allocator.free_group_begin()
        try:
            for r in done:
                slots = stack.req_pool.req_to_token[r.row, : r.seq_len].to(torch.int64)
                self._verify_sequence(r, slots)
                aligned = r.seq_len // ps * ps
                if aligned:
                    entry = PrefixEntry(r.spec.session, aligned, "device", slots[:aligned].clone())
                    self.store.put(entry)
                if aligned < r.seq_len:  # the unshared tail: the partial last page's slots
                    with stats.timed("free", r.seq_len - aligned):
                        allocator.free(slots[aligned:])
                stack.req_pool.free(r.row)
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
        layer = (int(r.spec.session) + r.turn) % self.stack.kv_pool.layer_num
        positions = self._arange(0, r.seq_len)
        sessions = torch.full_like(positions, int(r.spec.session))
        h = self.stack.content.hashes(sessions, positions, layer + 1)
        bad = self.stack.count_mismatches(layer, slots, h)
        self.stats.sequences_verified += 1
        if bad:
            self.stats.fail(
                f"session {r.spec.session} turn {r.turn}: {bad}/{r.seq_len} tokens of layer "
                f"{layer} differ from their content"
            )
