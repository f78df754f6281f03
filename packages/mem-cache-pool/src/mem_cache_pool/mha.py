"""``MHATokenToKVPool``: per-layer K and V buffers (mirrors SGLang's ``MHATokenToKVPool``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mem_cache_kernels import checks
from mem_cache_kernels.dispatch import pick
from mem_cache_pool._checks import check_rows, check_scale
from mem_cache_pool.base import PADDING_SLOT, KVCache, KVWriteLoc, _write_slots

__all__ = ["MHATokenToKVPool"]


class MHATokenToKVPool(KVCache):
    """Multi-head attention pool: per layer ``k_buffer[l]`` ``[size + page_size, head_num,
    head_dim]`` and ``v_buffer[l]`` ``[size + page_size, head_num, v_head_dim]`` (store dtype,
    zero-initialised), NHD layout (``kv_cache_layout == "nhd"``).

    Layout (SGLang 0.5.23): when K and V rows have the same shape (``v_head_dim == head_dim``),
    each layer's K and V are the two block-aligned halves of **one** allocation
    ``[2, ceil(rows / page_size) * page_size, head_num, head_dim]``: ``k_buffer[l]`` is
    ``fused[0, :rows]`` and ``v_buffer[l]`` is ``fused[1, :rows]`` (each contiguous, with its
    standalone shape and strides), so V's base is ``padded_rows * row_bytes`` after K's and a
    paged kernel with one pool base reaches V by a block offset. Otherwise K and V are separate
    allocations.

    Args (SGLang order): ``size, page_size, dtype, head_num, head_dim, layer_num, device,
    enable_memory_saver``, then optional ``v_head_dim`` (default ``head_dim``);
    ``swa_head_num`` / ``swa_head_dim`` / ``swa_v_head_dim`` (when given they replace
    ``head_num`` / ``head_dim`` / ``v_head_dim``, as SGLang builds a window sub-pool);
    ``start_layer``, ``end_layer``; ``enable_alt_stream`` (SGLang writes V on a second CUDA
    stream during graph capture; these pools issue one write, so no stream is created and
    ``alt_stream`` is None); ``enable_kv_cache_copy`` (SGLang pre-tunes its Triton slot copy;
    ``move_kv_cache`` here needs no set-up, so accepted with no effect); ``kv_cache_layout``
    (``None`` or ``"nhd"``; HND / vectorized 5-D layouts are not provided: ``ValueError``);
    ``quant_method`` (``None`` or an unquantized method, ``name == "unquantized"``; FP4 / MXFP8
    quantized pools are not provided: ``NotImplementedError``); ``post_capture_active``
    (CUDA-graph post-capture VMM backing is not provided: ``True`` raises
    ``NotImplementedError``); ``allocation_label`` (names the pool); keyword ``debug``.

    ``get_kv_size_bytes()`` returns ``(k_bytes, v_bytes)``. Buffer descriptor roles:
    ``("k", "v")``.
    """

    hicache_write_back_staging: tuple[torch.Tensor, torch.Tensor] | None = None
    """SGLang: a staging pair for HiCache write-back of quantized pools; None here."""
    k_scale_buffer: list[torch.Tensor] | None = None
    """Per-layer K scale buffers of a quantized (FP4/MXFP8) pool: None (not quantized)."""
    v_scale_buffer: list[torch.Tensor] | None = None
    """Per-layer V scale buffers of a quantized pool: None (not quantized)."""
    native_k_scale_buffer: list[torch.Tensor] | None = None
    """Native-kernel K scales of a quantized pool: None (not quantized)."""
    native_v_scale_buffer: list[torch.Tensor] | None = None
    """Native-kernel V scales of a quantized pool: None (not quantized)."""
    dq_k_buffer: torch.Tensor | None = None
    """Dequant workspace (K) of a quantized pool: None (not quantized)."""
    dq_v_buffer: torch.Tensor | None = None
    """Dequant workspace (V) of a quantized pool: None (not quantized)."""
    alt_stream: None = None
    """SGLang's second CUDA stream for V writes: None (see ``enable_alt_stream``)."""
    use_hnd: bool = False
    """HND layout (SGLang's ``SGLANG_USE_HND_KVCACHE``): not provided, False."""
    use_native_move_kv_cache: bool = False
    """SGLang's ``SGLANG_NATIVE_MOVE_KV_CACHE`` switch: False (our move has one path)."""

    def __init__(  # noqa: PLR0917 (SGLang-compatible positional signature)
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: str | torch.device,
        enable_memory_saver: bool = False,
        v_head_dim: int | None = None,
        swa_head_num: int | None = None,
        swa_head_dim: int | None = None,
        swa_v_head_dim: int | None = None,
        start_layer: int | None = None,
        end_layer: int | None = None,
        enable_alt_stream: bool = True,
        enable_kv_cache_copy: bool = False,
        kv_cache_layout: str | None = None,
        quant_method: Any = None,
        post_capture_active: bool = False,
        allocation_label: str | None = None,
        *,
        debug: bool = False,
    ) -> None:
        if kv_cache_layout not in (None, "nhd"):
            raise ValueError(
                f"kv_cache_layout must be None or 'nhd' (the only layout provided), "
                f"got {kv_cache_layout!r}"
            )
        if quant_method is not None and getattr(quant_method, "name", None) != "unquantized":
            raise NotImplementedError(
                "quantized KV cache (FP4 / MXFP8 quant_method) is not provided by "
                f"mem_cache_pool, got quant_method={type(quant_method).__name__}"
            )
        if post_capture_active:
            raise NotImplementedError(
                "post_capture_active (CUDA-graph post-capture VMM backing) is not provided by "
                "mem_cache_pool"
            )
        super().__init__(
            size,
            page_size,
            dtype,
            layer_num,
            device,
            enable_memory_saver,
            start_layer,
            end_layer,
            allocation_label,
            debug=debug,
        )
        self.enable_alt_stream = bool(enable_alt_stream)
        self.enable_kv_cache_copy = bool(enable_kv_cache_copy)
        self.kv_cache_layout = "nhd"
        self.quant_method = quant_method
        self.head_num = checks.check_int(
            "head_num", head_num if swa_head_num is None else swa_head_num, minimum=1
        )
        self.head_dim = checks.check_int(
            "head_dim", head_dim if swa_head_dim is None else swa_head_dim, minimum=1
        )
        v_dim = (
            swa_v_head_dim
            if swa_v_head_dim is not None
            else v_head_dim
            if v_head_dim is not None
            else head_dim
        )
        self.v_head_dim = checks.check_int("v_head_dim", v_dim, minimum=1)
        self.k_buffer, self.v_buffer = self._create_buffers()
        #: per layer index: the uint8 byte-row views of its k and v buffers (see _store_rows)
        self._byte_rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        desc = self.get_buffer_desc()
        # SGLang names: pointer tables (uint64, on the device) and row strides in bytes
        self.data_ptrs = desc.data_ptrs
        self.k_data_ptrs = desc.data_ptrs[:layer_num]
        self.v_data_ptrs = desc.data_ptrs[layer_num:]
        self.data_strides = torch.tensor(
            [desc.row_bytes[0]] * layer_num + [desc.row_bytes[1]] * layer_num,
            dtype=torch.int64,
            device=self.device,
        )
        self.row_dim = self.head_num * self.head_dim
        self.v_row_dim = self.head_num * self.v_head_dim
        self.model_layer_ids = tuple(range(self.start_layer, self.start_layer + self.layer_num))
        self._finalize_allocation()

    def _create_buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        rows = self.num_rows
        k_row = (self.head_num, self.head_dim)
        v_row = (self.head_num, self.v_head_dim)

        def zeros(shape: tuple[int, ...]) -> torch.Tensor:
            return torch.zeros(shape, dtype=self.store_dtype, device=self.device)

        if k_row == v_row:
            padded = -(-rows // self.page_size) * self.page_size
            fused = [zeros((2, padded, *k_row)) for _ in range(self.layer_num)]
            return [b[0, :rows] for b in fused], [b[1, :rows] for b in fused]
        return (
            [zeros((rows, *k_row)) for _ in range(self.layer_num)],
            [zeros((rows, *v_row)) for _ in range(self.layer_num)],
        )

    # ---------------------------------------------------------------- SGLang surface
    @property
    def is_quantized_kv_cache(self) -> bool:
        """False: these pools store plain (or fp8-as-uint8) rows, no FP4/MXFP8 scales."""
        return False

    @property
    def device_module(self) -> Any:
        """``torch.get_device_module(device)`` (``torch.cuda``, ``torch.cpu``, ...), as SGLang
        keeps it for its stream handling."""
        return torch.get_device_module(self.device)

    @property
    def num_pages(self) -> int:
        """Pages the buffers span, the padding page included: ``ceil((size + page_size) /
        page_size)`` (SGLang sets this for its HND layout, ``(size + page_size) //
        page_size``)."""
        return -(-self.num_rows // self.page_size)

    @property
    def post_capture_backed_bytes(self) -> int:
        """Bytes backed by post-capture VMM: 0 (the feature is not provided)."""
        return 0

    def finalize_backing(self, config: object) -> None:
        """SGLang: back the final span of a post-capture (VMM) pool. Post-capture backing is
        not provided: ``NotImplementedError`` (SGLang's call fails too on a pool built without
        ``post_capture_active``: it has no backing owner)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support finalize_backing (post-capture backing)"
        )

    def get_v_head_dim(self) -> int:
        """The value head dim of every layer (``v_head_dim``)."""
        return self.v_head_dim

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """``(data_ptrs, data_lens, item_lens)`` for PD KV transfer, per buffer in the order
        ``k[0..L-1], v[0..L-1]``: the base address, ``(size + page_size) * row_bytes`` (the
        whole buffer) and ``page_size * row_bytes`` (one page), as SGLang derives them."""
        desc = self.get_buffer_desc()
        ptrs = [t.data_ptr() for role in desc.buffers for t in role]
        lens = [self.num_rows * rb for rb in desc.row_bytes for _ in range(self.layer_num)]
        items = [self.page_size * rb for rb in desc.row_bytes for _ in range(self.layer_num)]
        return ptrs, lens, items

    def get_raw_kv_buffer(
        self, layer_id: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Raw FP4 data and scales of a quantized pool. Quantized (FP4) pools are not
        provided: ``NotImplementedError`` (SGLang raises ``RuntimeError`` for its non-FP4
        pools)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support get_raw_kv_buffer (FP4 KV cache)"
        )

    def get_dequant_workspace(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequant workspace of a quantized pool: not provided, ``NotImplementedError`` (SGLang
        raises ``RuntimeError`` for a pool without dequant buffers)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support get_dequant_workspace (FP4 KV cache)"
        )

    def get_flashinfer_dequant_workspace_kv_buffer(  # noqa: PLR0917
        self,
        layer: object,
        req_to_token: torch.Tensor,
        req_pool_indices_cpu: object,
        extend_prefix_lens_cpu: object,
        extend_seq_lens_cpu: object,
        page_size: int,
        *,
        prepare_workspace: bool,
        use_ragged: bool,
        k_cur: torch.Tensor | None = None,
        v_cur: torch.Tensor | None = None,
        layer_id_override: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """FlashInfer FP8 view of a quantized pool: quantized pools are not provided,
        ``NotImplementedError`` (SGLang raises ``RuntimeError`` for a non-quantized pool)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support get_flashinfer_dequant_workspace_kv_buffer "
            "(quantized KV cache)"
        )

    def get_flashinfer_decode_dequant_workspace_kv_buffer(
        self,
        layer: object,
        req_to_token: torch.Tensor,
        req_pool_indices: object,
        seq_lens: object,
        *,
        layer_id_override: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode-time variant: ``NotImplementedError`` (quantized pools are not provided)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support "
            "get_flashinfer_decode_dequant_workspace_kv_buffer (quantized KV cache)"
        )

    def _role_buffers(self) -> tuple[tuple[str, Sequence[torch.Tensor]], ...]:
        return (("k", self.k_buffer), ("v", self.v_buffer))

    def _view(self, buf: torch.Tensor) -> torch.Tensor:
        return buf.view(self.dtype) if self.store_dtype != self.dtype else buf

    def _get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.k_buffer[layer_id - self.start_layer])

    def _get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.v_buffer[layer_id - self.start_layer])

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """``(k_bytes, v_bytes)`` summed over layers."""
        k = sum(t.numel() * t.element_size() for t in self.k_buffer)
        v = sum(t.numel() * t.element_size() for t in self.v_buffer)
        return k, v

    def set_kv_buffer(  # noqa: PLR0917 (SGLang-compatible positional signature)
        self,
        layer: object,
        loc_info: torch.Tensor | KVWriteLoc,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
        layer_id_override: int | None = None,
        dcp_kv_mask: torch.Tensor | None = None,
    ) -> None:
        """Write ``cache_k`` ``[n, head_num, head_dim]`` and ``cache_v`` ``[n, head_num,
        v_head_dim]`` at slots ``loc_info`` ``[n]`` of layer ``layer``.

        ``layer``: SGLang's ``RadixAttention`` (anything with an int ``layer_id``) or an int;
        ``layer_id_override`` (SGLang) replaces its id (``layer`` may then be None). Inputs may
        be any floating dtype: when it differs from ``dtype`` they are divided by
        ``k_scale``/``v_scale`` (if given; unlike SGLang's in-place ``div_``, the caller's
        tensors are not modified) and cast. A ``KVWriteLoc`` writes at its ``loc``.
        ``dcp_kv_mask`` (decode context parallel) must be None: DCP is not provided
        (``NotImplementedError`` otherwise). Entries of ``loc`` equal to 0 (the padding slot,
        where CUDA-graph padded tokens write) are skipped, as SGLang 0.5.23's CUDA
        ``store_cache`` kernel does: slot 0 keeps its contents. Validates everything before
        writing; mutates rows ``loc`` of one layer.
        """
        if dcp_kv_mask is not None:
            raise NotImplementedError("dcp_kv_mask (decode context parallel) is not provided")
        # The common forms are accepted inline; anything else goes to the pool's full check,
        # which raises naming the argument (or accepts an unusual valid form, e.g. an int
        # subclass). Either way each argument is checked once, here.
        if not (k_scale is None or isinstance(k_scale, (float, torch.Tensor))):
            check_scale("k_scale", k_scale)
        if not (v_scale is None or isinstance(v_scale, (float, torch.Tensor))):
            check_scale("v_scale", v_scale)
        start = self.start_layer
        lid = layer if layer_id_override is None else layer_id_override
        lid = getattr(lid, "layer_id", lid)
        if type(lid) is not int or not start <= lid < self.end_layer:
            lid = self._write_layer(layer, layer_id_override) + start
        slots = loc_info.loc if isinstance(loc_info, KVWriteLoc) else loc_info
        device = self.device
        cpu = device.type == "cpu"  # CPU operands are recognised without building devices
        if not (
            cpu
            and type(slots) is torch.Tensor
            and slots.is_cpu
            and slots.dtype in checks.INDEX_DTYPES
            and slots.dim() == 1
        ):
            if not isinstance(slots, torch.Tensor):
                _write_slots("loc_info", loc_info)  # raises: not a tensor nor a KVWriteLoc
            checks.check_index("loc_info", slots, device=device)
        n = slots.shape[0]
        rows = self.size + self.page_size
        padded = True  # may loc_info hold the padding slot? (not known on a GPU: assume so)
        if n and slots.is_cpu:  # values free to read: one pass gives both answers
            lo, hi = checks.host_bounds(slots)
            if lo < 0 or hi >= rows:
                checks.check_index_values("loc_info", slots, limit=rows)  # raises
            padded = lo == PADDING_SLOT
        else:
            checks.check_index_values("loc_info", slots, limit=rows, full=self.debug)
        k, v = cache_k, cache_v
        if not (
            isinstance(k, torch.Tensor)
            and k.shape == (n, self.head_num, self.head_dim)
            and k.dtype.is_floating_point
            and (k.is_cpu if cpu else checks.same_device(k.device, device))
        ):
            check_rows("cache_k", k, (n, self.head_num, self.head_dim), device)
        if not (
            isinstance(v, torch.Tensor)
            and v.shape == (n, self.head_num, self.v_head_dim)
            and v.dtype.is_floating_point
            and (v.is_cpu if cpu else checks.same_device(v.device, device))
        ):
            check_rows("cache_v", v, (n, self.head_num, self.v_head_dim), device)
        if k_scale is not None and k.dtype != self.dtype:
            k = k / k_scale
        if v_scale is not None and v.dtype != self.dtype:
            v = v / v_scale
        if n:
            index = lid - start
            k_cache, v_cache = self.k_buffer[index], self.v_buffer[index]
            # The padding rule, decided here once: slot 0 becomes -1, a row the trusted store
            # skips (SGLang's CUDA store_cache leaves slot 0 alone).
            loc = slots.masked_fill(slots == PADDING_SLOT, -1) if padded else slots
            k_rows, v_rows = self._store_rows(index, k_cache, v_cache)
            store = pick("store_kv", "auto", k_rows, v_rows, loc, k, v)
            store(k_rows, v_rows, loc, k, v, self.dtype)

    def _store_rows(
        self, index: int, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s buffers as uint8 byte rows ``[rows, row_bytes]``, the form the store
        kernel's jobs move (they take such a view as it is). Kept per layer while the layer's
        buffers keep their addresses: a write builds no view of the buffers (four tensor views,
        about 4 us of a one-token write); a buffer replaced in ``k_buffer`` / ``v_buffer`` or
        given other memory is viewed afresh. Buffers that are not contiguous are handed over as
        they are (the jobs view them)."""
        got = self._byte_rows.get(index)
        if (
            got is not None
            and got[0].data_ptr() == k_cache.data_ptr()
            and got[1].data_ptr() == v_cache.data_ptr()
        ):
            return got
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            return k_cache, v_cache
        rows = (
            k_cache.view(torch.uint8).view(k_cache.shape[0], -1),
            v_cache.view(torch.uint8).view(v_cache.shape[0], -1),
        )
        self._byte_rows[index] = rows
        return rows

    def set_kv_buffer_prefix_valid(  # noqa: PLR0917 (SGLang-compatible signature)
        self,
        layer: object,
        loc_2d: torch.Tensor,
        commit_lens: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
        layer_id_override: int | None = None,
    ) -> None:
        """Commit a prefix of each row of a 2-D write (speculative verify): ``loc_2d`` ``[B,
        T]`` slots, ``commit_lens`` ``[B]``; rows ``cache_k``/``cache_v`` ``[B * T, ...]`` in
        ``loc_2d``'s row-major order. Row ``b * T + t`` is written at ``loc_2d[b, t]`` iff
        ``t < commit_lens[b]``; the rest is dropped. Otherwise as :meth:`set_kv_buffer`
        (which it calls with the kept rows). ``ValueError`` for a ``loc_2d`` that is not 2-D, a
        ``commit_lens`` that is not ``[B]`` or row counts other than ``B * T``.
        """
        loc_t = checks.check_tensor("loc_2d", loc_2d)
        lens_t = checks.check_tensor("commit_lens", commit_lens)
        if loc_t.dim() != 2:
            raise ValueError(f"loc_2d must be rank-2, got shape {tuple(loc_t.shape)}")
        if lens_t.dim() != 1 or lens_t.shape[0] != loc_t.shape[0]:
            raise ValueError(
                f"commit_lens must have shape ({loc_t.shape[0]},), got {tuple(lens_t.shape)}"
            )
        rows = loc_t.numel()
        for name, t in (("cache_k", cache_k), ("cache_v", cache_v)):
            if checks.check_tensor(name, t).shape[0] != rows:
                raise ValueError(
                    f"{name} must have {rows} rows (loc_2d {tuple(loc_t.shape)}), "
                    f"got {tuple(t.shape)}"
                )
        offsets = torch.arange(loc_t.shape[1], device=loc_t.device)
        keep = (offsets[None, :] < lens_t.to(loc_t.device, torch.int64)[:, None]).reshape(-1)
        idx = torch.nonzero(keep).flatten()
        self.set_kv_buffer(
            layer,
            loc_t.reshape(-1).index_select(0, idx),
            cache_k.index_select(0, idx.to(cache_k.device)),
            cache_v.index_select(0, idx.to(cache_v.device)),
            k_scale,
            v_scale,
            layer_id_override=layer_id_override,
        )
