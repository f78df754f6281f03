"""Sliding-window pools: ``BaseSWAKVPool`` and ``SWAKVPool`` (mirrors SGLang's SWA pools).

A hybrid model has full-attention layers and sliding-window (SWA) layers. ``SWAKVPool`` holds two
sub-pools: ``full_kv_pool`` (``size`` slots, the full layers) and ``swa_kv_pool`` (``size_swa``
slots, the window layers). The allocator owns a full -> swa slot mapping (int64, length
``size + page_size + 1``, 0 = unmapped, last element -1) and registers it with
``register_mapping``; the pool only reads it.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence

import torch

import mem_cache_kernels as kernels
from mem_cache_kernels import checks
from mem_cache_pool._checks import check_copy_roles, check_mapping, check_slots
from mem_cache_pool.base import CpuKVCopy, KVBufferDesc, KVCache, KVWriteLoc, unwrap_write_loc
from mem_cache_pool.mha import MHATokenToKVPool

__all__ = ["BaseSWAKVPool", "SWAKVPool"]


def _layer_ids(name: str, ids: object) -> list[int]:
    """``ids`` as a list of int layer ids (``TypeError`` for a non-sequence or a non-int id)."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"{name} must be a sequence of int layer ids, got {type(ids).__name__}")
    return [checks.check_int(f"{name}[{i}]", v) for i, v in enumerate(ids)]


class BaseSWAKVPool(KVCache):
    """A pool whose window layers live in ``swa_kv_pool`` with their own slot space.

    ``register_mapping(mapping)`` installs the allocator's full -> swa slot mapping (int64
    ``[size + page_size + 1]`` on the pool's device, ``mapping[-1] == -1``; ``TypeError`` /
    ``ValueError`` otherwise). ``translate_loc_from_full_to_swa(idx)`` returns ``mapping[idx]``
    (int64, same shape; 0 where unmapped). Using the mapping before registering it is a
    ``RuntimeError``.
    """

    full_kv_pool: KVCache
    swa_kv_pool: KVCache

    @abc.abstractmethod
    def register_mapping(self, mapping: torch.Tensor) -> None: ...

    @abc.abstractmethod
    def translate_loc_from_full_to_swa(self, idx: torch.Tensor) -> torch.Tensor: ...


class SWAKVPool(BaseSWAKVPool):
    """Full + sliding-window MHA pools routed by global layer id.

    Args:
        size, size_swa: slots of the full and the window sub-pool.
        page_size, dtype, device, enable_memory_saver, debug: as for :class:`KVCache`.
        head_num, head_dim, v_head_dim: full-layer geometry; ``swa_head_num``, ``swa_head_dim``,
            ``swa_v_head_dim`` override it for the window layers.
        swa_attention_layer_ids, full_attention_layer_ids: disjoint global layer ids whose union
            is a contiguous range ``[start_layer, end_layer)``.
        token_to_kv_pool_class: the sub-pool class (``MHATokenToKVPool`` or a subclass).

    Routing: layer ``l`` maps to ``layers_mapping[l] = (sub-pool layer, is_swa)``. Reads wait on
    the wrapper's readiness waiter (index ``l - start_layer``); the sub-pools have none.
    ``set_kv_buffer`` writes full layers at ``loc`` and window layers at ``KVWriteLoc.swa_loc``.
    ``move_kv_cache`` moves both sub-pools (window slots translated through the mapping).
    ``get_buffer_desc()`` describes the full sub-pool (``swa_kv_pool.get_buffer_desc()`` the
    window one); ``get_kv_size_bytes()`` is ``(k_bytes, v_bytes)`` over both sub-pools.
    """

    def __init__(  # noqa: PLR0917 (SGLang-compatible positional signature)
        self,
        size: int,
        size_swa: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        swa_attention_layer_ids: Sequence[int],
        full_attention_layer_ids: Sequence[int],
        device: str | torch.device,
        enable_memory_saver: bool = False,
        v_head_dim: int | None = None,
        swa_head_num: int | None = None,
        swa_head_dim: int | None = None,
        swa_v_head_dim: int | None = None,
        token_to_kv_pool_class: type[MHATokenToKVPool] = MHATokenToKVPool,
        *,
        debug: bool = False,
    ) -> None:
        swa_ids = _layer_ids("swa_attention_layer_ids", swa_attention_layer_ids)
        full_ids = _layer_ids("full_attention_layer_ids", full_attention_layer_ids)
        all_ids = sorted(swa_ids + full_ids)
        if not all_ids:
            raise ValueError(
                "swa_attention_layer_ids and full_attention_layer_ids must hold at least one "
                f"layer id in total, got {swa_ids} and {full_ids}"
            )
        if all_ids != list(range(all_ids[0], all_ids[0] + len(all_ids))):
            raise ValueError(
                "swa_attention_layer_ids and full_attention_layer_ids must be disjoint and cover "
                f"a contiguous layer range, got {swa_ids} and {full_ids}"
            )
        super().__init__(
            size,
            page_size,
            dtype,
            len(all_ids),
            device,
            enable_memory_saver,
            all_ids[0],
            all_ids[-1] + 1,
            debug=debug,
        )
        self.size_swa = checks.check_int("size_swa", size_swa, minimum=0)
        self.swa_layer_nums, self.full_layer_nums = len(swa_ids), len(full_ids)
        self.swa_attention_layer_ids, self.full_attention_layer_ids = swa_ids, full_ids
        self.layers_mapping: dict[int, tuple[int, bool]] = {}
        for local, gid in enumerate(full_ids):
            self.layers_mapping[gid] = (local, False)
        for local, gid in enumerate(swa_ids):
            self.layers_mapping[gid] = (local, True)
        common = dict(enable_memory_saver=enable_memory_saver, debug=debug)
        # a sub-pool needs >= 1 layer; an empty side gets no pool at all
        self._full = (
            token_to_kv_pool_class(
                size,
                page_size,
                dtype,
                head_num,
                head_dim,
                len(full_ids),
                device,
                v_head_dim=v_head_dim,
                **common,
            )
            if full_ids
            else None
        )
        self._swa = (
            token_to_kv_pool_class(
                size_swa,
                page_size,
                dtype,
                head_num if swa_head_num is None else swa_head_num,
                head_dim if swa_head_dim is None else swa_head_dim,
                len(swa_ids),
                device,
                v_head_dim=swa_v_head_dim if swa_v_head_dim is not None else v_head_dim,
                **common,
            )
            if swa_ids
            else None
        )
        self.full_to_swa_index_mapping: torch.Tensor | None = None
        self._finalize_allocation()

    # ---------------------------------------------------------------- sub-pools and routing
    @property
    def full_kv_pool(self) -> MHATokenToKVPool:  # type: ignore[override]
        """The full-attention sub-pool (``RuntimeError`` if the model has no full layers)."""
        if self._full is None:
            raise RuntimeError("this SWAKVPool has no full-attention layers")
        return self._full

    @property
    def swa_kv_pool(self) -> MHATokenToKVPool:  # type: ignore[override]
        """The sliding-window sub-pool (``RuntimeError`` if the model has no window layers)."""
        if self._swa is None:
            raise RuntimeError("this SWAKVPool has no sliding-window layers")
        return self._swa

    def _route(self, layer_id: int) -> tuple[MHATokenToKVPool, int, bool]:
        self.layer_index(layer_id)
        local, is_swa = self.layers_mapping[layer_id]
        return (self.swa_kv_pool if is_swa else self.full_kv_pool), local, is_swa

    def _sub_pools(self) -> list[tuple[str, MHATokenToKVPool]]:
        return [(n, p) for n, p in (("full", self._full), ("swa", self._swa)) if p is not None]

    def _role_buffers(self) -> tuple[tuple[str, Sequence[torch.Tensor]], ...]:
        return tuple(
            (f"{name}.{role}", bufs)
            for name, pool in self._sub_pools()
            for role, bufs in pool._role_buffers()
        )

    def _get_key_buffer(self, layer_id: int) -> torch.Tensor:
        pool, local, _ = self._route(layer_id)
        return pool._get_key_buffer(local)

    def _get_value_buffer(self, layer_id: int) -> torch.Tensor:
        pool, local, _ = self._route(layer_id)
        return pool._get_value_buffer(local)

    def get_buffer_desc(self) -> KVBufferDesc:
        """The full sub-pool's descriptor (window layers: ``swa_kv_pool.get_buffer_desc()``)."""
        return self.full_kv_pool.get_buffer_desc()

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """``(k_bytes, v_bytes)`` summed over both sub-pools."""
        sizes = [pool.get_kv_size_bytes() for _, pool in self._sub_pools()]
        return sum(k for k, _ in sizes), sum(v for _, v in sizes)

    # ---------------------------------------------------------------- mapping
    def register_mapping(self, mapping: torch.Tensor) -> None:
        """Install the full -> swa slot mapping (see :class:`BaseSWAKVPool`)."""
        self.full_to_swa_index_mapping = check_mapping(
            "mapping",
            mapping,
            self.device,
            self.num_rows + 1,
            full=self.debug,
            targets=None if self._swa is None else self._swa.num_rows,
        )

    def _mapping(self) -> torch.Tensor:
        if self.full_to_swa_index_mapping is None:
            raise RuntimeError(
                "no full -> swa mapping registered: call register_mapping(mapping) before "
                "writing, moving or translating sliding-window slots"
            )
        return self.full_to_swa_index_mapping

    def translate_loc_from_full_to_swa(self, idx: torch.Tensor) -> torch.Tensor:
        """``mapping[idx]``: window slots (int64) of full slots ``idx`` (0 where unmapped)."""
        mapping = self._mapping()
        check_slots("idx", idx, self.device, self.num_rows, full=self.debug)
        out = mapping[idx]
        if self.debug and self._swa is not None:
            checks.check_index_values("translated idx", out, limit=self._swa.num_rows, full=True)
        return out

    # ---------------------------------------------------------------- writes and moves
    def set_kv_buffer(  # noqa: PLR0917 (SGLang-compatible positional signature)
        self,
        layer_id: int,
        loc: torch.Tensor | KVWriteLoc,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
        layer_id_override: int | None = None,
    ) -> None:
        """Write at ``loc`` (full layers) or ``loc.swa_loc`` (window layers; must not be None).

        Shapes and dtypes as :meth:`MHATokenToKVPool.set_kv_buffer` for the routed sub-pool.
        """
        layer = layer_id if layer_id_override is None else layer_id_override
        pool, local, is_swa = self._route(layer)
        if is_swa:
            if not isinstance(loc, (torch.Tensor, KVWriteLoc)):
                raise TypeError(
                    f"loc must be a torch.Tensor or a KVWriteLoc, got {type(loc).__name__}"
                )
            swa_loc = loc.swa_loc if isinstance(loc, KVWriteLoc) else None
            if swa_loc is None:
                raise ValueError(
                    f"loc must be a KVWriteLoc with swa_loc set for sliding-window layer {layer},"
                    f" got {type(loc).__name__}"
                    + (" with swa_loc=None" if isinstance(loc, KVWriteLoc) else "")
                )
            slots = swa_loc
        else:
            slots = unwrap_write_loc(loc)
        pool.set_kv_buffer(local, slots, cache_k, cache_v, k_scale, v_scale)

    def _swa_slots(self, full_slots: torch.Tensor) -> torch.Tensor:
        """Window slots of validated full slots; -1 (a row every kernel skips) where unmapped."""
        out = self._mapping()[full_slots]
        out = torch.where(out > 0, out, torch.full_like(out, -1))
        if self.debug and self._swa is not None:
            checks.check_index_values(
                "translated slots", out.clamp(min=0), limit=self._swa.num_rows, full=True
            )
        return out

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Move full rows ``src_loc -> tgt_loc`` and the window rows of the same tokens.

        Window slots are translated through the mapping first (required when the pool has
        window layers); a pair where either token has no window slot is skipped there.
        """
        tgt = self._check_loc("tgt_loc", tgt_loc)
        checks.check_distinct("tgt_loc", tgt, full=self.debug)
        src = self._check_loc("src_loc", src_loc, length=tgt.numel())
        if self._swa is not None:
            swa_tgt, swa_src = self._swa_slots(tgt), self._swa_slots(src)
            skip = (swa_tgt < 0) | (swa_src < 0)
            swa_tgt = torch.where(skip, torch.full_like(swa_tgt, -1), swa_tgt)
            swa_src = torch.where(skip, torch.full_like(swa_src, -1), swa_src)
        if self._full is not None:
            self._full.move_kv_cache(tgt, src)
        if self._swa is not None and tgt.numel():
            kernels.copy_all_layer_kv_cache(self._swa._all_buffers(), swa_tgt, swa_src)

    # ---------------------------------------------------------------- retraction
    def get_cpu_copy(
        self,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> CpuKVCopy:
        """CPU copy of full rows ``indices`` and of their window rows.

        Keys are ``"full.k"``, ``"full.v"``, ``"swa.k"``, ``"swa.v"`` (present sub-pools only);
        window rows of tokens without a window slot are copies of the padding row 0.
        """
        idx = self._check_loc("indices", indices)
        out: CpuKVCopy = {}
        for name, pool in self._sub_pools():
            sub_idx = self._swa_slots(idx).clamp(min=0) if name == "swa" else idx
            for role, tensors in pool.get_cpu_copy(sub_idx).items():
                out[f"{name}.{role}"] = tensors
        return out

    def load_cpu_copy(
        self,
        kv_cache_cpu: CpuKVCopy,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> None:
        """Write a :meth:`get_cpu_copy` result back at full slots ``indices``; window rows go to
        the translated slots (tokens without a window slot are skipped there).

        Everything is validated before either sub-pool is written.
        """
        idx = self._check_loc("indices", indices)
        check_copy_roles(kv_cache_cpu, [r for r, _ in self._role_buffers()])
        parts = []
        for name, pool in self._sub_pools():
            prefix = f"{name}."
            sub = {k[len(prefix) :]: v for k, v in kv_cache_cpu.items() if k.startswith(prefix)}
            pool._check_cpu_copy(sub, idx)
            parts.append((name, pool, sub))
        swa_idx = self._swa_slots(idx) if self._swa is not None else idx
        if not idx.numel():
            return
        rows = torch.arange(idx.numel())
        for name, pool, sub in parts:
            roles = pool._role_buffers()
            kernels.transfer_rows_all_layers(
                [sub[r] for r, _ in roles],
                [bufs for _, bufs in roles],
                rows,
                swa_idx if name == "swa" else idx,
            )
