"""``HiCacheMemory``: an in-process pointer backend (a dict of bytes objects).

The reference implementation of :class:`~mem_cache_storage.backend.PointerStorageBackend`: it
is what a distributed zero-copy client (``batch_put_from`` / ``batch_get_into`` /
``batch_is_exist``) looks like to the base class, without a network. Useful in tests, in
benchmarks (the cost of the base class alone) and as a template for backend authors. Pages live
as long as the backend object (or the dict passed as ``options["store"]``, which several backend
objects may share). ``capacity_bytes`` (0 = unlimited) evicts whole objects in insertion order.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from mem_cache_storage import _memory
from mem_cache_storage.backend import PointerStorageBackend

__all__ = ["HiCacheMemory"]


class HiCacheMemory(PointerStorageBackend):
    """Objects in a process-local ordered dict (see the module docstring)."""

    backend_name = "memory"

    def __init__(
        self, storage_config: object | None = None, kwargs: object | None = None, /,
        **options: Any,
    ) -> None:
        super().__init__(storage_config, kwargs, **options)
        store = self.options.get("store")
        if store is not None and not isinstance(store, OrderedDict):
            raise TypeError(f"store must be an OrderedDict, got {type(store).__name__}")
        self._store: OrderedDict[str, bytes] = store if store is not None else OrderedDict()
        self.capacity_bytes = int(self.options.get("capacity_bytes", 0) or 0)
        self._lock = threading.Lock()
        self._usage = sum(len(v) for v in self._store.values())

    def _batch_put_from(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[bool]:
        with self._lock:
            for key, ptr, n in zip(keys, ptrs, sizes):
                data = bytes(_memory.view(ptr, n))
                old = self._store.pop(key, None)
                self._usage += n - (len(old) if old is not None else 0)
                self._store[key] = data
            evicted = 0
            while self.capacity_bytes and self._usage > self.capacity_bytes and self._store:
                _, old = self._store.popitem(last=False)
                self._usage -= len(old)
                evicted += 1
        if evicted:
            self.stats.add(evicted=evicted)
        return [True] * len(keys)

    def _batch_get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[bool]:
        out: list[bool] = []
        with self._lock:
            for key, ptr, n in zip(keys, ptrs, sizes):
                data = self._store.get(key)
                if data is None or len(data) != n:
                    out.append(False)
                    continue
                _memory.view(ptr, n)[:] = data
                out.append(True)
        return out

    def _batch_is_exist(self, keys: list[str]) -> list[bool]:
        with self._lock:
            return [k in self._store for k in keys]

    def _clear(self) -> None:
        with self._lock:
            self._store.clear()
            self._usage = 0
