"""``HiCacheStorage``: the storage (L3) backend interface, names and semantics of SGLang's.

A backend stores whole KV pages under string keys. The engine's controller computes the keys
(chained page hashes, see :mod:`mem_cache_storage.keys`) and moves pages between the host pool
(L2) and the backend.

Contract (every backend; :mod:`mem_cache_storage.testing` checks it):

* ``get(key, target_location)``: copy the page stored under ``key`` into ``target_location`` (a
  contiguous CPU tensor, e.g. ``host_pool.get_dummy_flat_data_page()``) and return it, or return
  ``None`` when the key is absent *or its stored data cannot be verified* (torn, truncated,
  foreign, corrupted): a backend never returns wrong bytes.
* ``batch_get(keys, target_locations)``: ``get`` per key, a list of tensors or ``None``.
* ``set(key, value)`` / ``batch_set(keys, values) -> bool``: store; ``True`` when every page was
  stored. Overwriting a key replaces it atomically (a reader sees the old or the new page).
* ``exists(key) -> bool``; ``batch_exists(keys, extra_info) -> int``: the number of consecutive
  keys present from the first one (chained keys: the length of the cached prefix in pages).
* Zero copy, on the pool given to ``register_mem_pool_host``: ``batch_get_v1(keys,
  host_indices, extra_info)`` / ``batch_set_v1(...)`` move the pages at ``host_indices`` (whole
  pages of host slots, ``len(keys)`` pages, as ``host_pool.alloc`` returns them) and return one
  ``bool`` per key. A ``False`` page of ``batch_get_v1`` holds undefined bytes; the caller must
  not use it. The default raises ``NotImplementedError`` (never returns ``None``).
* ``clear()`` removes every page of this backend; ``get_stats()`` returns counters or ``None``.
* Errors: a caller mistake (wrong types, wrong sizes) raises ``ValueError``/``TypeError``; a
  storage failure is reported as a miss / ``False``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from mem_cache_storage.config import HiCacheStorageExtraInfo

__all__ = ["HiCacheStorage"]


class HiCacheStorage(ABC):
    """Abstract storage backend (see the module docstring)."""

    mem_pool_host: Any = None

    @property
    def registered_pools(self) -> dict[str, Any]:
        """Host pools of the v2 calls by name (see :meth:`register_mem_host_pool_v2`)."""
        pools: dict[str, Any] = self.__dict__.setdefault("_registered_pools", {})
        return pools

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Remember the host pool the zero-copy calls read from and write to."""
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """Remember ``host_pool`` under ``host_pool_name`` (a ``PoolName`` or its string) for
        the v2 calls; ``registered_pools`` maps names (strings) to pools. SGLang's hybrid
        controller calls this once per host pool, the KV pool included."""
        name = str(getattr(host_pool_name, "value", host_pool_name))
        self.registered_pools[name] = host_pool

    def on_host_pools_registered(self) -> None:  # noqa: B027 (a hook; SGLang's is a no-op)
        """The initial registration burst is over (SGLang calls this once per attach, after
        ``register_mem_pool_host`` and every ``register_mem_host_pool_v2``). Nothing to finalize
        by default; raising fails the attach."""

    def batch_exists_v2(
        self, keys: list[str], pool_transfers: list[Any] | None = None,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> Any:
        """The stored prefix of ``keys`` over the KV pool and every pool of
        ``pool_transfers`` under their hit policies, a ``PoolTransferResult``
        (:mod:`mem_cache_storage.pools`). The default raises ``NotImplementedError`` (SGLang's)."""
        raise NotImplementedError(f"{type(self).__name__} has no batch_exists_v2")

    def batch_get_v2(
        self, transfers: list[Any], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> dict[str, list[bool]]:
        """Read each transfer's pages into its pool's host slots; one bool per key per pool.
        The default raises ``NotImplementedError`` (SGLang's)."""
        raise NotImplementedError(f"{type(self).__name__} has no batch_get_v2")

    def batch_set_v2(
        self, transfers: list[Any], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> dict[str, list[bool]]:
        """Write each transfer's pages from its pool's host slots; one bool per key per pool.
        The default raises ``NotImplementedError`` (SGLang's)."""
        raise NotImplementedError(f"{type(self).__name__} has no batch_set_v2")

    @abstractmethod
    def get(
        self,
        key: str,
        target_location: Any | None = None,
        target_sizes: Any | None = None,
    ) -> torch.Tensor | None:
        """The page under ``key`` copied into ``target_location``, or ``None`` (a miss)."""

    @abstractmethod
    def batch_get(
        self,
        keys: list[str],
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> list[torch.Tensor | None] | int:
        """``get`` for each key."""

    @abstractmethod
    def set(
        self,
        key: str,
        value: Any | None = None,
        target_location: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        """Store ``value`` under ``key``; ``True`` on success."""

    @abstractmethod
    def batch_set(
        self,
        keys: list[str],
        values: Any | None = None,
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        """Store every value; ``True`` when all were stored."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` is stored."""

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        """Number of consecutive keys present, counting from ``keys[0]``."""
        for i, key in enumerate(keys):
            if not self.exists(key):
                return i
        return len(keys)

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Zero-copy get into the registered host pool's pages at ``host_indices``."""
        raise NotImplementedError(f"{type(self).__name__} has no zero-copy batch_get_v1")

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Zero-copy set from the registered host pool's pages at ``host_indices``."""
        raise NotImplementedError(f"{type(self).__name__} has no zero-copy batch_set_v1")

    def clear(self) -> None:  # noqa: B027 (SGLang's default is a no-op, not abstract)
        """Remove every stored page (no-op by default)."""

    def get_stats(self) -> Any:
        """Backend counters, or ``None``."""
        return None
