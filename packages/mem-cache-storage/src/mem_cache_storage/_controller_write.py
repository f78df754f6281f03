"""The write path of :class:`~mem_cache_storage.controller.StorageController` (a base of it):
host pages -> storage, skipping the leading keys the backend already has (``batch_exists``), in
batches of ``batch_pages`` through the zero-copy ``batch_set_v1`` (extra pools' parts through the
v2 calls first); synchronous (:meth:`~ControllerWrites.write`), on the backup thread
(:meth:`~ControllerWrites.write_async`), or at the point the write policy names
(:meth:`~ControllerWrites.on_host_evict`, :meth:`~ControllerWrites.on_host_insert`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch

from mem_cache_kernels.checks import check_index
from mem_cache_storage import _multi_pool as mp
from mem_cache_storage._multi_pool import ExtraPool
from mem_cache_storage.backend import _key_list

__all__ = ["ControllerWrites", "WritePolicy", "WriteResult"]

_log = logging.getLogger(__name__)

WritePolicy = Literal["write_back", "write_through"]


class _Counts(Protocol):  # the controller's counters, as the write path uses them
    def add(self, **deltas: float) -> None: ...

    def add_pool(self, pool: str, **deltas: int) -> None: ...


class _Records(Protocol):  # the controller's latency recorder
    def record(self, seconds: float) -> None: ...


@dataclass(frozen=True, slots=True)
class WriteResult:
    """Pages ``written``, ``skipped`` (already stored) and ``failed`` by one write (token
    pages: the KV pool's); ``extra_failed``: pages of extra pools that failed."""

    written: int
    skipped: int
    failed: int
    extra_failed: int = 0


class ControllerWrites:
    """The controller's writes (see the module docstring); the controller's state and calls it
    uses are declared here for mypy."""

    extra_pools: tuple[ExtraPool, ...]
    page_size: int
    page_bytes: int
    batch_pages: int
    writes_enabled: bool
    write_policy: WritePolicy
    _closed: bool
    _backup: ThreadPoolExecutor
    _counters: _Counts
    _write_latency: _Records
    _extra_bytes: dict[str, int]

    if TYPE_CHECKING:  # the controller's, used here

        def _exists_prefix(self, keys: list[str]) -> int: ...

        def _exists_v2(self, keys: list[str]) -> Any: ...

        def _io_v2(self, write: bool, pools: Sequence[ExtraPool], keys: list[str],
                   indices: Mapping[str, torch.Tensor]) -> dict[str, int]: ...

        def _call_v1(self, name: str, keys: list[str], slots: torch.Tensor) -> list[bool]: ...

        def _slots_of(self, slots: torch.Tensor, first_page: int, pages: int) -> torch.Tensor: ...

    def _check_write(self, keys: Iterable[str], host_indices: torch.Tensor,
                     extra_indices: object) -> tuple[list[str], dict[str, torch.Tensor]]:
        """Every write entry point's argument check (the one check of the write path: below
        it, :meth:`_write` and the backend's trusted entry take the arguments as they are)."""
        keys = _key_list(keys)
        check_index("host_indices", host_indices)
        if host_indices.numel() != len(keys) * self.page_size:
            raise ValueError(
                f"host_indices must hold len(keys) * page_size = {len(keys) * self.page_size} "
                f"slots, got {host_indices.numel()}"
            )
        if not (self.extra_pools or extra_indices):  # the KV-only path stays in this module
            return keys, {}
        return keys, mp.check_extra_indices(self.extra_pools, extra_indices, len(keys))

    def write(self, keys: Sequence[str], host_indices: torch.Tensor,
              extra_indices: Mapping[str, torch.Tensor] | None = None) -> WriteResult:
        """Store the pages at ``host_indices`` (``len(keys) * page_size`` host slots) under
        ``keys``, skipping the leading keys already stored. Synchronous: the caller keeps the
        host pages until it returns. With ``extra_pools``, ``extra_indices`` maps every extra
        pool's name to its slots of these pages (``all_pages``: ``len(keys)`` pages;
        ``trailing_pages``: the last ``min(trailing_pages, len(keys))`` pages)."""
        keys, extra = self._check_write(keys, host_indices, extra_indices)
        return self._write(keys, host_indices, extra)

    def _write(self, keys: list[str], host_indices: torch.Tensor,
               extra: Mapping[str, torch.Tensor]) -> WriteResult:
        """:meth:`write` on checked arguments. Extra pools' parts go first (a trailing part,
        then per batch the ``all_pages`` parts before the KV pages), so a KV page that storage
        reports present never lacks a part written with it."""
        kv_on = bool(keys) and self.writes_enabled
        # Mamba states are TP-sharded even where the KV is replicated (SGLang's should_backup)
        pools = [p for p in self.extra_pools if kv_on or p.name == "mamba"]
        if not keys or not (kv_on or pools):
            return WriteResult(0, len(keys), 0)
        t0 = time.perf_counter()
        n = len(keys)
        trailing_done = False
        if self.extra_pools:
            result = self._exists_v2(keys)
            present = mp.contiguous_present(result, self.extra_pools) if result else 0
            trailing_done = result is not None and n in mp.restorable(result, n)
        else:
            present = self._exists_prefix(keys)
        written = failed = extra_failed = 0
        io_s = 0.0
        t1 = time.perf_counter()
        for p in pools:
            if not p.trailing:
                continue
            k = mp.part_pages(p, n)
            if trailing_done:
                self._counters.add_pool(p.name, pages_skipped=k)
                continue
            good = self._io_v2(True, [p], keys[n - k:], extra)[p.name]
            extra_failed += k - good
            self._counters.add_pool(p.name, pages_written=good, pages_write_failed=k - good,
                                    bytes_written=good * self._extra_bytes[p.name])
        all_pages = [p for p in pools if not p.trailing]
        for p in all_pages:
            self._counters.add_pool(p.name, pages_skipped=present)
        for lo in range(present, n, self.batch_pages):
            batch = keys[lo : lo + self.batch_pages]
            nb = len(batch)
            if all_pages:
                parts = {p.name: extra[p.name][lo * p.page_size : (lo + nb) * p.page_size]
                         for p in all_pages}
                got = self._io_v2(True, all_pages, batch, parts)
                for p in all_pages:
                    g = got[p.name]
                    extra_failed += nb - g
                    self._counters.add_pool(p.name, pages_written=g, pages_write_failed=nb - g,
                                            bytes_written=g * self._extra_bytes[p.name])
            if not kv_on:
                continue
            ok = self._call_v1("batch_set_v1", batch, self._slots_of(host_indices, lo, nb))
            good = sum(ok)
            written += good
            failed += nb - good
        io_s += time.perf_counter() - t1
        self._counters.add(pages_written=written, pages_skipped=present,
                           pages_write_failed=failed, bytes_written=written * self.page_bytes,
                           write_seconds=io_s)
        self._write_latency.record(time.perf_counter() - t0)
        return WriteResult(written, present, failed, extra_failed)

    def write_async(
        self,
        keys: Sequence[str],
        host_indices: torch.Tensor,
        on_done: Callable[[WriteResult], None] | None = None,
        extra_indices: Mapping[str, torch.Tensor] | None = None,
    ) -> Future[WriteResult]:
        """:meth:`write` on the backup thread. The caller keeps the host pages until the write
        ended: ``on_done(result)`` runs on the backup thread right after (e.g. to free them), and
        the returned future completes after it. A failing write completes with
        ``failed == len(keys)``; a raising ``on_done`` fails the future."""
        if self._closed:
            raise RuntimeError("StorageController is closed")
        keys, extra = self._check_write(keys, host_indices, extra_indices)

        def job() -> WriteResult:
            try:
                result = self._write(keys, host_indices, extra)
            except Exception as exc:
                _log.warning("storage write failed (%s): counted as failed pages", exc)
                self._counters.add(pages_write_failed=len(keys))
                result = WriteResult(0, 0, len(keys))
            if on_done is not None:
                on_done(result)
            return result

        return self._backup.submit(job)

    def on_host_evict(self, keys: Sequence[str], host_indices: torch.Tensor,
                      extra_indices: Mapping[str, torch.Tensor] | None = None) -> WriteResult:
        """Host pages are about to be freed: write them under ``write_back``."""
        keys, extra = self._check_write(keys, host_indices, extra_indices)
        if self.write_policy != "write_back":
            return WriteResult(0, 0, 0)
        return self._write(keys, host_indices, extra)

    def on_host_insert(self, keys: Sequence[str], host_indices: torch.Tensor,
                       extra_indices: Mapping[str, torch.Tensor] | None = None) -> WriteResult:
        """Pages just reached the host pool: write them under ``write_through``."""
        keys, extra = self._check_write(keys, host_indices, extra_indices)
        if self.write_policy != "write_through":
            return WriteResult(0, 0, 0)
        return self._write(keys, host_indices, extra)
