"""Hybrid linear-attention models: request rows with a state slot, and a full-attention KV pool.

Mirrors SGLang 0.5.23's ``HybridReqToTokenPool`` and ``HybridLinearKVPool``
(``sglang.srt.mem_cache.memory_pool``):

* :class:`HybridReqToTokenPool` is a :class:`~mem_cache_pool.ReqToTokenPool` whose requests also
  own a Mamba state slot of its :class:`~mem_cache_pool.mamba.MambaPool` (``mamba_pool``), handed
  out by ``mamba_allocator``; ``req_index_to_mamba_index_mapping[row]`` is the slot of the
  request in ``row`` (what the attention backends read). With ``enable_mamba_extra_buffer`` each
  request also holds ping-pong *track* slots, where the radix cache checkpoints states.
* :class:`HybridLinearKVPool` holds KV only for the full-attention layers (an MHA or MLA pool of
  ``len(full_attention_layer_ids)`` layers) and maps global layer ids onto it; the Mamba states
  ride along in ``get_cpu_copy`` / ``load_cpu_copy`` (retraction) through ``mamba_pool``.

A request is any object with ``req.kv.req_pool_idx`` and ``req.kv.mamba_pool_idx`` (SGLang
0.5.23's ``ReqKvInfo``; also ``mamba_needs_clear`` and, with the extra buffer, the ping-pong
fields), or one carrying those attributes itself (older SGLang). ``mamba_pool_idx`` is a 0-d
int64 tensor (SGLang's convention), ``None`` when the request holds no state.

Unlike SGLang (which asserts after taking the rows), ``alloc`` checks row *and* state-slot
availability first and returns ``None`` with no state change when either is short.
Out of scope: the Qwen4-Exp PLE side states (``short_conv_layer_ids``, ``ngram_context_len``),
the int8 checkpoint pool and the ReplaySSM rings (``NotImplementedError`` when requested).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from mem_cache_kernels import checks
from mem_cache_pool._checks import layer_id_of
from mem_cache_pool._mamba_slots import MambaSlotFreeList
from mem_cache_pool.base import CpuKVCopy, KVBufferDesc, KVCache, KVWriteLoc, LayerReadyWaiter
from mem_cache_pool.mamba import MambaPool
from mem_cache_pool.mha import MHATokenToKVPool
from mem_cache_pool.mla import MLATokenToKVPool
from mem_cache_pool.req_to_token import ReqToTokenPool

__all__ = ["HybridLinearKVPool", "HybridReqToTokenPool"]


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
        if layer_transfer_counter is not None and not isinstance(
            layer_transfer_counter, LayerReadyWaiter
        ):
            raise TypeError(
                "layer_transfer_counter must implement wait_until(layer_index), got "
                f"{type(layer_transfer_counter).__name__}"
            )
        self.layer_transfer_counter = layer_transfer_counter

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


class _LayerProxy:
    """``layer`` with ``layer_id`` replaced (no mutation of the caller's object)."""

    def __init__(self, layer: Any, layer_id: int) -> None:
        self._layer = layer
        self.layer_id = layer_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._layer, name)


class HybridLinearKVPool(KVCache):
    """KV of the full-attention layers of a hybrid model; Mamba states in ``mamba_pool``.

    ``full_kv_pool`` is an :class:`MHATokenToKVPool` (or :class:`MLATokenToKVPool` with
    ``use_mla``, or the given ``full_kv_pool`` / ``full_kv_pool_class``) of
    ``len(full_attention_layer_ids)`` layers; ``full_attention_layer_id_mapping`` maps a global
    layer id to its index there. Every layer-addressed method takes global ids (``ValueError``
    for a linear-attention layer id, naming the full-attention ones) and waits once for the layer
    when a layer-transfer counter is registered. ``get_cpu_copy(indices, mamba_indices)``
    returns ``(kv_cpu, mamba_cpu)``. Not supported: ``use_dsa`` and ``quant_method``
    (``NotImplementedError``).
    """

    cpu_copy_carries_mamba = True

    def __init__(  # noqa: PLR0917 (SGLang-compatible positional signature)
        self,
        size: int,
        dtype: torch.dtype,
        page_size: int,
        head_num: int,
        head_dim: int,
        full_attention_layer_ids: Sequence[int],
        device: str | torch.device,
        mamba_pool: MambaPool,
        enable_memory_saver: bool = False,
        enable_kv_cache_copy: bool = False,
        use_mla: bool = False,
        kv_lora_rank: int | None = None,
        qk_rope_head_dim: int | None = None,
        use_dsa: bool = False,
        index_head_dim: int | None = None,
        kv_cache_dim: int | None = None,
        index_kpool: int = 1,
        index_kpool_compress: bool = False,
        tail_extra_slots: int = 0,
        max_running_requests: int | None = None,
        skip_topk_layers: list[bool] | None = None,
        start_layer: int | None = None,
        full_kv_pool_class: type | None = None,
        quant_method: Any = None,
        full_kv_pool: KVCache | None = None,
        post_capture_active: bool = False,
    ) -> None:
        if use_dsa or quant_method is not None or post_capture_active:
            raise NotImplementedError(
                "HybridLinearKVPool: use_dsa, quant_method and post_capture_active are not "
                "supported by mem_cache_pool"
            )
        if isinstance(full_attention_layer_ids, (str, bytes)) or not isinstance(
            full_attention_layer_ids, Sequence
        ):
            raise TypeError(
                "full_attention_layer_ids must be a sequence of ints, got "
                f"{type(full_attention_layer_ids).__name__}"
            )
        ids = [
            checks.check_int(f"full_attention_layer_ids[{i}]", x, minimum=0)
            for i, x in enumerate(full_attention_layer_ids)
        ]
        if not ids or len(set(ids)) != len(ids):
            raise ValueError(f"full_attention_layer_ids must be non-empty and distinct, got {ids}")
        if not isinstance(mamba_pool, MambaPool):
            raise TypeError(f"mamba_pool must be a MambaPool, got {type(mamba_pool).__name__}")
        super().__init__(size, page_size, dtype, len(ids), device, enable_memory_saver)
        self.full_layer_nums = len(ids)
        self.head_num = head_num
        self.head_dim = head_dim
        self.mamba_pool = mamba_pool
        self.use_mla = checks.check_bool("use_mla", use_mla)
        self.use_dsa = False
        self.start_layer = checks.check_int(
            "start_layer", 0 if start_layer is None else start_layer, minimum=0
        )
        self.full_kv_pool: Any
        if full_kv_pool is not None:
            if not isinstance(full_kv_pool, KVCache):
                raise TypeError(f"full_kv_pool must be a KVCache, got {type(full_kv_pool)}")
            self.full_kv_pool = full_kv_pool
        elif not self.use_mla:
            cls = full_kv_pool_class if full_kv_pool_class is not None else MHATokenToKVPool
            self.full_kv_pool = cls(
                size, page_size, dtype, head_num, head_dim, len(ids), device, enable_memory_saver
            )
        else:
            if kv_lora_rank is None or qk_rope_head_dim is None:
                raise ValueError("use_mla needs kv_lora_rank and qk_rope_head_dim, got None")
            cls = full_kv_pool_class if full_kv_pool_class is not None else MLATokenToKVPool
            self.full_kv_pool = cls(
                size,
                page_size,
                dtype,
                kv_lora_rank,
                qk_rope_head_dim,
                len(ids),
                device,
                enable_memory_saver,
            )
        self.full_kv_pool.model_layer_ids = tuple(ids)
        self.full_attention_layer_id_mapping = {layer: i for i, layer in enumerate(ids)}
        if self.use_mla:
            self.mem_usage = self.get_kv_size_bytes() / (1 << 30)
        else:
            k, v = self.get_kv_size_bytes()
            self.mem_usage = (k + v) / (1 << 30)

    # ------------------------------------------------------------------ KVCache hooks
    def _role_buffers(self) -> tuple[tuple[str, Sequence[torch.Tensor]], ...]:
        return self.full_kv_pool._role_buffers()  # type: ignore[no-any-return]

    def _get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.full_kv_pool._get_key_buffer(  # type: ignore[no-any-return]
            self._transfer_full_attention_id(layer_id)
        )

    def _get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.full_kv_pool._get_value_buffer(  # type: ignore[no-any-return]
            self._transfer_full_attention_id(layer_id)
        )

    def get_buffer_desc(self) -> KVBufferDesc:
        """The full-attention pool's buffer descriptor (its layers are dense indices)."""
        return self.full_kv_pool.get_buffer_desc()  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ layer ids
    def _transfer_full_attention_id(self, layer_id: object, name: str = "layer_id") -> int:
        return self._full_attention_layer(layer_id, name)[1]

    def _full_attention_layer(self, layer_id: object, name: str = "layer_id") -> tuple[int, int]:
        """``(global id, dense index)`` of full-attention layer ``layer_id`` (an int or a layer
        object): an int id of a full-attention layer is accepted inline, anything else is
        checked by ``layer_id_of`` (which raises naming ``name``)."""
        layer = getattr(layer_id, "layer_id", layer_id)
        if type(layer) is not int:
            layer = layer_id_of(name, layer_id)
        index = self.full_attention_layer_id_mapping.get(layer)
        if index is None:
            raise ValueError(
                f"{name}={layer} not in full attention layers: "
                f"{list(self.full_attention_layer_id_mapping)}"
            )
        return layer, index

    def layer_index(self, layer_id: object, name: str = "layer_id") -> int:
        """Dense index of global full-attention layer ``layer_id`` (an int or a layer object)."""
        return self._full_attention_layer(layer_id, name)[1]

    def _wait_for_layer(self, layer_id: int) -> None:
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(layer_id - self.start_layer)

    def _wait_layer(self, layer_id: object, name: str = "layer_id") -> int:
        layer, index = self._full_attention_layer(layer_id, name)
        self._wait_for_layer(layer)
        return index

    def register_layer_transfer_counter(
        self, layer_transfer_counter: LayerReadyWaiter | None
    ) -> None:
        """Install the waiter here; the inner pool waits for nothing (SGLang's split)."""
        super().register_layer_transfer_counter(layer_transfer_counter)
        self.full_kv_pool.register_layer_transfer_counter(None)

    def get_key_buffer(self, layer_id: int, scale: float | None = None) -> torch.Tensor:
        """Keys of global full-attention layer ``layer_id`` (waits for it)."""
        index = self._wait_layer(layer_id)
        return self.full_kv_pool._get_key_buffer(index)  # type: ignore[no-any-return]

    def get_value_buffer(self, layer_id: int, scale: float | None = None) -> torch.Tensor:
        """Values of global full-attention layer ``layer_id`` (waits for it)."""
        index = self._wait_layer(layer_id)
        return self.full_kv_pool._get_value_buffer(index)  # type: ignore[no-any-return]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys, values)`` of global full-attention layer ``layer_id``; waits once."""
        index = self._wait_layer(layer_id)
        return self.full_kv_pool._get_key_buffer(index), self.full_kv_pool._get_value_buffer(index)

    def get_v_head_dim(self) -> int:
        """Head dim of the values."""
        return int(self.full_kv_pool._get_value_buffer(self.full_kv_pool.start_layer).shape[-1])

    # ------------------------------------------------------------------ writes
    def set_kv_buffer(  # noqa: PLR0917
        self,
        layer: Any,
        loc_info: torch.Tensor | KVWriteLoc,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
        dcp_kv_mask: torch.Tensor | None = None,
    ) -> None:
        """Write K/V at ``loc_info`` for ``layer`` (a RadixAttention-like object with
        ``.layer_id``, or a global layer id) of a full-attention layer (MHA)."""
        if dcp_kv_mask is not None:
            raise NotImplementedError("HybridLinearKVPool: decode context parallel (dcp_kv_mask)")
        layer_id = layer if isinstance(layer, int) else getattr(layer, "layer_id", None)
        if layer_id is None:
            raise TypeError(
                f"layer must be a layer id or have a layer_id attribute, got {type(layer).__name__}"
            )
        index = self._transfer_full_attention_id(layer_id, "layer")
        if self.use_mla:
            self.full_kv_pool.set_kv_buffer(index, loc_info, cache_k, cache_v)
        else:
            self.full_kv_pool.set_kv_buffer(index, loc_info, cache_k, cache_v, k_scale, v_scale)

    @contextmanager
    def _transfer_id_context(self, layer: Any) -> Iterator[Any]:
        yield _LayerProxy(layer, self._transfer_full_attention_id(layer.layer_id))

    def set_mla_kv_buffer(
        self, layer: Any, loc_info: Any, cache_k_nope: torch.Tensor, cache_k_rope: torch.Tensor
    ) -> None:
        """MLA write of the latent parts (``use_mla`` only: ``NotImplementedError`` otherwise)."""
        if not self.use_mla:
            raise NotImplementedError("HybridLinearKVPool does not support set_mla_kv_buffer (MHA)")
        index = self._transfer_full_attention_id(getattr(layer, "layer_id", layer))
        self.full_kv_pool.set_mla_kv_buffer(index, loc_info, cache_k_nope, cache_k_rope)

    def get_mla_kv_buffer(
        self, layer: Any, loc: torch.Tensor, dst_dtype: torch.dtype | None = None
    ) -> Any:
        """MLA read of the latent parts (``use_mla`` only: ``NotImplementedError`` otherwise)."""
        if not self.use_mla:
            raise NotImplementedError("HybridLinearKVPool does not support get_mla_kv_buffer (MHA)")
        layer_id = getattr(layer, "layer_id", layer)
        self._wait_for_layer(layer_id)
        index = self._transfer_full_attention_id(layer_id)
        return self.full_kv_pool.get_mla_kv_buffer(index, loc, dst_dtype)

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """See :meth:`KVCache.move_kv_cache` (full-attention layers only)."""
        self.full_kv_pool.move_kv_cache(tgt_loc, src_loc)

    # ------------------------------------------------------------------ sizes and descriptors
    def get_kv_size_bytes(self) -> Any:
        """The full-attention pool's (MHA: ``(k_bytes, v_bytes)``)."""
        return self.full_kv_pool.get_kv_size_bytes()

    def get_total_bytes(self) -> int:
        """Bytes of the full-attention pool's buffers (the states are ``mamba_pool``'s)."""
        return int(self.full_kv_pool.get_total_bytes())

    def get_kv_layer_ids(self) -> list[int]:
        """Global layer ids aligned with the full-attention KV buffers (K then V for MHA)."""
        ids = list(self.full_attention_layer_id_mapping)
        return ids if self.use_mla else ids * 2

    def get_state_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """See :meth:`MambaPool.get_contiguous_buf_infos`."""
        return self.mamba_pool.get_contiguous_buf_infos()

    def get_state_dim_per_tensor(self) -> list[int]:
        """See :meth:`MambaPool.get_state_dim_per_tensor`."""
        return self.mamba_pool.get_state_dim_per_tensor()

    def get_state_layer_ids(self) -> list[int]:
        """See :meth:`MambaPool.get_state_layer_ids`."""
        return self.mamba_pool.get_state_layer_ids()

    def get_state_slice_outer_counts(self) -> list[int]:
        """See :meth:`MambaPool.get_state_slice_outer_counts`."""
        return self.mamba_pool.get_state_slice_outer_counts()

    def get_state_conv_shard_groups(self) -> list[list[int] | None]:
        """See :meth:`MambaPool.get_state_conv_shard_groups`."""
        return self.mamba_pool.get_state_conv_shard_groups()

    def maybe_get_custom_mem_pool(self) -> None:
        """``None``: no custom memory pool (SGLang's answer when the feature is off)."""
        return None

    # ------------------------------------------------------------------ retraction
    def get_cpu_copy(  # type: ignore[override]
        self,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> tuple[CpuKVCopy, Any]:
        """``(kv_cpu, mamba_cpu)``: the KV rows ``indices`` and, when ``mamba_indices`` is given,
        the states of those slots (``MambaPool.get_cpu_copy``; else ``None``)."""
        if mamba_indices is not None:
            self.mamba_pool._check_slots("mamba_indices", mamba_indices)
        kv_cpu = self.full_kv_pool.get_cpu_copy(indices)
        mamba_cpu = (
            self.mamba_pool.get_cpu_copy(mamba_indices) if mamba_indices is not None else None
        )
        return kv_cpu, mamba_cpu

    def load_cpu_copy(  # type: ignore[override]
        self,
        cache_cpu: tuple[CpuKVCopy, Any],
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> None:
        """Write a :meth:`get_cpu_copy` result back at ``indices`` (and ``mamba_indices``).
        Both parts are checked before anything is written."""
        if not isinstance(cache_cpu, tuple):
            raise TypeError(
                "cache_cpu must be the (kv_cpu, mamba_cpu) pair of get_cpu_copy, got "
                f"{type(cache_cpu).__name__}"
            )
        if len(cache_cpu) != 2:
            raise ValueError(f"cache_cpu must be a (kv_cpu, mamba_cpu) pair, got {len(cache_cpu)}")
        kv_cpu, mamba_cpu = cache_cpu
        states = mamba_indices if mamba_cpu is not None else None
        if states is not None:  # the states are checked before the KV is written
            self.mamba_pool._check_cpu_copy(mamba_cpu, states, "cache_cpu[1]", "mamba_indices")
        self.full_kv_pool.load_cpu_copy(kv_cpu, indices)
        if states is not None:
            self.mamba_pool.load_cpu_copy(mamba_cpu, states)

    # ------------------------------------------------------------------ features that are off
    # SGLang's HybridLinearKVPool forwards these to a DSA / quantised / post-capture full pool;
    # none of those exist here, so each answers what SGLang answers with the feature off.
    @property
    def post_capture_backed_bytes(self) -> int:
        """``0``: no CUDA-graph post-capture backing."""
        return 0

    def finalize_backing(self, config: Any) -> None:
        """Post-capture resize: not supported (the pool is sized at construction)."""
        raise NotImplementedError("HybridLinearKVPool.finalize_backing: no post-capture backing")

    @property
    def dsa_kv_cache_store_fp8(self) -> bool:
        """``False``: no DSA full pool."""
        return False

    @property
    def kv_cache_dim(self) -> int | None:
        """``None``: no DSA full pool."""
        return getattr(self.full_kv_pool, "kv_cache_dim", None)

    @property
    def index_head_dim(self) -> int | None:
        """``None``: no DSA index cache."""
        return None

    @property
    def quant_block_size(self) -> int | None:
        """``None``: no quantised full pool."""
        return None

    @property
    def index_kpool(self) -> int:
        """``1``: no DSA index k-pool."""
        return 1

    @property
    def index_kpool_compress(self) -> bool:
        """``False``: no DSA index k-pool."""
        return False

    @property
    def tail_extra_slots(self) -> int:
        """``0``: no DSA compress tails."""
        return 0

    @property
    def index_page_size(self) -> int:
        """The page size (no separate DSA index paging)."""
        return self.page_size

    def host_pool_decls(self) -> Any:
        """The full-attention pool's host-pool declarations (the states are the host tier's
        :class:`mem_cache_pool_host.MambaPoolHost`'s), ``()`` when it declares none."""
        decls = getattr(self.full_kv_pool, "host_pool_decls", None)
        return decls() if callable(decls) else ()

    def get_kv_buffer_shape(self) -> tuple[torch.Size, torch.Size]:
        """Shapes of one layer's K and V buffers (of the dense full-attention pool)."""
        index = self.full_kv_pool.start_layer
        k = self.full_kv_pool._get_key_buffer(index)
        v = self.full_kv_pool._get_value_buffer(index)
        return k.shape, v.shape

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """``(data_ptrs, data_lens, item_lens)`` of the full-attention KV buffers."""
        inner = getattr(self.full_kv_pool, "get_contiguous_buf_infos", None)
        if callable(inner):
            return inner()  # type: ignore[no-any-return]
        bufs = self.full_kv_pool._all_buffers()
        return (
            [t.data_ptr() for t in bufs],
            [t.numel() * t.element_size() for t in bufs],
            [t[0].numel() * t.element_size() * self.page_size for t in bufs],
        )

    def get_raw_kv_buffer(
        self, layer_id: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Quantised raw buffers: not supported (no quantised full pool)."""
        raise NotImplementedError("HybridLinearKVPool: no quantised (FP4/MXFP8) full pool")

    def get_dequant_workspace(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantised workspace: not supported (no quantised full pool)."""
        raise NotImplementedError("HybridLinearKVPool: no quantised (FP4/MXFP8) full pool")

    def get_flashinfer_dequant_workspace_kv_buffer(
        self, layer: Any, *args: Any, **kwargs: Any
    ) -> Any:
        """Quantised workspace: not supported (no quantised full pool)."""
        raise NotImplementedError("HybridLinearKVPool: no quantised (FP4/MXFP8) full pool")

    def get_flashinfer_decode_dequant_workspace_kv_buffer(
        self, layer: Any, *args: Any, **kwargs: Any
    ) -> Any:
        """Quantised workspace: not supported (no quantised full pool)."""
        raise NotImplementedError("HybridLinearKVPool: no quantised (FP4/MXFP8) full pool")

    def get_kv_scale_buffer(self, layer_id: int) -> Any:
        """MXFP8 scales: not supported (no quantised full pool)."""
        raise NotImplementedError("HybridLinearKVPool: no quantised (FP4/MXFP8) full pool")

    def _no_dsa(self, name: str) -> NotImplementedError:
        return NotImplementedError(f"HybridLinearKVPool does not support {name} (no DSA pool)")

    def set_index_k_scale_buffer(
        self, layer_id: int, loc: torch.Tensor, index_k: torch.Tensor, index_k_scale: torch.Tensor
    ) -> None:
        """DSA only: ``NotImplementedError`` (SGLang asserts ``use_dsa``)."""
        raise self._no_dsa("set_index_k_scale_buffer")

    def get_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:
        """DSA only: ``NotImplementedError`` (SGLang asserts ``use_dsa``)."""
        raise self._no_dsa("get_index_k_with_scale_buffer")

    def get_broadcastable_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:
        """DSA only: ``NotImplementedError`` (SGLang asserts ``use_dsa``)."""
        raise self._no_dsa("get_broadcastable_index_k_with_scale_buffer")

    def invalidate_index_buffer_for_layer(self, layer_id: int) -> None:
        """No-op without DSA (SGLang returns early)."""
        checks.check_int("layer_id", layer_id)

    def get_index_k_scale_buffer(
        self,
        layer_id: int,
        seq_len_tensor: torch.Tensor,
        page_indices: torch.Tensor,
        seq_len_sum: int,
        max_seq_len: int,
    ) -> Any:
        """DSA only: ``NotImplementedError`` (SGLang asserts ``use_dsa``)."""
        raise self._no_dsa("get_index_k_scale_buffer")

    def get_compress_tail_buffers(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """DSA only: ``NotImplementedError`` (SGLang asserts ``use_dsa``)."""
        raise self._no_dsa("get_compress_tail_buffers")

    def kpool_decode_update_index_cache(self, layer_id: int, *args: Any, **kwargs: Any) -> None:
        """DSA only: ``NotImplementedError`` (SGLang asserts ``use_dsa``)."""
        raise self._no_dsa("kpool_decode_update_index_cache")

    def set_compress_tail_for_request(  # noqa: PLR0917
        self,
        layer_id: int,
        req_pool_idx: torch.Tensor,
        key_tail: torch.Tensor,
        score_tail: torch.Tensor,
        n_remain: int,
        dst_logical_start: int,
    ) -> None:
        """DSA only: ``NotImplementedError`` (SGLang asserts ``use_dsa``)."""
        raise self._no_dsa("set_compress_tail_for_request")
