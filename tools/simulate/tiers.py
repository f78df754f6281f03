"""The cached-prefix tiers of the engine loop (``loop.py``): device, host and storage (L3).

A finished turn's page-aligned prefix stays cached as its session's entry in the LRU
:class:`~tools.simulate.prefix_store.PrefixStore`; the shared-prefix cache
(``shared_prefix.py``) holds one device copy of the preamble every session shares. This module
moves entries between the tiers through the model's adapter (``model.py``):

* ``make_room``: the device pool is short, so the LRU device entry is backed up to the host (or
  dropped when the host has no room or the backup fails), and the shared prefix is evicted last;
* ``make_host_room``: LRU host entries are dropped, written back to L3 first;
* ``session_prefix``: at admission, the session's entry on the device; a host hit (or an L3 hit,
  prefetched into host room first) is loaded back layer by layer and verified, its shared
  preamble matched on the device first;
* ``restart`` flushes every entry to L3 and drops it; ``drain`` frees every entry.
"""

from __future__ import annotations

from typing import Generic

import torch

from tools.simulate.model import H, ModelAdapter
from tools.simulate.prefix_store import PrefixEntry, PrefixStore
from tools.simulate.shared_prefix import SharedPrefixCache
from tools.simulate.stats import SimStats
from tools.simulate.storage_tier import StorageTier
from tools.simulate.workload import SessionSpec

__all__ = ["CacheTiers"]


class CacheTiers(Generic[H]):
    """The prefix store, the shared-prefix cache (``shared_tokens``, 0: off) and the storage
    tier ``l3`` (or ``None``) of one engine over ``model``."""

    def __init__(
        self, model: ModelAdapter[H], stats: SimStats, shared_tokens: int,
        l3: StorageTier | None,
    ) -> None:
        self.model = model
        self.stats = stats
        self.store = PrefixStore()
        self.shared = SharedPrefixCache(shared_tokens, model.page_size)
        self.l3 = l3

    # ------------------------------------------------------------ admission
    def session_prefix(
        self, spec: SessionSpec, turn: int, history: int, entry: PrefixEntry | None
    ) -> tuple[torch.Tensor, int] | None:
        """The session's cached prefix on the device (``entry``, taken from the store; loaded
        from the host or L3 if needed) with its borrowed shared count; ``None`` when there is
        none."""
        stats, l3, model = self.stats, self.l3, self.model
        if turn > 0:
            stats.returning_turns += 1
            stats.reusable_tokens += history
        from_l3 = entry is None and turn > 0 and l3 is not None
        if from_l3 and l3 is not None:  # L1 and L2 missed: prefetch from storage
            entry = l3.fetch(spec.session, history, self.make_host_room)
        if entry is None:
            stats.misses += turn > 0
            return None
        if entry.tier == "device":
            stats.device_hits += 1
            stats.device_hit_tokens += entry.length
            return entry.slots, entry.shared  # the entry's cache reference goes to the request
        host = model.host_unbind(entry)
        # a radix-cache lookup matches the device copy of the shared preamble first: only the
        # rest of the session's prefix is loaded from the host
        borrowed = self.shared.match(entry.length + 1)
        n = 0 if borrowed is None else borrowed.numel()
        rest = entry.length - n
        device_slots = torch.arange(0, dtype=torch.int64, device=model.device)
        ok = True
        if rest:
            with stats.timed("alloc", rest):
                out = model.allocator.alloc(rest)
            if out is None:
                raise RuntimeError(f"alloc({rest}) failed after room was made for it")
            device_slots = out
            ok = model.load(host, n, device_slots, spec.session)
        model.host_free(host)  # consumed on success, dropped on failure
        if not ok:
            self.free_owned(device_slots, 0)
            if n:
                self.shared.release()
            stats.misses += 1
            if from_l3 and l3 is not None:
                l3.record_load_failure()
            return None
        if from_l3 and l3 is not None:  # tokens it served: the shared part came from L1
            l3.record_hit(rest)
        else:
            stats.host_hits += 1
            stats.host_hit_tokens += rest
        if borrowed is None:
            return device_slots, 0
        stats.shared_prefix_hits += 1
        stats.shared_prefix_hit_tokens += n
        return torch.cat([borrowed, device_slots]), n

    # -------------------------------------------------------------- device
    def make_room(self, tokens: int) -> bool:
        """Evict LRU device prefixes until ``tokens`` slots are free; ``False`` if impossible."""
        while self.model.allocator.available_size() < tokens:
            if not self._evict_one():
                return False
        return True

    def _evict_one(self) -> bool:
        """Back the LRU device prefix up to the host (dropped if that fails), or evict the
        shared prefix when no device prefix is left; ``False`` when there is nothing to evict."""
        model = self.model
        entry = self.store.oldest("device")
        if entry is None:
            return self.evict_shared()
        host = self._reserve_host(entry.length)
        if host is not None and model.backup(entry.slots, host):
            shared = entry.shared
            slots = self.store.move_to_host(entry.session, model.host_bind(entry.session, host))
            self.free_owned(slots, shared)
            self.stats.evictions_to_host += 1
            if self.l3 is not None:
                self.l3.on_host_insert(entry)
            return True
        if host is not None:  # the backup failed: the host reservation holds garbage
            model.host_free(host)
        self.store.take(entry.session)
        self.free_owned(entry.slots, entry.shared)
        self.stats.device_drops += 1
        return True

    def evict_shared(self) -> bool:
        """Free the shared-prefix cache's pages if no request or entry holds them."""
        slots = self.shared.evict()
        if slots is None:
            return False
        self.free_device(slots)
        self.stats.shared_prefix_evictions += 1
        return True

    def free_owned(self, slots: torch.Tensor, shared: int, *, reverse: bool = False) -> None:
        """Free a holder's ``slots`` (sequence order) except the first ``shared``, borrowed from
        the shared-prefix cache, whose reference it releases; ``reverse``: free them last first
        (a retracted request)."""
        if shared:
            self.shared.release()
        own = slots[shared:]
        if own.numel():
            self.free_device(own.flip(0) if reverse else own)

    def free_device(self, slots: torch.Tensor) -> None:
        with self.stats.timed("free", slots.numel()):
            self.model.allocator.free(slots)

    # ---------------------------------------------------------------- host
    def _reserve_host(self, tokens: int) -> H | None:
        if not self.make_host_room(tokens):
            return None
        return self.model.host_alloc(tokens)

    def make_host_room(self, tokens: int) -> bool:
        """Drop LRU host entries (written back to L3 first) until ``tokens`` host slots are free."""
        while self.model.host_available() < tokens:
            victim = self.store.oldest("host")
            if victim is None:
                return False
            self.store.take(victim.session)
            if self.l3 is not None:
                self.l3.on_host_drop(victim)
            self._free_host_entry(victim)
            self.stats.host_drops += 1
        return True

    def _free_host_entry(self, entry: PrefixEntry) -> None:
        """Release the host room of a host ``entry`` that left the store."""
        self.model.host_free(self.model.host_unbind(entry))

    # ----------------------------------------------------------- lifecycle
    def restart(self) -> None:
        """Every cached prefix is flushed to the storage tier (host entries directly, device
        entries through a device->host backup) and then dropped; the storage tier reopens its
        directory. Running requests carry on."""
        model, l3 = self.model, self.l3
        device_entries: list[PrefixEntry] = []
        for session in self.store.sessions():
            entry = self.store.take(session)
            if entry is None:
                continue
            if entry.tier == "device":
                device_entries.append(entry)
                continue
            if l3 is not None:
                l3.on_host_drop(entry)
            self._free_host_entry(entry)
        for entry in device_entries:
            staging = model.host_alloc(entry.length) if l3 is not None else None
            if staging is not None:
                slots = model.host_bind(entry.session, staging)
                staged = PrefixEntry(entry.session, entry.length, "host", slots)
                if model.backup(entry.slots, staging) and l3 is not None:
                    l3.on_host_drop(staged)
                self._free_host_entry(staged)
            self.free_owned(entry.slots, entry.shared)
        self.evict_shared()  # unless running requests still hold it
        if l3 is not None:
            l3.restart()

    def drain(self) -> None:
        """Free every cached prefix (no request may be running)."""
        for session in self.store.sessions():
            entry = self.store.take(session)
            if entry is None:
                continue
            if entry.tier == "device":
                self.free_owned(entry.slots, entry.shared)
            else:
                self._free_host_entry(entry)
        if self.shared.tokens_held and not self.evict_shared():
            raise RuntimeError(f"drain(): the shared prefix still has {self.shared.refs} holders")
