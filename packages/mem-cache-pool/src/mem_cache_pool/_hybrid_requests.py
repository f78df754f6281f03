"""``HybridReqToTokenPool``: request rows that also own a Mamba state slot (and, with SGLang's
extra buffer, ping-pong track slots); the public path is :mod:`mem_cache_pool.hybrid`."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from mem_cache_kernels import checks
from mem_cache_pool._mamba_slots import MambaSlotFreeList
from mem_cache_pool.base import LayerReadyWaiter, check_layer_waiter
from mem_cache_pool.mamba import MambaPool
from mem_cache_pool.req_to_token import ReqToTokenPool

__all__ = ["HybridReqToTokenPool"]


def _tracking_slots(*, extra_buffer: bool, overlap: bool, lazy: bool = False) -> int:
    """SGLang's ``get_mamba_tracking_slots``: initial ping-pong track slots per request."""
    if not extra_buffer:
        return 0
    if lazy:
        return 1
    return 2 if overlap else 1


def _holder(req: object, name: str) -> Any:
    kv = getattr(req, "kv", None)
    holder = kv if kv is not None and hasattr(kv, "req_pool_idx") else req
    if not hasattr(holder, "req_pool_idx") or not hasattr(holder, "mamba_pool_idx"):
        raise TypeError(
            f"{name} must be a request with kv.req_pool_idx and kv.mamba_pool_idx (SGLang "
            f"0.5.23) or req_pool_idx and mamba_pool_idx attributes, got {type(req).__name__}"
        )
    return holder


class HybridReqToTokenPool(ReqToTokenPool):
    """Request rows plus a Mamba state slot per request (see the module doc).

    Keyword arguments are SGLang's: ``size`` rows, ``mamba_size`` state slots,
    ``mamba_spec_state_size`` speculative slots, ``cache_params`` / ``mamba_layer_ids`` (for the
    :class:`MambaPool`), ``enable_mamba_extra_buffer`` (ping-pong track slots; with
    ``enable_overlap_schedule`` two per request, else one; ``enable_mamba_extra_buffer_lazy``:
    one up front), ``speculative_num_draft_tokens`` (intermediate buffers), ``start_layer`` (the
    first global layer of this pipeline stage, for the layer-transfer waits).
    """

    mamba_pool_cls = MambaPool

    def __init__(
        self,
        *,
        size: int,
        mamba_size: int,
        mamba_spec_state_size: int,
        max_context_len: int,
        device: str | torch.device,
        enable_memory_saver: bool,
        cache_params: Any,
        mamba_layer_ids: Sequence[int],
        enable_mamba_extra_buffer: bool,
        enable_mamba_extra_buffer_lazy: bool = False,
        speculative_num_draft_tokens: int | None = None,
        speculative_eagle_topk: int | None = None,
        enable_overlap_schedule: bool = True,
        start_layer: int | None = None,
        enable_linear_replayssm: bool = False,
        linear_replayssm_cache_len: int = 16,
        mamba_envelope_layout: bool = False,
        enable_linear_replayssm_spec: bool = False,
        short_conv_layer_ids: Sequence[int] | None = None,
        short_conv_state_shape: tuple[int, int] | None = None,
        ngram_context_len: int = 0,
        ngram_eos_token_id: int = 0,
    ) -> None:
        if short_conv_layer_ids or checks.check_int("ngram_context_len", ngram_context_len):
            raise NotImplementedError(
                "HybridReqToTokenPool: the Qwen4-Exp PLE side states (short_conv_layer_ids, "
                "ngram_context_len) are not supported by mem_cache_pool"
            )
        super().__init__(
            size=size,
            max_context_len=max_context_len,
            device=device,
            enable_memory_saver=enable_memory_saver,
        )
        extra = checks.check_bool("enable_mamba_extra_buffer", enable_mamba_extra_buffer)
        lazy = checks.check_bool("enable_mamba_extra_buffer_lazy", enable_mamba_extra_buffer_lazy)
        overlap = checks.check_bool("enable_overlap_schedule", enable_overlap_schedule)
        self.mamba_ping_pong_track_buffer_size = _tracking_slots(extra_buffer=True, overlap=overlap)
        self.mamba_initial_tracking_slots = _tracking_slots(
            extra_buffer=extra, overlap=overlap, lazy=lazy
        )
        self.enable_mamba_extra_buffer = extra
        self.enable_mamba_extra_buffer_lazy = lazy
        self.start_layer = checks.check_int(
            "start_layer", 0 if start_layer is None else start_layer, minimum=0
        )
        self.layer_transfer_counter: LayerReadyWaiter | None = None
        self.ple_window_cache = None
        self.short_conv_pool = None
        self.ngram_pool = None
        self.mamba_ckpt_pool = None
        self._init_mamba_pool(
            mamba_size=mamba_size,
            mamba_spec_state_size=mamba_spec_state_size,
            cache_params=cache_params,
            mamba_layer_ids=mamba_layer_ids,
            device=device,
            enable_mamba_extra_buffer=extra,
            speculative_num_draft_tokens=speculative_num_draft_tokens,
            speculative_eagle_topk=speculative_eagle_topk,
            enable_linear_replayssm=enable_linear_replayssm,
            linear_replayssm_cache_len=linear_replayssm_cache_len,
            mamba_envelope_layout=mamba_envelope_layout,
            enable_linear_replayssm_spec=enable_linear_replayssm_spec,
        )

    def _init_mamba_pool(  # noqa: PLR0917 (SGLang's positional signature)
        self,
        mamba_size: int,
        mamba_spec_state_size: int,
        cache_params: Any,
        mamba_layer_ids: Sequence[int],
        device: str | torch.device,
        enable_mamba_extra_buffer: bool,
        speculative_num_draft_tokens: int | None = None,
        speculative_eagle_topk: int | None = None,
        enable_linear_replayssm: bool = False,
        linear_replayssm_cache_len: int = 16,
        mamba_envelope_layout: bool = False,
        enable_linear_replayssm_spec: bool = False,
    ) -> None:
        # checked here, under this pool's names (the Mamba pool calls them size, spec_state_size)
        checks.check_int("mamba_size", mamba_size, minimum=0)
        checks.check_int("mamba_spec_state_size", mamba_spec_state_size, minimum=0)
        self._build_mamba_pool(
            mamba_size,
            mamba_spec_state_size,
            cache_params,
            mamba_layer_ids,
            device,
            enable_mamba_extra_buffer,
            speculative_num_draft_tokens,
            speculative_eagle_topk,
            enable_linear_replayssm,
            linear_replayssm_cache_len,
            mamba_envelope_layout,
            enable_linear_replayssm_spec,
        )

    def _build_mamba_pool(  # noqa: PLR0917
        self,
        mamba_size: int,
        mamba_spec_state_size: int,
        cache_params: Any,
        mamba_layer_ids: Sequence[int],
        device: str | torch.device,
        enable_mamba_extra_buffer: bool,
        speculative_num_draft_tokens: int | None,
        speculative_eagle_topk: int | None,
        enable_linear_replayssm: bool,
        linear_replayssm_cache_len: int,
        mamba_envelope_layout: bool,
        enable_linear_replayssm_spec: bool,
    ) -> None:
        self.mamba_pool = self.mamba_pool_cls(
            size=mamba_size,
            spec_state_size=mamba_spec_state_size,
            cache_params=cache_params,
            mamba_layer_ids=mamba_layer_ids,
            device=device,
            enable_memory_saver=self.enable_memory_saver,
            speculative_num_draft_tokens=speculative_num_draft_tokens,
            speculative_eagle_topk=speculative_eagle_topk,
            enable_linear_replayssm=enable_linear_replayssm,
            linear_replayssm_cache_len=linear_replayssm_cache_len,
            envelope_layout=mamba_envelope_layout,
            enable_linear_replayssm_spec=enable_linear_replayssm_spec,
        )
        self.mamba_allocator: Any = MambaSlotFreeList(mamba_size, device)
        self.mamba_map = {layer_id: i for i, layer_id in enumerate(self.mamba_pool.mamba_layer_ids)}
        rows = self.req_to_token.shape[0]
        self.req_index_to_mamba_index_mapping = torch.zeros(
            rows, dtype=torch.int32, device=self.device
        )
        if enable_mamba_extra_buffer:
            self.req_index_to_mamba_ping_pong_track_buffer_mapping = torch.zeros(
                (rows, self.mamba_ping_pong_track_buffer_size),
                dtype=torch.int64,
                device=self.device,
            )

    def clone_with_new_mamba(
        self,
        *,
        mamba_size: int,
        mamba_spec_state_size: int,
        cache_params: Any,
        device: str | torch.device,
        enable_mamba_extra_buffer: bool,
        draft_model_idx: int,
        speculative_num_draft_tokens: int | None = None,
        speculative_eagle_topk: int | None = None,
    ) -> HybridReqToTokenPool:
        """A shallow copy sharing the rows and the row -> slot mapping, with a fresh Mamba pool
        of the single layer ``draft_model_idx`` (multi-layer EAGLE draft workers)."""
        checks.check_int("draft_model_idx", draft_model_idx, minimum=0)
        clone = copy.copy(self)
        clone._init_mamba_pool(
            mamba_size=mamba_size,
            mamba_spec_state_size=mamba_spec_state_size,
            cache_params=cache_params,
            mamba_layer_ids=[draft_model_idx],
            device=device,
            enable_mamba_extra_buffer=enable_mamba_extra_buffer,
            speculative_num_draft_tokens=speculative_num_draft_tokens,
            speculative_eagle_topk=speculative_eagle_topk,
        )
        clone.req_index_to_mamba_index_mapping = self.req_index_to_mamba_index_mapping
        if enable_mamba_extra_buffer:
            clone.req_index_to_mamba_ping_pong_track_buffer_mapping = (
                self.req_index_to_mamba_ping_pong_track_buffer_mapping
            )
        return clone

    def register_layer_transfer_counter(
        self, layer_transfer_counter: LayerReadyWaiter | None
    ) -> None:
        """Install (``None``: remove) the per-layer readiness waiter of the host tier."""
        self.layer_transfer_counter = check_layer_waiter(layer_transfer_counter)

    # ------------------------------------------------------------------ allocation
    def alloc(self, reqs: Sequence[Any]) -> list[int] | None:  # type: ignore[override]
        """Rows for ``reqs`` (as :meth:`ReqToTokenPool.alloc`) plus a state slot for every
        request without one (``kv.mamba_pool_idx`` set to a 0-d slot tensor and
        ``kv.mamba_needs_clear = True``) and, with the extra buffer, its track slots. Writes
        ``req_index_to_mamba_index_mapping`` for every request's row. ``None`` with no state
        change when rows or state slots are short."""
        if isinstance(reqs, (int, str, bytes)) or not isinstance(reqs, Sequence):
            raise TypeError(
                "reqs must be a sequence of requests (a state slot is bound per request; use "
                f"alloc_rows for bare rows), got {type(reqs).__name__}"
            )
        holders = [_holder(r, f"reqs[{i}]") for i, r in enumerate(reqs)]
        need_slots = 0
        for i, h in enumerate(holders):
            if h.mamba_pool_idx is None:
                need_slots += 1
            else:
                self._check_slot(f"reqs[{i}].kv.mamba_pool_idx", h.mamba_pool_idx)
            if (
                self.enable_mamba_extra_buffer
                and getattr(h, "mamba_ping_pong_track_buffer", None) is None
            ):
                need_slots += self.mamba_initial_tracking_slots
        need_rows = sum(1 for h in holders if h.req_pool_idx is None)
        if need_rows > self.available_size() or need_slots > self.mamba_allocator.available_size():
            return None
        select = super().alloc(reqs)
        if select is None:  # pragma: no cover - checked above
            return None
        slots: list[torch.Tensor] = []
        tracks: list[torch.Tensor] = []
        for h in holders:
            if h.mamba_pool_idx is None:
                mid = self.mamba_allocator.alloc(1)
                if mid is None:
                    raise RuntimeError("mamba_allocator ran out of slots it reported free")
                h.mamba_pool_idx = mid[0]
                h.mamba_needs_clear = True
            slots.append(torch.as_tensor(h.mamba_pool_idx).reshape(()))
            if self.enable_mamba_extra_buffer:
                if getattr(h, "mamba_ping_pong_track_buffer", None) is None:
                    self._alloc_ping_pong_buffer(h)
                tracks.append(h.mamba_ping_pong_track_buffer)
        if select:
            rows = torch.tensor(select, dtype=torch.int64, device=self.device)
            self.req_index_to_mamba_index_mapping[rows] = torch.stack(slots).to(
                device=self.device, dtype=torch.int32
            )
            if self.enable_mamba_extra_buffer:
                self.req_index_to_mamba_ping_pong_track_buffer_mapping[rows] = torch.stack(
                    tracks
                ).to(self.device)
        return select

    def _check_slot(self, name: str, value: object) -> None:
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise TypeError(f"{name} must be a one-element slot tensor or None, got {value!r}")
        if value.dtype not in checks.INDEX_DTYPES:
            raise TypeError(f"{name} must be int32 or int64, got {value.dtype}")

    def get_mamba_indices(self, req_indices: torch.Tensor) -> torch.Tensor:
        """State slots (int32) of the requests in rows ``req_indices``."""
        idx = checks.check_index("req_indices", req_indices)
        checks.check_index_values("req_indices", idx, limit=self.size + 1)
        return self.req_index_to_mamba_index_mapping[idx.to(self.device)]

    @property
    def mamba_v2p_table(self) -> torch.Tensor | None:
        """``None``: the slots this pool hands out are physical."""
        return None

    @property
    def mamba_translate_is_fusable(self) -> bool:
        """Whether the translate is the identity or a table gather (True here)."""
        if self.mamba_v2p_table is not None:
            return True
        return type(self).translate_mamba_indices is HybridReqToTokenPool.translate_mamba_indices

    def translate_mamba_indices(self, mamba_indices: torch.Tensor) -> torch.Tensor:
        """Virtual -> physical slot translate: the identity for this static pool."""
        return checks.check_index("mamba_indices", mamba_indices)

    # ------------------------------------------------------------------ layer access
    def _wait(self, layer_id: int) -> None:
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(layer_id - self.start_layer)

    def mamba2_layer_index(self, layer_id: int) -> int:
        """Pool index of global Mamba layer ``layer_id`` (waits for its host-tier load)."""
        layer = checks.check_int("layer_id", layer_id)
        if layer not in self.mamba_map:
            raise ValueError(
                f"layer_id must be a Mamba layer {sorted(self.mamba_map)}, got {layer}"
            )
        self._wait(layer)
        return self.mamba_map[layer]

    def mamba2_layer_cache(self, layer_id: int) -> Any:
        """The state views of global Mamba layer ``layer_id``."""
        return self.mamba_pool.mamba2_layer_cache(self.mamba2_layer_index(layer_id))

    def short_conv_layer_cache(self, layer_id: int) -> torch.Tensor:
        """PLE short-conv state: not supported (no such layers here)."""
        raise NotImplementedError("HybridReqToTokenPool has no PLE short-conv layers")

    def short_conv_layer_intermediate_cache(self, layer_id: int) -> torch.Tensor | None:
        """``None``: no PLE short-conv layers (SGLang's answer when the feature is off)."""
        checks.check_int("layer_id", layer_id)
        return None

    def get_ngram_context(self, ngram_indices: torch.Tensor) -> torch.Tensor:
        """PLE n-gram context: not supported (disabled)."""
        raise NotImplementedError("HybridReqToTokenPool has no PLE n-gram pool")

    def set_ngram_context(self, ngram_indices: torch.Tensor, context: torch.Tensor) -> None:
        """PLE n-gram context: not supported (disabled)."""
        raise NotImplementedError("HybridReqToTokenPool has no PLE n-gram pool")

    def set_ngram_intermediate_context(
        self, context: torch.Tensor, indices: torch.Tensor | None = None
    ) -> None:
        """PLE n-gram context: not supported (disabled)."""
        raise NotImplementedError("HybridReqToTokenPool has no PLE n-gram pool")

    def copy_mamba_state(self, src_index: torch.Tensor, dst_index: torch.Tensor) -> None:
        """``mamba_pool.copy_from(src_index, dst_index)`` after the last Mamba layer is loaded
        (radix-cache copy-on-write of a checkpoint into a request's slot)."""
        if isinstance(src_index, torch.Tensor) and src_index.numel() == 0:
            src_index = src_index.reshape(-1)
        src, dst = self.mamba_pool._check_copy("src_index", src_index, "dst_index", dst_index)
        if src.numel():
            counter = self.layer_transfer_counter
            waits = counter is not None and getattr(counter, "consumer_index", 0) >= 0
            if waits and self.mamba_map:
                self._wait(max(self.mamba_map))
        self.mamba_pool._copy_slots(src, dst)

    def get_speculative_mamba2_params_all_layers(self) -> MambaPool.SpeculativeState:
        """See :meth:`MambaPool.get_speculative_mamba2_params_all_layers`."""
        return self.mamba_pool.get_speculative_mamba2_params_all_layers()

    def get_state_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """See :meth:`MambaPool.get_contiguous_buf_infos`."""
        return self.mamba_pool.get_contiguous_buf_infos()

    def get_state_dim_per_tensor(self) -> list[int]:
        """See :meth:`MambaPool.get_state_dim_per_tensor`."""
        return self.mamba_pool.get_state_dim_per_tensor()

    def get_state_slice_outer_counts(self) -> list[int]:
        """See :meth:`MambaPool.get_state_slice_outer_counts`."""
        return self.mamba_pool.get_state_slice_outer_counts()

    def get_state_conv_shard_groups(self) -> list[list[int] | None]:
        """See :meth:`MambaPool.get_state_conv_shard_groups`."""
        return self.mamba_pool.get_state_conv_shard_groups()

    # ------------------------------------------------------------------ ping-pong track slots
    def get_mamba_ping_pong_other_idx(self, mamba_next_track_idx: int) -> int:
        """The other ping-pong entry (``1 - i`` with two entries, ``i`` with one)."""
        checks.check_int("mamba_next_track_idx", mamba_next_track_idx, minimum=0, maximum=1)
        if self.mamba_ping_pong_track_buffer_size == 2:
            return 1 - mamba_next_track_idx
        return mamba_next_track_idx

    def get_mamba_ping_pong_keep_idx(self, req: Any) -> int:
        """The ping-pong entry holding the most recent tracked state."""
        return int(_holder(req, "req").mamba_last_track_idx)

    def _alloc_ping_pong_buffer(self, req: Any) -> None:
        h = _holder(req, "req") if not hasattr(req, "mamba_pool_idx") else req
        n = self.mamba_initial_tracking_slots
        got = self.mamba_allocator.alloc(n)
        if got is None:
            raise RuntimeError("mamba_allocator ran out of track slots it reported free")
        buf = torch.full(
            (self.mamba_ping_pong_track_buffer_size,), -1, dtype=got.dtype, device=got.device
        )
        buf[:n] = got
        h.mamba_ping_pong_track_buffer = buf
        h.mamba_ping_pong_empty = [False] * n + [True] * (
            self.mamba_ping_pong_track_buffer_size - n
        )
        h.mamba_prev_track_seqlen = None
        h.mamba_next_track_idx = 0
        h.mamba_last_track_idx = (
            0 if self.enable_mamba_extra_buffer_lazy else self.get_mamba_ping_pong_other_idx(0)
        )

    def set_mamba_ping_pong_slot(self, req: Any, idx: int, value: torch.Tensor | int) -> None:
        """Set ping-pong entry ``idx`` of ``req`` to a slot tensor (or ``-1``: empty) and
        mirror it into ``req_index_to_mamba_ping_pong_track_buffer_mapping``."""
        h = _holder(req, "req")
        size = self.mamba_ping_pong_track_buffer_size
        checks.check_int("idx", idx, minimum=-size, maximum=size - 1)  # torch's index range
        if not isinstance(value, torch.Tensor) and value != -1:  # SGLang compares with -1
            kind = TypeError if not isinstance(value, (int, float)) else ValueError
            raise kind(f"value must be a slot tensor or -1, got {value!r}")
        if isinstance(value, torch.Tensor):
            h.mamba_ping_pong_track_buffer[idx] = value
        else:
            h.mamba_ping_pong_track_buffer[idx].fill_(-1)
        self.req_index_to_mamba_ping_pong_track_buffer_mapping[h.req_pool_idx] = (
            h.mamba_ping_pong_track_buffer
        )
        h.mamba_ping_pong_empty[idx] = not isinstance(value, torch.Tensor)

    def donate_mamba_ping_pong_slot(self, req: Any, new_slot: torch.Tensor) -> torch.Tensor:
        """Hand the tracked-state slot to the radix cache (returned, shape ``[1]``) and put
        ``new_slot[0]`` in its place."""
        h = _holder(req, "req")
        if checks.check_index("new_slot", new_slot).numel() < 1:
            raise ValueError("new_slot must hold a slot, got an empty tensor")
        keep = self.get_mamba_ping_pong_keep_idx(req)
        donated: torch.Tensor = h.mamba_ping_pong_track_buffer[keep].unsqueeze(-1).clone()
        self.set_mamba_ping_pong_slot(req, keep, new_slot[0])
        return donated

    def free_mamba_cache(
        self, req: Any, mamba_ping_pong_track_buffer_to_keep: int | None = None
    ) -> None:
        """Free ``req``'s state slot (``kv.mamba_pool_idx`` back to ``None``) and, with the
        extra buffer, its track slots except entry ``mamba_ping_pong_track_buffer_to_keep``
        (donated to the radix cache). ``ValueError`` for a request holding no state slot."""
        h = _holder(req, "req")
        if h.mamba_pool_idx is None:
            raise ValueError("req.kv.mamba_pool_idx must be a held slot, got None (double free?)")
        keep = mamba_ping_pong_track_buffer_to_keep
        size = self.mamba_ping_pong_track_buffer_size
        if keep is not None and not isinstance(keep, int):  # SGLang compares: a bool passes
            raise TypeError(
                f"mamba_ping_pong_track_buffer_to_keep must be None or an int, got "
                f"{type(keep).__name__}"
            )
        if self.enable_mamba_extra_buffer and (
            keep not in (None, 0, 1) or (keep == 1 and size != 2)
        ):
            raise ValueError(f"mamba_ping_pong_track_buffer_to_keep must be None, 0 or 1 < {size}")
        self.mamba_allocator.free(torch.as_tensor(h.mamba_pool_idx).reshape(1))
        h.mamba_pool_idx = None
        if self.enable_mamba_extra_buffer:
            empty = h.mamba_ping_pong_empty or [True] * size
            positions = [p for p in range(size) if p != keep and not empty[p]]
            row = self.req_index_to_mamba_ping_pong_track_buffer_mapping[h.req_pool_idx]
            if len(positions) == size:
                self.mamba_allocator.free(row)
            else:
                for p in positions:
                    self.mamba_allocator.free(row[p : p + 1])
            h.mamba_ping_pong_track_buffer = None
            h.mamba_ping_pong_empty = None
            h.mamba_next_track_idx = None
            h.mamba_last_track_idx = None
            h.mamba_last_track_seqlen = None
            h.mamba_prev_track_seqlen = None
            h.mamba_cow_src_index = None
            h.mamba_needs_clear = False

    def clear(self) -> None:
        """Free every row and state slot; zero the row -> slot mappings."""
        super().clear()
        if hasattr(self, "mamba_allocator"):
            self.mamba_allocator.clear()
            self.req_index_to_mamba_index_mapping.zero_()
            if self.enable_mamba_extra_buffer:
                self.req_index_to_mamba_ping_pong_track_buffer_mapping.zero_()
