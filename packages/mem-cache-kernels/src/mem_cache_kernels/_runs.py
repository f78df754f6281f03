"""Run detection for index pairs: maximal runs where both sides advance together.

Used by the host-driven ``direct_*`` copies and by the torch reference's CPU fast path (one slice
copy per run instead of a gather + scatter). Vectorised; the only Python loop is the caller's loop
over runs.
"""

from __future__ import annotations

import torch

__all__ = ["find_runs", "run_starts"]


def run_starts(src: torch.Tensor, dst: torch.Tensor, *, dst_step: int = 1) -> torch.Tensor:
    """Positions where a new run begins (``src`` +1 and ``dst`` +``dst_step`` otherwise).

    ``src``/``dst``: int64 tensors of equal length, no negative entries.
    """
    n = src.numel()
    brk = torch.ones(n, dtype=torch.bool, device=src.device)
    if n > 1:
        brk[1:] = (src[1:] != src[:-1] + 1) | (dst[1:] != dst[:-1] + dst_step)
    return torch.nonzero(brk, as_tuple=True)[0]


def find_runs(
    src: torch.Tensor, dst: torch.Tensor, *, dst_step: int = 1
) -> list[tuple[int, int, int]]:
    """Maximal runs ``(src_start, dst_start, length)`` of pairs where ``src`` advances by one and
    ``dst`` by ``dst_step``.

    ``src``/``dst`` are CPU int64 tensors of equal length; pairs with a negative index are dropped
    first (a dropped pair also ends a run).
    """
    keep = (src >= 0) & (dst >= 0)
    n = src.numel()
    if n == 0:
        return []
    if bool(keep.all()):
        starts = run_starts(src, dst, dst_step=dst_step)
    else:
        pos = torch.nonzero(keep, as_tuple=True)[0]
        src, dst = src[keep], dst[keep]
        if src.numel() == 0:
            return []
        brk = torch.zeros(src.numel(), dtype=torch.bool)
        brk[run_starts(src, dst, dst_step=dst_step)] = True
        brk[1:] |= pos[1:] != pos[:-1] + 1  # a dropped pair breaks the run around it
        starts = torch.nonzero(brk, as_tuple=True)[0]
    ends = torch.cat([starts[1:], torch.tensor([src.numel()])])
    return list(
        zip(src[starts].tolist(), dst[starts].tolist(), (ends - starts).tolist(), strict=True)
    )
