"""The torch reference implementations, callable directly (the tests' oracle).

Same names and signatures as the public ops minus ``backend``. These functions **do not validate**
their arguments: library code should call ``mem_cache_kernels.<op>(..., backend="torch")``, which
validates and then runs exactly the same torch code (the ``torch`` column of
:data:`mem_cache_kernels.dispatch.TABLE`). The host-driven ``direct_*`` ops have a single
implementation and are not repeated here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels import _layout as lay
from mem_cache_kernels._torch import rows
from mem_cache_kernels._torch.alloc import alloc_decode, alloc_extend
from mem_cache_kernels._torch.req_table import get_last_loc, write_req_to_token

__all__ = [
    "alloc_decode",
    "alloc_extend",
    "backup_all_layers_to_page_first",
    "copy_all_layer_kv_cache",
    "get_last_loc",
    "get_mla_kv_buffer",
    "load_layer_from_page_first",
    "set_mla_kv_buffer",
    "store_kv",
    "transfer_rows",
    "transfer_rows_all_layers",
    "write_req_to_token",
]


def store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
) -> None:
    """``k_cache[loc] = k``, ``v_cache[loc] = v`` (cast to ``dtype``, stored as the cache dtype)."""
    lay.store_kv(rows.run_jobs, k_cache, v_cache, loc, k, v, dtype)


def set_mla_kv_buffer(
    kv_buffer: torch.Tensor,
    loc: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
) -> None:
    """``kv_buffer[loc, ..., :nope] = k_nope``; ``kv_buffer[loc, ..., nope:] = k_rope``."""
    lay.set_mla_kv_buffer(rows.run_jobs, kv_buffer, loc, k_nope, k_rope, dtype)


def get_mla_kv_buffer(
    kv_buffer: torch.Tensor, loc: torch.Tensor, nope_dim: int, *, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather ``(kv_buffer[loc, ..., :nope_dim], kv_buffer[loc, ..., nope_dim:])``."""
    return lay.get_mla_kv_buffer(rows.run_jobs, kv_buffer, loc, nope_dim, dtype)


def copy_all_layer_kv_cache(
    buffers: Sequence[torch.Tensor], tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every buffer: rows ``tgt_loc`` get the old contents of rows ``src_loc``."""
    rows.copy_all_layer_kv_cache(buffers, tgt_loc, src_loc)


def transfer_rows(
    src: Sequence[torch.Tensor],
    dst: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
) -> None:
    """One layer, layer-first both sides: ``dst[r][dst_indices] = src[r][src_indices]``."""
    lay.transfer_rows(rows.run_jobs, src, dst, src_indices, dst_indices)


def transfer_rows_all_layers(
    src: Sequence[Sequence[torch.Tensor]],
    dst: Sequence[Sequence[torch.Tensor]],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
) -> None:
    """Every layer, ``[role][layer]`` both sides."""
    lay.transfer_rows_all_layers(rows.run_jobs, src, dst, src_indices, dst_indices)


def load_layer_from_page_first(
    host: Sequence[torch.Tensor],
    device: Sequence[torch.Tensor],
    host_indices: torch.Tensor,
    device_indices: torch.Tensor,
    layer_id: int,
) -> None:
    """Page-first host ``[slots, L, *row]`` at ``layer_id`` -> device layer ``[rows, *row]``."""
    lay.load_layer_from_page_first(
        rows.run_jobs, host, device, host_indices, device_indices, layer_id
    )


def backup_all_layers_to_page_first(
    device: Sequence[Sequence[torch.Tensor]],
    host: Sequence[torch.Tensor],
    device_indices: torch.Tensor,
    host_indices: torch.Tensor,
) -> None:
    """Device layers ``[role][layer]`` -> page-first host ``[slots, L, *row]`` (every layer)."""
    lay.backup_all_layers_to_page_first(rows.run_jobs, device, host, device_indices, host_indices)
