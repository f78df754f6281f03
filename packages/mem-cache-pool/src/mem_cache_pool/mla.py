"""``MLATokenToKVPool``: one latent row per token and layer (mirrors SGLang's MLA pool)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels import checks
from mem_cache_kernels.dispatch import pick
from mem_cache_pool._checks import check_rows
from mem_cache_pool.base import PADDING_SLOT, KVCache, KVWriteLoc, _write_slots

__all__ = ["MLATokenToKVPool"]


class MLATokenToKVPool(KVCache):
    """Multi-head latent attention pool: per layer ``kv_buffer[l]`` ``[size + page_size, 1,
    kv_cache_dim]`` (store dtype, zero-initialised).

    ``kv_cache_dim = kv_lora_rank + qk_rope_head_dim`` unless ``override_kv_cache_dim`` is given
    (a packed row, e.g. DSA fp8: 656 bytes). A row is ``[nope (kv_lora_rank) | rope]``.
    ``get_key_buffer`` returns the whole row, ``get_value_buffer`` its first ``kv_lora_rank``
    elements (views). ``get_kv_size_bytes()`` returns one int. Descriptor role: ``("kv",)``.

    SGLang arguments: ``use_dsa`` (the pool is the latent part of a DSA pool; sets
    ``use_dsa`` and, with an fp8 ``dtype`` and an override, ``dsa_kv_cache_store_fp8`` as
    SGLang does; SGLang applies ``override_kv_cache_dim`` only then, ours whenever given, which
    is how :class:`DSATokenToKVPool` sizes its rows); ``dcp_replicated`` (decode context
    parallel: not provided, must be False; with DCP off SGLang writes rows as given, so do we).
    """

    write_loc_is_dcp_resolved: bool = False
    """SGLang: whether write locs arrive with the DCP owner rule resolved. DCP is not provided
    (one rank): locs are plain slots either way; False as in SGLang's MLA pool."""
    kv_scale_buffer: list[torch.Tensor] | None = None
    """Per-layer scale buffers of SGLang's FP4 MLA pool: None (not quantized)."""

    def __init__(  # noqa: PLR0917 (SGLang-compatible positional signature)
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str | torch.device,
        enable_memory_saver: bool = False,
        start_layer: int | None = None,
        end_layer: int | None = None,
        use_dsa: bool = False,
        override_kv_cache_dim: int | None = None,
        dcp_replicated: bool = False,
        *,
        debug: bool = False,
    ) -> None:
        if dcp_replicated:
            raise NotImplementedError(
                "dcp_replicated (decode context parallel) is not provided by mem_cache_pool"
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
            debug=debug,
        )
        self.use_dsa = bool(use_dsa)
        self.dcp_replicated = False
        self.dsa_kv_cache_store_fp8 = (
            self.use_dsa and self.dtype == torch.float8_e4m3fn and override_kv_cache_dim is not None
        )
        self.kv_lora_rank = checks.check_int("kv_lora_rank", kv_lora_rank, minimum=1)
        # a row is [nope | rope] with both parts non-empty
        if override_kv_cache_dim is None:
            self.qk_rope_head_dim = checks.check_int(
                "qk_rope_head_dim", qk_rope_head_dim, minimum=1
            )
            self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        else:
            self.qk_rope_head_dim = checks.check_int(
                "qk_rope_head_dim", qk_rope_head_dim, minimum=0
            )
            self.kv_cache_dim = checks.check_int(
                "override_kv_cache_dim", override_kv_cache_dim, minimum=kv_lora_rank + 1
            )
        self.kv_buffer = [
            torch.zeros(
                (self.num_rows, 1, self.kv_cache_dim), dtype=self.store_dtype, device=self.device
            )
            for _ in range(layer_num)
        ]
        self.data_ptrs = self.get_buffer_desc().data_ptrs
        self.model_layer_ids = tuple(range(self.start_layer, self.start_layer + self.layer_num))
        self._finalize_allocation()

    def _role_buffers(self) -> tuple[tuple[str, Sequence[torch.Tensor]], ...]:
        return (("kv", self.kv_buffer),)

    def _view(self, buf: torch.Tensor) -> torch.Tensor:
        return buf.view(self.dtype) if self.store_dtype != self.dtype else buf

    def _get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.kv_buffer[layer_id - self.start_layer])

    def _get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.kv_buffer[layer_id - self.start_layer])[..., : self.kv_lora_rank]

    def get_kv_size_bytes(self) -> int:
        """Bytes of the latent buffers summed over layers."""
        return sum(t.numel() * t.element_size() for t in self.kv_buffer)

    # The write and read methods accept the common argument forms inline and hand anything else
    # to the pool's full checks (:mod:`mem_cache_pool._checks`), which raise naming the argument
    # (or accept an unusual valid form); either way each argument is checked once, at the
    # public method, and the trusted kernel body (``dispatch.pick``) runs unchecked below it.
    def _local_layer(self, layer: object, layer_id_override: object = None) -> int:
        """Local index of a call's layer (``layer_id_override`` when given, else ``layer``)."""
        lid = layer if layer_id_override is None else layer_id_override
        lid = getattr(lid, "layer_id", lid)
        if type(lid) is not int or not self.start_layer <= lid < self.end_layer:
            return self._write_layer(layer, layer_id_override)
        return lid - self.start_layer

    def _device_loc(self, name: str, loc: torch.Tensor) -> torch.Tensor:
        """Validated slots to write/read (HiSparse translates logical locations here)."""
        t = checks.check_index(name, loc, device=self.device)
        checks.check_index_values(name, t, limit=self.size + self.page_size, full=self.debug)
        return t

    def _write_loc(self, loc_info: object) -> torch.Tensor:
        slots = loc_info.loc if isinstance(loc_info, KVWriteLoc) else loc_info
        if not isinstance(slots, torch.Tensor):
            return self._device_loc("loc_info", _write_slots("loc_info", loc_info))  # raises
        return self._device_loc("loc_info", slots)

    def set_kv_buffer(
        self,
        layer: object,
        loc_info: torch.Tensor | KVWriteLoc,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor | None = None,
        layer_id_override: int | None = None,
    ) -> None:
        """Write packed rows ``cache_k`` ``[n, 1, kv_cache_dim]`` at slots ``loc_info`` ``[n]``.

        ``layer``: a layer object with an int ``layer_id`` (SGLang's ``RadixAttention``) or an
        int; ``layer_id_override`` replaces its id.
        ``cache_v`` is ignored (MLA has no separate value). Inputs in another floating dtype
        are cast to ``dtype``. Slot 0 (padding) is written like any other slot, as SGLang
        0.5.23's packed-row store does (only :meth:`set_mla_kv_buffer` skips it). Validates
        before writing; mutates rows ``loc`` of one layer.
        """
        index = self._local_layer(layer, layer_id_override)
        slots = self._write_loc(loc_info)
        n = slots.shape[0]
        k = _rows("cache_k", cache_k, (n, 1, self.kv_cache_dim), self.device)
        if n:
            nd = self.kv_lora_rank
            buf = self.kv_buffer[index]
            nope, rope = k[..., :nd], k[..., nd:]
            pick("set_mla_kv_buffer", "auto", buf, slots, nope, rope)(
                buf, slots, nope, rope, self.dtype
            )

    def set_mla_kv_buffer(
        self,
        layer: object,
        loc_info: torch.Tensor | KVWriteLoc,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
        layer_id_override: int | None = None,
    ) -> None:
        """Write ``cache_k_nope`` ``[n, 1, kv_lora_rank]`` and ``cache_k_rope`` ``[n, 1,
        kv_cache_dim - kv_lora_rank]`` into the two halves of rows ``loc`` (no concatenation).

        ``layer``: a layer object with an int ``layer_id`` or an int; ``layer_id_override``
        replaces its id. Inputs in another floating dtype are cast to ``dtype``.

        Entries of ``loc`` that are (or, for HiSparse, translate to) device slot 0, the padding
        slot, are skipped, as SGLang 0.5.23's ``set_mla_kv_buffer`` kernels do: slot 0 keeps its
        contents. Validates before writing; mutates rows ``loc`` of one layer.
        """
        index = self._local_layer(layer, layer_id_override)
        slots = self._write_loc(loc_info)
        n = slots.shape[0]
        nope = _rows("cache_k_nope", cache_k_nope, (n, 1, self.kv_lora_rank), self.device)
        rope_dim = self.kv_cache_dim - self.kv_lora_rank
        rope = _rows("cache_k_rope", cache_k_rope, (n, 1, rope_dim), self.device)
        if n:
            buf = self.kv_buffer[index]
            # the padding rule, decided here once: slot 0 becomes -1, a row the store skips
            loc = slots.masked_fill(slots == PADDING_SLOT, -1)
            pick("set_mla_kv_buffer", "auto", buf, loc, nope, rope)(
                buf, loc, nope, rope, self.dtype
            )

    def get_mla_kv_buffer(
        self, layer: object, loc: torch.Tensor, dst_dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Gather rows ``loc`` into new tensors ``(nope [n, 1, kv_lora_rank], rope [n, 1,
        kv_cache_dim - kv_lora_rank])``; ``rope`` is None when that width is 0 (SGLang: when
        ``qk_rope_head_dim == 0``).

        ``layer``: a layer object with an int ``layer_id`` or an int. The rows are returned in
        ``dtype`` (bit-exact), or cast to ``dst_dtype`` when given. Waits once for the layer.
        Does not mutate the pool.
        """
        if dst_dtype is not None and not isinstance(dst_dtype, torch.dtype):
            checks.check_dtype_arg("dst_dtype", dst_dtype)  # raises
        index = self._local_layer(layer)
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(index)
        slots = self._device_loc("loc", loc)
        view = self.dtype if self.store_dtype != self.dtype else None
        buf = self.kv_buffer[index]
        nope, rope = pick("get_mla_kv_buffer", "auto", buf, slots)(
            buf, slots, self.kv_lora_rank, view
        )
        if dst_dtype is not None and dst_dtype != nope.dtype:
            nope, rope = nope.to(dst_dtype), rope.to(dst_dtype)
        if rope.shape[-1] == 0:
            return nope, None
        return nope, rope

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """``(data_ptrs, data_lens, item_lens)`` of the per-layer latent buffers for PD KV
        transfer: base address, whole-buffer bytes, one page's bytes (SGLang's values)."""
        ptrs = [t.data_ptr() for t in self.kv_buffer]
        lens = [t.numel() * t.element_size() for t in self.kv_buffer]
        items = [t[0].numel() * t.element_size() * self.page_size for t in self.kv_buffer]
        return ptrs, lens, items


def _rows(name: str, t: object, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Rows to write: a floating tensor of exactly ``shape`` on ``device`` (else
    :func:`~mem_cache_pool._checks.check_rows` raises naming ``name``)."""
    if (
        isinstance(t, torch.Tensor)
        and t.shape == shape
        and t.dtype.is_floating_point
        and checks.same_device(t.device, device)
    ):
        return t
    return check_rows(name, t, shape, device)
