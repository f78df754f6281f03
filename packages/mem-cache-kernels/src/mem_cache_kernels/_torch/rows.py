"""Torch row-copy primitive shared by the store, move and transfer references.

``copy_rows(src, dst, src_idx, dst_idx)`` copies byte rows: ``dst[dst_idx[i]] = src[src_idx[i]]``
for every ``i`` where both indices are non-negative (a negative index skips the pair). ``src`` and
``dst`` are uint8 ``[rows, row_bytes]`` views (any row stride, contiguous rows, possibly on
different devices); ``None`` for an index means the identity ``0..n-1``. All reads happen
before any write, so overlapping source and target rows of one buffer are safe.
"""

from __future__ import annotations

import torch

__all__ = ["copy_rows", "drop_negative"]


def _wide(t: torch.Tensor) -> torch.Tensor:
    """Reinterpret a uint8 ``[rows, B]`` view with the widest integer element that divides it."""
    row_bytes = t.shape[1]
    for dtype in (torch.int64, torch.int32, torch.int16):
        w = dtype.itemsize
        if (
            row_bytes % w == 0
            and (t.stride(0) % w == 0 or t.shape[0] <= 1)
            and t.storage_offset() % w == 0
        ):
            return t.view(dtype)
    return t


def drop_negative(
    src_idx: torch.Tensor | None, dst_idx: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Drop the pairs where either index is negative; an identity (``None``) side becomes explicit.

    Returns the inputs unchanged when no index is negative (the common case).
    """
    given = [idx for idx in (src_idx, dst_idx) if idx is not None]
    if not given:
        return src_idx, dst_idx
    keep = given[0] >= 0
    if len(given) == 2:
        keep = keep & (given[1] >= 0).to(keep.device)
    if bool(keep.all()):
        return src_idx, dst_idx
    pos = torch.nonzero(keep, as_tuple=True)[0]

    def pick(idx: torch.Tensor | None) -> torch.Tensor:
        return pos if idx is None else idx[keep.to(idx.device)]

    return pick(src_idx), pick(dst_idx)


def copy_rows(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_idx: torch.Tensor | None,
    dst_idx: torch.Tensor | None,
) -> None:
    """Copy byte rows ``src[src_idx] -> dst[dst_idx]`` (see the module docstring)."""
    src_idx, dst_idx = drop_negative(src_idx, dst_idx)
    s, d = _wide(src), _wide(dst)
    if s.dtype != d.dtype:
        s, d = src, dst
    rows = s if src_idx is None else s.index_select(0, src_idx.to(s.device))
    if rows.device != d.device:
        rows = rows.to(d.device)
    if dst_idx is None:
        d[: rows.shape[0]].copy_(rows)
    else:
        d.index_copy_(0, dst_idx.to(device=d.device, dtype=torch.int64), rows)
