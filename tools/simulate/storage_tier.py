"""The storage tier (L3) of the simulator: a file backend in a directory (or a Mooncake Store,
``storage="mooncake"``) plus the controller.

* Token ids are a deterministic function of (session, position), so a session's history always
  has the same chained page hashes (``mem_cache_storage.page_hashes``); the engine's content
  model is keyed the same way, so a page read back under a key must hold exactly that
  session's rows, which the host->device load verifies layer by layer.
* ``write_back``: the engine calls :meth:`StorageTier.on_host_drop` before freeing an evicted host
  entry (``write_back`` policy) and :meth:`StorageTier.on_host_insert` after a device->host backup
  (``write_through``); only keys storage does not hold are written.
* ``fetch``: a returning turn that missed the device and the host asks storage how many of its
  history pages it holds, makes that much host room (evicting host entries, which writes them
  back), and prefetches them on the controller's background thread, waiting at most
  ``timeout_s``; the host slots it gets back are then loaded to the device like a host hit.
* ``restart``: the engine dropped its device and host caches; the backend and controller objects
  are rebuilt on the same directory (a new process over a warm L3).
* **Several host pools** (``--model hybrid``: the Mamba state pool; ``--model deepseek_v4``: the
  c4 / c128 record mirrors beside the window mirror): an :class:`L3Binding` of the model names
  the main host pool, the controller's ``extra_pools`` (written and prefetched with the main
  pool's pages through the backend's v2 calls), an entry's slots in every pool and how a
  prefetched prefix becomes the model's host reservation. mha/mla use :class:`StackBinding`
  (one pool).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import torch

from mem_cache_storage import HiCacheFile, HiCacheStorageConfig, LatencyRecorder, page_hashes
from mem_cache_storage.controller import (
    ControllerStats,
    ExtraPool,
    PrefetchResult,
    StorageController,
    WritePolicy,
)
from tools.simulate.prefix_store import PrefixEntry
from tools.simulate.stack import MemoryStack
from tools.simulate.storage_faults import STORAGE_FAULT_KINDS, FaultyStorage
from tools.simulate.workload import SessionId

__all__ = ["L3Binding", "L3Stats", "StackBinding", "StorageTier", "token_ids"]

_M31 = (1 << 31) - 1
SLOW_S = 0.3
FAULT_TIMEOUT_S = 0.1
TIMEOUT_S = 120.0


def token_ids(session: int, start: int, end: int) -> torch.Tensor:
    """Token ids of positions ``[start, end)`` of ``session`` (deterministic, 31-bit)."""
    pos = torch.arange(start, end, dtype=torch.int64)
    h = ((session & _M31) * 0x5BD1E995 + pos * 0x27D4EB2F + 0x3C6EF372) & _M31
    h = ((h ^ (h >> 15)) * 0x2C1B3C6D) & _M31
    return (h ^ (h >> 13)) & _M31


@dataclass(slots=True)
class L3Stats:
    """What the report shows about the storage tier (accumulated over restarts): the
    controllers' own counters (``controller``: every controller's :class:`ControllerStats`
    summed), the backends' (``backend_errors``, ``pages_rejected``, ``pages_evicted``) and what
    only the simulator knows (lookups, verified hits, restarts, end-to-end prefetch latency)."""

    backend: str = "none"
    directory: str = ""
    write_policy: str = "write_back"
    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0
    hits_after_restart: int = 0
    load_failures: int = 0
    timeouts: int = 0
    restarts: int = 0
    controller: ControllerStats = field(default_factory=ControllerStats)
    #: backend calls that failed: the controllers' ``backend_errors`` plus the backends' errors
    backend_errors: int = 0
    pages_rejected: int = 0
    pages_evicted: int = 0
    #: page writes the store refused (``StorageStats.set_refused``: every attempt, retried ones
    #: included)
    set_refused: int = 0
    #: the extra host pools written and read with the main pool's pages (name -> hit policy)
    extra_pools: dict[str, str] = field(default_factory=dict)
    prefetch_p50_s: float = 0.0
    prefetch_p99_s: float = 0.0
    prefetch_reserved_at_end: int = 0
    faults: dict[str, int] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        """The controllers' counters read through (``pages_written``, ``load_gb_per_s``, ...:
        every :class:`ControllerStats` attribute this class does not have itself)."""
        if name != "controller" and hasattr(ControllerStats, name):
            return getattr(self.controller, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class L3Binding(Protocol):
    """What the storage tier needs from a model with its own host pools (see the module)."""

    #: the storage key space's model name (``sim-<model>-<layers>L``)
    model_name: str
    #: the main host pool (``register_mem_pool_host``; the controller's ``host_pool``)
    host_pool: Any
    #: the controller's extra pools
    extra_pools: tuple[ExtraPool, ...]
    #: host bytes of the cached prefixes at most (a local Mooncake store's segment size)
    host_bytes: int

    def host_slots(self, entry: PrefixEntry) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A host ``entry``'s slots in the main pool and in every extra pool."""
        ...

    def adopt(self, session: SessionId, result: PrefetchResult, tokens: int) -> PrefixEntry:
        """A finished prefetch of ``tokens`` tokens of ``session`` as the model's host
        reservation (bound to the session) and its host entry."""
        ...


class StackBinding:
    """The :class:`L3Binding` of a ``MemoryStack`` (mha / mla: one host pool)."""

    extra_pools: tuple[ExtraPool, ...] = ()

    def __init__(self, stack: MemoryStack) -> None:
        cfg = stack.cfg
        self.model_name = f"sim-{cfg.model}-{cfg.layers}L"
        self.host_pool = stack.host_pool
        self.host_bytes = stack.host_capacity * stack.bytes_per_token

    def host_slots(self, entry: PrefixEntry) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return entry.slots, {}

    def adopt(self, session: SessionId, result: PrefetchResult, tokens: int) -> PrefixEntry:
        return PrefixEntry(session, tokens, "host", result.host_indices)


class StorageTier:
    """One simulated L3 (see the module docstring). ``stack``: the configuration and page size
    (``cfg``, ``page_size``); ``binding``: the model's host pools (default: ``stack``'s one
    host pool, a ``MemoryStack``)."""

    def __init__(
        self,
        stack: Any,
        *,
        directory: str | None,
        write_policy: str,
        fault_rate: float,
        seed: int,
        capacity_bytes: int = 0,
        binding: L3Binding | None = None,
    ) -> None:
        self.stack = stack
        self.binding: L3Binding = binding if binding is not None else StackBinding(stack)
        self.page_size = stack.page_size
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="mem-cache-l3-"))
        self.write_policy = write_policy
        self.fault_rate = fault_rate
        self.seed = seed
        self.capacity_bytes = capacity_bytes
        self.timeout_s = FAULT_TIMEOUT_S if fault_rate else TIMEOUT_S
        self.mooncake = stack.cfg.storage == "mooncake"
        self._store: Any = None  # a local Mooncake Store this tier started (and stops)
        self.mooncake_options: dict[str, object] = {}
        if self.mooncake:
            self.mooncake_options = self._mooncake_options()
        self.stats = L3Stats(backend=stack.cfg.storage,
                             directory=str(self.mooncake_options.get("master_server_address",
                                                                      self.directory)),
                             write_policy=write_policy,
                             extra_pools={p.name: p.hit_policy
                                          for p in self.binding.extra_pools})
        self.hit_keys: list[str] = []  # keys of every L3 hit verified on the device (in order)
        self._pending: list[str] = []
        self._faults: dict[str, int] = dict.fromkeys(STORAGE_FAULT_KINDS, 0)
        self._latency = LatencyRecorder()
        self._hashes: dict[int, list[str]] = {}
        if fault_rate:  # injected failures are counted in the report, not logged one by one
            logging.getLogger("mem_cache_storage").setLevel(logging.ERROR)
        self._open(first=True)

    # --------------------------------------------------------------- lifecycle
    def _mooncake_options(self) -> dict[str, object]:
        cfg = self.stack.cfg
        if cfg.storage_master:
            host = cfg.storage_master.rsplit(":", 1)[0]
            return {"master_server_address": cfg.storage_master, "protocol": "tcp",
                    "metadata_server": cfg.storage_metadata or f"http://{host}:8080/metadata"}
        from tools.mooncake.store import LocalMooncakeStore

        segment = max(64 << 20, 2 * self.binding.host_bytes)
        self._store = LocalMooncakeStore(segment_bytes=segment).start()
        options: dict[str, object] = self._store.client_options()
        return options

    def _open(self, first: bool = False) -> None:
        cfg = self.stack.cfg
        extra: dict[str, object] = {"model_fingerprint": f"seed{cfg.seed}-{cfg.dtype}"}
        config = HiCacheStorageConfig(
            is_mla_model=cfg.model == "mla",
            model_name=self.binding.model_name,
            extra_config=extra | self.mooncake_options | (
                {"retry_backoff_s": 0.2, "max_backoff_s": 1.0} if self.mooncake else {}),
        )
        self.file: Any
        if self.mooncake:
            from mem_cache_storage.mooncake import HiCacheMooncake

            self.file = HiCacheMooncake(config, self.binding.host_pool)
        else:
            self.file = HiCacheFile(config, storage_dir=str(self.directory),
                                    capacity_bytes=self.capacity_bytes)
        if first and self._own_dir and not self.mooncake:
            self.file.clear()
        self.storage = FaultyStorage(self.file, self.fault_rate, self.seed + self.stats.restarts,
                                     SLOW_S)
        self.controller = StorageController(self.storage, self.binding.host_pool,
                                            write_policy=cast(WritePolicy, self.write_policy),
                                            extra_pools=self.binding.extra_pools)

    def _collect(self) -> None:
        """Fold the current controller's and backend's counters into ``stats``."""
        c: ControllerStats = self.controller.stats()
        s = self.stats
        s.controller += c
        backend = self.file.get_stats()
        s.backend_errors += c.backend_errors + backend.errors
        s.pages_rejected += backend.rejected
        s.set_refused += getattr(backend, "set_refused", 0)
        s.pages_evicted += getattr(backend, "evicted", 0)
        for kind, n in self.storage.injected.items():
            self._faults[kind] += n

    def _shutdown(self) -> None:
        self.controller.close()
        self.stats.prefetch_reserved_at_end = self.controller.reserved_pages
        self._collect()
        if self.mooncake:
            self.file.close()  # unregisters the host pool's buffers

    def restart(self) -> None:
        """New backend and controller objects over the same directory (a restarted engine)."""
        self._shutdown()
        self.stats.restarts += 1
        self._hashes.clear()
        self._open()

    def close(self) -> None:
        self._shutdown()
        lat = self._latency.summary()
        self.stats.prefetch_p50_s, self.stats.prefetch_p99_s = lat.p50_s, lat.p99_s
        self.stats.faults = dict(self._faults)
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)
        if self._store is not None:
            self._store.stop()

    def take_written_keys(self) -> list[str]:
        """Keys this tier stored since the last call (the multi-instance writer table)."""
        keys, self.storage.written = self.storage.written, []
        return keys

    def take_hit_keys(self) -> list[str]:
        """Keys of the L3 hits verified since the last call."""
        keys, self.hit_keys = self.hit_keys, []
        return keys

    # -------------------------------------------------------------------- keys
    def keys(self, session: int, pages: int) -> list[str]:
        """Chained hashes of the session's first ``pages`` pages (cached per session)."""
        known = self._hashes.setdefault(session, [])
        if len(known) < pages:
            ps = self.page_size
            prior = known[-1] if known else None
            tokens = token_ids(session, len(known) * ps, pages * ps)
            known.extend(page_hashes(tokens, ps, prior))
        return known[:pages]

    # ------------------------------------------------------------------ writes
    def on_host_drop(self, entry: PrefixEntry) -> None:
        """A host entry is about to be freed (write-back policy writes it)."""
        slots, extra = self.binding.host_slots(entry)
        self.controller.on_host_evict(self.keys(int(entry.session), entry.length // self.page_size),
                                      slots, extra)

    def on_host_insert(self, entry: PrefixEntry) -> None:
        """An entry was just backed up to the host (write-through policy writes it)."""
        slots, extra = self.binding.host_slots(entry)
        self.controller.on_host_insert(
            self.keys(int(entry.session), entry.length // self.page_size), slots, extra
        )

    # ------------------------------------------------------------------- reads
    def fetch(
        self, session: SessionId, history: int, make_host_room: Callable[[int], bool]
    ) -> PrefixEntry | None:
        """The session's longest stored history prefix, prefetched into host slots (the caller
        owns them), or ``None``."""
        pages = history // self.page_size
        if pages == 0:
            return None
        self.stats.lookups += 1
        keys = self.keys(int(session), pages)
        t0 = time.perf_counter()
        hit = self.controller.lookup(keys)
        if hit == 0 or not make_host_room(hit * self.page_size):
            return None
        handle = self.controller.prefetch(keys[:hit])
        result = handle.wait(timeout=self.timeout_s)
        if result.status == "timeout":
            self.stats.timeouts += 1
            handle.join()  # its pages are freed when the background work ends
        self._latency.record(time.perf_counter() - t0)
        if result.status != "done":
            return None
        self._pending = keys[: result.pages]
        return self.binding.adopt(session, result, result.pages * self.page_size)

    def record_hit(self, tokens: int) -> None:
        """A prefix from L3 reached the device and was verified bit-exact there."""
        self.stats.hits += 1
        self.stats.hit_tokens += tokens
        self.hit_keys.extend(self._pending)
        self._pending = []
        if self.stats.restarts:
            self.stats.hits_after_restart += 1

    def record_load_failure(self) -> None:
        self.stats.load_failures += 1
        self._pending = []

    @property
    def reserved_pages(self) -> int:
        return self.controller.reserved_pages

    def describe(self) -> dict[str, Any]:
        return {"backend": self.stats.backend, "directory": str(self.directory)}
