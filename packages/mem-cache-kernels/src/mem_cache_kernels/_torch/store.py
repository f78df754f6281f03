"""Torch reference of the KV store ops (``store_kv``, ``set/get_mla_kv_buffer``)."""

from __future__ import annotations

import torch

from mem_cache_kernels import _movement
from mem_cache_kernels._torch.jobs import run_jobs

__all__ = ["get_mla_kv_buffer", "set_mla_kv_buffer", "store_kv"]


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
    _movement.store_kv(run_jobs, k_cache, v_cache, loc, k, v, dtype)


def set_mla_kv_buffer(
    kv_buffer: torch.Tensor,
    loc: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
) -> None:
    """``kv_buffer[loc, ..., :nope] = k_nope``; ``kv_buffer[loc, ..., nope:] = k_rope``."""
    _movement.set_mla_kv_buffer(run_jobs, kv_buffer, loc, k_nope, k_rope, dtype)


def get_mla_kv_buffer(
    kv_buffer: torch.Tensor, loc: torch.Tensor, nope_dim: int, *, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather ``(kv_buffer[loc, ..., :nope_dim], kv_buffer[loc, ..., nope_dim:])``."""
    return _movement.get_mla_kv_buffer(run_jobs, kv_buffer, loc, nope_dim, dtype)
