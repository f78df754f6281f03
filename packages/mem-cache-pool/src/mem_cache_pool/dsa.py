"""``DSATokenToKVPool``: MLA plus the page-major indexer-key cache of DeepSeek sparse attention."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels import checks
from mem_cache_kernels.dispatch import pick
from mem_cache_pool._checks import (
    batch_page_tokens,
    check_copy_layers,
    check_copy_roles,
    check_rows,
    check_slots,
)
from mem_cache_pool._index_pages import IndexPageLayout
from mem_cache_pool.base import CpuKVCopy
from mem_cache_pool.mla import MLATokenToKVPool

__all__ = ["INDEX_HEAD_DIM", "DSATokenToKVPool"]

INDEX_HEAD_DIM = 128
_INDEX_ROLES = ("index_k", "index_k_scale")
_FP8_INDEX = (torch.float8_e4m3fn, torch.uint8)


class DSATokenToKVPool(MLATokenToKVPool):
    """MLA latent rows plus, per layer, the lightning-indexer key buffer
    ``index_k_with_scale_buffer[l]``: uint8 ``[num_pages, page_size * 132]``, **page-major** (each
    page: ``page_size`` fp8 keys of 128 bytes, then ``page_size`` fp32 scales; 8448 bytes per
    64-token page). Token ``t`` lives in page ``t // page_size``.

    Args (beyond :class:`MLATokenToKVPool`):
        index_head_dim: must be 128.
        kv_cache_dim: override of the latent row width (SGLang's ``kv_cache_dim``).
        index_buf_size: slots covered by the index buffer (default ``size``; the HiSparse pool
            keeps keys for a logical space larger than the device pool).

    Index slot tensors are checked against ``index_num_rows`` (``num_pages * page_size``).
    ``move_kv_cache`` moves latent rows and index keys/scales at the right byte offsets for any
    page size. ``get_kv_size_bytes()`` (int) includes the index buffers. CPU copies carry the
    roles ``"kv"``, ``"index_k"`` (``[n, 128]`` uint8) and ``"index_k_scale"`` (``[n, 4]`` uint8).
    """

    quant_block_size = 128
    """Index keys are quantised in blocks of 128 values, one fp32 scale each (SGLang)."""
    index_k_with_scale_buffer_dtype = torch.uint8
    """dtype of the index buffers."""
    rope_storage_dtype = torch.bfloat16
    """SGLang: the rope part of a packed fp8 DSA row is stored in bf16."""

    def __init__(  # noqa: PLR0917 (SGLang-compatible positional signature)
        self,
        size: int,
        page_size: int,
        kv_lora_rank: int | torch.dtype,
        dtype: torch.dtype | int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str | torch.device,
        index_head_dim: int = INDEX_HEAD_DIM,
        enable_memory_saver: bool = False,
        kv_cache_dim: int | None = None,
        start_layer: int | None = None,
        end_layer: int | None = None,
        index_buf_size: int | None = None,
        index_kpool: int = 1,
        index_kpool_compress: bool = False,
        tail_extra_slots: int = 0,
        max_running_requests: int | None = None,
        skip_topk_layers: Sequence[bool] | None = None,
        dcp_replicated: bool = False,
        *,
        debug: bool = False,
    ) -> None:
        # SGLang 0.5.23's order is (size, page_size, kv_lora_rank, dtype, ...); mem-cache's
        # earlier order (size, page_size, dtype, kv_lora_rank, ...) is recognised by the dtype
        # in third place (a dtype is never a rank) and still accepted.
        if isinstance(kv_lora_rank, torch.dtype) and not isinstance(dtype, torch.dtype):
            kv_lora_rank, dtype = dtype, kv_lora_rank
        if checks.check_int("index_head_dim", index_head_dim) != INDEX_HEAD_DIM:
            raise ValueError(f"index_head_dim must be {INDEX_HEAD_DIM}, got {index_head_dim}")
        if checks.check_int("index_kpool", index_kpool, minimum=1) != 1 or index_kpool_compress:
            raise NotImplementedError(
                "index_kpool > 1 / index_kpool_compress (SGLang's compressed index pages) are "
                f"not provided, got index_kpool={index_kpool}, "
                f"index_kpool_compress={index_kpool_compress}"
            )
        if checks.check_int("tail_extra_slots", tail_extra_slots, minimum=0):
            raise NotImplementedError(
                "tail_extra_slots serves SGLang's kpool compress tails, which are not provided"
            )
        checks.check_optional_int("max_running_requests", max_running_requests)
        skip = [False] * checks.check_int("layer_num", layer_num, minimum=1)
        if skip_topk_layers is not None:
            skip = [bool(b) for b in skip_topk_layers]
            if len(skip) != layer_num:
                raise ValueError(
                    f"skip_topk_layers must hold layer_num={layer_num} flags, got {len(skip)}"
                )
        rank = checks.check_int("kv_lora_rank", kv_lora_rank, minimum=1)
        rope = checks.check_int("qk_rope_head_dim", qk_rope_head_dim, minimum=0)
        override = None
        if kv_cache_dim is not None and checks.check_int("kv_cache_dim", kv_cache_dim) != (
            rank + rope
        ):
            override = kv_cache_dim
        super().__init__(
            size,
            page_size,
            dtype,  # type: ignore[arg-type]
            rank,
            rope,
            layer_num,
            device,
            enable_memory_saver,
            start_layer,
            end_layer,
            True,
            override,
            dcp_replicated,
            debug=debug,
        )
        self.skip_topk_layers = skip
        self.index_kpool = 1
        self.index_kpool_compress = False
        self.kpool_use_compress = False
        self.tail_extra_slots = 0
        self.index_page_size = self.page_size
        self.index_head_dim = index_head_dim
        self.index_buf_size = checks.check_int(
            "index_buf_size", size if index_buf_size is None else index_buf_size, minimum=0
        )
        self.index_layout = IndexPageLayout(page_size, index_head_dim)
        pages = self.index_layout.num_pages(self.index_buf_size)
        self.index_num_rows = pages * page_size
        self.index_k_with_scale_buffer = [
            torch.zeros(
                (pages, self.index_layout.page_bytes), dtype=torch.uint8, device=self.device
            )
            for _ in range(layer_num)
        ]
        self._finalize_allocation()

    # ---------------------------------------------------------------- accounting
    def get_total_bytes(self) -> int:
        # MLA's constructor finalises before the index buffers exist; DSA finalises again
        bufs: list[torch.Tensor] = getattr(self, "index_k_with_scale_buffer", [])
        index = sum(t.numel() for t in bufs)
        return super().get_total_bytes() + index

    def get_kv_size_bytes(self) -> int:
        """Latent buffers plus index buffers, in bytes."""
        return self.get_total_bytes()

    # ---------------------------------------------------------------- index buffer
    def _check_index_loc(
        self, name: str, loc: object, *, length: int | None = None
    ) -> torch.Tensor:
        """A slot tensor of the index buffer: checked against ``index_num_rows``."""
        t = checks.check_index(name, loc, length=length, device=self.device)
        checks.check_index_values(name, t, limit=self.index_num_rows, full=self.debug)
        return t

    def get_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:
        """The raw page-major uint8 buffer of layer ``layer_id`` (waits for the layer)."""
        return self.index_k_with_scale_buffer[self._wait_layer(layer_id)]

    def set_index_k_scale_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        index_k: torch.Tensor,
        index_k_scale: torch.Tensor,
    ) -> None:
        """Write keys ``index_k`` (fp8 e4m3 or uint8 ``[n, 128]``) and scales ``index_k_scale``
        (float32 ``[n]`` or ``[n, 1]``) of tokens ``loc`` ``[n]`` into their pages.

        Validates before writing; mutates the key and scale bytes of tokens ``loc`` only.
        """
        index = self.layer_index(layer_id)
        slots = self._check_index_loc("loc", loc)
        n = slots.numel()
        keys = check_rows("index_k", index_k, (n, INDEX_HEAD_DIM), self.device, dtypes=_FP8_INDEX)
        if isinstance(index_k_scale, torch.Tensor) and index_k_scale.dim() == 2:
            scale = check_rows(
                "index_k_scale", index_k_scale, (n, 1), self.device, dtypes=(torch.float32,)
            )
        else:
            scale = check_rows(
                "index_k_scale", index_k_scale, (n,), self.device, dtypes=(torch.float32,)
            )
        if not n:
            return
        lay, buf = self.index_layout, self.index_k_with_scale_buffer[index]
        key_src = keys.contiguous().view(torch.uint8).reshape(-1, lay.key_row_bytes)
        scale_src = scale.contiguous().reshape(n).view(torch.uint8).reshape(n, lay.scale_bytes)
        _transfer_rows(
            key_src, lay.key_view(buf), self._arange(key_src.shape[0]), lay.key_rows(slots)
        )
        _transfer_rows(scale_src, lay.scale_view(buf), self._arange(n), lay.scale_rows(slots))

    def get_index_k_scale_buffer(
        self,
        layer_id: int,
        seq_len_tensor: torch.Tensor,
        page_indices: torch.Tensor,
        seq_len_sum: int,
        max_seq_len: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather the index keys and scales of a batch of sequences (SGLang's ``GetKAndS``).

        ``page_indices`` ``[B, max_pages]`` (int32/int64 page ids per sequence),
        ``seq_len_tensor`` ``[B]`` (tokens of each sequence), ``seq_len_sum`` (their sum) and
        ``max_seq_len`` (their maximum). Returns new uint8 tensors ``(keys [seq_len_sum, 128],
        scales [seq_len_sum, 4])``: sequence ``b``'s first ``seq_len[b]`` tokens (token ``t`` in
        page ``page_indices[b, t // page_size]``), sequences concatenated in order. Waits once
        for the layer. ``ValueError`` when the sums disagree or a sequence needs more pages
        than its row holds.
        """
        index = self._wait_layer(layer_id)
        tokens = batch_page_tokens(page_indices, seq_len_tensor, seq_len_sum, max_seq_len,
                                   page_size=self.page_size, device=self.device,
                                   limit=self.index_num_rows)
        return self._gather_index(index, tokens)

    # ---------------------------------------------------------------- SGLang kpool compress (off)
    def get_compress_tail_buffers(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """SGLang's kpool-compress tail rings: ``NotImplementedError``, the feature is not
        provided (``kpool_use_compress`` False, where SGLang's assertion fails)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support get_compress_tail_buffers "
            "(kpool compress is off)"
        )

    def get_compress_tail_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """``([], [], [])``: no compress tails to transfer (kpool compress off), as SGLang."""
        return [], [], []

    def kpool_decode_update_index_cache(  # noqa: PLR0917 (SGLang's signature)
        self,
        layer_id: int,
        key: torch.Tensor,
        slot_score: torch.Tensor,
        ape: torch.Tensor,
        block_tables: torch.Tensor,
        req_pool_indices: torch.Tensor,
        positions: torch.Tensor,
        seq_lens: torch.Tensor,
        out_cache_loc: torch.Tensor,
        round_scale: bool = False,
    ) -> None:
        """SGLang's kpool-compress decode update: ``NotImplementedError`` (kpool compress is
        not provided)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support kpool_decode_update_index_cache "
            "(kpool compress is off)"
        )

    def set_compress_tail_for_request(  # noqa: PLR0917 (SGLang's signature)
        self,
        layer_id: int,
        req_pool_idx: torch.Tensor,
        key_tail: torch.Tensor,
        score_tail: torch.Tensor,
        n_remain: int,
        dst_logical_start: int,
    ) -> None:
        """SGLang's kpool-compress tail write: ``NotImplementedError`` (kpool compress is not
        provided)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support set_compress_tail_for_request "
            "(kpool compress is off)"
        )

    def get_state_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """``(data_ptrs, data_lens, item_lens)`` of the per-layer index buffers (the "state"
        that PD transfer sends with the KV): base address, whole-buffer bytes, one page row's
        bytes, as SGLang's ``IndexKeyCache.state_buf_infos``."""
        bufs = self.index_k_with_scale_buffer
        return (
            [b.data_ptr() for b in bufs],
            [b.numel() for b in bufs],
            [b[0].numel() if b.shape[0] else 0 for b in bufs],
        )

    def _arange(self, n: int) -> torch.Tensor:
        return torch.arange(n, device=self.device)

    def _gather_index(self, index: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lay, buf = self.index_layout, self.index_k_with_scale_buffer[index]
        n = slots.numel()
        keys = torch.empty(
            (n * lay.key_rows_per_token, lay.key_row_bytes), dtype=torch.uint8, device=self.device
        )
        scales = torch.empty((n, lay.scale_bytes), dtype=torch.uint8, device=self.device)
        if n:
            rows = self._arange(keys.shape[0])
            _transfer_rows(lay.key_view(buf), keys, lay.key_rows(slots), rows)
            _transfer_rows(lay.scale_view(buf), scales, lay.scale_rows(slots), rows[:n])
        return keys.view(n, INDEX_HEAD_DIM), scales

    def get_index_k(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
        """New fp8 (e4m3) tensor ``[n, 128]``: the index keys of tokens ``loc`` (waits once)."""
        index = self._wait_layer(layer_id)
        keys, _ = self._gather_index(index, self._check_index_loc("loc", loc))
        return keys.view(torch.float8_e4m3fn)

    def get_index_k_scale(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
        """New float32 tensor ``[n]``: the index-key scales of tokens ``loc`` (waits once)."""
        index = self._wait_layer(layer_id)
        _, scales = self._gather_index(index, self._check_index_loc("loc", loc))
        return scales.view(torch.float32).reshape(-1)

    def _page_tokens(self, seq_len: int, page_indices: torch.Tensor) -> torch.Tensor:
        check_slots(
            "page_indices",
            page_indices,
            self.device,
            self.index_num_rows // self.page_size,
            full=self.debug,
        )
        checks.check_int("seq_len", seq_len, minimum=0)
        if seq_len > page_indices.numel() * self.page_size:
            raise ValueError(
                f"seq_len must be <= len(page_indices) * page_size = "
                f"{page_indices.numel() * self.page_size}, got {seq_len}"
            )
        offsets = torch.arange(self.page_size, device=self.device)
        tokens = page_indices.to(torch.int64)[:, None] * self.page_size + offsets
        return tokens.reshape(-1)[:seq_len]

    def get_index_k_continuous(
        self, layer_id: int, seq_len: int, page_indices: torch.Tensor
    ) -> torch.Tensor:
        """fp8 ``[seq_len, 128]``: keys of the first ``seq_len`` tokens of ``page_indices``."""
        return self.get_index_k(layer_id, self._page_tokens(seq_len, page_indices))

    def get_index_k_scale_continuous(
        self, layer_id: int, seq_len: int, page_indices: torch.Tensor
    ) -> torch.Tensor:
        """float32 ``[seq_len]``: scales of the first ``seq_len`` tokens of ``page_indices``."""
        return self.get_index_k_scale(layer_id, self._page_tokens(seq_len, page_indices))

    def _move_index_rows(self, tgt: torch.Tensor, src: torch.Tensor) -> None:
        """Move index keys and scales of tokens ``src -> tgt`` in every layer (byte offsets per
        the page-major layout, not token rows)."""
        lay = self.index_layout
        bufs = self.index_k_with_scale_buffer
        _copy_rows([lay.key_view(b) for b in bufs], lay.key_rows(tgt), lay.key_rows(src))
        _copy_rows([lay.scale_view(b) for b in bufs], lay.scale_rows(tgt), lay.scale_rows(src))

    # ---------------------------------------------------------------- moves and retraction
    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Move latent rows and index keys/scales of tokens ``src_loc`` to ``tgt_loc``."""
        limit = min(self.num_rows, self.index_num_rows)
        tgt = self._check_loc("tgt_loc", tgt_loc, limit=limit)
        checks.check_distinct("tgt_loc", tgt, full=self.debug)
        src = self._check_loc("src_loc", src_loc, limit=limit, length=tgt.numel())
        if tgt.numel():
            _copy_rows(self.kv_buffer, tgt, src)
            self._move_index_rows(tgt, src)

    def get_cpu_copy(
        self,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> CpuKVCopy:
        """Latent rows plus index keys/scales of tokens ``indices`` on the CPU."""
        idx = self._check_loc("indices", indices, limit=min(self.num_rows, self.index_num_rows))
        out = super().get_cpu_copy(idx)
        gathered = [self._gather_index(i, idx) for i in range(self.layer_num)]
        out["index_k"] = [k.cpu() for k, _ in gathered]
        out["index_k_scale"] = [s.cpu() for _, s in gathered]
        return out

    def load_cpu_copy(
        self,
        kv_cache_cpu_dict: CpuKVCopy,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> None:
        """Write a :meth:`get_cpu_copy` result back at tokens ``indices`` (validated first)."""
        kv_cache_cpu = kv_cache_cpu_dict
        arg = "kv_cache_cpu_dict"
        idx = self._check_loc("indices", indices, limit=min(self.num_rows, self.index_num_rows))
        check_copy_roles(kv_cache_cpu, ["kv", *_INDEX_ROLES], arg)
        kv_part = {k: v for k, v in kv_cache_cpu.items() if k not in _INDEX_ROLES}
        self._check_cpu_copy(kv_part, idx, arg)
        n = idx.numel()
        for role, width in zip(_INDEX_ROLES, (INDEX_HEAD_DIM, self.index_layout.scale_bytes)):
            name = f"{arg}[{role!r}]"
            check_copy_layers(name, kv_cache_cpu[role], self.layer_num, torch.uint8, (n, width))
        super().load_cpu_copy(kv_part, idx)
        for i in range(self.layer_num):
            self.set_index_k_scale_buffer(
                self.start_layer + i,
                idx,
                kv_cache_cpu["index_k"][i].to(self.device),
                kv_cache_cpu["index_k_scale"][i].to(self.device).view(torch.float32).reshape(n),
            )


# The trusted kernel bodies (dispatch.pick): the pool's methods checked their arguments, and the
# byte views of the index buffer are the pool's own.
def _transfer_rows(
    src: torch.Tensor, dst: torch.Tensor, src_rows: torch.Tensor, dst_rows: torch.Tensor
) -> None:
    """``dst[dst_rows] = src[src_rows]`` (byte rows)."""
    pick("transfer_rows", "auto", src, dst, src_rows)([src], [dst], src_rows, dst_rows)


def _copy_rows(buffers: Sequence[torch.Tensor], tgt: torch.Tensor, src: torch.Tensor) -> None:
    """Rows ``tgt`` of every buffer get the old rows ``src`` (overlap-safe)."""
    pick("copy_all_layer_kv_cache", "auto", buffers[0], tgt, src)(buffers, tgt, src)
