"""SGLang 0.5.23's ``DeepSeekV4TokenToKVPool`` surface (private base of
:class:`mem_cache_pool.deepseek_v4.DeepSeekV4TokenToKVPool`).

SGLang 0.5.23 redesigned the DeepSeek-V4 pool around layouts and modes we do not provide: the V4.1
KV layouts (``kv_layout`` other than ``"v4"``), the unified bf16 KV rows (``unified_kv_pool``), the
fp4 / split (ROCm) low-ratio indexer, online c128 compression with MTP banks, the DSpark draft
window (``swa_valid_from``) and the trtllm uniform-fp8 pages. Members serving those answer what
SGLang answers with the feature off (``False`` / ``None`` / ``0`` / empty infos / a no-op), or raise
``NotImplementedError`` where SGLang's call cannot succeed with it off; each docstring says which.
Everything else (layout getters, the SWA / compressed / indexer reads and writes, compress-state
views, request-scoped state, PD buffer infos) runs on our buffers. This module holds the layout,
SWA and compressed-cache members; ``_deepseek_v4_index`` the indexer's, ``_deepseek_v4_requests``
the compress-state, request-state, buffer-info and unified-KV ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mem_cache_kernels import checks, deepseek_v4
from mem_cache_pool._deepseek_v4_indexer import DeepSeekV4IndexerPool
from mem_cache_pool._deepseek_v4_layers import (
    CompressedPoolConfig,
    CompressStateLayer,
)
from mem_cache_pool._deepseek_v4_norm_rope import (
    check_norm_rope_args,
    norm_rope_rows,
    rope_query_,
)
from mem_cache_pool._deepseek_v4_single import DeepSeekV4SingleKVPool
from mem_cache_pool._deepseek_v4_state import CompressStatePool
from mem_cache_pool.base import KVWriteLoc
from mem_cache_pool.swa import BaseSWAKVPool

__all__ = ["KV_LAYOUT", "DeepSeekV4SGLangSurface", "buf_infos", "parse_kv_layouts"]

KV_LAYOUT = "v4"
"""The one KV layout ours stores (SGLang's ``KVLayout.V4``: 584-byte records)."""

_V41_LAYOUTS = ("v41", "v41_new")
_BufInfos = tuple[list[int], list[int], list[int]]


def parse_kv_layouts(kv_layout: object, compressed_kv_layout: object) -> str | None:
    """Check SGLang's ``kv_layout`` / ``compressed_kv_layout`` constructor arguments.

    ``kv_layout`` is ``"v4"`` (or an enum whose ``value`` is ``"v4"``); the V4.1 main layouts
    (``"v41"``, ``"v41_new"``) are ``NotImplementedError``; anything else ``ValueError`` (SGLang
    rejects it too). ``compressed_kv_layout`` is None, ``"auto"`` or ``"fp8"`` (a V4 main cache
    pairs only with V4 compressed caches, SGLang's assertion): returned as given.
    """
    value = getattr(kv_layout, "value", kv_layout)
    if not isinstance(value, str):
        raise TypeError(f"kv_layout must be a str or a KVLayout, got {type(kv_layout).__name__}")
    if value.lower() in _V41_LAYOUTS:
        raise NotImplementedError(f"kv_layout {value!r}: only the V4 layout ('v4') is provided")
    if value.lower() != KV_LAYOUT:
        raise ValueError(f"kv_layout must be 'v4' (a main-cache layout), got {value!r}")
    if compressed_kv_layout is None:
        return None
    if not isinstance(compressed_kv_layout, str):
        raise TypeError(
            f"compressed_kv_layout must be None or a str, got {type(compressed_kv_layout).__name__}"
        )
    if compressed_kv_layout.lower() not in ("auto", "fp8"):
        raise ValueError(
            "compressed_kv_layout must be None, 'auto' or 'fp8' next to a V4 main cache, "
            f"got {compressed_kv_layout!r}"
        )
    return compressed_kv_layout


def buf_infos(bufs: Sequence[torch.Tensor], rows_per_item: int = 1) -> _BufInfos:
    return (
        [b.data_ptr() for b in bufs],
        [b.numel() * b.element_size() for b in bufs],
        [b[0].numel() * b.element_size() * rows_per_item for b in bufs],
    )


class DeepSeekV4SGLangSurface(BaseSWAKVPool):
    """SGLang 0.5.23's DeepSeek-V4 pool members; see the module docstring."""

    _swa: DeepSeekV4SingleKVPool
    c4_kv_pool: DeepSeekV4SingleKVPool | None
    c128_kv_pool: DeepSeekV4SingleKVPool | None
    c4_indexer_kv_pool: DeepSeekV4IndexerPool | None
    c4_state_pool: CompressStatePool | None
    c4_indexer_state_pool: CompressStatePool | None
    c128_state_pool: CompressStatePool | None
    layer_mapping: dict[int, tuple[int, int, DeepSeekV4SingleKVPool | None]]
    compression_ratios: list[int]

    uniform_fp8 = False
    """SGLang: trtllm's uniform 512-byte e4m3 pages. Not provided: False."""
    needs_paged_swa_allocator = True
    """SGLang: False only under encoder SWA replay (request windows). Ours is paged: True."""

    def _init_sglang_surface(
        self,
        *,
        num_req_slots: int,
        c4_size: int,
        c128_size: int,
        state_dtypes: tuple[torch.dtype, torch.dtype],
        kv_source_layers: list[int],
        unified_fp8: bool,
        compressed_kv_layout: str | None,
    ) -> None:
        """Set SGLang's attributes once the sub-pools exist (trusted arguments)."""
        self.kv_layout = KV_LAYOUT
        self.compressed_kv_layout_option = compressed_kv_layout
        self._unified_kv_fp8 = unified_fp8
        self.c4_logical_size = self.size // 4
        self.kv_source_layers = kv_source_layers
        self.online_c128_mtp_pending_seq_lens: torch.Tensor | None = None
        c128_state = self.c128_state_pool
        self.online_c128_state_num_req_slots = 0 if c128_state is None else c128_state.size + 1
        self.swa_valid_from: torch.Tensor | None = None
        self.unified_kv_pool: None = None
        self.unified_swa_window: int | None = None
        self.unified_swa_ring_size: int | None = None
        self.unified_swa_pages: int | None = None
        self.num_req_slots = num_req_slots
        ratios = set(self.compression_ratios)
        configs: dict[int, CompressedPoolConfig] = {}
        if 4 in ratios and self.c4_state_pool is not None:
            configs[4] = CompressedPoolConfig(
                c4_size, self.c4_state_pool.size, state_dtypes[0], self.c4_logical_size
            )
        if 128 in ratios and self.c128_state_pool is not None:
            configs[128] = CompressedPoolConfig(
                c128_size, self.c128_state_pool.size, state_dtypes[1]
            )
        self.compressed_pool_configs = configs
        self.kv_pools: dict[int, DeepSeekV4SingleKVPool | None] = {
            r: (self.c4_kv_pool if r == 4 else self.c128_kv_pool) for r in configs
        }
        self.index_pools: dict[int, DeepSeekV4IndexerPool] = (
            {4: self.c4_indexer_kv_pool} if self.c4_indexer_kv_pool is not None else {}
        )
        self.present_ratios: tuple[int, ...] = tuple(sorted(self.kv_pools))
        self.sources_by_ratio: dict[int, list[int]] = {
            r: [lid for lid, (lr, _, _) in self.layer_mapping.items() if lr == r]
            for r in (4, 128)
            if r in ratios
        }
        attn: list[CompressStateLayer | None] = [None] * self.end_layer
        index: list[CompressStateLayer | None] = [None] * self.end_layer
        for lid, (ratio, local, _) in self.layer_mapping.items():
            if not ratio:
                continue
            pool = self.c4_state_pool if ratio == 4 else self.c128_state_pool
            if pool is not None:
                attn[lid] = CompressStateLayer(pool, local, ratio, request_scoped=ratio == 128)
            if ratio == 4 and self.c4_indexer_state_pool is not None:
                index[lid] = CompressStateLayer(self.c4_indexer_state_pool, local, 4, False)
        self.compress_state_pools = attn
        self.indexer_compress_state_pools = index

    # ---------------------------------------------------------------- routing helpers
    def _compressed(self, layer_id: object) -> tuple[int, int, DeepSeekV4SingleKVPool]:
        lid = self._layer(layer_id)
        ratio, local, pool = self.layer_mapping[lid]
        if pool is None:
            raise ValueError(f"layer_id {lid} has compress ratio 0 (no compressed cache)")
        return ratio, local, pool

    def _c4(self, layer_id: object, what: str) -> tuple[int, DeepSeekV4IndexerPool]:
        ratio, local, _ = self._compressed(layer_id)
        if ratio != 4 or self.c4_indexer_kv_pool is None:
            raise ValueError(f"layer_id {layer_id} has compress ratio {ratio}; {what} needs 4")
        return local, self.c4_indexer_kv_pool

    # ---------------------------------------------------------------- layouts and sizes
    def compressed_kv_layout(self, compress_ratio: int) -> str:
        """Layout of a ratio's compressed cache next to the V4 main cache: always ``"v4"``."""
        checks.check_int("compress_ratio", compress_ratio)
        return KV_LAYOUT

    def pd_kv_layout(self) -> str:
        """Main and compressed layouts PD peers must share, e.g. ``"v4,c4:v4,c128:v4"``."""
        ratios = sorted(set(self.compression_ratios) - {0})
        return ",".join([KV_LAYOUT, *(f"c{r}:{KV_LAYOUT}" for r in ratios)])

    def get_swa_key_layout(self) -> str:
        """``"v4"``."""
        return KV_LAYOUT

    def get_swa_key_bytes_per_token(self) -> int:
        """584: bytes of one V4 record (the last dim SGLang's attention kernel reads)."""
        return deepseek_v4.TOKEN_BYTES

    def get_extra_key_page_size(self, layer_id: int) -> int:
        """Page size of ``layer_id``'s compressed pool (``page_size // ratio``)."""
        return self._compressed(layer_id)[2].page_size

    def get_extra_key_layout(self, layer_id: int) -> str:
        """``"v4"`` for a compressed layer (``ValueError`` for a ratio-0 layer)."""
        self._compressed(layer_id)
        return KV_LAYOUT

    def get_extra_key_bytes_per_token(self, layer_id: int) -> int:
        """584 for a compressed layer (``ValueError`` for a ratio-0 layer)."""
        self._compressed(layer_id)
        return deepseek_v4.TOKEN_BYTES

    def source_layer_of(self, layer_id: int) -> int:
        """The layer owning ``layer_id``'s compressed storage: itself (ratios 4 / 128; the
        ratio-1/2 kv_source sharing of SGLang is not provided). ``ValueError`` for ratio 0."""
        self._compressed(layer_id)
        return self._layer(layer_id)

    # ---------------------------------------------------------------- SWA reads / writes
    def get_swa_raw_buffer(self, layer_id: int) -> torch.Tensor:
        """Window page rows of ``layer_id`` (uint8, no wait; SGLang's raw buffer)."""
        return self._swa.kv_buffer[self.layer_index(layer_id)]

    def get_swa_key_buffer_radix(self, layer_id: int) -> torch.Tensor:
        """Window page rows of ``layer_id`` viewed as ``dtype`` (fp8; SGLang's
        ``get_key_buffer`` view of the uint8 rows), waiting for the layer."""
        index = self._wait_layer(layer_id)
        return self._swa.kv_buffer[index].view(self.dtype)

    def _write_pack(
        self, pool: DeepSeekV4SingleKVPool, index: int, name: str, loc: object, pack: object
    ) -> None:
        """Write records ``[n, 584]`` uint8, or SGLang's ``NopeFp8RopeBf16Pack`` (fp8
        ``k_nope_fp8`` ``[n, 448]``, bf16 ``k_rope_bf16`` ``[n, 64]``, uint8
        ``scale_k_nope_ue8m0`` ``[n, 7]``; packed as
        :func:`mem_cache_kernels.deepseek_v4.pack_records`)."""
        if not isinstance(loc, (torch.Tensor, KVWriteLoc)):
            raise TypeError(f"{name} must be a slot tensor, got {type(loc).__name__}")
        if isinstance(pack, torch.Tensor):
            pool._set_records(
                pool.start_layer + index, name, loc, pack, "cache_nope_fp8_rope_bf16_pack"
            )
            return
        parts: list[torch.Tensor] = []
        for attr in ("k_nope_fp8", "scale_k_nope_ue8m0", "k_rope_bf16"):
            part = getattr(pack, attr, None)
            if not isinstance(part, torch.Tensor):
                raise TypeError(
                    "cache_nope_fp8_rope_bf16_pack must be records (uint8 [n, 584]) or a "
                    f"NopeFp8RopeBf16Pack, got {type(pack).__name__}"
                )
            parts.append(part.reshape(-1, part.shape[-1]) if part.dim() else part)
        pool._set_parts(index, name, loc, *parts)

    def set_swa_key_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_nope_fp8_rope_bf16_pack: Any
    ) -> None:
        """Write V4 records (or a ``NopeFp8RopeBf16Pack``) at window slots ``loc``."""
        index = self.layer_index(layer_id)
        self._write_pack(self._swa, index, "loc", loc, cache_nope_fp8_rope_bf16_pack)

    def set_swa_key_buffer_radix(
        self, layer_id: int, swa_loc: torch.Tensor, cache_nope_fp8_rope_bf16_pack: Any
    ) -> None:
        """:meth:`set_swa_key_buffer` (SGLang's radix-path name)."""
        index = self.layer_index(layer_id)
        self._write_pack(self._swa, index, "swa_loc", swa_loc, cache_nope_fp8_rope_bf16_pack)

    def set_swa_key_buffer_radix_fused(
        self, layer_id: int, swa_loc: torch.Tensor, cache_k: torch.Tensor
    ) -> None:
        """Quantise float ``cache_k`` ``[n, 512]`` (normed, rotated) into the window pool at
        ``swa_loc`` (:func:`mem_cache_kernels.deepseek_v4.quantize_nope` + bf16 rope, as SGLang's
        V4 store)."""
        self._swa._quantize_write(self.layer_index(layer_id), "swa_loc", swa_loc, cache_k)

    def set_swa_key_buffer_radix_fused_norm_rope(  # noqa: PLR0917 (SGLang's signature)
        self,
        layer_id: int,
        swa_loc: torch.Tensor,
        kv: torch.Tensor,
        kv_weight: torch.Tensor,
        eps: float,
        freqs_cis: torch.Tensor,
        positions: torch.Tensor,
        q: torch.Tensor | None = None,
    ) -> None:
        """SGLang's fused K store (``fused_k_norm_rope_flashmla``, V4 layout), in torch.

        ``kv`` float ``[n, 512]`` (bf16 / fp16 / fp32, read only), ``kv_weight`` float ``[512]``,
        ``eps`` a number, ``freqs_cis`` complex64 ``[max_pos, 32]``, ``positions`` int32/int64
        ``[n]`` (rows of ``freqs_cis``), ``swa_loc`` int32/int64 ``[n]`` window slots of
        ``layer_id``. Each row is RMS-normed over its 512 dims with ``kv_weight`` and ``eps``, its
        last 64 dims rotated as 32 interleaved (real, imag) pairs by ``freqs_cis[positions]``, all
        in float32, then stored as :meth:`set_swa_key_buffer_radix_fused` stores float32 rows
        (nope quantised to fp8 from the fp32 values, rope rounded to bf16). Rows with
        ``swa_loc < 0`` are not stored (SGLang skips them). ``q`` (optional, float
        ``[n, heads, 512]``): the last 64 dims of every head are rotated in place with the same
        frequencies (not normed), rows with ``swa_loc < 0`` included; that is SGLang's ROCm
        launch (its CUDA launch asserts ``q is None``). Exact order of the math:
        ``mem_cache_pool._deepseek_v4_norm_rope``. Arguments are checked before anything is
        written."""
        index = self.layer_index(layer_id)
        slots = checks.check_index("swa_loc", swa_loc, device=self.device)
        kv_t, w, eps_f, freqs, pos, q_t = check_norm_rope_args(
            slots.numel(), self.device, kv, kv_weight, eps, freqs_cis, positions, q
        )
        keep = slots >= 0
        rows = norm_rope_rows(kv_t[keep], w, eps_f, freqs, pos[keep])
        self._swa._quantize_write(index, "swa_loc", slots[keep], rows)
        if q_t is not None:
            rope_query_(q_t, freqs, pos)

    def set_swa_valid_from(self, slots: torch.Tensor, valid_from: torch.Tensor) -> None:
        """SGLang's DSpark draft window mark: not provided (``swa_valid_from`` is None, where
        SGLang's assignment fails): ``NotImplementedError``."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support set_swa_valid_from (no DSpark draft window)"
        )

    def get_swa_valid_from_buf_infos(self) -> _BufInfos:
        """``([], [], [])``: no DSpark draft window mark, as SGLang when ``swa_valid_from`` is
        None."""
        return [], [], []

    # ---------------------------------------------------------------- compressed (extra) cache
    def get_extra_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Compressed page rows of ``layer_id`` viewed as ``dtype`` (fp8, as SGLang's), waiting
        for the layer."""
        self._wait_layer(layer_id)
        _, local, pool = self._compressed(layer_id)
        return pool.kv_buffer[local].view(self.dtype)

    def set_extra_key_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_nope_fp8_rope_bf16_pack: Any
    ) -> None:
        """Write V4 records (or a ``NopeFp8RopeBf16Pack``) at compressed slots ``loc`` of
        ``layer_id`` (HiSparse c4: logical compressed slots)."""
        _, local, pool = self._compressed(layer_id)
        self._write_pack(pool, local, "loc", loc, cache_nope_fp8_rope_bf16_pack)

    def set_extra_key_buffer_fused(
        self,
        layer_id: int,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        freqs_cis: torch.Tensor | None = None,
    ) -> None:
        """Quantise float ``cache_k`` ``[n, 512]`` into ``layer_id``'s compressed cache at
        ``loc``. ``freqs_cis`` (in-kernel RoPE) is for SGLang's fp4 caches only: with the V4
        layout it is a ``ValueError`` (SGLang's assertion)."""
        _, local, pool = self._compressed(layer_id)
        if freqs_cis is not None:
            raise ValueError("freqs_cis must be None: in-kernel RoPE is for the fp4 cache only")
        pool._quantize_write(local, "loc", loc, cache_k)
