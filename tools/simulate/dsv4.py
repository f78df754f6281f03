"""``--model dsv4``: the serving workload over the DeepSeek-V4 HiSparse stack (``dsv4_stack.py``).

The engine loop is the default model's (``engine.py``: arrivals, FCFS admission with the whole
future footprint reserved, LRU eviction of cached prefixes to the host, host hits loaded back
layer by layer, prefill, decode, finish inside one free group), with the DeepSeek-V4 differences:

* prefill is one ``alloc_extend`` of the HiSparse allocator (logical + window slots, and c4
  device slots for the compressed entries the new tokens complete); decode is a one-token
  ``alloc_extend`` per request, so every compressed entry of a sequence has a device slot and
  can be verified (the coordinator's ``alloc_decode`` + ``alloc_device_buffer`` protocol is
  covered by the allocator package's equivalence tests and conformance kit, not here);
* every token writes a window record per layer and every entry-completing token a c4 / c128
  record per compressed layer (packed with ``mem_cache_kernels.dsv4``);
* an eviction backs up the window, c4 and c128 records of the prefix to their
  ``DeepSeekV4SingleKVPoolHost`` mirrors (token-granular; ``dsv4_hicache.py``), then frees the
  logical slots (which releases window and c4 device slots too); a host hit allocates whole
  pages with ``alloc`` and loads every record pool layer by layer on an IO thread, while the
  scheduler thread reads each layer through the composite pool (``get_swa_key_buffer`` /
  ``get_compressed_key_buffer``, which wait on the registered layer counter) and verifies it
  bit-exact;
* conservation is checked per side: logical full slots, window slots, c4 device slots (whole
  device pages of ``page_size // 4`` entries), each host mirror's page rows, request rows.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mem_cache_kernels import write_req_to_token
from tools.simulate.config import SimConfig
from tools.simulate.dsv4_hicache import DSv4HostTransfers, host_tokens
from tools.simulate.dsv4_stack import DSv4Stack, build_dsv4_stack
from tools.simulate.faults import FaultInjector
from tools.simulate.prefix_store import PrefixEntry, PrefixStore
from tools.simulate.stats import SimStats
from tools.simulate.workload import SessionId, SessionSpec, Workload, generate_workload

__all__ = ["DSv4Engine", "run_dsv4"]


@dataclass(slots=True)
class _Req:
    spec: SessionSpec
    turn: int
    row: int
    prefix_len: int
    prefix_slots: torch.Tensor
    input_len: int
    final_len: int
    seq_len: int = 0


class DSv4Engine:
    """The simulated engine over a :class:`DSv4Stack` (see the module doc)."""

    def __init__(
        self, workload: Workload, stack: DSv4Stack, stats: SimStats, faults: FaultInjector
    ) -> None:
        self.cfg = stack.cfg
        self.stack = stack
        self.stats = stats
        self.transfers = DSv4HostTransfers(stack, stats, faults)
        self.ps = stack.page_size
        self.cps = stack.page_size // 4
        self.store = PrefixStore()
        self.host_rows: dict[SessionId, dict[str, torch.Tensor]] = {}
        self.running: list[_Req] = []
        self.ready: deque[tuple[SessionSpec, int]] = deque()
        self._later: list[tuple[int, SessionId, int]] = []
        self._sessions = {s.session: s for s in workload.sessions}
        self._arrivals = deque(sorted(workload.sessions, key=lambda s: s.arrival_step))
        self.total_requests = workload.requests
        self.device = stack.device

    def _arange(self, start: int, end: int) -> torch.Tensor:
        return torch.arange(start, end, dtype=torch.int64, device=self.device)

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.ps) * self.ps

    # ----------------------------------------------------------------- loop
    def done(self) -> bool:
        return not (self.running or self.ready or self._later or self._arrivals)

    def close(self) -> None:
        self.transfers.close()

    def step(self) -> None:
        now = self.stats.steps
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
            self._extend(decoding, prefill=False)
        self.running.extend(admitted)
        self.stats.peak_running = max(self.stats.peak_running, len(self.running))
        self._finish()
        self.stats.steps += 1
        if self.stats.steps % self.cfg.check_every == 0:
            self.check()

    def drain(self) -> None:
        if self.running:
            raise RuntimeError(f"drain() with {len(self.running)} requests still running")
        for session in self.store.sessions():
            entry = self.store.take(session)
            if entry is None:
                continue
            if entry.tier == "device":
                self._free_device(entry.slots)
            else:
                self._free_host(session)

    # ------------------------------------------------------------ invariants
    def check(self) -> None:
        """Slot conservation on every side; a violation is an integrity failure."""
        st, stats, a = self.stack, self.stats, self.stack.allocator
        stats.conservation_checks += 1
        live = sum(self._pages(r.seq_len) for r in self.running)
        cached = self.store.tokens("device")
        c4_live = sum(-(-(r.seq_len // 4) // self.cps) * self.cps for r in self.running)
        sides = {
            "logical": (st.swa_allocator.full_available_size(), live, st.logical_capacity),
            "window": (st.swa_allocator.swa_available_size(), live, st.swa_capacity),
            "c4 device": (
                a.hisparse_attn_allocator.available_size(),
                c4_live + (cached // 4 if st.pool.c4_kv_pool is not None else 0),
                st.c4_device_capacity,
            ),
        }
        for name, (avail, used, cap) in sides.items():
            extra = 0 if name == "c4 device" else cached
            if avail + used + extra != cap:
                stats.fail(
                    f"step {stats.steps}: {name} slots not conserved: available {avail} + used "
                    f"{used} + cached {extra} != capacity {cap}"
                )
        host_rows = self.store.tokens("host") // self.ps
        for kind in st.kinds:
            have = kind.host.available_size() + host_rows
            if have != kind.capacity:
                stats.fail(
                    f"step {stats.steps}: host {kind.name} rows not conserved: {have} != "
                    f"{kind.capacity}"
                )
        rows = st.req_pool.available_size() + len(self.running)
        if rows != st.req_capacity:
            stats.fail(f"step {stats.steps}: request rows not conserved: {rows}")
        used_now = st.logical_capacity - st.swa_allocator.full_available_size()
        stats.peak_device_tokens = max(stats.peak_device_tokens, used_now)
        stats.peak_host_tokens = max(stats.peak_host_tokens, host_rows * self.ps)

    def leak_check(self) -> None:
        st = self.stack
        self.stats.leaks = {
            "logical": (st.swa_allocator.full_available_size(), st.logical_capacity),
            "window": (st.swa_allocator.swa_available_size(), st.swa_capacity),
            "c4 device": (
                st.allocator.hisparse_attn_allocator.available_size(),
                st.c4_device_capacity,
            ),
            **{f"host {k.name}": (k.host.available_size(), k.capacity) for k in st.kinds},
            "req_to_token": (st.req_pool.available_size(), st.req_capacity),
        }
        # logical compressed slots still mapped to a device slot: none may be left (0 of 0)
        mapped = int((st.allocator.full_to_hisparse_device_index_mapping[:-1] != 0).sum())
        self.stats.leaks["c4 mapped entries"] = (mapped, 0)

    # ------------------------------------------------------------ admission
    def _admit(self) -> list[_Req]:
        admitted: list[_Req] = []
        reserve = sum(self._future(r) for r in self.running)
        while self.ready and len(self.running) + len(admitted) < self.cfg.max_running:
            spec, turn = self.ready[0]
            t = spec.turns[turn]
            history = spec.history_len(turn)
            input_len = history + t.prompt_len
            final_len = input_len + t.output_len
            entry = self.store.take(spec.session)
            on_device = entry.length if entry is not None and entry.tier == "device" else 0
            need = self._pages(final_len) - on_device
            if not self._make_room(reserve + need):
                if entry is not None:
                    self.store.put(entry)
                if not self.running and not admitted:
                    raise RuntimeError(
                        f"cannot admit session {spec.session} turn {turn} ({final_len} tokens) "
                        f"into an idle engine: logical capacity {self.stack.logical_capacity}"
                    )
                break
            self.ready.popleft()
            prefix = self._prefix_slots(spec, turn, history, entry)
            rows = self.stack.req_pool.alloc(1)
            if rows is None:
                raise RuntimeError("ReqToTokenPool has no free row below max_running requests")
            req = _Req(spec, turn, rows[0], prefix.numel(), prefix, input_len, final_len)
            admitted.append(req)
            reserve += self._pages(final_len) - req.prefix_len
        return admitted

    def _dev_tokens(self, seq_len: int) -> int:
        """c4 device pages a sequence of ``seq_len`` tokens holds, in tokens (``page_size``
        per page of ``page_size // 4`` entries)."""
        return -(-(seq_len // 4) // self.cps) * self.ps

    def _future(self, r: _Req) -> int:
        """Tokens of ``available_size()`` a running request may still take: its logical pages are
        all taken by prefill, but its c4 device pages only as its entries complete."""
        logical = self._pages(r.final_len) - self._pages(r.seq_len)
        return max(logical, self._dev_tokens(r.final_len) - self._dev_tokens(r.seq_len))

    def _make_room(self, tokens: int) -> bool:
        while self.stack.allocator.available_size() < tokens:
            if not self._evict_one():
                return False
        return True

    def _prefix_slots(
        self, spec: SessionSpec, turn: int, history: int, entry: PrefixEntry | None
    ) -> torch.Tensor:
        stats = self.stats
        if turn > 0:
            stats.returning_turns += 1
            stats.reusable_tokens += history
        empty = self._arange(0, 0)
        if entry is None:
            stats.misses += turn > 0
            return empty
        if entry.tier == "device":
            stats.device_hits += 1
            stats.device_hit_tokens += entry.length
            return entry.slots
        with stats.timed("alloc", entry.length):
            full = self.stack.allocator.alloc(entry.length)
        if full is None:
            raise RuntimeError(f"alloc({entry.length}) failed after room was made for it")
        ok = self.transfers.load(self.host_rows[spec.session], full, int(spec.session))
        self._free_host(spec.session)  # consumed on success, dropped on failure
        if not ok:
            self._free_device(full)
            stats.misses += 1
            return empty
        stats.host_hits += 1
        stats.host_hit_tokens += entry.length
        return full

    # ------------------------------------------------------------ host tier
    def _free_host(self, session: SessionId) -> None:
        for kind in self.stack.kinds:
            kind.host.free(self.host_rows[session][kind.name])
        del self.host_rows[session]

    def _reserve_host(self, rows: int) -> dict[str, torch.Tensor] | None:
        kinds = self.stack.kinds
        while min(k.host.available_size() for k in kinds) < rows:
            victim = self.store.oldest("host")
            if victim is None:
                return None
            self.store.take(victim.session)
            self._free_host(victim.session)
            self.stats.host_drops += 1
        got = {k.name: k.host.alloc(rows) for k in kinds}
        if any(v is None for v in got.values()):
            raise RuntimeError(f"host alloc({rows}) failed after room was made for it")
        return {name: v for name, v in got.items() if v is not None}

    def _evict_one(self) -> bool:
        entry = self.store.oldest("device")
        if entry is None:
            return False
        host = self._reserve_host(entry.length // self.ps)
        if host is not None and self.transfers.backup(entry.slots, host):
            self.host_rows[entry.session] = host
            full = self.store.move_to_host(entry.session, host_tokens(host["swa"], self.ps))
            self._free_device(full)
            self.stats.evictions_to_host += 1
            return True
        if host is not None:  # the backup failed: its host rows hold garbage
            for kind in self.stack.kinds:
                kind.host.free(host[kind.name])
        self.store.take(entry.session)
        self._free_device(entry.slots)
        self.stats.device_drops += 1
        return True

    def _free_device(self, full: torch.Tensor) -> None:
        with self.stats.timed("free", full.numel()):
            self.stack.allocator.free(full)

    # ------------------------------------------------------- forward passes
    def _extend(self, reqs: list[_Req], *, prefill: bool) -> None:
        """Prefill (``prefill``: prompt tokens after the cached prefix) or decode (one token)
        for ``reqs``: one ``alloc_extend``, the request table, every record."""
        stack, stats = self.stack, self.stats
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
        rows = self._tensor([r.row for r in reqs])
        table = stack.req_pool.req_to_token
        if prefill:
            last = [int(r.prefix_slots[-1]) if r.prefix_len else -1 for r in reqs]
        else:
            last = table[rows, prefix_lens - 1].tolist()
        kind = "alloc_extend" if prefill else "alloc_extend (decode)"
        with stats.timed(kind, n):
            out = stack.allocator.alloc_extend(
                prefix_lens, pre_cpu, seq_lens, seq_cpu, self._tensor(last), n
            )
        if out is None:
            raise RuntimeError(f"{kind} of {n} tokens failed despite the reservation")
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
        stack.write(out, sessions, positions)
        for r, s in zip(reqs, seq):
            if prefill and r.turn > 0:
                stats.recomputed_tokens += r.spec.history_len(r.turn) - r.prefix_len
            r.seq_len = s
        if prefill:
            stats.prefill_tokens += n
        else:
            stats.decode_tokens += n

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
                if aligned < r.seq_len:  # the partial last page, passed as a whole page
                    page = int(slots[aligned]) // ps
                    with stats.timed("free", ps):
                        allocator.free(self._arange(page * ps, (page + 1) * ps))
                stack.req_pool.free(r.row)
                stats.requests_done += 1
                if r.turn + 1 < len(r.spec.turns):
                    heapq.heappush(
                        self._later,
                        (stats.steps + self.cfg.think_steps, r.spec.session, r.turn + 1),
                    )
        finally:
            with stats.timed("free_group_end"):
                allocator.free_group_end()

    def _verify_sequence(self, r: _Req, slots: torch.Tensor) -> None:
        """Check one layer (rotating) of the finished sequence: window records of every token and
        compressed records of every entry (c4 through the HiSparse mapping)."""
        layer = (int(r.spec.session) + r.turn) % self.stack.pool.layer_num
        positions = self._arange(0, r.seq_len)
        sessions = torch.full_like(positions, int(r.spec.session))
        bad = self.stack.verify_layer(layer, slots, sessions, positions)
        self.stats.sequences_verified += 1
        if bad:
            self.stats.fail(
                f"session {r.spec.session} turn {r.turn}: {bad} records of layer {layer} differ "
                "from their content"
            )


def run_dsv4(cfg: SimConfig, progress: Callable[[int, int], None] | None = None) -> SimStats:
    """One ``--model dsv4`` run (called by ``simulation.run_simulation``): statistics with
    integrity failures and the leak check filled in."""
    t0 = time.perf_counter()
    workload = generate_workload(cfg)
    stack = build_dsv4_stack(cfg, workload.max_context_len + 1)
    stats = SimStats(
        device_capacity=stack.logical_capacity,
        host_capacity=stack.kinds[0].capacity * stack.page_size,
        bytes_per_token=stack.bytes_per_token,
    )
    engine = DSv4Engine(workload, stack, stats, FaultInjector(cfg.faults, cfg.seed))
    try:
        while not engine.done():
            engine.step()
            if progress is not None:
                progress(stats.requests_done, engine.total_requests)
        engine.check()
        engine.drain()
    finally:
        engine.close()
    engine.check()
    engine.leak_check()
    for kind in stack.kinds:
        kind.host.close()
    stats.wall_s = time.perf_counter() - t0
    return stats
