"""Several host pools per page: SGLang's v2 storage descriptors (``PoolName``,
``PoolHitPolicy``, ``PoolTransfer``, ``PoolTransferResult``, ``count_pool_hits``).

A hybrid model (SWA, DSA, DeepSeek-V4, Mamba) keeps, next to its KV pool, further host pools whose
pages belong to the same token pages (an SWA window, a DSA indexer, compressed KV). The v2 calls
of :class:`~mem_cache_storage.base.HiCacheStorage` move them together: one
:class:`PoolTransfer` per pool (its name, the host slots, the caller keys), stored under
``{key}.{pool name}`` (``{key}`` for the KV pool), as SGLang 0.5.23 does.

``PoolHitPolicy`` says which stored pages of a pool a cached prefix needs:

* ``ALL_PAGES``: every page of the prefix (e.g. the DSA indexer);
* ``TRAILING_PAGES``: only the last ``len(transfer.keys)`` pages of it (SWA / Mamba states);
* ``BLOCK_GROUPS``: declared by SGLang 0.5.23 but used by none of its pools or backends (its
  file backend rejects it); ours reject it the same way (``ValueError``).

SGLang's own objects (its dataclasses and ``str`` enums) are accepted wherever these are: only the
attributes are read and the enums compare equal to their string values.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from mem_cache_storage.config import HiCacheStorageExtraInfo

__all__ = [
    "PoolHitPolicy",
    "PoolPagesMixin",
    "PoolName",
    "PoolTransfer",
    "PoolTransferResult",
    "count_pool_hits",
    "pool_key",
]


class PoolName(str, Enum):
    """Well-known pool names (SGLang's values)."""

    KV = "kv"
    MAMBA = "mamba"
    SWA = "swa"
    AUXILIARY_SWA = "auxiliary_swa"
    INDEXER = "indexer"
    DEEPSEEK_V4_C1 = "deepseek_v4_c1"
    DEEPSEEK_V4_C1_INDEXER = "deepseek_v4_c1_indexer"
    DEEPSEEK_V4_C1_INDEXER_SCALE = "deepseek_v4_c1_indexer_scale"
    DEEPSEEK_V4_C2 = "deepseek_v4_c2"
    DEEPSEEK_V4_C2_INDEXER = "deepseek_v4_c2_indexer"
    DEEPSEEK_V4_C2_INDEXER_SCALE = "deepseek_v4_c2_indexer_scale"
    DEEPSEEK_V4_C4 = "deepseek_v4_c4"
    DEEPSEEK_V4_C4_INDEXER = "deepseek_v4_c4_indexer"
    DEEPSEEK_V4_C4_INDEXER_SCALE = "deepseek_v4_c4_indexer_scale"
    DEEPSEEK_V4_C128 = "deepseek_v4_c128"
    DEEPSEEK_V4_C4_ROPE = "deepseek_v4_c4_rope"
    DEEPSEEK_V4_C128_ROPE = "deepseek_v4_c128_rope"
    DEEPSEEK_V4_C4_STATE = "deepseek_v4_c4_state"
    DEEPSEEK_V4_C4_INDEXER_STATE = "deepseek_v4_c4_indexer_state"
    DEEPSEEK_V4_C128_STATE = "deepseek_v4_c128_state"
    DRAFT = "draft"
    DRAFT_INDEXER = "draft_indexer"
    DRAFT_SWA = "draft_swa"

    def __str__(self) -> str:
        return self.value


class PoolHitPolicy(str, Enum):
    """Which pages of a pool a cached prefix needs (see the module docstring)."""

    ALL_PAGES = "all_pages"
    TRAILING_PAGES = "trailing_pages"
    BLOCK_GROUPS = "block_groups"


@dataclass
class PoolTransfer:
    """One pool's share of a v2 call: ``host_indices`` (``len(keys) * page_size`` slots of that
    pool), ``keys`` (caller keys, one per page) and the pool's ``hit_policy``; the other fields
    are SGLang's device-side bookkeeping, carried and ignored here."""

    name: str
    host_indices: torch.Tensor | None = None
    device_indices: torch.Tensor | None = None
    keys: list[str] | None = None
    hit_policy: str = PoolHitPolicy.ALL_PAGES
    nodes_to_load: list[Any] | None = None
    indices_from_pool: str | None = None
    block_pages: int = 0
    group_pages: int = 0


@dataclass
class PoolTransferResult:
    """``batch_exists_v2``'s answer: ``kv_hit_pages`` (the usable prefix, in pages),
    ``extra_pool_hit_pages`` (pages found per pool) and ``restorable_prefix_pages`` (every
    prefix length every pool can restore; the caller intersects these across ranks)."""

    kv_hit_pages: int
    extra_pool_hit_pages: dict[str, int] = field(default_factory=dict)
    restorable_prefix_pages: list[int] | None = None

    @classmethod
    def empty(cls) -> PoolTransferResult:
        """No hit."""
        return cls(0, {})

    def update_kv_hit_pages(self, kv_hit_pages: int) -> None:
        """Keep the largest ``kv_hit_pages`` seen across batches."""
        self.kv_hit_pages = max(self.kv_hit_pages, kv_hit_pages)

    def update_extra_pool_hit_pages(self, results: dict[str, int]) -> None:
        """Record per-pool counts."""
        self.extra_pool_hit_pages.update(results)


def count_pool_hits(results: dict[str, list[bool]]) -> dict[str, int]:
    """The leading run of ``True`` per pool."""
    return {name: (rs.index(False) if False in rs else len(rs)) for name, rs in results.items()}


def _name(pool_name: object) -> str:
    return str(getattr(pool_name, "value", pool_name))


def pool_key(pool_name: object, key: str) -> str:
    """The caller key of ``key``'s page of pool ``pool_name``: ``key`` for the KV pool (and for
    ``None`` / ``"__default__"``), ``{key}.{pool name}`` otherwise (SGLang's naming)."""
    name = str(getattr(pool_name, "value", pool_name)) if pool_name is not None else "kv"
    return key if name in ("kv", "__default__") else f"{key}.{name}"


_log = logging.getLogger("mem_cache_storage.backend")


class PoolPagesMixin:
    """The v2 calls of :class:`~mem_cache_storage.backend.PageStorageBackend` (several host
    pools per page): ``register_mem_host_pool_v2``, ``batch_exists_v2``, ``batch_get_v2``,
    ``batch_set_v2``. A pool's page of caller key ``k`` is stored under ``{k}.{pool}``
    (:func:`pool_key`), in the pool's native page format, with the same verification as a KV
    page; the KV pool falls back to ``register_mem_pool_host``'s."""

    # provided by PageStorageBackend / HiCacheStorage
    mem_pool_host: Any
    registered_pools: dict[str, Any]
    keyspace: Any
    _exist: Callable[[list[str]], list[bool]]
    _host_io: Callable[[bool, Any, list[str], torch.Tensor, bool], list[bool]]
    _check_keys: Callable[..., list[str]]

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        if not (hasattr(host_pool, "get_page_buffer_meta") and hasattr(host_pool, "page_size")):
            raise TypeError(
                "host_pool must be a host pool (get_page_buffer_meta, page_size), got "
                f"{type(host_pool).__name__}"
            )
        super().register_mem_host_pool_v2(host_pool, host_pool_name)  # type: ignore[misc]

    def _pool(self, name: str) -> Any:
        pool = self.registered_pools.get(name)
        if pool is None and name == "kv":
            pool = self.mem_pool_host
        return pool

    def batch_exists_v2(
        self, keys: list[str], pool_transfers: list[Any] | None = None,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> PoolTransferResult:
        """SGLang's v2 existence query: the KV prefix of ``keys`` and, per pool of
        ``pool_transfers``, the prefix lengths its hit policy can restore (see
        :mod:`mem_cache_storage.pools`); a failing backend holds nothing."""
        keys = self._check_keys(keys)
        transfers = list(pool_transfers or [])
        names = [_name(t.name) for t in transfers]
        policies = [_name(getattr(t, "hit_policy", PoolHitPolicy.ALL_PAGES)) for t in transfers]
        for policy in policies:
            if policy not in (PoolHitPolicy.ALL_PAGES.value, PoolHitPolicy.TRAILING_PAGES.value):
                raise ValueError(
                    f"pool_transfers hit_policy must be 'all_pages' or 'trailing_pages', "
                    f"got {policy!r}"
                )
        ks = self.keyspace
        n = len(keys)
        skeys = ks.storage_keys(keys)
        for name in names:
            skeys += ks.storage_keys([pool_key(name, k) for k in keys])
        found = self._exist(skeys)
        kv_pages = found[:n].index(False) if False in found[:n] else n
        hit: dict[str, int] = {"kv": kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        for p, (transfer, name, policy) in enumerate(zip(transfers, names, policies)):
            if not restorable:
                break
            have = found[(p + 1) * n : (p + 2) * n]
            if policy == PoolHitPolicy.ALL_PAGES.value:
                boundary = next((i for i in range(kv_pages) if not have[i]), kv_pages)
                ok = set(range(1, boundary + 1))
            else:
                trailing = max(1, len(transfer.keys) if transfer.keys else 1)
                ok = {m for m in range(1, kv_pages + 1)
                      if all(have[max(0, m - trailing) : m])}
                boundary = max(ok, default=0)
            if boundary:
                hit[name] = boundary
            restorable = [m for m in restorable if m in ok]
        return PoolTransferResult(restorable[-1] if restorable else 0, hit, restorable)

    def _batch_io_v2(self, write: bool, transfers: list[Any]) -> dict[str, list[bool]]:
        if isinstance(transfers, (str, bytes)) or not isinstance(transfers, Sequence):
            raise TypeError(f"transfers must be a list of PoolTransfer, got "
                            f"{type(transfers).__name__}")
        out: dict[str, list[bool]] = {}
        for transfer in transfers:
            name = _name(transfer.name)
            keys = self._check_keys(list(transfer.keys or []), f"transfers[{name}].keys")
            pool = self._pool(name)
            indices = transfer.host_indices
            ps = int(getattr(pool, "page_size", 0) or 0)
            if pool is None or indices is None or indices.numel() != len(keys) * ps:
                _log.warning("%s: v2 %s of pool %r: no such pool or %s host slots for %d pages",
                             type(self).__name__, "set" if write else "get", name,
                             None if indices is None else indices.numel(), len(keys))
                out[name] = [False] * len(keys)
                continue
            skeys = self.keyspace.storage_keys([pool_key(name, k) for k in keys])
            out[name] = self._host_io(write, pool, skeys, indices, False)
        return out

    def _trusted_io_v2(self, write: bool, transfers: list[Any]) -> dict[str, list[bool]]:
        """``batch_set_v2`` (``write``) / ``batch_get_v2`` for a caller that checked every
        transfer itself (a registered pool's name, caller keys, exactly ``len(keys) *
        page_size`` index slots of that pool): the storage controller's I/O threads, so the v2
        path checks ``host_indices`` once, at the controller's entry."""
        out: dict[str, list[bool]] = {}
        ks = self.keyspace
        for t in transfers:
            name = _name(t.name)
            skeys = ks.storage_keys([pool_key(name, k) for k in t.keys])
            out[name] = self._host_io(write, self._pool(name), skeys, t.host_indices, True)
        return out

    def batch_get_v2(
        self, transfers: list[Any], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> dict[str, list[bool]]:
        """Read every transfer's pages into its pool (``registered_pools[transfer.name]``); a
        pool that is not registered or slots that are not ``len(keys)`` pages give all
        ``False``; a page that fails verification is ``False`` (its slots hold undefined bytes)."""
        return self._batch_io_v2(False, transfers)

    def batch_set_v2(
        self, transfers: list[Any], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> dict[str, list[bool]]:
        """Write every transfer's pages from its pool; one bool per key per pool."""
        return self._batch_io_v2(True, transfers)
