"""Seeded fault injection for the storage tier (L3): failed, slow, corrupted and partial
storage operations.

:class:`FaultyStorage` wraps the simulator's :class:`~mem_cache_storage.HiCacheFile` and, with
probability ``rate`` per backend call, makes the call

* **fail**: raise before touching anything;
* **slow**: sleep ``slow_s`` first (longer than the simulator's prefetch wait, so the prefetch
  times out and must release its pages);
* **corrupt**: flip one payload byte of a stored page file (after a write, or before a read) -
  bit rot the backend's checksum must catch;
* **partial**: a read or write that stops after a random number of pages.

The controller must turn every one of them into a miss or a shorter prefix, release every
reserved host page, and never let a wrong byte reach the device (the simulator verifies every
page it loads from L3). The v2 calls (several host pools per page: ``--model hybrid`` and
``--model deepseek_v4``) draw the same faults per call; a partial v2 call stops every pool's
pages at the drawn page.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from mem_cache_storage import HiCacheFile, HiCacheStorage, HiCacheStorageExtraInfo
from mem_cache_storage.backend import PageStorageBackend
from mem_cache_storage.pools import PoolTransfer

__all__ = ["FaultyStorage", "InjectedStorageError", "STORAGE_FAULT_KINDS"]

STORAGE_FAULT_KINDS = ("fail", "slow", "corrupt", "partial")


def _name(pool_name: object) -> str:
    return str(getattr(pool_name, "value", pool_name))


class InjectedStorageError(OSError):
    """Raised inside a storage call by the fault injector (never by the packages)."""


class FaultyStorage(HiCacheStorage):
    """A storage backend whose zero-copy calls suffer seeded faults (see the module).

    ``corrupt`` needs a backend with one file per page (:class:`HiCacheFile`); on other backends
    (Mooncake) it is not drawn. ``written`` logs every key a ``batch_set_v1`` stored (in order),
    for the multi-instance run's writer table; the caller empties it.
    """

    def __init__(self, inner: PageStorageBackend, rate: float, seed: int,
                 slow_s: float) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be in [0, 1], got {rate}")
        self.inner = inner
        self.kinds = STORAGE_FAULT_KINDS if isinstance(inner, HiCacheFile) else tuple(
            k for k in STORAGE_FAULT_KINDS if k != "corrupt")
        self.written: list[str] = []
        self.rate = rate
        self.slow_s = slow_s
        self.storage_config = inner.storage_config
        self._rng = random.Random(seed ^ 0x51_0BA6E)
        self._lock = threading.Lock()
        self.injected: dict[str, int] = dict.fromkeys(STORAGE_FAULT_KINDS, 0)

    # ------------------------------------------------------------ plumbing
    @property
    def mem_pool_host(self) -> Any:
        return self.inner.mem_pool_host

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.inner.register_mem_pool_host(mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        self.inner.register_mem_host_pool_v2(host_pool, host_pool_name)

    def _draw(self, n: int) -> tuple[str | None, int]:
        with self._lock:
            if self.rate == 0.0 or self._rng.random() >= self.rate:
                return None, 0
            kind = self._rng.choice(self.kinds)
            self.injected[kind] += 1
            return kind, self._rng.randrange(max(1, n))

    def _corrupt(self, key: str) -> bool:
        if not isinstance(self.inner, HiCacheFile):
            return False
        extent = self.inner.page_extent(key)  # this key's payload bytes (a segment holds many)
        if extent is None or extent[2] == 0:
            return False
        path, offset, nbytes = extent
        at = offset + nbytes - 1 - nbytes // 3  # a payload byte of this page
        try:
            with path.open("r+b") as f:
                f.seek(at)
                byte = f.read(1)
                f.seek(at)
                f.write(bytes([byte[0] ^ 0x10]))
        except FileNotFoundError:
            return False
        return True

    # ----------------------------------------------------- faulty zero-copy API
    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        kind, _ = self._draw(len(keys))
        if kind == "fail":
            raise InjectedStorageError("injected batch_exists failure")
        if kind == "slow":
            time.sleep(self.slow_s)
        return self.inner.batch_exists(keys, extra_info)

    def _v1(self, write: bool, keys: list[str], host_indices: torch.Tensor,
            io: Callable[[list[str], torch.Tensor], list[bool]]) -> list[bool]:
        """One zero-copy read / write (``io``) with a drawn fault."""
        kind, at = self._draw(len(keys))
        what = "batch_set_v1" if write else "batch_get_v1"
        if kind == "fail":
            raise InjectedStorageError(f"injected {what} failure")
        if kind == "slow":
            time.sleep(self.slow_s)
        if not write:
            if kind == "corrupt" and keys:
                self._corrupt(keys[at])
            ok = io(keys, host_indices)
            return [o and i < at for i, o in enumerate(ok)] if kind == "partial" else ok
        if kind == "partial":
            ps = self.inner.keyspace.page_size
            done = io(keys[:at], host_indices[: at * ps])
            self.written.extend(k for k, o in zip(keys, done, strict=False) if o)
            return done + [False] * (len(keys) - at)
        ok = io(keys, host_indices)
        self.written.extend(k for k, o in zip(keys, ok, strict=False) if o)
        if kind == "corrupt" and keys:
            self._corrupt(keys[at])
        return ok

    def batch_get_v1(
        self, keys: list[str], host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        return self._v1(False, keys, host_indices,
                        lambda k, i: self.inner.batch_get_v1(k, i, extra_info))

    def batch_set_v1(
        self, keys: list[str], host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        return self._v1(True, keys, host_indices,
                        lambda k, i: self.inner.batch_set_v1(k, i, extra_info))

    def _trusted_host_io(self, write: bool, keys: list[str],
                         host_indices: torch.Tensor) -> list[bool]:
        """The controller's trusted entry (arguments checked once, by the controller), with
        the same faults as the SGLang-named calls."""
        return self._v1(write, keys, host_indices,
                        lambda k, i: self.inner._trusted_host_io(write, k, i))

    # ------------------------------------------------------------ faulty v2 API
    def batch_exists_v2(self, keys: list[str], pool_transfers: list[Any] | None = None,
                        extra_info: HiCacheStorageExtraInfo | None = None) -> Any:
        kind, _ = self._draw(len(keys))
        if kind == "fail":
            raise InjectedStorageError("injected batch_exists_v2 failure")
        if kind == "slow":
            time.sleep(self.slow_s)
        return self.inner.batch_exists_v2(keys, pool_transfers, extra_info)

    def _io_v2(self, write: bool, transfers: list[Any],
               extra_info: HiCacheStorageExtraInfo | None,
               trusted: bool = False) -> dict[str, list[bool]]:
        n = max((len(t.keys or []) for t in transfers), default=0)
        sizes = {_name(t.name): len(t.keys or []) for t in transfers}
        kind, at = self._draw(n)
        what = "batch_set_v2" if write else "batch_get_v2"
        if kind == "fail":
            raise InjectedStorageError(f"injected {what} failure")
        if kind == "slow":
            time.sleep(self.slow_s)
        if kind == "corrupt" and not write:
            for t in transfers:
                if len(t.keys or []) > at:
                    self._corrupt(f"{t.keys[at]}.{_name(t.name)}")
        call: Callable[[list[Any], HiCacheStorageExtraInfo | None], dict[str, list[bool]]] = (
            (lambda ts, _info: self.inner._trusted_io_v2(write, ts)) if trusted
            else self.inner.batch_set_v2 if write else self.inner.batch_get_v2)
        if kind == "partial" and write:  # only the pages before the drawn one are stored
            pools = self.inner.registered_pools
            transfers = [
                PoolTransfer(t.name, t.host_indices[: min(at, len(t.keys)) * int(
                    pools.get(_name(t.name), self.inner.mem_pool_host).page_size)],
                    keys=t.keys[:at], hit_policy=t.hit_policy)
                for t in transfers
            ]
            return {name: ok + [False] * (sizes[name] - len(ok))
                    for name, ok in call(transfers, extra_info).items()}
        out = call(transfers, extra_info)
        if kind == "corrupt" and write:
            for t in transfers:
                if len(t.keys or []) > at:
                    self._corrupt(f"{t.keys[at]}.{_name(t.name)}")
        if kind == "partial":
            out = {name: [o and i < at for i, o in enumerate(ok)] for name, ok in out.items()}
        return out

    def _trusted_io_v2(self, write: bool, transfers: list[Any]) -> dict[str, list[bool]]:
        """The controller's trusted v2 entry, with the same faults as the public v2 calls."""
        return self._io_v2(write, transfers, None, trusted=True)

    def batch_get_v2(self, transfers: list[Any],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> dict[str, list[bool]]:
        return self._io_v2(False, transfers, extra_info)

    def batch_set_v2(self, transfers: list[Any],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> dict[str, list[bool]]:
        return self._io_v2(True, transfers, extra_info)

    # ------------------------------------------------------ copying API (no faults)
    def get(self, key: str, target_location: Any | None = None,
            target_sizes: Any | None = None) -> torch.Tensor | None:
        return self.inner.get(key, target_location, target_sizes)

    def batch_get(self, keys: list[str], target_locations: Any | None = None,
                  target_sizes: Any | None = None) -> list[torch.Tensor | None]:
        return self.inner.batch_get(keys, target_locations, target_sizes)

    def set(self, key: str, value: Any | None = None, target_location: Any | None = None,
            target_sizes: Any | None = None) -> bool:
        return self.inner.set(key, value, target_location, target_sizes)

    def batch_set(self, keys: list[str], values: Any | None = None,
                  target_locations: Any | None = None, target_sizes: Any | None = None) -> bool:
        return self.inner.batch_set(keys, values, target_locations, target_sizes)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def clear(self) -> None:
        self.inner.clear()

    def get_stats(self) -> Any:
        return self.inner.get_stats()
