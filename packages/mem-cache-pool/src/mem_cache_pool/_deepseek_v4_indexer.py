"""``DeepSeekV4IndexerPool``: page-major lightning-indexer keys with fp32 scales (private;
re-exported by :mod:`mem_cache_pool.deepseek_v4`)."""

from __future__ import annotations

import torch

from mem_cache_kernels import checks
from mem_cache_kernels.checks import check_dtype
from mem_cache_pool._checks import check_copy_layers, check_copy_roles, check_rows
from mem_cache_pool._page_row_pool import PageRowPool
from mem_cache_pool.base import CpuKVCopy, KVWriteLoc, _write_slots

__all__ = ["DeepSeekV4IndexerPool", "check_index_head_dim"]

_SCALE_BYTES = 4  # one float32 scale per token


def check_index_head_dim(name: str, value: object) -> int:
    """An indexer head dim: an int, a positive multiple of 8."""
    dim = checks.check_int(name, value, minimum=8)
    if dim % 8:
        raise ValueError(f"{name} must be a multiple of 8, got {dim}")
    return dim


class DeepSeekV4IndexerPool(PageRowPool):
    """Indexer key cache: per layer uint8 ``[num_pages, page_size * (key_bytes + 4)]``.

    ``key_bytes = index_head_dim`` (fp8 e4m3 keys) or ``index_head_dim // 2`` with
    ``use_fp4=True`` (two fp4 values per byte, stored verbatim). A page row is
    ``[key_0 .. key_{ps-1}][scale_0 .. scale_{ps-1}]``: the first ``ps * key_bytes`` bytes hold
    the keys of the page's tokens, the trailing ``ps * 4`` bytes their float32 scales.

    Args (SGLang order): ``size``, ``page_size``, ``dtype`` (the key dtype,
    ``torch.float8_e4m3fn``), ``index_head_dim`` (a multiple of 8), ``layer_num``, ``device``,
    ``enable_memory_saver``, ``start_layer``, ``end_layer``; keyword ``use_fp4``, ``debug``.
    Writes :meth:`set_index_k_scale_buffer`; reads :meth:`get_index_k_scale_buffer` and
    :meth:`get_key_buffer` (page rows). Bulk ops are token-granular (``key_bytes + 4`` bytes).
    """

    def __init__(  # noqa: PLR0917 (SGLang-compatible positional signature)
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        index_head_dim: int,
        layer_num: int,
        device: str | torch.device,
        enable_memory_saver: bool = False,
        start_layer: int | None = None,
        end_layer: int | None = None,
        *,
        use_fp4: bool = False,
        debug: bool = False,
    ) -> None:
        if check_dtype("dtype", dtype) != torch.float8_e4m3fn:
            raise ValueError(f"dtype must be torch.float8_e4m3fn (indexer keys), got {dtype}")
        check_index_head_dim("index_head_dim", index_head_dim)
        self.index_head_dim = index_head_dim
        self.use_fp4 = bool(use_fp4)
        self.key_bytes = index_head_dim // 2 if use_fp4 else index_head_dim
        self.token_bytes = self.key_bytes + _SCALE_BYTES
        ps = checks.check_int("page_size", page_size, minimum=1)
        super().__init__(
            size,
            page_size,
            dtype,
            layer_num,
            device,
            enable_memory_saver,
            start_layer,
            end_layer,
            page_bytes=ps * self.token_bytes,
            debug=debug,
        )

    def _views(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Key bytes ``[pages, ps, key_bytes]`` and scale bytes ``[pages, ps, 4]`` of a layer."""
        buf, ps, kb = self.kv_buffer[index], self.page_size, self.key_bytes
        keys = buf[:, : ps * kb].view(self.num_pages, ps, kb)
        scales = buf[:, ps * kb :].view(self.num_pages, ps, _SCALE_BYTES)
        return keys, scales

    def set_index_k_scale_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor | KVWriteLoc,
        index_k: torch.Tensor,
        index_k_scale: torch.Tensor,
    ) -> None:
        """Write keys ``index_k`` (fp8 or uint8 ``[n, key_bytes]``) and float32 scales
        ``index_k_scale`` (``[n]`` or ``[n, 1]``) at slots ``loc``. Validates first."""
        self._set_index_k_scale(layer_id, "loc", loc, index_k, index_k_scale)

    def _set_index_k_scale(
        self,
        layer_id: int,
        name: str,
        loc: torch.Tensor | KVWriteLoc,
        index_k: torch.Tensor,
        index_k_scale: torch.Tensor,
    ) -> None:
        """:meth:`set_index_k_scale_buffer` with the slot argument called ``name``."""
        index = self.layer_index(layer_id)
        slots = self._check_slots(name, _write_slots(name, loc))
        n = slots.numel()
        k = check_rows(
            "index_k", index_k, (n, self.key_bytes), self.device, dtypes=(self.dtype, torch.uint8)
        )
        if isinstance(index_k_scale, torch.Tensor) and index_k_scale.dim() == 2:
            index_k_scale = index_k_scale.reshape(-1)
        scale = check_rows(
            "index_k_scale", index_k_scale, (n,), self.device, dtypes=(torch.float32,)
        )
        if not n:
            return
        keys, scales = self._views(index)
        page, off = slots // self.page_size, slots % self.page_size
        keys[page, off] = k.view(torch.uint8)
        scales[page, off] = scale.contiguous().view(torch.uint8).view(n, _SCALE_BYTES)

    def set_kv_buffer(
        self,
        layer: object,
        loc: torch.Tensor | KVWriteLoc,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
    ) -> None:
        """Not supported: write keys with :meth:`set_index_k_scale_buffer`."""
        raise NotImplementedError(
            "DeepSeekV4IndexerPool stores keys with scales: use set_index_k_scale_buffer"
        )

    def get_index_k_scale_buffer(
        self, layer_id: int, loc: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys [n, key_bytes], scales float32 [n])`` of slots ``loc`` (copies; keys viewed
        as fp8 unless ``use_fp4``). Waits once for the layer."""
        index = self._wait_layer(layer_id)
        rows = self._gather(index, self._check_slots("loc", loc))
        keys = rows[:, : self.key_bytes].contiguous()
        scales = rows[:, self.key_bytes :].contiguous().view(torch.float32).reshape(-1)
        return (keys if self.use_fp4 else keys.view(self.dtype)), scales

    # ---------------------------------------------------------------- token-granular helpers
    def _gather(self, index: int, slots: torch.Tensor) -> torch.Tensor:
        keys, scales = self._views(index)
        page, off = slots // self.page_size, slots % self.page_size
        return torch.cat([keys[page, off], scales[page, off]], dim=1)

    def _scatter(self, index: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        keys, scales = self._views(index)
        page, off = slots // self.page_size, slots % self.page_size
        keys[page, off] = rows[:, : self.key_bytes]
        scales[page, off] = rows[:, self.key_bytes :]

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Every layer: tokens ``tgt_loc`` get the keys and scales of tokens ``src_loc``."""
        tgt = self._check_slots("tgt_loc", tgt_loc)
        checks.check_distinct("tgt_loc", tgt, full=self.debug)
        src = self._check_slots("src_loc", src_loc, length=tgt.numel())
        for index in range(self.layer_num):
            self._scatter(index, tgt, self._gather(index, src))

    def get_cpu_copy(
        self,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> CpuKVCopy:
        """``{"kv": [per-layer CPU uint8 [n, key_bytes + 4]]}`` (keys then scale bytes)."""
        idx = self._check_slots("indices", indices)
        return {"kv": [self._gather(i, idx).cpu() for i in range(self.layer_num)]}

    def _check_cpu_copy(
        self, kv_cache_cpu: CpuKVCopy, idx: torch.Tensor, arg: str = "kv_cache_cpu"
    ) -> None:
        """Check that ``kv_cache_cpu`` is ``{"kv": layer_num x uint8 [n, bytes]}``."""
        copy = check_copy_roles(kv_cache_cpu, ["kv"])
        want = (idx.numel(), self.token_bytes)
        check_copy_layers("kv_cache_cpu['kv']", copy["kv"], self.layer_num, torch.uint8, want)

    def load_cpu_copy(
        self,
        kv_cache_cpu: CpuKVCopy,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> None:
        """Write a :meth:`get_cpu_copy` result at distinct slots ``indices`` (checked first)."""
        idx = self._check_slots("indices", indices)
        checks.check_distinct("indices", idx, full=self.debug)
        self._check_cpu_copy(kv_cache_cpu, idx)
        for i, t in enumerate(kv_cache_cpu["kv"]):
            self._scatter(i, idx, t.to(self.device))
