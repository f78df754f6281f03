"""The mha/mla engine: the engine loop (``loop.py``) over a ``stack.MemoryStack``.

What the model adapter adds to the loop: K/V rows of every layer written through the device
pool (``MemoryStack.write_kv``), a finished sequence verified on one layer, the partial last page
freed as its slots (the allocator frees the page), host room in slots of the one host pool,
backups and layer-wise loads through :class:`~tools.simulate.hicache.HostTransfers`, and the
conservation / leak checks of ``integrity.py``. This is the engine of the storage tier (L3) and
of the multi-instance driver (``tools/mooncake/instances.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_allocator import BaseTokenToKVPoolAllocator
from tools.simulate.faults import FaultInjector
from tools.simulate.hicache import HostTransfers
from tools.simulate.integrity import check_conservation, leak_check, owned_slots
from tools.simulate.loop import EngineLoop
from tools.simulate.model import Req
from tools.simulate.prefix_store import PrefixEntry, PrefixStore
from tools.simulate.stack import MemoryStack
from tools.simulate.stats import SimStats
from tools.simulate.storage_tier import StorageTier
from tools.simulate.workload import SessionId, Workload

__all__ = ["Engine", "MemoryStackModel", "Req"]


class MemoryStackModel:
    """The :class:`~tools.simulate.model.ModelAdapter` of a ``MemoryStack`` (host reservations
    are host slots)."""

    capacity_name = "device capacity"
    decode_by_extend = False

    def __init__(self, stack: MemoryStack, stats: SimStats, faults: FaultInjector) -> None:
        self.stack = stack
        self.stats = stats
        self.cfg = stack.cfg
        self.device = stack.device
        self.page_size = stack.page_size
        self.allocator: BaseTokenToKVPoolAllocator = stack.allocator
        self.req_pool = stack.req_pool
        self.layer_num = stack.kv_pool.layer_num
        self.device_capacity = stack.device_capacity
        self.transfers = HostTransfers(stack, stats, faults)

    # ------------------------------------------------------------- device
    def write(self, slots: torch.Tensor, sessions: torch.Tensor, positions: torch.Tensor) -> None:
        self.stack.write_kv(slots, sessions, positions)

    def verify_layer(
        self, layer: int, slots: torch.Tensor, sessions: torch.Tensor, positions: torch.Tensor
    ) -> int:
        h = self.stack.content.hashes(sessions, positions, layer + 1)
        return self.stack.count_mismatches(layer, slots, h)

    def mismatch_text(self, bad: int, seq_len: int) -> str:
        return f"{bad}/{seq_len} tokens"

    def future_tokens(self, seq_len: int, final_len: int) -> int:
        return owned_slots(final_len, self.page_size) - owned_slots(seq_len, self.page_size)

    def tail_slots(self, slots: torch.Tensor, aligned: int) -> torch.Tensor:
        return slots[aligned:]  # the unshared tail: the partial last page's slots

    # --------------------------------------------------------------- host
    def host_available(self) -> int:
        return self.stack.host_pool.available_size()

    def host_alloc(self, tokens: int) -> torch.Tensor | None:
        return self.stack.host_pool.alloc(tokens)

    def host_free(self, host: torch.Tensor) -> None:
        self.stack.host_pool.free(host)

    def host_bind(self, session: SessionId, host: torch.Tensor) -> torch.Tensor:
        return host

    def host_unbind(self, entry: PrefixEntry) -> torch.Tensor:
        return entry.slots

    def backup(self, device_slots: torch.Tensor, host: torch.Tensor) -> bool:
        return self.transfers.backup(device_slots, host)

    def load(
        self, host: torch.Tensor, start: int, device_slots: torch.Tensor, session: SessionId
    ) -> bool:
        positions = torch.arange(
            start, start + device_slots.numel(), dtype=torch.int64, device=self.device
        )
        sessions = torch.full_like(positions, int(session))
        return self.transfers.load(host[start:], device_slots, sessions, positions)

    # ------------------------------------------------------------- checks
    def check(self, running: Sequence[Req], store: PrefixStore, shared_held: int) -> None:
        check_conservation(
            self.stack, store, (r.seq_len - r.shared for r in running), self.stats, shared_held
        )

    def leak_check(self) -> None:
        leak_check(self.stack, self.stats)

    def close(self) -> None:
        self.transfers.close()

    def close_host(self) -> None:
        self.stack.host_pool.close()


class Engine(EngineLoop[torch.Tensor]):
    """The engine loop over one ``MemoryStack`` (see ``loop.py``); ``l3``: the storage tier."""

    def __init__(
        self, workload: Workload, stack: MemoryStack, stats: SimStats, faults: FaultInjector,
        l3: StorageTier | None = None, *, follow_ups: bool = True,
    ) -> None:
        model = MemoryStackModel(stack, stats, faults)
        super().__init__(workload, model, stats, l3, follow_ups=follow_ups)
        self.stack = stack
        self.transfers = model.transfers
