"""``--model deepseek_v4``: the serving workload over the DeepSeek-V4 HiSparse stack
(``deepseek_v4_stack.py``).

The engine loop is every model's (``loop.py``: arrivals, FCFS admission with the whole future
footprint reserved, LRU eviction of cached prefixes to the host, host hits loaded back layer by
layer, prefill, decode, finish inside one free group); :class:`DeepSeekV4Model` adds the DeepSeek-V4
differences:

* prefill is one ``alloc_extend`` of the HiSparse allocator (logical + window slots, and c4
  device slots for the compressed entries the new tokens complete); decode is a one-token
  ``alloc_extend`` per request, so every compressed entry of a sequence has a device slot and
  can be verified (the coordinator's ``alloc_decode`` + ``alloc_device_buffer`` protocol is
  covered by the allocator package's equivalence tests and conformance kit, not here);
* every token writes a window record per layer and every entry-completing token a c4 / c128
  record per compressed layer (packed with ``mem_cache_kernels.deepseek_v4``);
* a running request's reservation also covers the c4 device pages its entries will complete,
  and a finished request's partial last page is freed as a whole page;
* an eviction backs up the window, c4 and c128 records of the prefix to their
  ``DeepSeekV4SingleKVPoolHost`` mirrors (token-granular; ``deepseek_v4_hicache.py``; a host
  reservation is the page rows of every mirror), then frees the logical slots (which releases
  window and c4 device slots too); a host hit allocates whole pages with ``alloc`` and loads
  every record pool layer by layer on an IO thread, while the scheduler thread reads each layer
  through the composite pool (``get_swa_key_buffer`` / ``get_compressed_key_buffer``, which wait
  on the registered layer counter) and verifies it bit-exact;
* conservation is checked per side: logical full slots, window slots, c4 device slots (whole
  device pages of ``page_size // 4`` entries), each host mirror's page rows, request rows.

With ``--storage file`` a host entry's records of every record pool go to L3 together and come
back through the same verified layer-wise load (``l3_bindings.py``). Not modelled here (the
options are ignored in this mode): the shared prefix, speculative decoding, retraction and the
mid-run restart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from mem_cache_allocator import BaseTokenToKVPoolAllocator
from tools.simulate.deepseek_v4_hicache import DeepSeekV4HostTransfers, host_tokens
from tools.simulate.deepseek_v4_stack import DeepSeekV4Stack
from tools.simulate.faults import FaultInjector
from tools.simulate.loop import EngineLoop
from tools.simulate.model import Req
from tools.simulate.prefix_store import PrefixEntry, PrefixStore
from tools.simulate.stats import SimStats
from tools.simulate.storage_tier import StorageTier
from tools.simulate.workload import SessionId, Workload

__all__ = ["DeepSeekV4Engine", "DeepSeekV4Model", "HostRows"]

HostRows = dict[str, torch.Tensor]
"""A host reservation: page rows per record pool (``RecordKind.name``)."""


class DeepSeekV4Model:
    """The :class:`~tools.simulate.model.ModelAdapter` of a :class:`DeepSeekV4Stack` (see the
    module doc)."""

    capacity_name = "logical capacity"
    decode_by_extend = True

    def __init__(self, stack: DeepSeekV4Stack, stats: SimStats, faults: FaultInjector) -> None:
        self.stack = stack
        self.stats = stats
        # what this mode does not model is off for the loop (the report keeps the options given)
        self.cfg = dataclasses.replace(
            stack.cfg, spec_draft=0, retract_after=0, shared_prefix_tokens=0, restart_at=-1
        )
        self.device = stack.device
        self.page_size = stack.page_size
        self.cps = stack.page_size // 4  # c4 entries per device page
        self.allocator: BaseTokenToKVPoolAllocator = stack.allocator
        self.req_pool = stack.req_pool
        self.layer_num = stack.pool.layer_num
        self.device_capacity = stack.logical_capacity
        self.transfers = DeepSeekV4HostTransfers(stack, stats, faults)
        self.host_rows: dict[SessionId, HostRows] = {}  # of the host entries

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.page_size) * self.page_size

    def _dev_tokens(self, seq_len: int) -> int:
        """c4 device pages a sequence of ``seq_len`` tokens holds, in tokens (``page_size``
        per page of ``page_size // 4`` entries)."""
        return -(-(seq_len // 4) // self.cps) * self.page_size

    # ------------------------------------------------------------- device
    def write(self, slots: torch.Tensor, sessions: torch.Tensor, positions: torch.Tensor) -> None:
        self.stack.write(slots, sessions, positions)

    def verify_layer(
        self, layer: int, slots: torch.Tensor, sessions: torch.Tensor, positions: torch.Tensor
    ) -> int:
        """Window records of every token and compressed records of every entry (c4 through
        the HiSparse mapping)."""
        return self.stack.verify_layer(layer, slots, sessions, positions)

    def mismatch_text(self, bad: int, seq_len: int) -> str:
        return f"{bad} records"

    def future_tokens(self, seq_len: int, final_len: int) -> int:
        """Its logical pages are all taken by prefill, but its c4 device pages only as its
        entries complete."""
        logical = self._pages(final_len) - self._pages(seq_len)
        return max(logical, self._dev_tokens(final_len) - self._dev_tokens(seq_len))

    def tail_slots(self, slots: torch.Tensor, aligned: int) -> torch.Tensor:
        """The partial last page, passed as a whole page."""
        ps = self.page_size
        page = int(slots[aligned]) // ps
        return torch.arange(page * ps, (page + 1) * ps, dtype=torch.int64, device=self.device)

    # --------------------------------------------------------------- host
    def host_available(self) -> int:
        return min(k.host.available_size() for k in self.stack.kinds) * self.page_size

    def host_alloc(self, tokens: int) -> HostRows | None:
        rows = tokens // self.page_size
        got = {k.name: k.host.alloc(rows) for k in self.stack.kinds}
        have = {name: v for name, v in got.items() if v is not None}
        if len(have) == len(got):
            return have
        if have:  # the mirrors have the same page rows and move in step
            raise RuntimeError(f"host alloc({rows}) failed on some record pools only")
        return None

    def host_free(self, host: HostRows) -> None:
        for kind in self.stack.kinds:
            kind.host.free(host[kind.name])

    def host_bind(self, session: SessionId, host: HostRows) -> torch.Tensor:
        self.host_rows[session] = host
        return host_tokens(host["swa"], self.page_size)

    def host_unbind(self, entry: PrefixEntry) -> HostRows:
        return self.host_rows.pop(entry.session)

    def backup(self, device_slots: torch.Tensor, host: HostRows) -> bool:
        return self.transfers.backup(device_slots, host)

    def load(
        self, host: HostRows, start: int, device_slots: torch.Tensor, session: SessionId
    ) -> bool:
        if start:
            raise RuntimeError(f"a DeepSeek-V4 prefix is loaded whole, not from token {start}")
        return self.transfers.load(host, device_slots, int(session))

    # ------------------------------------------------------------- checks
    def check(self, running: Sequence[Req], store: PrefixStore, shared_held: int) -> None:
        """Slot conservation on every side; a violation is an integrity failure (no shared
        prefix in this mode: ``shared_held`` is 0)."""
        st, stats, a = self.stack, self.stats, self.stack.allocator
        stats.conservation_checks += 1
        live = sum(self._pages(r.seq_len) for r in running)
        cached = store.tokens("device")
        c4_live = sum(-(-(r.seq_len // 4) // self.cps) * self.cps for r in running)
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
        host_rows = store.tokens("host") // self.page_size
        for kind in st.kinds:
            have = kind.host.available_size() + host_rows
            if have != kind.capacity:
                stats.fail(
                    f"step {stats.steps}: host {kind.name} rows not conserved: {have} != "
                    f"{kind.capacity}"
                )
        rows = st.req_pool.available_size() + len(running)
        if rows != st.req_capacity:
            stats.fail(f"step {stats.steps}: request rows not conserved: {rows}")
        used_now = st.logical_capacity - st.swa_allocator.full_available_size()
        stats.peak_device_tokens = max(stats.peak_device_tokens, used_now)
        stats.peak_host_tokens = max(stats.peak_host_tokens, host_rows * self.page_size)

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

    def close(self) -> None:
        self.transfers.close()

    def close_host(self) -> None:
        for kind in self.stack.kinds:
            kind.host.close()


class DeepSeekV4Engine(EngineLoop[HostRows]):
    """The engine loop over a :class:`DeepSeekV4Stack` (see the module doc); ``l3_for(model)``:
    its storage tier (``l3_bindings.DeepSeekV4Binding``), or ``None``."""

    def __init__(
        self, workload: Workload, stack: DeepSeekV4Stack, stats: SimStats, faults: FaultInjector,
        l3_for: Callable[[DeepSeekV4Model], StorageTier | None] | None = None,
    ) -> None:
        model = DeepSeekV4Model(stack, stats, faults)
        super().__init__(workload, model, stats, l3_for(model) if l3_for is not None else None)
        self.stack = stack
        self.transfers = model.transfers
