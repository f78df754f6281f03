"""DeepSeek-V4 device pools (mirrors SGLang's ``deepseek_v4_memory_pool``).

* :class:`DeepSeekV4SingleKVPool`: page-major uint8 rows of 584-byte compressed records (split
  layout ``[values][scales][pad]``, see :mod:`mem_cache_kernels.deepseek_v4`).
* :class:`HiSparseC4DevicePool`: the device c4 pool of HiSparse (logical -> device mapping;
  :func:`translate_full_to_compressed`: full slot ``f`` has compressed slot ``f // 4`` iff
  ``(f + 1) % 4 == 0``).
* :class:`DeepSeekV4IndexerPool`: page-major indexer keys + fp32 scales.
* :class:`CompressStatePool`: per-request ring buffers of compressor state.
* :class:`DeepSeekV4TokenToKVPool`: the composite, routing each layer to the sliding-window pool
  and, by its compress ratio (0, 4 or 128), to the c4 / c128 / indexer / state sub-pools.

Page-row pools describe themselves in page-row units (``get_buffer_desc()``: one row per page,
``page_size = 1``), so a host mirror moves whole page rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from mem_cache_kernels import checks
from mem_cache_kernels.checks import check_dtype
from mem_cache_pool._checks import check_mapping, check_slots
from mem_cache_pool._deepseek_v4_indexer import DeepSeekV4IndexerPool, check_index_head_dim
from mem_cache_pool._deepseek_v4_layers import CompressedPoolConfig, CompressStateLayer
from mem_cache_pool._deepseek_v4_requests import DeepSeekV4RequestStateSurface
from mem_cache_pool._deepseek_v4_sglang import parse_kv_layouts
from mem_cache_pool._deepseek_v4_single import (
    DeepSeekV4SingleKVPool,
    HiSparseC4DevicePool,
    compressed_last_loc,
    translate_full_to_compressed,
)
from mem_cache_pool._deepseek_v4_state import CompressStatePool
from mem_cache_pool.base import CpuKVCopy, KVBufferDesc, KVCache, KVWriteLoc

__all__ = [
    "CompressStateLayer",
    "CompressStatePool",
    "CompressedPoolConfig",
    "DeepSeekV4IndexerPool",
    "DeepSeekV4SingleKVPool",
    "DeepSeekV4TokenToKVPool",
    "HiSparseC4DevicePool",
    "compressed_last_loc",
    "translate_full_to_compressed",
]

COMPRESS_RATIOS = (0, 4, 128)


class DeepSeekV4TokenToKVPool(DeepSeekV4RequestStateSurface):
    """Sliding-window + compressed (c4, c128) + indexer + compress-state pools, per layer.

    Args (SGLang 0.5.23's order): ``max_num_reqs``; ``swa_size`` (slots of the sliding-window
    pool, page ``swa_page_size``); ``c4_size`` (device slots of the c4 pool, page
    ``page_size // 4``); ``c128_size`` (slots of the c128 pool, page ``page_size // 128``);
    ``c4_state_pool_size`` / ``c128_state_pool_size`` (request slots of the state rings, raised
    to ``num_req_slots - 1``); ``page_size`` (the logical full page size); ``swa_page_size``;
    ``dtype`` (``torch.float8_e4m3fn``); ``c4_state_dtype`` / ``c128_state_dtype``;
    ``qk_nope_head_dim`` (448), ``qk_rope_head_dim`` (64), ``indexer_head_dim``; ``layer_num``;
    ``device``; ``enable_memory_saver``; ``compression_ratios`` (one of 0, 4, 128 per layer);
    ``sliding_window``; ``start_layer``/``end_layer``; ``enable_hisparse`` (the c4 pool becomes a
    :class:`HiSparseC4DevicePool`); ``online_mtp_max_draft_tokens`` (> 0 doubles the rings:
    16/256 instead of 8/128); ``num_req_slots`` (request slots the state rings address, default
    ``max_num_reqs + 1``); ``unified_fp8`` (kept; the unified KV layout itself is not provided);
    ``kv_source_layers`` (kept; they serve SGLang's ratio-1/2 layers, not provided);
    ``full_size`` (checked, unused: SGLang sizes its ratio-1/2 pools with it); ``is_draft_worker``
    (no DSpark draft window here); ``kv_layout`` (``"v4"``; the V4.1 layouts are
    ``NotImplementedError``); ``compressed_kv_layout`` (None / ``"auto"`` / ``"fp8"``); keyword
    ``state_dim`` (default nope + rope), ``use_fp4_indexer``, ``debug``.

    SGLang 0.5.23's surface (layouts, compressed / indexer / state getters and setters,
    request-scoped state, PD buffer infos, the members of features not provided) lives in
    the private modules ``_deepseek_v4_sglang``, ``_deepseek_v4_index`` and
    ``_deepseek_v4_requests``.

    Logical full size: ``size = c128_size * 128`` when there are c128 layers, else
    ``c4_size * 4``; the indexer covers the logical c4 space (``size // 4`` slots) even when the
    c4 KV pool is device-limited (HiSparse). Sub-pools with no layer are ``None``.

    Routing: ``layer_mapping[layer_id] = (ratio, compress_layer_id, compressed pool or None)``;
    every layer also has sliding-window records in ``swa_kv_pool`` (global layer ids). Reads wait
    on this pool's readiness waiter (index ``layer_id - start_layer``). ``set_kv_buffer``
    quantises ``cache_k`` into the window pool at ``KVWriteLoc.swa_loc`` (required).
    ``get_buffer_desc()`` is the window pool's; :meth:`get_buffer_descs` names every sub-pool.
    ``move_kv_cache`` and the CPU copy are not supported (``NotImplementedError``).
    """

    def __init__(  # noqa: PLR0917 (SGLang-compatible positional signature)
        self,
        max_num_reqs: int,
        swa_size: int,
        c4_size: int,
        c128_size: int,
        c4_state_pool_size: int,
        c128_state_pool_size: int,
        page_size: int,
        swa_page_size: int,
        dtype: torch.dtype,
        c4_state_dtype: torch.dtype,
        c128_state_dtype: torch.dtype,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        indexer_head_dim: int,
        layer_num: int,
        device: str | torch.device,
        enable_memory_saver: bool,
        compression_ratios: Sequence[int],
        sliding_window: int = 128,
        start_layer: int | None = None,
        end_layer: int | None = None,
        enable_hisparse: bool = False,
        online_mtp_max_draft_tokens: int = 0,
        num_req_slots: int | None = None,
        unified_fp8: bool | None = None,
        kv_source_layers: Sequence[int] = (),
        full_size: int | None = None,
        is_draft_worker: bool = False,
        kv_layout: object = "v4",
        compressed_kv_layout: str | None = None,
        *,
        state_dim: int | None = None,
        use_fp4_indexer: bool = False,
        debug: bool = False,
    ) -> None:
        checks.check_int("layer_num", layer_num, minimum=1)
        if isinstance(compression_ratios, (str, bytes)) or not isinstance(
            compression_ratios, Iterable
        ):
            raise TypeError(
                "compression_ratios must be a sequence of ints (0, 4 or 128 per layer), "
                f"got {type(compression_ratios).__name__}"
            )
        ratios = [
            checks.check_int(f"compression_ratios[{i}]", r)
            for i, r in enumerate(compression_ratios)
        ]
        if len(ratios) != layer_num or any(r not in COMPRESS_RATIOS for r in ratios):
            raise ValueError(
                f"compression_ratios must hold layer_num={layer_num} values in "
                f"{COMPRESS_RATIOS}, got {ratios}"
            )
        c4_ids = [i for i, r in enumerate(ratios) if r == 4]
        c128_ids = [i for i, r in enumerate(ratios) if r == 128]
        # every argument is checked under its own name here, before a sub-pool sees it
        checks.check_int("page_size", page_size, minimum=1)
        checks.check_int("swa_page_size", swa_page_size, minimum=1)
        for name, value in (
            ("swa_size", swa_size),
            ("c4_size", c4_size),
            ("c128_size", c128_size),
            ("c4_state_pool_size", c4_state_pool_size),
            ("c128_state_pool_size", c128_state_pool_size),
        ):
            checks.check_int(name, value, minimum=0)
        checks.check_int("qk_nope_head_dim", qk_nope_head_dim)
        checks.check_int("qk_rope_head_dim", qk_rope_head_dim)
        checks.check_int("indexer_head_dim", indexer_head_dim)
        checks.check_optional_int("state_dim", state_dim)
        slots = checks.check_optional_int("num_req_slots", num_req_slots, minimum=1)
        fp8_rows = unified_fp8 is not None and checks.check_bool("unified_fp8", unified_fp8)
        if isinstance(kv_source_layers, (str, bytes)) or not isinstance(kv_source_layers, Iterable):
            raise TypeError(
                "kv_source_layers must be a sequence of int layer ids, got "
                f"{type(kv_source_layers).__name__}"
            )
        sources = [
            checks.check_int(f"kv_source_layers[{i}]", v) for i, v in enumerate(kv_source_layers)
        ]
        checks.check_optional_int("full_size", full_size, minimum=0)
        checks.check_bool("is_draft_worker", is_draft_worker)
        layout_option = parse_kv_layouts(kv_layout, compressed_kv_layout)
        for name, state_dtype, ids in (
            ("c4_state_dtype", c4_state_dtype, c4_ids),
            ("c128_state_dtype", c128_state_dtype, c128_ids),
        ):
            if not check_dtype(name, state_dtype).is_floating_point and ids:
                raise ValueError(f"{name} must be a floating-point torch.dtype, got {state_dtype}")
        if c4_ids:
            check_index_head_dim("indexer_head_dim", indexer_head_dim)
        for ratio, ids in ((4, c4_ids), (128, c128_ids)):
            if ids and page_size % ratio:
                raise ValueError(
                    f"page_size must be a multiple of {ratio} with ratio-{ratio} layers, "
                    f"got {page_size}"
                )
        full_size = c128_size * 128 if c128_ids else c4_size * 4
        super().__init__(
            full_size,
            page_size,
            dtype,
            layer_num,
            device,
            enable_memory_saver,
            start_layer,
            end_layer,
            debug=debug,
        )
        self.max_num_reqs = checks.check_int("max_num_reqs", max_num_reqs, minimum=0)
        req_slots = self.max_num_reqs + 1 if slots is None else slots
        # the rings cover every addressable request slot (SGLang: PD preallocation included)
        c4_state_pool_size = max(c4_state_pool_size, req_slots - 1)
        c128_state_pool_size = max(c128_state_pool_size, req_slots - 1)
        self.sliding_window = checks.check_int("sliding_window", sliding_window, minimum=1)
        self.compression_ratios = ratios
        self.qk_nope_head_dim, self.qk_rope_head_dim = qk_nope_head_dim, qk_rope_head_dim
        self.enable_hisparse = bool(enable_hisparse)
        spec = (
            checks.check_int("online_mtp_max_draft_tokens", online_mtp_max_draft_tokens, minimum=0)
            > 0
        )
        self.c4_ring_size, self.c128_ring_size = (16, 256) if spec else (8, 128)
        dim = qk_nope_head_dim + qk_rope_head_dim if state_dim is None else state_dim
        heads = (qk_nope_head_dim, qk_rope_head_dim)
        common = dict(enable_memory_saver=enable_memory_saver, debug=debug)
        self._swa = DeepSeekV4SingleKVPool(
            swa_size, swa_page_size, dtype, *heads, layer_num, device,
            start_layer=self.start_layer, end_layer=self.end_layer, **common,
        )  # fmt: skip
        self.c4_kv_pool: DeepSeekV4SingleKVPool | None = None
        self.c4_indexer_kv_pool: DeepSeekV4IndexerPool | None = None
        self.c4_state_pool: CompressStatePool | None = None
        self.c4_indexer_state_pool: CompressStatePool | None = None
        if c4_ids:
            c4_cls = HiSparseC4DevicePool if enable_hisparse else DeepSeekV4SingleKVPool
            c4_ps = page_size // 4
            self.c4_kv_pool = c4_cls(c4_size, c4_ps, dtype, *heads, len(c4_ids), device, **common)
            self.c4_indexer_kv_pool = DeepSeekV4IndexerPool(
                full_size // 4, c4_ps, dtype, indexer_head_dim, len(c4_ids), device,
                use_fp4=use_fp4_indexer, **common,
            )  # fmt: skip
            self.c4_state_pool = CompressStatePool(
                c4_state_pool_size, self.c4_ring_size, dim, len(c4_ids), device, c4_state_dtype,
                debug=debug,
            )  # fmt: skip
            self.c4_indexer_state_pool = CompressStatePool(
                c4_state_pool_size, self.c4_ring_size, indexer_head_dim, len(c4_ids), device,
                c4_state_dtype, debug=debug,
            )  # fmt: skip
        self.c128_kv_pool: DeepSeekV4SingleKVPool | None = None
        self.c128_state_pool: CompressStatePool | None = None
        if c128_ids:
            self.c128_kv_pool = DeepSeekV4SingleKVPool(
                c128_size, page_size // 128, dtype, *heads, len(c128_ids), device, **common
            )
            self.c128_state_pool = CompressStatePool(
                c128_state_pool_size, self.c128_ring_size, dim, len(c128_ids), device,
                c128_state_dtype, debug=debug,
            )  # fmt: skip
        self.layer_mapping: dict[int, tuple[int, int, DeepSeekV4SingleKVPool | None]] = {}
        for local, ratio in enumerate(ratios):
            ids = c4_ids if ratio == 4 else c128_ids
            pool = self.c4_kv_pool if ratio == 4 else self.c128_kv_pool if ratio == 128 else None
            self.layer_mapping[self.start_layer + local] = (
                ratio,
                ids.index(local) if ratio else -1,
                pool,
            )
        self.full_to_swa_index_mapping: torch.Tensor | None = None
        # SGLang 0.5.23 names of the sizes above
        self.swa_size, self.swa_page_size, self.c128_size = swa_size, swa_page_size, c128_size
        self.full_size = full_size
        self.indexer_head_dim = indexer_head_dim
        self.online_mtp_max_draft_tokens = online_mtp_max_draft_tokens
        self._init_sglang_surface(
            num_req_slots=req_slots,
            c4_size=c4_size,
            c128_size=c128_size,
            state_dtypes=(c4_state_dtype, c128_state_dtype),
            kv_source_layers=sources,
            unified_fp8=fp8_rows,
            compressed_kv_layout=layout_option,
        )
        self._finalize_allocation()

    # ---------------------------------------------------------------- sub-pools
    @property
    def swa_kv_pool(self) -> DeepSeekV4SingleKVPool:  # type: ignore[override]
        """The sliding-window pool (all layers, global layer ids)."""
        return self._swa

    @property
    def full_kv_pool(self) -> KVCache | None:  # type: ignore[override]
        """``None``: DeepSeek-V4 keeps no full-attention pool (compressed layers live in
        ``c4_kv_pool`` / ``c128_kv_pool``). SGLang reads this attribute with a default of
        ``None``, so ``SWATokenToKVPoolAllocator(..., kvcache=<this pool>)`` builds its full-side
        allocator without a pool, as SGLang builds the DeepSeek-V4 stack."""
        return None

    def _named_pools(self) -> list[tuple[str, KVCache]]:
        pools: list[tuple[str, KVCache | None]] = [
            ("swa", self._swa),
            ("c4", self.c4_kv_pool),
            ("c128", self.c128_kv_pool),
            ("c4_indexer", self.c4_indexer_kv_pool),
        ]
        return [(n, p) for n, p in pools if p is not None]

    def _state_pools(self) -> list[tuple[str, CompressStatePool]]:
        pools = [
            ("c4_state", self.c4_state_pool),
            ("c4_indexer_state", self.c4_indexer_state_pool),
            ("c128_state", self.c128_state_pool),
        ]
        return [(n, p) for n, p in pools if p is not None]

    def _role_buffers(self) -> tuple[tuple[str, Sequence[torch.Tensor]], ...]:
        return tuple(
            (f"{name}.{role}", bufs)
            for name, pool in self._named_pools()
            for role, bufs in pool._role_buffers()
        )

    def get_total_bytes(self) -> int:
        """Bytes of every sub-pool, compress-state rings included."""
        return super().get_total_bytes() + sum(p.get_total_bytes() for _, p in self._state_pools())

    def get_buffer_desc(self) -> KVBufferDesc:
        """The sliding-window pool's descriptor (page-row units)."""
        return self._swa.get_buffer_desc()

    def get_buffer_descs(self) -> dict[str, KVBufferDesc]:
        """Descriptors of every present sub-pool: ``swa``, ``c4``, ``c128``, ``c4_indexer``,
        ``c4_state``, ``c128_state``."""
        descs = {name: pool.get_buffer_desc() for name, pool in self._named_pools()}
        descs.update({name: pool.get_buffer_desc() for name, pool in self._state_pools()})
        return descs

    def get_state_buf_infos(self) -> dict[str, KVBufferDesc]:
        """Descriptors of the compress-state rings (the "state" PD transfer sends)."""
        return {name: pool.get_buffer_desc() for name, pool in self._state_pools()}

    # ---------------------------------------------------------------- routing
    def wait_layer_transfer(self, layer_id: int) -> None:
        """Validate ``layer_id`` and wait once for it (the readiness waiter, if any)."""
        self._wait_layer(layer_id)

    def get_ring_size(self, compress_ratio: int) -> int:
        """Rows of one request's compress-state ring for ratio 4 or 128 (``c4_ring_size`` /
        ``c128_ring_size``; doubled when built with ``online_mtp_max_draft_tokens > 0``)."""
        ratio = checks.check_int("compress_ratio", compress_ratio)
        if ratio not in (4, 128):
            raise ValueError(f"compress_ratio must be 4 or 128, got {ratio}")
        return self.c4_ring_size if ratio == 4 else self.c128_ring_size

    def get_swa_key_page_size(self) -> int:
        """Page size of the sliding-window pool (no request-window rows here)."""
        return self._swa.page_size

    def get_index_k_page_size(self, compress_ratio: int = 4) -> int:
        """Page size of the indexer pool of ``compress_ratio`` (only 4 has one here;
        ``ValueError`` otherwise or without c4 layers)."""
        if checks.check_int("compress_ratio", compress_ratio) != 4 or (
            self.c4_indexer_kv_pool is None
        ):
            raise ValueError(
                f"compress_ratio must be 4 on a pool with ratio-4 layers, got {compress_ratio}"
            )
        return self.c4_indexer_kv_pool.page_size

    def get_compress_ratio(self, layer_id: int) -> int:
        """0, 4 or 128."""
        return self.layer_mapping[self._layer(layer_id)][0]

    def _get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._swa._get_key_buffer(layer_id)

    def _get_value_buffer(self, layer_id: int) -> torch.Tensor:
        raise NotImplementedError("DeepSeekV4TokenToKVPool has no value buffer")

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Not supported (no value buffer): ``NotImplementedError``."""
        lid = self._layer(layer_id)  # checked, never waited for: the call fails anyway
        return self._get_key_buffer(lid), self._get_value_buffer(lid)

    def get_swa_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Sliding-window page rows of ``layer_id`` (waits for the layer)."""
        return self.get_key_buffer(layer_id)

    def get_compressed_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Compressed page rows (c4 or c128 pool) of ``layer_id`` (waits for the layer)."""
        self._wait_layer(layer_id)
        _, local, pool = self._compressed(layer_id)
        return pool.kv_buffer[local]

    def get_indexer_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Indexer page rows of c4 layer ``layer_id`` (waits for the layer)."""
        self._wait_layer(layer_id)
        local, pool = self._c4(layer_id, "the indexer")
        return pool.kv_buffer[local]

    def get_state_pool(self, layer_id: int) -> tuple[CompressStatePool, int]:
        """``(state pool, local layer index)`` of a compressed layer."""
        ratio, local, _ = self._compressed(layer_id)
        pool = self.c4_state_pool if ratio == 4 else self.c128_state_pool
        assert pool is not None  # a compressed layer implies its state pool
        return pool, local

    # ---------------------------------------------------------------- mapping
    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        """Install the full -> swa slot mapping (int64 ``[size + page_size + 1]``, last -1)."""
        self.full_to_swa_index_mapping = check_mapping(
            "full_to_swa_index_mapping",
            full_to_swa_index_mapping,
            self.device,
            self.num_rows + 1,
            full=self.debug,
        )

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """``mapping[kv_indices]``: window slots (int64) of full slots (0 where unmapped).

        ``kv_indices`` is checked first (``TypeError``/``ValueError``), then ``RuntimeError``
        when no mapping is registered."""
        check_slots("kv_indices", kv_indices, self.device, self.num_rows, full=self.debug)
        if self.full_to_swa_index_mapping is None:
            raise RuntimeError("no full -> swa mapping registered: call register_mapping first")
        return self.full_to_swa_index_mapping[kv_indices]

    def translate_loc_from_full_to_compressed(
        self, full_loc: torch.Tensor, compress_ratio: int = 4
    ) -> torch.Tensor:
        """Compressed slots of the full slots completing an entry (``(f + 1) % r == 0``)."""
        if checks.check_int("compress_ratio", compress_ratio) not in (4, 128):
            raise ValueError(f"compress_ratio must be 4 or 128, got {compress_ratio}")
        return translate_full_to_compressed(full_loc, compress_ratio)

    # ---------------------------------------------------------------- writes
    def set_kv_buffer(
        self,
        layer: object,
        loc: torch.Tensor | KVWriteLoc,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor | None = None,
    ) -> None:
        """Quantise ``cache_k`` (``[n, 512]``) into the window pool at ``loc.swa_loc``;
        ``layer`` is a layer object with an int ``layer_id`` or an int."""
        layer_id = self._layer(layer, "layer")
        if not isinstance(loc, (torch.Tensor, KVWriteLoc)):
            raise TypeError(f"loc must be a KVWriteLoc with swa_loc set, got {type(loc).__name__}")
        swa_loc = loc.swa_loc if isinstance(loc, KVWriteLoc) else None
        if swa_loc is None:
            raise ValueError(f"loc must be a KVWriteLoc with swa_loc set, got {type(loc).__name__}")
        self._swa.set_kv_buffer(layer_id, swa_loc, cache_k)

    def set_compressed_key_buffer(
        self, layer_id: int, compressed_loc: torch.Tensor, records: torch.Tensor
    ) -> None:
        """Write packed records at compressed slots of ``layer_id``'s c4 or c128 pool (HiSparse
        c4: logical compressed slots, translated by the pool's mapping)."""
        _, local, pool = self._compressed(layer_id)
        pool._set_records(local, "compressed_loc", compressed_loc, records)

    # ---------------------------------------------------------------- unsupported bulk ops
    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Not supported for the composite (compressed entries do not move per token)."""
        raise NotImplementedError("DeepSeekV4TokenToKVPool does not support move_kv_cache")

    def get_cpu_copy(
        self,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> CpuKVCopy:
        """Not supported (``NotImplementedError``)."""
        raise NotImplementedError("DeepSeekV4TokenToKVPool does not support get_cpu_copy")

    def load_cpu_copy(
        self,
        kv_cache_cpu: CpuKVCopy,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> None:
        """Not supported (``NotImplementedError``)."""
        raise NotImplementedError("DeepSeekV4TokenToKVPool does not support load_cpu_copy")
