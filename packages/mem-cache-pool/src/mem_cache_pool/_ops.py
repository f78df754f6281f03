"""The kernel operations the pools use, as thin adapters over ``mem_cache_kernels`` (private).

TEMPORARY: while the kernels package has not exported its ops yet, each adapter falls back to an
equivalent torch expression. Once ``mem_cache_kernels`` exports them this module calls them only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

import mem_cache_kernels as _k

__all__ = [
    "copy_rows_all_layers",
    "get_mla",
    "set_mla",
    "store_kv",
    "transfer_rows",
    "transfer_rows_all_layers",
]


def _op(name: str) -> Callable[..., Any] | None:
    op = getattr(_k, name, None)
    return op if callable(op) else None


def _as_store(x: torch.Tensor, dtype: torch.dtype, store: torch.dtype) -> torch.Tensor:
    y = x.to(dtype)
    return y.view(store) if store != dtype else y


def store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    dtype: torch.dtype,
) -> None:
    """``k_cache[loc] = k``, ``v_cache[loc] = v`` (cast to ``dtype``, stored as the cache dtype)."""
    op = _op("store_kv")
    if op is not None:
        op(k_cache, v_cache, loc, k, v, dtype=dtype)
        return
    k_cache[loc] = _as_store(k, dtype, k_cache.dtype)
    v_cache[loc] = _as_store(v, dtype, v_cache.dtype)


def set_mla(
    kv_buffer: torch.Tensor,
    loc: torch.Tensor,
    nope: torch.Tensor,
    rope: torch.Tensor,
    *,
    dtype: torch.dtype,
) -> None:
    """``kv_buffer[loc, :, :nope_dim] = nope``; ``kv_buffer[loc, :, nope_dim:] = rope``."""
    op = _op("set_mla_kv_buffer")
    if op is not None:
        op(kv_buffer, loc, nope, rope, dtype=dtype)
        return
    nd = nope.shape[-1]
    kv_buffer[loc, :, :nd] = _as_store(nope, dtype, kv_buffer.dtype)
    kv_buffer[loc, :, nd:] = _as_store(rope, dtype, kv_buffer.dtype)


def get_mla(
    kv_buffer: torch.Tensor, loc: torch.Tensor, nope_dim: int, dtype: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather rows ``loc`` of ``kv_buffer`` split at ``nope_dim`` (viewed as ``dtype`` if given)."""
    op = _op("get_mla_kv_buffer")
    if op is not None:
        nope, rope = op(kv_buffer, loc, nope_dim, dtype=dtype)
        return nope, rope
    rows = kv_buffer[loc]
    if dtype is not None and dtype != rows.dtype:
        rows = rows.view(dtype)
    return rows[..., :nope_dim].contiguous(), rows[..., nope_dim:].contiguous()


def copy_rows_all_layers(
    buffers: Sequence[torch.Tensor], tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every buffer: rows ``tgt_loc`` get the old contents of rows ``src_loc``."""
    op = _op("copy_all_layer_kv_cache")
    if op is not None:
        op(buffers, tgt_loc, src_loc)
        return
    for buf in buffers:
        buf[tgt_loc] = buf[src_loc].clone()


def transfer_rows(
    src: Sequence[torch.Tensor],
    dst: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
) -> None:
    """For each role r: ``dst[r][dst_indices] = src[r][src_indices]`` (one layer)."""
    op = _op("transfer_rows")
    if op is not None:
        op(src, dst, src_indices, dst_indices)
        return
    for s, d in zip(src, dst):
        d[dst_indices.to(d.device)] = s[src_indices.to(s.device)].to(d.device)


def transfer_rows_all_layers(
    src: Sequence[Sequence[torch.Tensor]],
    dst: Sequence[Sequence[torch.Tensor]],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
) -> None:
    """``transfer_rows`` for every layer; ``src``/``dst`` are ``[role][layer]``."""
    op = _op("transfer_rows_all_layers")
    if op is not None:
        op(src, dst, src_indices, dst_indices)
        return
    for s_role, d_role in zip(src, dst):
        transfer_rows(s_role, d_role, src_indices, dst_indices)
