"""The controller's backend calls besides the zero-copy v1 path (a base of
:class:`~mem_cache_storage.controller.StorageController`): SGLang's generic copying path for a
backend without v1 (SGLang's own ``HiCacheFile`` leaves ``batch_get_v1`` / ``batch_set_v1`` as its
base class's stubs: flat pages through the host pool and ``batch_get`` / ``batch_set``), and the
v2 calls that move extra pools' pages (``batch_exists_v2``, ``batch_get_v2`` / ``batch_set_v2``).
Every call goes through :func:`mem_cache_storage.backend.guarded`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch

from mem_cache_storage import _multi_pool as mp
from mem_cache_storage._multi_pool import ExtraPool
from mem_cache_storage.backend import guarded

__all__ = ["ExtraCalls"]


def _v1_is_stub(storage: Any) -> bool:
    """Whether ``storage``'s ``batch_get_v1`` / ``batch_set_v1`` are SGLang's base stubs
    (they return ``None``): the class defining them is SGLang's ``HiCacheStorage``."""
    for name in ("batch_get_v1", "batch_set_v1"):
        owner = next((c for c in type(storage).__mro__ if name in c.__dict__), None)
        if owner is None or (owner.__name__ == "HiCacheStorage"
                             and owner.__module__.startswith("sglang.")):
            return True
    return False


def _same(result: Any) -> list[bool]:
    out: list[bool] = result
    return out


class ExtraCalls:
    """The generic and v2 backend calls (see the module docstring); the controller's state they
    use is declared here for mypy."""

    storage: Any
    host_pool: Any
    page_size: int
    extra_pools: tuple[ExtraPool, ...]
    _trusted_io_v2: Callable[..., Any] | None
    _count_error: Callable[[], object]

    def _call_generic(self, write: bool, keys: list[str], slots: torch.Tensor) -> list[bool]:
        """The copying path (SGLang's ``_generic_page_get`` / ``_generic_page_set``): flat pages
        through the host pool and the backend's ``batch_get`` / ``batch_set``. ``batch_set``
        answers one bool for the batch; ``batch_get`` a tensor or ``None`` per key, and the
        leading run of tensors is copied into the host pages."""
        return guarded(partial(self._generic_io, write, keys, slots), _same, [False] * len(keys),
                       owner="storage", what="batch_set" if write else "batch_get",
                       count_error=self._count_error)

    def _generic_io(self, write: bool, keys: list[str], slots: torch.Tensor) -> list[bool]:
        pool, ps, n = self.host_pool, self.page_size, len(keys)
        firsts = [int(i) for i in slots[::ps].tolist()]
        if write:
            data = [pool.get_data_page(i, flat=True) for i in firsts]
            return [self.storage.batch_set(keys, data) is True] * n
        dummies = [pool.get_dummy_flat_data_page() for _ in firsts]
        got = self.storage.batch_get(keys, dummies)
        if not isinstance(got, list) or len(got) != n:
            raise ValueError(f"batch_get returned {type(got).__name__} for {n} pages")
        out = [False] * n
        for j, (first, page) in enumerate(zip(firsts, got)):
            if not isinstance(page, torch.Tensor):
                break
            pool.set_from_flat_data_page(first, page)
            out[j] = True
        return out

    def _exists_v2(self, keys: list[str]) -> Any:
        """``batch_exists_v2`` over ``keys`` with every extra pool (``None`` when it failed)."""
        def check(result: Any) -> Any:
            mp.restorable(result, len(keys))
            return result
        return guarded(partial(self.storage.batch_exists_v2, keys,
                               mp.query(self.extra_pools, keys)), check, None,
                       owner="storage", what="batch_exists_v2", count_error=self._count_error)

    def _io_v2(self, write: bool, pools: Sequence[ExtraPool], keys: list[str],
               indices: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """One ``batch_set_v2`` / ``batch_get_v2`` of ``pools``' pages of ``keys`` (their slots
        ``indices``): per pool, the leading pages that succeeded (0 for every pool when the
        call failed)."""
        if not pools or not keys:
            return {p.name: len(keys) for p in pools}
        n = len(keys)

        def answer(result: object) -> dict[str, int]:
            return {p.name: mp.leading(n, result, p.name) for p in pools}

        moves = mp.transfers(pools, keys, indices)
        if self._trusted_io_v2 is not None:  # ours: the controller checked the transfers
            call = partial(self._trusted_io_v2, write, moves)
        else:
            call = partial(self.storage.batch_set_v2 if write else self.storage.batch_get_v2,
                           moves)
        return guarded(call, answer,
                       {p.name: 0 for p in pools}, owner="storage",
                       what="batch_set_v2" if write else "batch_get_v2",
                       count_error=self._count_error)
