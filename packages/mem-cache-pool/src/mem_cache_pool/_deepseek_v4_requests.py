"""SGLang 0.5.23's compress-state, request-state, buffer-info and unified-KV members of
``DeepSeekV4TokenToKVPool`` (private base of :class:`mem_cache_pool.deepseek_v4.
DeepSeekV4TokenToKVPool`; see ``_deepseek_v4_sglang`` for the convention).

Compress state: ratio-4 rings (attention and indexer) and ratio-128 rings per layer, addressed by
request slot (rows ``[r * ring, (r + 1) * ring)``); SGLang's c128 state is request-scoped (it
travels as PD request state, :meth:`request_state_transfer_indices`). The clearing members write
SGLang's empty state: kv 0, score -inf. Online c128 compression, its MTP banks and the unified
bf16 KV rows are not provided.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from mem_cache_kernels import checks
from mem_cache_pool._checks import check_slots
from mem_cache_pool._deepseek_v4_index import DeepSeekV4IndexSurface
from mem_cache_pool._deepseek_v4_layers import CompressStateLayer, clear_state_rows
from mem_cache_pool._deepseek_v4_sglang import buf_infos

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["DeepSeekV4RequestStateSurface"]

_C128 = 128
_BufInfos = tuple[list[int], list[int], list[int]]


class DeepSeekV4RequestStateSurface(DeepSeekV4IndexSurface):
    """Compress-state views, request-scoped state, PD buffer infos; unified KV answers."""

    compress_state_pools: list[CompressStateLayer | None]
    indexer_compress_state_pools: list[CompressStateLayer | None]
    num_req_slots: int

    # ---------------------------------------------------------------- compress-state views
    def get_attention_compress_states(self, layer_id: int) -> CompressStateLayer:
        """The compress-state ring view of compressed layer ``layer_id`` (waits for it;
        ``ValueError`` for a ratio-0 layer, where SGLang asserts)."""
        lid = self._layer(layer_id)
        self._wait_layer(lid)
        state = self.compress_state_pools[lid]
        if state is None:
            raise ValueError(f"layer_id {lid} has compress ratio 0 (no compress state)")
        return state

    def get_indexer_compress_states(self, layer_id: int) -> CompressStateLayer:
        """The indexer compress-state ring view of c4 layer ``layer_id`` (waits for it)."""
        lid = self._layer(layer_id)
        self._wait_layer(lid)
        state = self.indexer_compress_state_pools[lid]
        if state is None:
            raise ValueError(f"layer_id {lid} is not a ratio-4 layer (no indexer state)")
        return state

    def _c128_states(self) -> list[CompressStateLayer]:
        return [s for s in self.compress_state_pools if s is not None and s.request_scoped]

    # ---------------------------------------------------------------- request-scoped state
    def _req_slot(self, name: str, value: object) -> int:
        return checks.check_int(name, value, minimum=0, maximum=self.num_req_slots - 1)

    def clear_request_scoped_state(self, req_pool_idx: int) -> None:
        """Reset request slot ``req_pool_idx``'s c128 rings (every ratio-128 layer) to SGLang's
        empty state (kv 0, score -inf). Ratio-4 state is not request-scoped (untouched)."""
        req = self._req_slot("req_pool_idx", req_pool_idx)
        for state in self._c128_states():
            start = req * state.ring_size
            clear_state_rows(
                state, torch.arange(start, start + state.ring_size, device=self.device)
            )

    def clear_c4_req_states(self, req_pool_indices: Any) -> None:
        """No-op: SGLang clears c4 request rings only under the unified KV layout (not
        provided), and returns at once otherwise."""

    def clear_unaccepted_c128_draft_states(
        self,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        accept_lens: torch.Tensor,
        num_draft_tokens: int,
    ) -> None:
        """After a speculative verify, clear the c128 ring rows of rejected draft tokens: for
        request ``b``, draft offsets ``d`` in ``[accept_lens[b], num_draft_tokens)`` clear row
        ``req_pool_indices[b] * ring + (seq_lens[b] + d) % ring`` of every ratio-128 layer (kv 0,
        score -inf). Nothing to do (nothing read) when ``num_draft_tokens <= 1``, as SGLang."""
        drafts = checks.check_int("num_draft_tokens", num_draft_tokens)
        if drafts <= 1:  # SGLang returns before reading the tensors
            return
        req = check_slots(
            "req_pool_indices", req_pool_indices, self.device, self.num_req_slots, full=self.debug
        )
        n = req.numel()
        lens = check_slots("seq_lens", seq_lens, self.device, 2**62, full=self.debug, length=n)
        acc = check_slots("accept_lens", accept_lens, self.device, 2**62, full=self.debug, length=n)
        if not n:
            return
        offs = torch.arange(drafts, device=self.device)
        rejected = offs[None, :] >= acc.long()[:, None]
        for state in self._c128_states():
            ring = state.ring_size
            rows = req.long()[:, None] * ring + (lens.long()[:, None] + offs[None, :]) % ring
            clear_state_rows(state, rows[rejected])

    def request_state_transfer_indices(
        self, req_pool_idx: int, seq_len: int
    ) -> npt.NDArray[np.int32]:
        """PD transfer indices (numpy int32) of one request's pending c128 block: empty at a
        block boundary (``seq_len % 128 == 0``), else the ring page (128 rows, see
        :meth:`get_request_state_buf_infos`) holding token ``seq_len - 1``:
        ``req_pool_idx * (ring // 128) + ((seq_len - 1) % ring) // 128``. ``ValueError``
        without ratio-128 layers (SGLang asserts). Needs numpy, as SGLang's PD path."""
        import numpy as np

        req = self._req_slot("req_pool_idx", req_pool_idx)
        length = checks.check_int("seq_len", seq_len)
        states = self._c128_states()
        if not states:
            raise ValueError("request_state_transfer_indices: no request-scoped (c128) state")
        if length == 0 or length % _C128 == 0:
            return np.empty((0,), dtype=np.int32)
        ring = states[0].ring_size
        page = req * (ring // _C128) + ((length - 1) % ring) // _C128
        return np.array([page], dtype=np.int32)

    def get_request_state_buf_infos(self) -> _BufInfos:
        """``(data_ptrs, data_lens, item_lens)`` of the request-scoped c128 state: per
        ratio-128 layer its kv-state then its score-state buffer; one item is one 128-row ring
        page."""
        bufs = [t for s in self._c128_states() for t in (s.kv_state, s.score_state)]
        return buf_infos(bufs, _C128)

    # ---------------------------------------------------------------- online c128 (off)
    def get_online_c128_mtp_state_slot_offset(self) -> int:
        """0: no online c128 MTP banks (SGLang's answer with online c128 off)."""
        return 0

    def get_online_c128_mtp_max_draft_tokens(self) -> int:
        """0: no online c128 MTP banks."""
        return 0

    def get_online_c128_state_num_req_slots(self) -> int:
        """Request slots the c128 state covers (``online_c128_state_num_req_slots``)."""
        return self.online_c128_state_num_req_slots

    def get_online_c128_mtp_pending_seq_lens(self) -> torch.Tensor:
        """Online c128 MTP pending lengths: not provided (``online_c128_mtp_pending_seq_lens``
        is None, where SGLang asserts): ``NotImplementedError``."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support get_online_c128_mtp_pending_seq_lens "
            "(no online c128 MTP state)"
        )

    # ---------------------------------------------------------------- PD buffer infos
    def get_contiguous_buf_infos(self) -> _BufInfos:
        """``(data_ptrs, data_lens, item_lens)`` of the compressed KV regions in SGLang's PD
        order: per ratio (4, then 128) its compressed KV page buffers, then its indexer page
        buffers; one item is one page row."""
        bufs: list[torch.Tensor] = []
        for ratio, pool in self.kv_pools.items():
            if pool is not None:
                bufs.extend(pool.kv_buffer)
            index = self.index_pools.get(ratio)
            if index is not None:
                bufs.extend(index.kv_buffer)
        return buf_infos(bufs)

    def get_unified_swa_ring_buf_infos(self) -> _BufInfos:
        """``([], [], [])``: no unified KV rows (SGLang's answer with unified KV off)."""
        return [], [], []

    # ---------------------------------------------------------------- unified KV (off)
    def _unified_off(self, name: str) -> NotImplementedError:
        return NotImplementedError(
            f"{type(self).__name__} does not support {name} (no unified bf16 KV layout)"
        )

    def get_unified_kv(self, layer_id: int) -> torch.Tensor:
        """Unified KV rows: not provided (``unified_kv_pool`` is None): ``NotImplementedError``."""
        raise self._unified_off("get_unified_kv")

    def get_unified_kv_rope(self, layer_id: int) -> torch.Tensor:
        """Unified fp8 rope rows: not provided (``NotImplementedError``)."""
        raise self._unified_off("get_unified_kv_rope")

    def unified_region_buffers(self, ratio: int) -> tuple[list[torch.Tensor], int]:
        """Unified compressed regions: not provided (SGLang asserts the layout):
        ``NotImplementedError``."""
        raise self._unified_off("unified_region_buffers")

    def unified_rope_region_buffers(self, ratio: int) -> tuple[list[torch.Tensor], int] | None:
        """None (no fp8 rope half), as SGLang without ``unified_fp8``; with ``unified_fp8=True``
        ``NotImplementedError`` (SGLang asserts the unified layout)."""
        if self._unified_kv_fp8:
            raise self._unified_off("unified_rope_region_buffers")
        return None

    def set_unified_key_buffer_radix_fused_norm_rope(  # noqa: PLR0917 (SGLang's signature)
        self,
        layer_id: int,
        swa_loc: torch.Tensor,
        kv: torch.Tensor,
        kv_weight: torch.Tensor,
        eps: float,
        freqs_cis: torch.Tensor,
        positions: torch.Tensor,
    ) -> None:
        """Unified KV store: not provided (``NotImplementedError``)."""
        raise self._unified_off("set_unified_key_buffer_radix_fused_norm_rope")
