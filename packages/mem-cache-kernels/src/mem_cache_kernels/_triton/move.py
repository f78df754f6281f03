"""Triton ``copy_all_layer_kv_cache``: overlap-safe in two phases.

Phase 1 gathers the ``src_loc`` rows of every buffer into a temporary (one launch per row size);
phase 2 scatters them to ``tgt_loc``. Since every read finishes before the first write (two
launches on one stream), overlapping source and target rows are safe for any number of rows,
unlike a single-launch load-then-store kernel whose guarantee holds only within one program.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels import _layout as lay
from mem_cache_kernels._triton.rows import run_jobs

__all__ = ["copy_all_layer_kv_cache"]

_ALIGN = 16


def copy_all_layer_kv_cache(
    buffers: Sequence[torch.Tensor], tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every buffer: rows ``tgt_loc`` get the old contents of rows ``src_loc``."""
    n = tgt_loc.shape[0]
    if n == 0:
        return
    views = [lay.byte_rows(f"buffers[{i}]", b) for i, b in enumerate(buffers)]
    # one temporary row holds every buffer's row, each part starting on a 16-byte boundary so the
    # copies keep using the widest words the buffers allow
    widths = [-(-v.shape[1] // _ALIGN) * _ALIGN for v in views]
    tmp = torch.empty((n, sum(widths)), dtype=torch.uint8, device=views[0].device)
    parts: list[torch.Tensor] = []
    col = 0
    for v, width in zip(views, widths):
        parts.append(tmp[:, col : col + v.shape[1]])
        col += width
    # a pair with a negative index is skipped in both phases
    src = torch.where(tgt_loc < 0, -1, src_loc.to(torch.int64))
    tgt = torch.where(src_loc < 0, -1, tgt_loc.to(torch.int64))
    run_jobs(list(zip(views, parts)), src, None)
    run_jobs(list(zip(parts, views)), None, tgt)
