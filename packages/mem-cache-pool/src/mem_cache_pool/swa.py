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
from typing import Any

import torch

from mem_cache_kernels import checks
from mem_cache_kernels.dispatch import pick
from mem_cache_pool._checks import check_copy_roles, check_mapping, check_slots
from mem_cache_pool.base import (
    CpuKVCopy,
    KVBufferDesc,
    KVCache,
    KVWriteLoc,
)
from mem_cache_pool.dsa import DSATokenToKVPool
from mem_cache_pool.mha import MHATokenToKVPool
from mem_cache_pool.mla import MLATokenToKVPool

__all__ = ["BaseSWAKVPool", "SWAKVPool"]


def _layer_ids(name: str, ids: object) -> list[int]:
    """``ids`` as a list of int layer ids (``TypeError`` for a non-sequence or a non-int id)."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"{name} must be a sequence of int layer ids, got {type(ids).__name__}")
    return [checks.check_int(f"{name}[{i}]", v) for i, v in enumerate(ids)]


class BaseSWAKVPool(KVCache):
    """A pool whose window layers live in ``swa_kv_pool`` with their own slot space.

    ``register_mapping(full_to_swa_index_mapping)`` installs the allocator's full -> swa slot
    mapping (int64 ``[size + page_size + 1]`` on the pool's device, ``mapping[-1] == -1``;
    ``TypeError`` / ``ValueError`` otherwise). ``translate_loc_from_full_to_swa(kv_indices)``
    returns ``mapping[kv_indices]`` (int64, same shape; 0 where unmapped). Using the mapping
    before registering it is a ``RuntimeError``. ``get_state_buf_infos()`` describes the window
    state PD transfer sends with the KV.
    """

    full_kv_pool: KVCache
    swa_kv_pool: KVCache
    swa_req_ring_size: int | None = None
    """SGLang: set when window KV is a per-request ring (not paged); ours are paged: None."""
    request_window: None = None
    """SGLang: per-request window rows (DeepSeek-V4.1 encoder replay): not provided, None."""
    swa_uses_full_indices: bool = False
    """SGLang: draft window buffers indexed by full-token ids. Ours use the mapping: False."""

    @abc.abstractmethod
    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        """Install the allocator's full -> window slot mapping (int64 ``[full slots + 1]``, on the
        pool's device; kept by reference, so later allocator writes are seen). Mutates the pool."""

    @abc.abstractmethod
    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """Window slots (int64, same shape) of full slots ``kv_indices`` through the registered
        mapping; ``RuntimeError`` if no mapping is registered."""

    @abc.abstractmethod
    def get_state_buf_infos(self) -> object:
        """SGLang 0.5.23's PD-transfer state buffers: the window sub-pool's
        ``(data_ptrs, data_lens, item_lens)``."""


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
        token_to_kv_pool_class: type[KVCache] = MHATokenToKVPool,
        full_kv_pool_class: type[KVCache] | None = None,
        swa_kv_pool_class: type[KVCache] | None = None,
        full_kv_pool_kwargs: dict[str, Any] | None = None,
        swa_kv_pool_kwargs: dict[str, Any] | None = None,
        enable_memory_saver: bool = False,
        **kwargs: Any,
    ) -> None:
        debug = bool(kwargs.pop("debug", False))
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
        classes = {}
        for name, cls in (
            ("token_to_kv_pool_class", token_to_kv_pool_class),
            ("full_kv_pool_class", full_kv_pool_class),
            ("swa_kv_pool_class", swa_kv_pool_class),
        ):
            if cls is not None and not (isinstance(cls, type) and issubclass(cls, KVCache)):
                raise TypeError(f"{name} must be a KVCache subclass, got {cls!r}")
            classes[name] = cls
        for name, kw in (
            ("full_kv_pool_kwargs", full_kv_pool_kwargs),
            ("swa_kv_pool_kwargs", swa_kv_pool_kwargs),
        ):
            if kw is not None and not isinstance(kw, dict):
                raise TypeError(f"{name} must be a dict or None, got {type(kw).__name__}")
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
        self.head_num, self.head_dim = head_num, head_dim
        self.swa_layer_nums, self.full_layer_nums = len(swa_ids), len(full_ids)
        self.swa_attention_layer_ids, self.full_attention_layer_ids = swa_ids, full_ids
        self.layers_mapping: dict[int, tuple[int, bool]] = {}
        for local, gid in enumerate(full_ids):
            self.layers_mapping[gid] = (local, False)
        for local, gid in enumerate(swa_ids):
            self.layers_mapping[gid] = (local, True)
        common: dict[str, Any] = {
            "page_size": page_size,
            "enable_memory_saver": enable_memory_saver,
            "device": device,
            "debug": debug,
        }
        if full_kv_pool_kwargs is None:
            full_kv_pool_kwargs = {
                **common, "head_num": head_num, "head_dim": head_dim,
                "allocation_label": "Full", **kwargs,
            }  # fmt: skip
            for key in ("swa_head_num", "swa_head_dim", "swa_v_head_dim"):
                full_kv_pool_kwargs.pop(key, None)
        if swa_kv_pool_kwargs is None:
            swa_kv_pool_kwargs = {
                **common, "head_num": head_num, "head_dim": head_dim,
                "allocation_label": "SWA", **kwargs,
            }  # fmt: skip
        full_cls = classes["full_kv_pool_class"] or token_to_kv_pool_class
        swa_cls = classes["swa_kv_pool_class"] or token_to_kv_pool_class
        # a sub-pool needs >= 1 layer; an empty side gets no pool at all
        self._full: KVCache | None = (
            full_cls(size=size, dtype=dtype, layer_num=len(full_ids), **full_kv_pool_kwargs)
            if full_ids
            else None
        )
        self._swa: KVCache | None = (
            swa_cls(size=size_swa, dtype=dtype, layer_num=len(swa_ids), **swa_kv_pool_kwargs)
            if swa_ids
            else None
        )
        for pool, ids in ((self._full, full_ids), (self._swa, swa_ids)):
            if isinstance(pool, MHATokenToKVPool):
                pool.model_layer_ids = tuple(ids)
        self.dsa_kv_cache_store_fp8 = False
        self.kv_cache_dim: int | None = None
        self.index_head_dim: int | None = None
        if isinstance(self._full, MLATokenToKVPool):
            self.dsa_kv_cache_store_fp8 = self._full.dsa_kv_cache_store_fp8
            self.kv_cache_dim = self._full.kv_cache_dim
        if isinstance(self._full, DSATokenToKVPool):
            self.index_head_dim = self._full.index_head_dim
        self.full_to_swa_index_mapping: torch.Tensor | None = None
        self._finalize_allocation()

    # ---------------------------------------------------------------- sub-pools and routing
    @property
    def full_kv_pool(self) -> KVCache:  # type: ignore[override]
        """The full-attention sub-pool (``RuntimeError`` if the model has no full layers)."""
        if self._full is None:
            raise RuntimeError("this SWAKVPool has no full-attention layers")
        return self._full

    @property
    def swa_kv_pool(self) -> KVCache:  # type: ignore[override]
        """The sliding-window sub-pool (``RuntimeError`` if the model has no window layers)."""
        if self._swa is None:
            raise RuntimeError("this SWAKVPool has no sliding-window layers")
        return self._swa

    def _quant_sub_pools(self) -> list[object]:
        return [p for _, p in self._sub_pools()]

    def _route(self, layer_id: object, name: str = "layer_id") -> tuple[KVCache, int, bool]:
        local, is_swa = self.layers_mapping[self._layer(layer_id, name)]
        return (self.swa_kv_pool if is_swa else self.full_kv_pool), local, is_swa

    def _sub_pools(self) -> list[tuple[str, KVCache]]:
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
        """``(k_bytes, v_bytes)`` summed over both sub-pools (an MLA sub-pool's one int counts
        as K bytes, as in SGLang)."""
        k = v = 0
        for _, pool in self._sub_pools():
            size = pool.get_kv_size_bytes()
            k += size[0] if isinstance(size, tuple) else size
            v += size[1] if isinstance(size, tuple) else 0
        return k, v

    def is_mla(self) -> bool:
        """Whether both sub-pools are MLA pools (a missing side counts as MLA)."""
        return all(isinstance(p, MLATokenToKVPool) for _, p in self._sub_pools())

    def get_v_head_dim(self) -> int:
        """Width of the value rows of the full sub-pool (the window one without full layers)."""
        lead = self._full if self._full is not None else self.swa_kv_pool
        return int(lead._get_value_buffer(lead.start_layer).shape[-1])

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """The full sub-pool's PD transfer buffers (SGLang: window ones are the "state")."""
        return self.full_kv_pool.get_contiguous_buf_infos()  # type: ignore[attr-defined, no-any-return]

    def get_state_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """The window sub-pool's PD transfer buffers (``get_contiguous_buf_infos`` of it)."""
        return self.swa_kv_pool.get_contiguous_buf_infos()  # type: ignore[attr-defined, no-any-return]

    def get_kv_scale_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """Scale buffers of a quantized (MXFP8) full sub-pool: SGLang's unquantized pools have
        none to send, and ours are unquantized: ``([], [], [])``."""
        return [], [], []

    def get_swa_kv_scale_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """As :meth:`get_kv_scale_buf_infos` for the window sub-pool: ``([], [], [])``."""
        return [], [], []

    def get_kv_scale_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-layer K/V scales of an MXFP8 sub-pool. Quantized sub-pools are not provided:
        ``NotImplementedError`` (SGLang's call fails too: plain MHA pools have no such method)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support get_kv_scale_buffer (MXFP8 KV cache)"
        )

    # ---------------------------------------------------------------- post-capture (off)
    @property
    def post_capture_backed_bytes(self) -> int:
        """0: no post-capture backing."""
        return 0

    def finalize_backing(self, config: object) -> None:
        """SGLang: back both sub-pools after capture. Post-capture backing is not provided:
        ``NotImplementedError``."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support finalize_backing (post-capture backing)"
        )

    # ---------------------------------------------------------------- mapping
    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        """Install the full -> swa slot mapping (see :class:`BaseSWAKVPool`)."""
        self.full_to_swa_index_mapping = check_mapping(
            "full_to_swa_index_mapping",
            full_to_swa_index_mapping,
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

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """``mapping[kv_indices]``: window slots (int64) of full slots (0 where unmapped)."""
        mapping = self._mapping()
        check_slots("kv_indices", kv_indices, self.device, self.num_rows, full=self.debug)
        out = mapping[kv_indices]
        if self.debug and self._swa is not None:
            checks.check_index_values(
                "translated kv_indices", out, limit=self._swa.num_rows, full=True
            )
        return out

    # ---------------------------------------------------------------- writes and moves
    def _write_target(
        self, layer: object, loc_info: object, name: str = "layer"
    ) -> tuple[KVCache, int, torch.Tensor]:
        """Routed sub-pool, its local layer and the slots to write: ``loc`` (or its
        ``full_loc`` when set) for full layers, ``loc_info.swa_loc`` for window layers."""
        pool, local, is_swa = self._route(layer, name)
        if not isinstance(loc_info, (torch.Tensor, KVWriteLoc)):
            raise TypeError(
                f"loc_info must be a torch.Tensor or a KVWriteLoc, got {type(loc_info).__name__}"
            )
        if is_swa:
            swa_loc = loc_info.swa_loc if isinstance(loc_info, KVWriteLoc) else None
            if swa_loc is None:
                raise ValueError(
                    f"loc_info must be a KVWriteLoc with swa_loc set for sliding-window layer "
                    f"{self.layer_index(layer) + self.start_layer}, got {type(loc_info).__name__}"
                    + (" with swa_loc=None" if isinstance(loc_info, KVWriteLoc) else "")
                )
            return pool, local, swa_loc
        # the slots are checked once, by the sub-pool's write (which names them loc_info)
        if isinstance(loc_info, KVWriteLoc):
            return pool, local, loc_info.loc if loc_info.full_loc is None else loc_info.full_loc
        return pool, local, loc_info

    def set_kv_buffer(  # noqa: PLR0917 (SGLang-compatible positional signature)
        self,
        layer: object,
        loc_info: torch.Tensor | KVWriteLoc,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
        layer_id_override: int | None = None,
    ) -> None:
        """Write at ``loc`` (full layers; ``loc.full_loc`` when set) or ``loc.swa_loc``
        (window layers; must not be None). ``layer``: a layer object with an int ``layer_id``
        or an int (``layer_id_override`` replaces it).

        Shapes and dtypes as the routed sub-pool's ``set_kv_buffer`` (an MLA sub-pool takes no
        scales, as in SGLang).
        """
        if layer_id_override is None:
            pool, local, slots = self._write_target(layer, loc_info, "layer")
        else:
            pool, local, slots = self._write_target(
                layer_id_override, loc_info, "layer_id_override"
            )
        if isinstance(pool, MLATokenToKVPool):
            pool.set_kv_buffer(local, slots, cache_k, cache_v)
        else:
            pool.set_kv_buffer(local, slots, cache_k, cache_v, k_scale, v_scale)  # type: ignore[call-arg]

    def set_mla_kv_buffer(
        self,
        layer: object,
        loc_info: torch.Tensor | KVWriteLoc,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
    ) -> None:
        """Route to the layer's MLA sub-pool's ``set_mla_kv_buffer`` (slots as
        :meth:`set_kv_buffer`); ``TypeError`` when that sub-pool is not an MLA pool."""
        pool, local, slots = self._write_target(layer, loc_info)
        if not isinstance(pool, MLATokenToKVPool):
            raise TypeError(
                f"layer {self.start_layer + self.layer_index(layer)} is not backed by an MLA "
                f"KV pool (its sub-pool is a {type(pool).__name__})"
            )
        pool.set_mla_kv_buffer(local, slots, cache_k_nope, cache_k_rope)

    def _index_pool(self, layer_id: object) -> tuple[DSATokenToKVPool, int]:
        pool, local, is_swa = self._route(layer_id)
        if is_swa or not isinstance(pool, DSATokenToKVPool):
            raise ValueError(
                f"layer_id must be a full-attention layer of a DSA full sub-pool, got "
                f"{self.start_layer + self.layer_index(layer_id)}"
            )
        return pool, local

    def get_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:
        """The DSA full sub-pool's index buffer of full layer ``layer_id`` (``ValueError`` for a
        window layer or a non-DSA full sub-pool)."""
        pool, local = self._index_pool(layer_id)
        return pool.get_index_k_with_scale_buffer(local)

    def get_index_k_scale_buffer(
        self, layer_id: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The DSA full sub-pool's :meth:`DSATokenToKVPool.get_index_k_scale_buffer`."""
        pool, local = self._index_pool(layer_id)
        return pool.get_index_k_scale_buffer(local, *args, **kwargs)

    def set_index_k_scale_buffer(self, layer_id: int, *args: Any, **kwargs: Any) -> None:
        """The DSA full sub-pool's :meth:`DSATokenToKVPool.set_index_k_scale_buffer`."""
        pool, local = self._index_pool(layer_id)
        pool.set_index_k_scale_buffer(local, *args, **kwargs)

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
            self._full._move_rows(tgt, src)  # checked above: the trusted body
        if self._swa is not None and tgt.numel():
            bufs = self._swa._all_buffers()
            pick("copy_all_layer_kv_cache", "auto", bufs[0], swa_tgt, swa_src)(
                bufs, swa_tgt, swa_src
            )

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
            src = [sub[r] for r, _ in roles]
            dst = [bufs for _, bufs in roles]
            dst_rows = swa_idx if name == "swa" else idx
            pick("transfer_rows_all_layers", "auto", src[0][0], dst[0][0], dst_rows)(
                src, dst, rows, dst_rows
            )
