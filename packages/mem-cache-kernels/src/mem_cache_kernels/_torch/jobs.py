"""Torch executor of row jobs (see :mod:`mem_cache_kernels._layout`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels._layout import RowJob
from mem_cache_kernels._torch.rows import copy_rows, drop_negative, plan_runs

__all__ = ["run_jobs"]


def run_jobs(
    jobs: Sequence[RowJob], src_idx: torch.Tensor | None, dst_idx: torch.Tensor | None
) -> None:
    """Run every job with the same indices (negatives dropped and runs found once, not per job)."""
    src_idx, dst_idx = drop_negative(src_idx, dst_idx)
    runs = None
    planned = False
    if src_idx is not None and dst_idx is not None and len(jobs) > 1:
        runs = plan_runs(src_idx, dst_idx, max(src.shape[1] for src, _ in jobs))
        planned = True
    for src, dst in jobs:
        copy_rows(src, dst, src_idx, dst_idx, runs, planned=planned)
