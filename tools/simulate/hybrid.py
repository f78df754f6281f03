"""``--model hybrid``: a hybrid linear-attention model (attention every 4th layer, Mamba elsewhere).

Layers ``3, 7, 11, ...`` of ``--layers`` are full attention; the others are Mamba-2 layers with a
conv state and a temporal (SSM) state per request. The stack is SGLang's for such models:

* :class:`mem_cache_pool.HybridLinearKVPool` over an MHA pool of the full-attention layers only
  (the loop's KV writes and reads go through it with *global* layer ids), the page allocator and
  the MHA host pool of the mha engine (``stack.py``, ``hicache.py``) for KV;
* :class:`mem_cache_pool.HybridReqToTokenPool`: a request row *and* a state slot per admitted
  request (``alloc(reqs)``); a finished or retracted request frees both (``free_mamba_cache``,
  ``free``);
* :class:`mem_cache_pool_host.MambaPoolHost` for the states of host-cached prefixes.

What the adapter adds to the engine loop (``loop.py``):

* every forward pass advances each request's state: its slot gets the deterministic state of
  (session, length) (``_StateContent``; bit patterns, compared as bytes);
* a finished request checkpoints the state at its cached (page-aligned) length into a fresh slot
  that belongs to its prefix entry (a copy of its own slot when the sequence ends on a page
  boundary; else the tracked state at the boundary, which SGLang's extra-buffer tracking computes
  in the forward pass); checkpoints are released when their entry leaves the device (reconciled
  against the prefix store at every check, as the radix cache frees a node's state with it);
* a device prefix hit copies the checkpoint into the request's slot (``copy_mamba_state``, the
  radix cache's copy-on-write) and verifies it bit-exact before the prompt runs; a fresh request
  gets its slot zeroed (``clear_slots``) and verified zero;
* an eviction backs the checkpoint up with the KV (``MambaPoolHost.backup_from_device_all_layer``)
  into one host state slot per host entry; a host hit loads it back layer by layer
  (``load_to_device_per_layer``) and verifies it bit-exact; a finished sequence's final state is
  verified too;
* conservation: working slots == running requests, checkpoints == device entries holding one,
  host state slots == host entries; the leak check covers both state pools.

The report's ``hybrid`` rows: peak state-slot occupancy (working + checkpoints), state bytes
moved host<->device, restores verified. With ``--storage file`` a host entry's KV pages and its
state go to L3 together and come back verified the same way (``l3_bindings.py``). Not modelled
here: the shared prefix and the mid-run restart (off in this mode).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from mem_cache_pool import (
    HybridLinearKVPool,
    HybridReqToTokenPool,
    Mamba2CacheParams,
    Mamba2StateShape,
)
from mem_cache_pool_host import MambaPoolHost
from tools.simulate.config import SimConfig
from tools.simulate.engine import MemoryStackModel
from tools.simulate.faults import FaultInjector
from tools.simulate.loop import EngineLoop
from tools.simulate.model import Req
from tools.simulate.prefix_store import PrefixEntry, PrefixStore
from tools.simulate.stack import MemoryStack, build_stack
from tools.simulate.stats import SimStats
from tools.simulate.storage_tier import StorageTier
from tools.simulate.workload import SessionId, Workload

__all__ = ["ATTENTION_EVERY", "HybridEngine", "HybridModel", "HybridStack", "build_hybrid_stack"]

ATTENTION_EVERY = 4
"""Every 4th layer (``3, 7, ...``) is full attention."""

_D2H, _H2D = "state d2h backup", "state h2d load"


class _SimRows(HybridReqToTokenPool):
    """The loop takes rows as ``alloc(1)`` / ``free(row)``: this binds each row to a request
    record, so every row comes with a state slot through ``alloc(reqs)`` / ``free_mamba_cache``
    (the package's calls; the records are what SGLang's ``Req.kv`` is)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.records: dict[int, SimpleNamespace] = {}
        self.unclaimed: list[SimpleNamespace] = []
        self.on_release: Any = None

    def alloc(self, reqs: Any) -> list[int] | None:
        if not isinstance(reqs, int):
            return super().alloc(reqs)
        recs = [
            SimpleNamespace(
                kv=SimpleNamespace(req_pool_idx=None, mamba_pool_idx=None), session=None
            )
            for _ in range(reqs)
        ]
        rows = super().alloc(recs)
        if rows is None:
            return None
        for row, rec in zip(rows, recs):
            self.records[row] = rec
            self.unclaimed.append(rec)
        return rows

    def free(self, free_index: Any) -> None:
        if not isinstance(free_index, int):
            super().free(free_index)
            return
        rec = self.records.pop(free_index)
        if self.on_release is not None:
            self.on_release(rec)
        self.free_mamba_cache(rec)
        super().free(rec)

    def clear(self) -> None:
        super().clear()
        if hasattr(self, "records"):
            self.records.clear()
            self.unclaimed.clear()


class _StateContent:
    """Deterministic state bytes of (session, length) for every state tensor (all layers)."""

    def __init__(self, tensors: Sequence[torch.Tensor], seed: int) -> None:
        self.specs = [(t.shape[0], tuple(t.shape[2:]), t.dtype) for t in tensors]
        self.seed = seed
        self.words = [
            (layers * int(torch.tensor(entry).prod()) * dt.itemsize + 3) // 4
            for layers, entry, dt in self.specs
        ]

    def states(
        self, sessions: list[int], lengths: list[int], device: torch.device
    ) -> list[torch.Tensor]:
        """Per tensor ``[n, layers, *entry]``: the states of the pairs."""
        key = torch.tensor(
            [(s * 1_000_003 + n * 7919 + self.seed * 104_729) for s, n in zip(sessions, lengths)],
            dtype=torch.int64,
        )
        out = []
        for i, ((layers, entry, dt), words) in enumerate(zip(self.specs, self.words)):
            base = torch.arange(words, dtype=torch.int64) * 2_654_435_761 + (i + 1) * 40_503
            x = (base[None, :] ^ (key[:, None] * 0x9E3779B1)) & 0xFFFFFFFF
            x = (x ^ (x >> 15)) * 0x2C1B3C6D & 0xFFFFFFFF
            x = x ^ (x >> 12)
            raw = x.to(torch.int32).view(torch.uint8)[
                :, : layers * int(torch.tensor(entry).prod()) * dt.itemsize
            ]
            out.append(raw.contiguous().view(dt).view(len(sessions), layers, *entry).to(device))
        return out


@dataclass(slots=True)
class HybridStack:
    """The mha stack of the full-attention layers plus the hybrid pools (see the module doc)."""

    base: MemoryStack
    kv: HybridLinearKVPool
    rows: _SimRows
    host_states: MambaPoolHost
    full_ids: list[int]
    mamba_ids: list[int]
    state_capacity: int
    host_state_capacity: int
    state_bytes: int


def build_hybrid_stack(cfg: SimConfig, max_context_len: int) -> HybridStack:
    """Every pool of ``--model hybrid`` on ``cfg.device`` (host pools on the CPU)."""
    if cfg.layers < ATTENTION_EVERY:
        raise ValueError(f"--model hybrid needs --layers >= {ATTENTION_EVERY}, got {cfg.layers}")
    full = [i for i in range(cfg.layers) if i % ATTENTION_EVERY == ATTENTION_EVERY - 1]
    mamba = [i for i in range(cfg.layers) if i not in full]
    base = build_stack(dataclasses.replace(cfg, model="mha", layers=len(full)), max_context_len)
    device = base.device
    shape = Mamba2StateShape.create(
        tp_world_size=1,
        intermediate_size=64,
        n_groups=1,
        num_heads=4,
        head_dim=16,
        state_size=16,
        conv_kernel=4,
    )
    params = Mamba2CacheParams(shape=shape, layers=mamba)
    entries = cfg.device_tokens // cfg.page_size
    # a working slot per running request, a checkpoint per device entry (>= 1 page each), and
    # the checkpoints of requests admitted since the last reconciliation
    state_slots = cfg.max_running + entries + cfg.max_running * cfg.check_every + 1
    rows = _SimRows(
        size=cfg.max_running,
        mamba_size=state_slots,
        mamba_spec_state_size=cfg.max_running,
        max_context_len=max_context_len,
        device=device,
        enable_memory_saver=False,
        cache_params=params,
        mamba_layer_ids=mamba,
        enable_mamba_extra_buffer=False,
    )
    kv = HybridLinearKVPool(
        base.kv_pool.size,
        cfg.torch_dtype,
        cfg.page_size,
        cfg.heads,
        cfg.head_dim,
        full,
        device,
        rows.mamba_pool,
        full_kv_pool=base.kv_pool,
    )
    host_entries = cfg.host_tokens // cfg.page_size
    host_states = MambaPoolHost(
        rows.mamba_pool,
        1.0,
        0,
        device_capacity=host_entries,
        pin_memory=device.type == "cuda",
        layout="page_first",
    )
    base.req_pool = rows
    base.req_capacity = rows.available_size()
    return HybridStack(
        base=base,
        kv=kv,
        rows=rows,
        host_states=host_states,
        full_ids=full,
        mamba_ids=mamba,
        state_capacity=state_slots,
        host_state_capacity=host_states.available_size(),
        state_bytes=params.mamba_cache_per_req,
    )


@dataclass(slots=True)
class HostRes:
    """A host reservation: KV host slots and one host state slot."""

    kv: torch.Tensor
    state: torch.Tensor
    session: SessionId | None = None
    length: int = 0


@dataclass(slots=True)
class _Checkpoint:
    slot: torch.Tensor
    length: int
    first_slot: int


class HybridModel(MemoryStackModel):
    """The :class:`~tools.simulate.model.ModelAdapter` of a :class:`HybridStack`."""

    def __init__(self, hs: HybridStack, stats: SimStats, faults: FaultInjector) -> None:
        super().__init__(hs.base, stats, faults)
        self.hs = hs
        self.cfg = dataclasses.replace(
            hs.base.cfg, shared_prefix_tokens=0, restart_at=-1, storage="none"
        )
        self.rows = hs.rows
        self.req_pool = hs.rows
        self.pool = hs.rows.mamba_pool
        self.states = [*self.pool.mamba_cache.conv, self.pool.mamba_cache.temporal]
        self.content_states = _StateContent(self.states, hs.base.cfg.seed)
        self.store: PrefixStore | None = None
        self.ckpt: dict[SessionId, _Checkpoint] = {}
        self.host_res: dict[SessionId, HostRes] = {}
        self.working: dict[SessionId, SimpleNamespace] = {}
        self.state_len: dict[SessionId, int] = {}
        self.peak_slots = 0
        self.restores = 0
        hs.rows.on_release = self._release
        hybrid = stats.hybrid
        hybrid.update(
            {
                "state slots capacity": hs.state_capacity,
                "host state slots capacity": hs.host_state_capacity,
                "state bytes per request": hs.state_bytes,
            }
        )

    # ------------------------------------------------------------- states
    def _expected(self, sessions: list[int], lengths: list[int]) -> list[torch.Tensor]:
        return self.content_states.states(sessions, lengths, self.device)

    def _write_states(self, slots: list[int], sessions: list[int], lengths: list[int]) -> None:
        idx = torch.tensor(slots, dtype=torch.int64, device=self.device)
        for t, v in zip(self.states, self._expected(sessions, lengths)):
            t[:, idx] = v.transpose(0, 1)

    def _state_matches(self, slot: int, session: int, length: int) -> bool:
        if length == 0:
            return all(not t[:, slot].view(torch.uint8).any() for t in self.states)
        want = self._expected([session], [length])
        return all(
            torch.equal(
                t[:, slot].reshape(-1).view(torch.uint8), w[0].reshape(-1).view(torch.uint8)
            )
            for t, w in zip(self.states, want)
        )

    def _claim(self, session: SessionId, prefix_len: int) -> None:
        """The request of ``session`` whose prefill starts now gets its state: zeroed (fresh),
        or the checkpoint of its cached prefix copied in (and verified)."""
        rec = self.rows.unclaimed.pop(0)
        rec.session = session
        self.working[session] = rec
        slot = rec.kv.mamba_pool_idx.reshape(1)
        if prefix_len == 0:
            self.pool.clear_slots(slot)  # mamba_needs_clear
            rec.kv.mamba_needs_clear = False
        else:
            ck = self.ckpt.get(session)
            if ck is None or ck.length != prefix_len:
                self.stats.fail(f"session {session}: a {prefix_len}-token prefix hit has no state")
                return
            self.rows.copy_mamba_state(ck.slot.reshape(1), slot)
            self.restores += 1
        if not self._state_matches(int(slot), int(session), prefix_len):
            self.stats.fail(f"session {session}: restored state of length {prefix_len} differs")

    def write(self, slots: torch.Tensor, sessions: torch.Tensor, positions: torch.Tensor) -> None:
        """KV of the full-attention layers through ``HybridLinearKVPool`` (global ids), then
        each request's state advanced to its new length."""
        content = self.stack.content
        h = content.hashes(sessions, positions, len(self.hs.full_ids))
        for i, layer_id in enumerate(self.hs.full_ids):
            k = content.rows_from(h[i, 0], 0)
            v = content.rows_from(h[i, 1], 1)
            self.hs.kv.set_kv_buffer(SimpleNamespace(layer_id=layer_id), slots, k, v)
        sess = sessions.tolist()
        pos = positions.tolist()
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for s, p in zip(sess, pos):
            first.setdefault(s, p)
            last[s] = p + 1
        for s, p in first.items():
            if SessionId(s) not in self.working:
                self._claim(SessionId(s), p)
        order = list(last)
        self._write_states(
            [int(self.working[SessionId(s)].kv.mamba_pool_idx) for s in order],
            order,
            [last[s] for s in order],
        )
        for s in order:
            self.state_len[SessionId(s)] = last[s]

    def verify_layer(
        self, layer: int, slots: torch.Tensor, sessions: torch.Tensor, positions: torch.Tensor
    ) -> int:
        """KV of full-attention layer ``layer`` (read by global id) and the request's state."""
        layer_id = self.hs.full_ids[layer]
        h = self.stack.content.hashes(sessions, positions, len(self.hs.full_ids))
        key = self.hs.kv.get_key_buffer(layer_id)[slots]
        val = self.hs.kv.get_value_buffer(layer_id)[slots]
        bad = max(
            self.stack.content.mismatches(key, h[layer, 0], 0),
            self.stack.content.mismatches(val, h[layer, 1], 1),
        )
        if sessions.numel():
            session = SessionId(int(sessions[0]))
            rec = self.working.get(session)
            if rec is None or not self._state_matches(
                int(rec.kv.mamba_pool_idx), int(session), int(positions[-1]) + 1
            ):
                self.stats.fail(f"session {session}: final state differs from its content")
        return bad

    def _release(self, rec: SimpleNamespace) -> None:
        """A row is freed (finish or retraction): a finished request checkpoints the state at
        its cached length for its new device entry."""
        session = rec.session
        if session is None:
            return
        self.working.pop(session, None)
        length = self.state_len.pop(session, 0)
        entry = self.store.peek(session) if self.store is not None else None
        if entry is None or entry.tier != "device":
            return  # retracted, or nothing cached
        old = self.ckpt.pop(session, None)
        if old is not None:
            self.rows.mamba_allocator.free(old.slot.reshape(1))
        got = self.rows.mamba_allocator.alloc(1)
        if got is None:
            raise RuntimeError("state slots exhausted: a checkpoint could not be taken")
        if entry.length == length:
            self.rows.copy_mamba_state(rec.kv.mamba_pool_idx.reshape(1), got)
        else:  # the state tracked at the page boundary
            self._write_states([int(got)], [int(session)], [entry.length])
        self.ckpt[session] = _Checkpoint(got[0].clone(), entry.length, int(entry.slots[0]))

    def _reconcile(self) -> None:
        """Free the checkpoints whose device entry left (evicted, dropped, taken by a hit)."""
        for session in list(self.ckpt):
            ck = self.ckpt[session]
            entry = self.store.peek(session) if self.store is not None else None
            alive = (
                entry is not None
                and entry.tier == "device"
                and entry.length == ck.length
                and int(entry.slots[0]) == ck.first_slot
            )
            if not alive:
                self.rows.mamba_allocator.free(ck.slot.reshape(1))
                del self.ckpt[session]
        used = len(self.rows.records) + len(self.ckpt)
        self.peak_slots = max(self.peak_slots, used)

    # --------------------------------------------------------------- host
    def host_available(self) -> int:
        if self.hs.host_states.available_size() == 0:
            return 0
        return super().host_available()

    def host_alloc(self, tokens: int) -> HostRes | None:  # type: ignore[override]
        state = self.hs.host_states.alloc(1)
        if state is None:
            return None
        kv = super().host_alloc(tokens)
        if kv is None:
            self.hs.host_states.free(state)
            return None
        return HostRes(kv, state, length=tokens)

    def host_free(self, host: HostRes) -> None:  # type: ignore[override]
        super().host_free(host.kv)
        self.hs.host_states.free(host.state)

    def host_bind(self, session: SessionId, host: HostRes) -> torch.Tensor:  # type: ignore[override]
        host.session = session
        self.host_res[session] = host
        return host.kv

    def host_unbind(self, entry: PrefixEntry) -> HostRes:  # type: ignore[override]
        return self.host_res.pop(entry.session)

    def backup(self, device_slots: torch.Tensor, host: HostRes) -> bool:  # type: ignore[override]
        if not super().backup(device_slots, host.kv):
            return False
        session = next(
            (s for s, ck in self.ckpt.items() if ck.first_slot == int(device_slots[0])), None
        )
        if session is None:
            self.stats.fail(f"a device entry at slot {int(device_slots[0])} has no state")
            return False
        ck = self.ckpt[session]
        stat = self.stats.transfer(_D2H)
        t0 = time.perf_counter_ns()
        self.hs.host_states.backup_from_device_all_layer(
            self.pool, host.state, ck.slot.reshape(1), self.cfg.io_backend
        )
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        stat.record(time.perf_counter_ns() - t0, 1, self.hs.state_bytes)
        host.length = ck.length
        return True

    def load(  # type: ignore[override]
        self, host: HostRes, start: int, device_slots: torch.Tensor, session: SessionId
    ) -> bool:
        if not super().load(host.kv, start, device_slots, session):
            return False
        got = self.rows.mamba_allocator.alloc(1)
        if got is None:
            raise RuntimeError("state slots exhausted: a host hit could not load its state")
        stat = self.stats.transfer(_H2D)
        t0 = time.perf_counter_ns()
        hs = self.hs.host_states
        hs.layer_done_counter.begin()
        for layer in range(len(self.hs.mamba_ids)):
            hs.load_to_device_per_layer(self.pool, host.state, got, layer, self.cfg.io_backend)
            hs.layer_done_counter.wait_until(layer)
        stat.record(time.perf_counter_ns() - t0, 1, self.hs.state_bytes)
        if not self._state_matches(int(got), int(session), host.length):
            self.stats.fail(f"session {session}: state loaded from the host differs")
        old = self.ckpt.pop(session, None)
        if old is not None:
            self.rows.mamba_allocator.free(old.slot.reshape(1))
        self.ckpt[session] = _Checkpoint(got[0].clone(), host.length, int(device_slots[0]))
        return True

    # ------------------------------------------------------------- checks
    def check(self, running: Sequence[Req], store: PrefixStore, shared_held: int) -> None:
        super().check(running, store, shared_held)
        self._reconcile()
        used = self.hs.state_capacity - self.rows.mamba_allocator.available_size()
        want = len(self.rows.records) + len(self.ckpt)
        if used != want or len(self.rows.records) != len(running):
            self.stats.fail(
                f"state slots: {used} in use, expected {len(running)} running + "
                f"{len(self.ckpt)} checkpoints ({len(self.rows.records)} rows held)"
            )
        host_used = self.hs.host_state_capacity - self.hs.host_states.available_size()
        if host_used != len(self.host_res):
            self.stats.fail(
                f"host state slots: {host_used} in use for {len(self.host_res)} entries"
            )

    def leak_check(self) -> None:
        super().leak_check()
        self._reconcile()
        self.stats.leaks["state slots"] = (
            self.rows.mamba_allocator.available_size(),
            self.hs.state_capacity,
        )
        self.stats.leaks["host state slots"] = (
            self.hs.host_states.available_size(),
            self.hs.host_state_capacity,
        )
        hybrid = self.stats.hybrid
        hybrid["peak state slots"] = self.peak_slots
        hybrid["state restores verified"] = self.restores
        hybrid["state bytes moved"] = sum(
            self.stats.transfers[d].bytes for d in (_D2H, _H2D) if d in self.stats.transfers
        )

    def close_host(self) -> None:
        super().close_host()
        self.hs.host_states.close()


class HybridEngine(EngineLoop[HostRes]):
    """The engine loop over a :class:`HybridStack` (see the module doc); ``l3_for(model)``:
    its storage tier (``l3_bindings.HybridBinding``), or ``None``."""

    def __init__(
        self, workload: Workload, hs: HybridStack, stats: SimStats, faults: FaultInjector,
        l3_for: Callable[[HybridModel], StorageTier | None] | None = None,
    ) -> None:
        model = HybridModel(hs, stats, faults)
        super().__init__(workload, model, stats, l3_for(model) if l3_for is not None else None)
        model.store = self.store
        self.hs = hs
