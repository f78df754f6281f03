"""SGLang 0.5.23's indexer members of ``DeepSeekV4TokenToKVPool`` (private base of
:class:`mem_cache_pool.deepseek_v4.DeepSeekV4TokenToKVPool`; see ``_deepseek_v4_sglang`` for the
convention): the c4 lightning-indexer keys read and written through SGLang's names, the fused fp8
store, the sequence gather (``GetKAndS``), and the fp4 / ROCm-split layouts' members, which are
not provided.
"""

from __future__ import annotations

import torch

from mem_cache_kernels import checks
from mem_cache_pool._checks import batch_page_tokens
from mem_cache_pool._deepseek_v4_sglang import DeepSeekV4SGLangSurface

__all__ = ["DeepSeekV4IndexSurface"]

_INDEXER_FP8_MAX = 448.0
_INDEXER_EPS = 1e-8  # SGLang's indexer store: scale = max(amax, 1e-8) / 448


class DeepSeekV4IndexSurface(DeepSeekV4SGLangSurface):
    """The indexer members of SGLang's DeepSeek-V4 pool."""

    # ---------------------------------------------------------------- indexer
    def get_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:
        """Indexer page rows (keys then fp32 scales) of c4 layer ``layer_id`` (waits)."""
        self._wait_layer(layer_id)
        local, pool = self._c4(layer_id, "the indexer")
        return pool.kv_buffer[local]

    def set_index_k_scale_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        index_k: torch.Tensor,
        index_k_scale: torch.Tensor,
    ) -> None:
        """Write indexer keys and fp32 scales at (logical) c4 slots ``loc`` of ``layer_id``."""
        local, pool = self._c4(layer_id, "the indexer")
        pool._set_index_k_scale(local, "loc", loc, index_k, index_k_scale)

    def set_index_k_fused(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor) -> None:
        """Quantise float index keys ``cache_k`` ``[n, indexer_head_dim]`` as SGLang's indexer
        store (per token ``scale = max(amax, 1e-8) / 448``, keys ``(x / scale)`` clamped to
        +-448 in fp8 e4m3) and write them at c4 slots ``loc``. An fp4 indexer pool:
        ``NotImplementedError``."""
        local, pool = self._c4(layer_id, "the indexer")
        if pool.use_fp4:
            raise NotImplementedError(
                f"{type(self).__name__} does not support set_index_k_fused on an fp4 indexer"
            )
        k = checks.check_tensor("cache_k", cache_k)
        if not k.dtype.is_floating_point:
            raise TypeError(f"cache_k must have a floating-point dtype, got {k.dtype}")
        if k.dim() != 2 or k.shape[1] != pool.index_head_dim:
            raise ValueError(
                f"cache_k must have shape (n, {pool.index_head_dim}), got {tuple(k.shape)}"
            )
        checks.check_on_device("cache_k", k, self.device)
        x = k.float()
        scale = x.abs().amax(dim=1).clamp_min(_INDEXER_EPS) / _INDEXER_FP8_MAX
        keys = (x * (1.0 / scale)[:, None]).clamp(-_INDEXER_FP8_MAX, _INDEXER_FP8_MAX)
        pool._set_index_k_scale(local, "loc", loc, keys.to(torch.float8_e4m3fn), scale)

    def get_index_k_scale_buffer(
        self,
        layer_id: int,
        seq_len_tensor: torch.Tensor,
        page_indices: torch.Tensor,
        seq_len_sum: int,
        max_seq_len: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather the index keys and scales of a batch of sequences (SGLang's ``GetKAndS``).

        ``page_indices`` ``[B, max_pages]`` (c4 indexer page ids per sequence),
        ``seq_len_tensor`` ``[B]`` (compressed tokens per sequence), ``seq_len_sum`` /
        ``max_seq_len`` (their sum / max). Returns new uint8 tensors ``(keys [seq_len_sum,
        key_bytes], scales [seq_len_sum, 4])``, sequences concatenated in order. Waits once."""
        self._wait_layer(layer_id)
        local, pool = self._c4(layer_id, "the indexer")
        tokens = batch_page_tokens(page_indices, seq_len_tensor, seq_len_sum, max_seq_len,
                                   page_size=pool.page_size, device=self.device,
                                   limit=pool.slot_limit)
        rows = pool._gather(local, tokens)
        return rows[:, : pool.key_bytes].contiguous(), rows[:, pool.key_bytes :].contiguous()

    def _fp4_off(self, name: str) -> NotImplementedError:
        return NotImplementedError(
            f"{type(self).__name__} does not support {name} (SGLang's fp4 ratio-1/2 or ROCm "
            "split indexer layout)"
        )

    def set_index_k_fp4(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor) -> None:
        """SGLang's fp4 indexer store: not provided (``NotImplementedError``)."""
        raise self._fp4_off("set_index_k_fp4")

    def get_index_k_fp4_payload_buffer(self, layer_id: int) -> torch.Tensor:
        """ROCm split fp4 payload buffer: absent, as in SGLang without it
        (``NotImplementedError``)."""
        raise self._fp4_off("get_index_k_fp4_payload_buffer")

    def get_index_k_fp4_scale_buffer(self, layer_id: int) -> torch.Tensor:
        """ROCm split fp4 scale buffer: absent (``NotImplementedError``)."""
        raise self._fp4_off("get_index_k_fp4_scale_buffer")

    def get_low_ratio_index_k_fp4(
        self, layer_id: int, slots: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed fp4 index-K rows of a ratio-1/2 layer: none here (``NotImplementedError``;
        SGLang asserts the fp4 layout)."""
        raise self._fp4_off("get_low_ratio_index_k_fp4")

    def get_low_ratio_index_k_dequant(
        self, layer_id: int, slots: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Dequantised fp4 index-K of a ratio-1/2 layer: none here (``NotImplementedError``)."""
        raise self._fp4_off("get_low_ratio_index_k_dequant")

    def low_ratio_index_k_is_split(self, layer_id: int) -> bool:
        """False: no ROCm split layout (``ValueError`` for a layer without an indexer)."""
        self._c4(layer_id, "an index-K pool")
        return False

    def low_ratio_index_k_page8(self, layer_id: int) -> bool:
        """False: no row-group page-8 layout (``ValueError`` without an indexer)."""
        self._c4(layer_id, "an index-K pool")
        return False

    def low_ratio_index_k_page8_ratios(self) -> frozenset[int]:
        """``frozenset()``: no index-K pool is in the page-8 layout."""
        return frozenset()
