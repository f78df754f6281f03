"""``StorageController``: the storage half of a HiCache controller (prefetch and write-back).

* **Write** (:meth:`StorageController.write`, or :meth:`~StorageController.write_async` on a backup
  thread; :mod:`mem_cache_storage._controller_write`): host pages -> storage, skipping the leading
  keys the backend already has (``batch_exists``), in batches of ``batch_pages`` through the
  zero-copy ``batch_set_v1``. The hooks :meth:`on_host_evict` (``write_policy="write_back"``) and
  :meth:`on_host_insert` (``"write_through"``) call it at the point the policy names. With an MLA
  model only the storage writer writes (TP rank 0; every rank holds the same KV).
* **Prefetch** (:meth:`StorageController.prefetch`): on a background thread, ``batch_exists``
  finds how many leading pages storage has, that many host pages are reserved (at most the free
  part of ``prefetch_budget_pages`` and what the host pool can give), and the pages are read with
  ``batch_get_v1`` batch by batch. The longest prefix of pages read intact is the result; every
  other reserved page is freed at once.
* **Backends without v1** (SGLang's own ``HiCacheFile`` leaves ``batch_get_v1`` /
  ``batch_set_v1`` as its base class's stubs, which return ``None``): pages go through the
  generic ``batch_get`` / ``batch_set`` with the host pool's flat pages, as SGLang's controller
  does (:attr:`StorageController.generic_io`; chosen at construction, or on a ``None`` answer;
  that path and the extra pools' v2 calls are :mod:`mem_cache_storage._controller_calls`).

The prefetch path (this module) runs through this module and :mod:`mem_cache_storage.backend`
only, on our side (at most five of our modules per public call, three of them the host pool's).

Ownership: the pages of a finished prefetch belong to the controller until
:meth:`PrefetchHandle.wait` returns them (they then belong to the caller, who frees them with
``host_pool.free``). :meth:`PrefetchHandle.cancel`, a ``wait`` timeout and :meth:`close` free
whatever the prefetch reserved, whenever the background work ends; :attr:`reserved_pages` is the
number of pages still held by prefetches, so ``0`` after :meth:`close` is the leak check.

Counters: :class:`ControllerStats` (a frozen snapshot, :meth:`StorageController.stats`) is the
one declaration of the controller's counters; the mutable counter behind it keeps one value per
field under a lock, and the simulator reports the same snapshot type.

Failures: an exception or a malformed result from the backend, a backend that is too slow for
the caller's ``wait`` timeout, or a partial batch all end as a shorter prefix or a miss, with
every reserved page released; nothing raises into the engine, and a page is only returned when
the backend said it was read intact. Backend calls go through
:func:`mem_cache_storage.backend.guarded` (the one place a failure is swallowed: counted once in
``backend_errors``, logged once); a backend of this package already answers its own failures
as misses (counted in its ``get_stats().errors``), so one failure is counted once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch

from mem_cache_kernels.checks import check_choice, check_int, check_optional_int
from mem_cache_storage import _multi_pool as mp
from mem_cache_storage._controller_calls import ExtraCalls, _v1_is_stub
from mem_cache_storage._controller_stats import (
    COUNTER_NAMES,
    POOL_COUNTERS,
    ControllerStats,
    LatencySummary,
    PoolStats,
)
from mem_cache_storage._controller_write import ControllerWrites, WritePolicy, WriteResult
from mem_cache_storage._multi_pool import ExtraPool
from mem_cache_storage.backend import _key_list, bools, guarded
from mem_cache_storage.config import STORAGE_BATCH_SIZE

__all__ = [
    "ControllerStats",
    "ExtraPool",
    "LatencyRecorder",
    "LatencySummary",
    "PrefetchHandle",
    "PrefetchResult",
    "PoolStats",
    "PrefetchStatus",
    "StorageController",
    "WritePolicy",
    "WriteResult",
]

_log = logging.getLogger(__name__)

PrefetchStatus = Literal["done", "miss", "failed", "cancelled", "timeout"]

_STORAGE_NEEDS = ("batch_exists", "batch_get_v1", "batch_set_v1", "register_mem_pool_host")
_HOST_POOL_NEEDS = ("page_size", "size", "get_size_per_token")
# the copying path (a backend without v1) also needs get_data_page / get_dummy_flat_data_page /
# set_from_flat_data_page, which every host pool (ours and SGLang's) has


_EMPTY = torch.empty(0, dtype=torch.int64)


def _clamped(n: int, result: object) -> int:
    """A ``batch_exists`` answer as a prefix length in ``[0, n]``."""
    return max(0, min(int(result), n))  # type: ignore[call-overload, no-any-return]


def _bools_or_stub(n: int, result: object) -> list[bool] | None:
    """A v1 answer as ``n`` bools; ``None`` stays ``None`` (SGLang's base stub: no v1 path)."""
    return None if result is None and n else bools(n, result)


@dataclass(frozen=True, slots=True)
class PrefetchResult:
    """Outcome of one prefetch. ``host_indices``: ``pages * page_size`` host slots holding the
    first ``pages`` pages of the requested keys (empty unless ``status == "done"``)."""

    status: PrefetchStatus
    requested: int
    pages: int
    host_indices: torch.Tensor
    latency_s: float
    #: per extra pool (``extra_pools``): its host slots of the prefix (``all_pages`` pools:
    #: ``pages`` pages; ``trailing_pages`` pools: the last ``min(trailing_pages, pages)``
    #: pages); the caller owns them with ``host_indices`` and frees them with that pool's
    #: ``free``
    extra_host_indices: Mapping[str, torch.Tensor] = field(default_factory=dict)


class LatencyRecorder:
    """Keeps the last ``window`` latencies; :meth:`summary` gives p50/p99/max (thread safe)."""

    def __init__(self, window: int = 8192) -> None:
        check_int("window", window, minimum=1)
        self._samples: deque[float] = deque(maxlen=window)
        self._total = 0
        self._lock = threading.Lock()

    def record(self, seconds: float) -> None:
        with self._lock:
            self._samples.append(float(seconds))
            self._total += 1

    def summary(self) -> LatencySummary:
        with self._lock:
            data = sorted(self._samples)
            total = self._total
        if not data:
            return LatencySummary(0, total, 0.0, 0.0, 0.0)

        def pct(q: float) -> float:
            return data[min(len(data) - 1, int(q * (len(data) - 1) + 0.5))]

        return LatencySummary(len(data), total, pct(0.50), pct(0.99), data[-1])


class _Counters:
    """The mutable counter behind :class:`ControllerStats`: one value per counter, one lock."""

    __slots__ = ("_lock", "_pools", "_values")

    def __init__(self, pools: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, Any] = dict.fromkeys(COUNTER_NAMES, 0)
        self._pools = {p: dict.fromkeys(POOL_COUNTERS, 0) for p in pools}

    def add(self, **deltas: float) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._values[name] += delta

    def add_pool(self, pool: str, **deltas: int) -> None:
        with self._lock:
            values = self._pools[pool]
            for name, delta in deltas.items():
                values[name] += delta

    def snapshot(self, prefetch: LatencyRecorder, write: LatencyRecorder) -> ControllerStats:
        with self._lock:
            values = dict(self._values)
            pools = {p: PoolStats(**v) for p, v in self._pools.items()}
        return ControllerStats(**values, prefetch_latency=prefetch.summary(),
                               write_latency=write.summary(), pools=pools)


class PrefetchHandle:
    """One prefetch in flight; :meth:`wait` for its :class:`PrefetchResult`."""

    def __init__(self, controller: StorageController, keys: list[str]) -> None:
        self._controller = controller
        self.keys = keys
        self.submitted = time.perf_counter()
        self._done = threading.Event()
        self._result: PrefetchResult | None = None
        self._slots: torch.Tensor | None = None  # every page reserved, until released/taken
        self._reserved = 0
        self._extra: dict[str, torch.Tensor] = {}  # extra pools' reserved slots, likewise
        self._extra_kept: dict[str, torch.Tensor] = {}
        self._state: Literal["running", "finished", "taken", "released"] = "running"
        self._cancel_status: PrefetchStatus | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancel_status is not None

    def done(self) -> bool:
        """Whether the background work ended."""
        return self._done.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the background work ended (after a cancel or a ``wait`` timeout, its pages
        are then freed); ``False`` if it is still running after ``timeout`` s."""
        return self._done.wait(timeout)

    def wait(self, timeout: float | None = None) -> PrefetchResult:
        """Block until the prefetch ends (at most ``timeout`` s) and take its pages.

        On timeout the prefetch is cancelled (its pages are freed when the background work ends)
        and the result has status ``"timeout"`` and no pages.
        """
        if not self._done.wait(timeout) and self._controller._cancel(self, "timeout"):
            return PrefetchResult("timeout", len(self.keys), 0, _EMPTY,
                                  time.perf_counter() - self.submitted)
        return self._controller._take(self)

    def cancel(self) -> None:
        """Give up: free every page this prefetch reserved (now, or when its work ends)."""
        self._controller._cancel(self, "cancelled")


class StorageController(ControllerWrites, ExtraCalls):
    """Prefetch and write-back between a host pool and a storage backend (see the module)."""

    # the write path (ControllerWrites) sees these as its protocols
    _counters: _Counters
    _write_latency: LatencyRecorder

    def __init__(
        self,
        storage: Any,
        host_pool: Any,
        *,
        prefetch_budget_pages: int | None = None,
        write_policy: WritePolicy = "write_back",
        batch_pages: int = STORAGE_BATCH_SIZE,
        io_threads: int = 1,
        extra_pools: Sequence[ExtraPool] = (),
    ) -> None:
        """``storage``: a :class:`~mem_cache_storage.base.HiCacheStorage` with zero-copy calls;
        ``host_pool``: the host pool (registered with ``storage`` here); ``prefetch_budget_pages``:
        most host pages held by prefetches at once (default: half the host pool's pages);
        ``extra_pools``: host pools whose pages travel with the KV pages through the backend's
        v2 calls (registered with ``register_mem_host_pool_v2`` here; see
        :class:`~mem_cache_storage._multi_pool.ExtraPool`)."""
        for name, obj, needs in (
            ("storage", storage, _STORAGE_NEEDS),
            ("host_pool", host_pool, _HOST_POOL_NEEDS),
        ):
            missing = [a for a in needs if not hasattr(obj, a)]
            if missing:
                raise TypeError(
                    f"{name} must have {', '.join(needs)}; {type(obj).__name__} lacks "
                    f"{', '.join(missing)}"
                )
        check_choice("write_policy", write_policy, ("write_back", "write_through"))
        check_int("batch_pages", batch_pages, minimum=1)
        check_optional_int("prefetch_budget_pages", prefetch_budget_pages, minimum=0)
        check_int("io_threads", io_threads, minimum=1)
        if isinstance(extra_pools, (str, bytes)) or not isinstance(extra_pools, Sequence):
            raise TypeError(f"extra_pools must be a list of ExtraPool, got "
                            f"{type(extra_pools).__name__}")
        for i, p in enumerate(extra_pools):
            if not isinstance(p, ExtraPool):
                raise TypeError(f"extra_pools[{i}] must be an ExtraPool, got {type(p).__name__}")
        names = [p.name for p in extra_pools]
        if len(set(names)) != len(names):
            raise ValueError(f"extra_pools must have distinct names, got {names}")
        if extra_pools:
            mp.check_storage_v2(storage)
        #: the extra pools (v2 path), in the order given
        self.extra_pools: tuple[ExtraPool, ...] = tuple(extra_pools)
        self.storage = storage
        self.host_pool = host_pool
        self.page_size = int(host_pool.page_size)
        pages_total = int(host_pool.size) // self.page_size
        budget = pages_total // 2 if prefetch_budget_pages is None else prefetch_budget_pages
        if budget < 0:
            raise ValueError(f"prefetch_budget_pages must be >= 0, got {budget}")
        self.prefetch_budget_pages = budget
        self.write_policy: WritePolicy = write_policy
        self.batch_pages = batch_pages
        self.page_bytes = int(host_pool.get_size_per_token()) * self.page_size
        config = getattr(storage, "storage_config", None)
        self.writes_enabled = not (
            config is not None and getattr(config, "is_mla_model", False)
            and getattr(config, "tp_rank", 0) != getattr(config, "dcp_rank", 0)
        )
        if getattr(storage, "mem_pool_host", None) is not host_pool:
            storage.register_mem_pool_host(host_pool)
        for p in self.extra_pools:
            storage.register_mem_host_pool_v2(p.host_pool, p.name)
        self._extra_bytes = {p.name: p.page_bytes() for p in self.extra_pools}
        # the backend's trusted entry (ours): the controller checked its arguments once
        self._trusted_io = getattr(storage, "_trusted_host_io", None)
        self._trusted_io_v2 = getattr(storage, "_trusted_io_v2", None)
        #: True when the backend has no zero-copy v1 calls (SGLang's base stubs): pages go
        #: through ``batch_get`` / ``batch_set`` (found out at construction or on a ``None``)
        self.generic_io = _v1_is_stub(storage)
        self._lock = threading.Lock()
        self._reserved = 0
        self._reserved_extra = 0
        self._handles: set[PrefetchHandle] = set()
        self._io = ThreadPoolExecutor(max_workers=io_threads,
                                      thread_name_prefix="storage-prefetch")
        self._backup = ThreadPoolExecutor(max_workers=1, thread_name_prefix="storage-backup")
        self._counters = _Counters(names)
        self._count_error = partial(self._counters.add, backend_errors=1)
        self._prefetch_latency = LatencyRecorder()
        self._write_latency = LatencyRecorder()
        self._closed = False

    # ------------------------------------------------------------- accounting
    @property
    def reserved_pages(self) -> int:
        """Host pages held by prefetches not yet taken or released (0 when idle), the extra
        pools' pages included."""
        with self._lock:
            return self._reserved + self._reserved_extra

    def stats(self) -> ControllerStats:
        """A snapshot of this controller's counters."""
        return self._counters.snapshot(self._prefetch_latency, self._write_latency)

    def _slots_of(self, slots: torch.Tensor, first_page: int, pages: int) -> torch.Tensor:
        ps = self.page_size
        return slots[first_page * ps : (first_page + pages) * ps]

    # ------------------------------------------------------------- backend calls
    def _exists_prefix(self, keys: list[str]) -> int:
        found = 0
        for lo in range(0, len(keys), self.batch_pages):
            batch = keys[lo : lo + self.batch_pages]
            n = guarded(partial(self.storage.batch_exists, batch), partial(_clamped, len(batch)),
                        -1, owner="storage", what="batch_exists", count_error=self._count_error)
            if n < 0:  # failed: what was found so far
                return found
            found += n
            if n < len(batch):
                break
        return found

    def _call_v1(self, name: str, keys: list[str], slots: torch.Tensor) -> list[bool]:
        if self.generic_io:
            return self._call_generic(name == "batch_set_v1", keys, slots)
        n = len(keys)
        failed: list[bool] | None = [False] * n
        call = (partial(self._trusted_io, name == "batch_set_v1", keys, slots)
                if self._trusted_io is not None else
                partial(getattr(self.storage, name), keys, slots, None))
        result = guarded(call,
                         partial(_bools_or_stub, n), failed, owner="storage", what=name,
                         count_error=self._count_error)
        if result is None:  # SGLang's base stub: the backend has no v1 path
            _log.info("storage %s returned None: using batch_get / batch_set from now on", name)
            self.generic_io = True
            return self._call_generic(name == "batch_set_v1", keys, slots)
        return result

    def lookup(self, keys: Sequence[str]) -> int:
        """How many leading ``keys`` storage holds (``batch_exists`` in batches; a failing
        backend counts as holding none). Lets a caller make host room before :meth:`prefetch`.
        With ``extra_pools``: the longest prefix every pool can restore (``batch_exists_v2``'s
        ``restorable_prefix_pages``)."""
        keys = _key_list(keys)
        if not self.extra_pools:
            return self._exists_prefix(keys)
        if not keys:
            return 0
        result = self._exists_v2(keys)
        pages = mp.restorable(result, len(keys)) if result is not None else []
        return pages[-1] if pages else 0

    # ---------------------------------------------------------------- prefetch
    def prefetch(self, keys: Sequence[str]) -> PrefetchHandle:
        """Start loading the longest stored prefix of ``keys`` into host pages (background).
        With ``extra_pools`` the prefix is the longest one every pool can restore, and the
        result carries each extra pool's slots (:attr:`PrefetchResult.extra_host_indices`)."""
        if self._closed:
            raise RuntimeError("StorageController is closed")
        handle = PrefetchHandle(self, _key_list(keys))
        with self._lock:
            self._handles.add(handle)
        self._counters.add(prefetches=1)
        self._io.submit(self._run, handle)
        return handle

    def _reserve(self, handle: PrefetchHandle, pages: int | list[int]) -> int:
        """Reserve host pages for ``handle`` within the budget: up to ``pages`` (an int), or
        the longest of the prefix lengths ``pages`` (a list) that fits, with every extra pool's
        part of it (all or nothing). Returns the pages reserved."""
        with self._lock:
            if handle.cancelled:
                return 0
            room = self.prefetch_budget_pages - self._reserved
            if isinstance(pages, int):
                pages = min(pages, room)
            else:
                pages = max((m for m in pages if m <= room), default=0)
            if pages <= 0:
                return 0
            slots = self.host_pool.alloc(pages * self.page_size)
            if slots is None:
                return 0
            extra: dict[str, torch.Tensor] = {}
            for p in self.extra_pools:
                got = p.host_pool.alloc(mp.part_pages(p, pages) * p.page_size)
                if got is None:  # one pool short: nothing reserved
                    for q in self.extra_pools:
                        if q.name in extra:
                            q.host_pool.free(extra[q.name])
                    self.host_pool.free(slots)
                    return 0
                extra[p.name] = got
            handle._slots = slots
            handle._reserved = pages
            handle._extra = extra
            self._reserved += pages
            self._reserved_extra += sum(
                mp.part_pages(p, pages) for p in self.extra_pools)
            return pages

    def _run(self, handle: PrefetchHandle) -> None:
        loaded = 0
        status: PrefetchStatus = "miss"
        try:
            if self.extra_pools:
                loaded = self._run_v2(handle)
            else:
                hit = self._exists_prefix(handle.keys)
                reserved = self._reserve(handle, hit) if hit else 0
                loaded = self._read(handle, reserved)
            status = "done" if loaded else "miss"
        except Exception as exc:  # never kill the IO thread
            _log.exception("storage prefetch failed: %s", exc)
            status, loaded = "failed", 0
        self._finish(handle, status, loaded)

    def _read(self, handle: PrefetchHandle, reserved: int,
              all_pages: Sequence[ExtraPool] = ()) -> int:
        """Read the first ``reserved`` pages of ``handle`` batch by batch (the KV pages and the
        ``all_pages`` pools' parts); the leading pages read intact in every pool."""
        slots = handle._slots
        if not reserved or slots is None:
            return 0
        loaded = 0
        t_io = time.perf_counter()
        for lo in range(0, reserved, self.batch_pages):
            if handle.cancelled:
                break
            batch = handle.keys[lo : min(reserved, lo + self.batch_pages)]
            nb = len(batch)
            ok = self._call_v1("batch_get_v1", batch, self._slots_of(slots, lo, nb))
            good = ok.index(False) if False in ok else nb
            if all_pages and good:
                parts = {p.name: handle._extra[p.name][lo * p.page_size : (lo + good)
                                                       * p.page_size] for p in all_pages}
                got = self._io_v2(False, all_pages, batch[:good], parts)
                for p in all_pages:
                    if got[p.name] < good:
                        self._counters.add_pool(p.name, part_misses=1)
                good = min([good, *got.values()])
            loaded += good
            if good < nb:
                break
        self._counters.add(load_seconds=time.perf_counter() - t_io)
        return loaded

    def _run_v2(self, handle: PrefetchHandle) -> int:
        """The prefetch with extra pools: the restorable prefix lengths, the longest that fits
        reserved in every pool, the KV and ``all_pages`` parts read, the prefix cut to the
        longest restorable length read intact, then the trailing parts at that length. Returns
        the pages kept (0: a miss); ``handle._extra_kept`` gets each pool's kept slots."""
        keys = handle.keys
        result = self._exists_v2(keys) if keys else None
        lengths = mp.restorable(result, len(keys)) if result is not None else []
        if not lengths or not self._reserve(handle, lengths):
            return 0
        pools = self.extra_pools
        good = self._read(handle, handle._reserved, [p for p in pools if not p.trailing])
        m = max((x for x in lengths if x <= good), default=0)
        if m == 0 or handle.cancelled:
            return 0
        for p in pools:
            if not p.trailing:
                continue
            k = mp.part_pages(p, m)
            part = {p.name: handle._extra[p.name][: k * p.page_size]}
            if self._io_v2(False, [p], keys[m - k : m], part)[p.name] < k:
                self._counters.add_pool(p.name, part_misses=1)
                return 0  # the KV pages without their state: nothing usable
        handle._extra_kept = {p.name: handle._extra[p.name][: mp.part_pages(p, m) * p.page_size]
                              for p in pools}
        for p in pools:
            k = mp.part_pages(p, m)
            self._counters.add_pool(p.name, pages_loaded=k,
                                    bytes_loaded=k * self._extra_bytes[p.name])
        return m

    def _release_extra(self, handle: PrefetchHandle, keep: bool) -> None:
        """Free the extra pools' reserved slots of ``handle`` (all of them, or those past the
        kept parts when ``keep``); under ``self._lock``."""
        for p in self.extra_pools:
            slots = handle._extra.get(p.name)
            if slots is None:
                continue
            kept = handle._extra_kept.get(p.name) if keep else None
            n = 0 if kept is None else kept.numel()
            self._reserved_extra -= (slots.numel() - n) // p.page_size
            if n < slots.numel():
                p.host_pool.free(slots[n:])
        handle._extra = {}
        if not keep:
            handle._extra_kept = {}

    def _finish(self, handle: PrefetchHandle, status: PrefetchStatus, loaded: int) -> None:
        latency = time.perf_counter() - handle.submitted
        keep = 0
        try:
            with self._lock:
                slots, reserved = handle._slots, handle._reserved
                keep = 0 if handle.cancelled or status != "done" else loaded
                self._reserved -= reserved - keep
                handle._reserved = keep
                kept = self._slots_of(slots, 0, keep) if slots is not None and keep else None
                handle._slots = kept
                if handle.cancelled:
                    handle._state = "released"
                    self._handles.discard(handle)
                    status = handle._cancel_status or "cancelled"
                else:
                    handle._state = "finished"
                handle._result = PrefetchResult(
                    status, len(handle.keys), keep, kept if kept is not None else _EMPTY, latency,
                    dict(handle._extra_kept) if keep else {},
                )
                self._release_extra(handle, keep > 0)
                if slots is not None and keep < reserved:  # last: a failing free changes nothing
                    self.host_pool.free(self._slots_of(slots, keep, reserved - keep))
        except Exception as exc:  # e.g. the host pool was closed under us: never hang a waiter
            _log.exception("storage prefetch could not release its pages: %s", exc)
        finally:
            c = {"done": "prefetch_hits", "miss": "prefetch_misses", "failed": "prefetch_failed",
                 "cancelled": "prefetch_cancelled", "timeout": "prefetch_timeouts"}[status]
            self._counters.add(**{c: 1})
            if status == "done":
                self._counters.add(pages_loaded=keep, bytes_loaded=keep * self.page_bytes)
            self._prefetch_latency.record(latency)
            handle._done.set()

    def _take(self, handle: PrefetchHandle) -> PrefetchResult:
        with self._lock:
            result = handle._result
            if result is None:  # the background work failed before it could record one
                return PrefetchResult("failed", len(handle.keys), 0, _EMPTY,
                                      time.perf_counter() - handle.submitted)
            if handle._state == "finished":
                self._reserved -= handle._reserved
                self._reserved_extra -= sum(
                    t.numel() // p.page_size for p in self.extra_pools
                    if (t := handle._extra_kept.get(p.name)) is not None)
                handle._reserved = 0
                handle._slots = None
                handle._extra_kept = {}
                handle._state = "taken"
                self._handles.discard(handle)
                return result
        # taken before, or released by a cancel: nothing to hand out
        return PrefetchResult(result.status if result.status != "done" else "cancelled",
                              result.requested, 0, _EMPTY, result.latency_s)

    def _cancel(self, handle: PrefetchHandle, status: PrefetchStatus) -> bool:
        """Cancel ``handle``; ``True`` when it had not been taken (its pages are or will be
        freed)."""
        with self._lock:
            if handle._state in ("taken", "released") or handle.cancelled:
                return handle._state != "taken"
            handle._cancel_status = status
            if handle._state == "finished":  # done but not taken: free now
                if handle._slots is not None and handle._reserved:
                    self.host_pool.free(handle._slots)
                for p in self.extra_pools:
                    kept = handle._extra_kept.get(p.name)
                    if kept is not None:
                        self._reserved_extra -= kept.numel() // p.page_size
                        p.host_pool.free(kept)
                handle._extra_kept = {}
                self._reserved -= handle._reserved
                handle._reserved = 0
                handle._slots = None
                handle._state = "released"
                self._handles.discard(handle)
            # still running: _finish frees everything when the background work ends
        return True

    def close(self) -> None:
        """Cancel every prefetch not yet taken, wait for the background work, and free their
        pages (idempotent). ``reserved_pages`` is 0 afterwards."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            handles = list(self._handles)
        for h in handles:
            h.cancel()
        self._backup.shutdown(wait=True)
        self._io.shutdown(wait=True)
        if self.reserved_pages:
            raise RuntimeError(f"{self.reserved_pages} prefetch pages still reserved after close")

    def __enter__(self) -> StorageController:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
