"""``MHATokenToKVPool``: per-layer K and V buffers (mirrors SGLang's ``MHATokenToKVPool``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

import mem_cache_kernels as kernels
from mem_cache_kernels import checks
from mem_cache_pool._checks import check_rows, check_scale
from mem_cache_pool.base import KVCache, KVWriteLoc, _skip_padding_slot, unwrap_write_loc

__all__ = ["MHATokenToKVPool"]


class MHATokenToKVPool(KVCache):
    """Multi-head attention pool: per layer ``k_buffer[l]`` ``[size + page_size, head_num,
    head_dim]`` and ``v_buffer[l]`` ``[size + page_size, head_num, v_head_dim]`` (store dtype,
    zero-initialised).

    ``v_head_dim`` defaults to ``head_dim``. See :class:`KVCache` for the shared arguments.
    ``get_kv_size_bytes()`` returns ``(k_bytes, v_bytes)``. Buffer descriptor roles: ``("k", "v")``.
    """

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
        start_layer: int | None = None,
        end_layer: int | None = None,
        *,
        debug: bool = False,
    ) -> None:
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
        self.head_num = checks.check_int("head_num", head_num, minimum=1)
        self.head_dim = checks.check_int("head_dim", head_dim, minimum=1)
        self.v_head_dim = checks.check_int(
            "v_head_dim", head_dim if v_head_dim is None else v_head_dim, minimum=1
        )
        rows = self.num_rows
        self.k_buffer = [
            torch.zeros((rows, head_num, self.head_dim), dtype=self.store_dtype, device=self.device)
            for _ in range(layer_num)
        ]
        self.v_buffer = [
            torch.zeros(
                (rows, head_num, self.v_head_dim), dtype=self.store_dtype, device=self.device
            )
            for _ in range(layer_num)
        ]
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
        self._finalize_allocation()

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
        layer_id: int,
        loc: torch.Tensor | KVWriteLoc,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
        layer_id_override: int | None = None,
    ) -> None:
        """Write ``cache_k`` ``[n, head_num, head_dim]`` and ``cache_v`` ``[n, head_num,
        v_head_dim]`` at slots ``loc`` ``[n]`` of layer ``layer_id``.

        Inputs may be any floating dtype: when it differs from ``dtype`` they are divided by
        ``k_scale``/``v_scale`` (if given; the inputs are not modified) and cast. A
        ``KVWriteLoc`` writes at its ``loc``. ``layer_id_override`` (SGLang) replaces
        ``layer_id``. Entries of ``loc`` equal to 0 (the padding slot, where CUDA-graph padded
        tokens write) are skipped, as SGLang 0.5.23's ``store_cache`` kernel does: slot 0 keeps
        its contents. Validates everything before writing; mutates rows ``loc`` of one layer.
        """
        check_scale("k_scale", k_scale)
        check_scale("v_scale", v_scale)
        layer = layer_id if layer_id_override is None else layer_id_override
        index = self.layer_index(layer)
        slots = self._check_loc("loc", unwrap_write_loc(loc))
        n = slots.numel()
        k = check_rows("cache_k", cache_k, (n, self.head_num, self.head_dim), self.device)
        v = check_rows("cache_v", cache_v, (n, self.head_num, self.v_head_dim), self.device)
        if k.dtype != self.dtype and k_scale is not None:
            k = k / k_scale
        if v.dtype != self.dtype and v_scale is not None:
            v = v / v_scale
        if n:
            kernels.store_kv(
                self.k_buffer[index],
                self.v_buffer[index],
                _skip_padding_slot(slots),
                k,
                v,
                dtype=self.dtype,
            )
