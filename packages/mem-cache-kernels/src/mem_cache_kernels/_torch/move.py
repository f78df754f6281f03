"""Torch reference of ``copy_all_layer_kv_cache`` (all reads before writes, per buffer)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels import _movement
from mem_cache_kernels._torch.jobs import run_jobs

__all__ = ["copy_all_layer_kv_cache"]


def copy_all_layer_kv_cache(
    buffers: Sequence[torch.Tensor], tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every buffer: rows ``tgt_loc`` get the old contents of rows ``src_loc``."""
    _movement.copy_all_layer_kv_cache(run_jobs, buffers, tgt_loc, src_loc)
