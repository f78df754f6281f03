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

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

__all__ = [
    "PoolHitPolicy",
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


def pool_key(pool_name: object, key: str) -> str:
    """The caller key of ``key``'s page of pool ``pool_name``: ``key`` for the KV pool (and for
    ``None`` / ``"__default__"``), ``{key}.{pool name}`` otherwise (SGLang's naming)."""
    name = str(getattr(pool_name, "value", pool_name)) if pool_name is not None else "kv"
    return key if name in ("kv", "__default__") else f"{key}.{name}"
