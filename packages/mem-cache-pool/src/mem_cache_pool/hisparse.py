"""``HiSparseDSATokenToKVPool``: a DSA pool whose latent rows cover only part of a larger logical
slot space (hierarchical sparse attention; mirrors SGLang's ``HiSparseDSATokenToKVPool``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels import checks
from mem_cache_kernels.dispatch import pick
from mem_cache_pool._checks import check_mapping
from mem_cache_pool.base import CpuKVCopy
from mem_cache_pool.dsa import INDEX_HEAD_DIM, DSATokenToKVPool

__all__ = ["HiSparseDSATokenToKVPool"]


class HiSparseDSATokenToKVPool(DSATokenToKVPool):
    """Latent rows for ``size`` device slots; indexer keys for ``index_buf_size`` logical slots.

    Callers address tokens by *logical* location (the full slot space of the allocator,
    ``[0, index_buf_size + page_size)``). The allocator owns a logical -> device slot mapping
    (int64 ``[index_buf_size + page_size + 1]`` on the pool's device, 0 = no device slot,
    ``mapping[-1] == -1``) and installs it with ``register_mapping``; the pool reads it.

    * ``set_kv_buffer`` / ``set_mla_kv_buffer`` / ``get_mla_kv_buffer`` take logical locations
      and translate them (writes of unmapped tokens land in the padding page).
    * Index-key methods (``set_index_k_scale_buffer``, ``get_index_k``...) take logical locations
      directly: the index buffer spans the whole logical space.
    * ``get_key_buffer`` & co. return device-slot buffers (attention kernels use device slots).
    * ``transfer_values_on_device(dst, src)`` copies latent rows between device slots.
    * ``move_kv_cache(tgt, src)`` takes logical locations: index rows move as is, latent rows at
      the translated device slots (pairs where either side is unmapped are skipped).

    Translating before ``register_mapping`` is a ``RuntimeError``. CPU copies (retraction) are
    not supported (``NotImplementedError``), as in SGLang.
    """

    full_to_hisparse_device_index_mapping: torch.Tensor | None = None

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
        index_kpool: int = 1,
        index_kpool_compress: bool = False,
        tail_extra_slots: int = 0,
        max_running_requests: int | None = None,
        skip_topk_layers: Sequence[bool] | None = None,
        host_to_device_ratio: int = 2,
        *,
        index_buf_size: int | None = None,
        debug: bool = False,
    ) -> None:
        """SGLang's arguments (see :class:`DSATokenToKVPool`); the logical space (index
        buffer) is ``size * host_to_device_ratio`` slots, as SGLang sizes it, unless the keyword
        ``index_buf_size`` gives it directly."""
        ratio = checks.check_int("host_to_device_ratio", host_to_device_ratio, minimum=1)
        if index_buf_size is None:
            index_buf_size = checks.check_int("size", size, minimum=0) * ratio
        super().__init__(
            size,
            page_size,
            kv_lora_rank,
            dtype,
            qk_rope_head_dim,
            layer_num,
            device,
            index_head_dim,
            enable_memory_saver,
            kv_cache_dim,
            start_layer,
            end_layer,
            index_buf_size,
            index_kpool,
            index_kpool_compress,
            tail_extra_slots,
            max_running_requests,
            skip_topk_layers,
            debug=debug,
        )
        self.host_to_device_ratio = ratio
        self.bytes_per_token = self.kv_cache_dim * self.store_dtype.itemsize
        """Bytes of one latent row (SGLang's copy-kernel stride)."""
        self.data_strides = torch.full_like(self.data_ptrs.view(torch.int64), self.bytes_per_token)
        """Per-layer row stride in bytes (int64, like ``data_ptrs``)."""

    # ---------------------------------------------------------------- mapping
    def register_mapping(self, full_to_hisparse_device_index_mapping: torch.Tensor) -> None:
        """Install the logical -> device slot mapping (see the class docstring)."""
        self.full_to_hisparse_device_index_mapping = check_mapping(
            "full_to_hisparse_device_index_mapping",
            full_to_hisparse_device_index_mapping,
            self.device,
            self.index_buf_size + self.page_size + 1,
            full=self.debug,
            targets=self.num_rows,
        )

    def _mapping(self) -> torch.Tensor:
        if self.full_to_hisparse_device_index_mapping is None:
            raise RuntimeError(
                "no logical -> device mapping registered: call register_mapping(mapping) before "
                "reading or writing latent rows by logical location"
            )
        return self.full_to_hisparse_device_index_mapping

    def translate_loc_to_hisparse_device(self, compressed_indices: torch.Tensor) -> torch.Tensor:
        """Device slots (int64) of logical locations of any shape (1-D slots or a 2-D page
        table), same shape; 0 where unmapped. Negative entries (padding) stay negative, as
        SGLang's kernel preserves them."""
        return self._translate_any("compressed_indices", compressed_indices)

    def _translate_any(self, name: str, indices: object) -> torch.Tensor:
        t = self._check_any_index(name, indices)
        mapping = self._mapping()
        flat = t.reshape(-1).long()
        checks.check_index_values(
            name, flat.clamp(min=0), limit=mapping.numel() - 1, full=self.debug
        )
        out = torch.where(flat < 0, flat, mapping[flat.clamp(min=0)])
        return out.reshape(t.shape)

    def _check_any_index(self, name: str, indices: object) -> torch.Tensor:
        t = checks.check_tensor(name, indices)
        if t.dtype not in checks.INDEX_DTYPES:
            raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
        checks.check_on_device(name, t, self.device)
        return t

    def translate_loc_from_full_to_hisparse_device(
        self, full_indices: torch.Tensor
    ) -> torch.Tensor:
        """Same as :meth:`translate_loc_to_hisparse_device` (full = logical ids here)."""
        return self._translate_any("full_indices", full_indices)

    def translate_loc_from_full_to_compressed(self, full_indices: torch.Tensor) -> torch.Tensor:
        """``full_indices`` itself (an int32/int64 tensor on the pool's device, any shape): a
        DSA pool's logical ids are not compressed (SGLang)."""
        return self._check_any_index("full_indices", full_indices)

    def translate_loc_to_device(self, loc: torch.Tensor) -> torch.Tensor:
        """Device slots (int64) of logical locations ``loc`` (0 where unmapped)."""
        return self._device_loc("loc", loc)

    def _device_loc(self, name: str, loc: torch.Tensor) -> torch.Tensor:
        mapping = self._mapping()
        logical = self._check_index_loc(name, loc)
        out = mapping[logical]
        if self.debug:
            checks.check_index_values(f"translated {name}", out, limit=self.num_rows, full=True)
        return out

    # ---------------------------------------------------------------- device-side moves
    def transfer_values_on_device(
        self, dst_indices: torch.Tensor, src_indices: torch.Tensor
    ) -> None:
        """Copy latent rows of device slots ``src_indices`` to ``dst_indices`` in every layer.

        Equal-length 1-D int32/int64 device-slot tensors; the two sets must not overlap (use
        ``move_kv_cache`` for overlapping moves). Mutates rows ``dst_indices`` only.
        """
        dst = self._check_loc("dst_indices", dst_indices)
        checks.check_distinct("dst_indices", dst, full=self.debug)
        src = self._check_loc("src_indices", src_indices, length=dst.numel())
        if dst.numel():
            bufs = [self.kv_buffer]
            pick("transfer_rows_all_layers", "auto", bufs[0][0], src)(bufs, bufs, src, dst)

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Move tokens ``src_loc -> tgt_loc`` (logical locations; see the class docstring)."""
        mapping = self._mapping()
        tgt = self._check_index_loc("tgt_loc", tgt_loc)
        checks.check_distinct("tgt_loc", tgt, full=self.debug)
        src = self._check_index_loc("src_loc", src_loc, length=tgt.numel())
        dev_tgt, dev_src = mapping[tgt], mapping[src]
        skip = (dev_tgt <= 0) | (dev_src <= 0)
        dev_tgt = torch.where(skip, torch.full_like(dev_tgt, -1), dev_tgt)
        dev_src = torch.where(skip, torch.full_like(dev_src, -1), dev_src)
        if self.debug:
            for name, t in (("translated tgt_loc", dev_tgt), ("translated src_loc", dev_src)):
                checks.check_index_values(name, t.clamp(min=0), limit=self.num_rows, full=True)
        if tgt.numel():
            bufs = self.kv_buffer
            pick("copy_all_layer_kv_cache", "auto", bufs[0], dev_tgt, dev_src)(
                bufs, dev_tgt, dev_src
            )
            self._move_index_rows(tgt, src)

    # ---------------------------------------------------------------- retraction
    def get_cpu_copy(
        self,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> CpuKVCopy:
        """Not supported for HiSparse pools."""
        raise NotImplementedError("HiSparseDSATokenToKVPool does not support get_cpu_copy")

    def load_cpu_copy(
        self,
        kv_cache_cpu: CpuKVCopy,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> None:
        """Not supported for HiSparse pools."""
        raise NotImplementedError("HiSparseDSATokenToKVPool does not support load_cpu_copy")
