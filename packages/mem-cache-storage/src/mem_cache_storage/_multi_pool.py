"""The controller's extra host pools (the v2 path of :class:`~mem_cache_storage.controller.
StorageController`): what an extra pool is (:class:`ExtraPool`) and the ``PoolTransfer``
lists the controller hands the backend's ``batch_exists_v2`` / ``batch_get_v2`` /
``batch_set_v2``.

Semantics (SGLang 0.5.23's hybrid cache controller):

* An extra pool's pages belong to the KV pool's token pages and are stored under the same page
  keys (the backend names them ``{key}.{pool}``).
* ``all_pages`` pools (a DSA indexer, DeepSeek-V4's record pools, ...) hold one page per token
  page: written and read batch by batch beside the KV pages; a page of the prefix counts only
  when the KV page and every ``all_pages`` part of it read intact (the prefix is clamped to the
  shortest of them, as SGLang's ``_page_transfer_kv_batch`` does).
* ``trailing_pages`` pools (Mamba states, an SWA window) hold only the pages at the end of a
  cached prefix (``trailing_pages`` of them: 1 for a Mamba state): a prefix of ``m`` pages is
  restorable only where storage holds that pool's pages ``m - trailing_pages .. m - 1``
  (``PoolTransferResult.restorable_prefix_pages``), and those parts are read after the KV pages
  completed, keyed by the prefix that was really read (SGLang's ``_sync_trailing_keys``). A
  trailing part that fails to read makes the whole prefetch a miss: the KV pages without their
  state cannot be used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mem_cache_kernels.checks import check_index, check_int
from mem_cache_storage.pools import PoolHitPolicy, PoolTransfer

__all__ = ["ExtraPool"]

ALL = PoolHitPolicy.ALL_PAGES.value
TRAILING = PoolHitPolicy.TRAILING_PAGES.value
_POOL_NEEDS = ("page_size", "get_page_buffer_meta", "alloc", "free")
_STORAGE_V2_NEEDS = ("batch_exists_v2", "batch_get_v2", "batch_set_v2",
                     "register_mem_host_pool_v2")


def _text(value: object) -> str:
    return str(getattr(value, "value", value))


@dataclass(frozen=True, slots=True)
class ExtraPool:
    """A host pool whose pages travel with the KV pages (see the module).

    ``name``: the pool's v2 name (SGLang's ``PoolName`` values: ``"mamba"``, ``"swa"``,
    ``"indexer"``, ``"deepseek_v4_c4"``, ...; an enum member is taken by value);
    ``host_pool``: the host pool (``page_size``, ``get_page_buffer_meta``, ``alloc``, ``free``);
    ``hit_policy``: ``"all_pages"`` or ``"trailing_pages"``; ``trailing_pages``: pages a
    ``trailing_pages`` pool keeps per prefix (its window; 1 for a Mamba state)."""

    name: str
    host_pool: Any
    hit_policy: str = ALL
    trailing_pages: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__}")
        name = _text(self.name)
        if not name or name in ("kv", "__default__"):
            raise ValueError(f"name must name an extra pool (not 'kv'), got {name!r}")
        missing = [a for a in _POOL_NEEDS if not hasattr(self.host_pool, a)]
        if missing:
            raise TypeError(f"host_pool must have {', '.join(_POOL_NEEDS)}; "
                            f"{type(self.host_pool).__name__} lacks {', '.join(missing)}")
        policy = _text(self.hit_policy)
        if policy not in (ALL, TRAILING):
            raise ValueError(f"hit_policy must be {ALL!r} or {TRAILING!r}, got {policy!r}")
        check_int("trailing_pages", self.trailing_pages, minimum=1)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "hit_policy", policy)

    @property
    def page_size(self) -> int:
        """Slots of one page of this pool."""
        return int(self.host_pool.page_size)

    @property
    def trailing(self) -> bool:
        return self.hit_policy == TRAILING

    def page_bytes(self) -> int:
        """Bytes of one page of this pool (0 when the pool cannot say)."""
        per_token = getattr(self.host_pool, "get_size_per_token", None)
        return int(per_token()) * self.page_size if callable(per_token) else 0




def part_pages(pool: ExtraPool, prefix_pages: int) -> int:
    """Pages of ``pool`` a prefix of ``prefix_pages`` token pages has."""
    return min(pool.trailing_pages, prefix_pages) if pool.trailing else prefix_pages


def check_storage_v2(storage: Any) -> None:
    """``TypeError`` unless ``storage`` has SGLang's v2 calls."""
    missing = [a for a in _STORAGE_V2_NEEDS if not hasattr(storage, a)]
    if missing:
        raise TypeError(f"storage must have {', '.join(_STORAGE_V2_NEEDS)} for extra_pools; "
                        f"{type(storage).__name__} lacks {', '.join(missing)}")


def check_extra_indices(
    pools: Sequence[ExtraPool], extra_indices: object, num_pages: int
) -> dict[str, torch.Tensor]:
    """The public entry check of a write's ``extra_indices``: a mapping with exactly one index
    tensor per extra pool, ``part_pages(pool, num_pages) * pool.page_size`` slots each."""
    if not pools:
        if extra_indices:
            raise ValueError("extra_indices given, but the controller has no extra_pools")
        return {}
    if not isinstance(extra_indices, Mapping):
        raise TypeError(f"extra_indices must be a mapping of pool name to host indices, got "
                        f"{type(extra_indices).__name__}")
    given = {_text(k): v for k, v in extra_indices.items()}
    want = [p.name for p in pools]
    if sorted(given) != sorted(want):
        raise ValueError(f"extra_indices must name the pools {want}, got {sorted(given)}")
    out: dict[str, torch.Tensor] = {}
    for p in pools:
        idx = check_index(f"extra_indices[{p.name!r}]", given[p.name])
        need = part_pages(p, num_pages) * p.page_size
        if idx.numel() != need:
            raise ValueError(f"extra_indices[{p.name!r}] must hold {need} slots "
                             f"({part_pages(p, num_pages)} pages), got {idx.numel()}")
        out[p.name] = idx
    return out


def query(pools: Sequence[ExtraPool], keys: list[str]) -> list[PoolTransfer]:
    """The ``pool_transfers`` of a ``batch_exists_v2`` over ``keys``: ``all_pages`` pools first
    (the backend stops evaluating pools once nothing is restorable), a trailing pool with its
    window as its key count."""
    ordered = sorted(pools, key=lambda p: p.trailing)
    return [PoolTransfer(p.name, keys=keys[max(0, len(keys) - p.trailing_pages):] if p.trailing
                         else None, hit_policy=p.hit_policy) for p in ordered]


def restorable(result: Any, n: int) -> list[int]:
    """The prefix lengths (pages, ascending, in ``1..n``) every pool can restore, from a
    ``batch_exists_v2`` answer (``ValueError`` for a malformed one)."""
    pages = getattr(result, "restorable_prefix_pages", None)
    kv = check_int("kv_hit_pages", getattr(result, "kv_hit_pages", None), minimum=0)
    if pages is None:  # a backend without sparse boundaries: its contiguous prefix
        pages = range(1, kv + 1)
    return sorted({int(m) for m in pages if 0 < int(m) <= n})


def contiguous_present(result: Any, pools: Sequence[ExtraPool]) -> int:
    """From a ``batch_exists_v2`` answer to :func:`query`: the leading pages whose KV part and
    every ``all_pages`` part are stored."""
    hits = dict(getattr(result, "extra_pool_hit_pages", {}) or {})
    kv = int(hits.get("kv", getattr(result, "kv_hit_pages", 0)))
    return min([kv, *(int(hits.get(p.name, 0)) for p in pools if not p.trailing)])


def transfers(pools: Sequence[ExtraPool], keys: list[str],
              indices: Mapping[str, torch.Tensor]) -> list[PoolTransfer]:
    """One ``PoolTransfer`` per pool over ``keys`` (``indices[name]``: exactly their slots)."""
    return [PoolTransfer(p.name, indices[p.name], keys=keys, hit_policy=p.hit_policy)
            for p in pools]


def leading(n: int, result: object, name: str) -> int:
    """The leading run of ``True`` of pool ``name`` in a ``batch_get_v2`` / ``batch_set_v2``
    answer (``ValueError`` when that pool's answer is not ``n`` results)."""
    if not isinstance(result, Mapping):
        raise ValueError(f"returned {type(result).__name__}, not a dict of pool results")
    got = result.get(name)
    if not isinstance(got, (list, tuple)) or len(got) != n:
        raise ValueError(f"returned {got!r} for pool {name!r} ({n} pages)")
    ok = [g is True for g in got]
    return ok.index(False) if False in ok else n
