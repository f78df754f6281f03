"""Torch reference of the request-table ops (``write_req_to_token``, ``get_last_loc``).

Both ops behave like the Triton kernels on inputs the public ops reject on the CPU (and pass
through unchecked on a GPU): a request whose row is outside ``[0, rows)`` (or whose prefix is
negative) writes nothing and reads as -1, and positions at or past ``max_len`` are not written, so
a bad row index never lands in another request's row (torch would wrap -1 to the last row).
"""

from __future__ import annotations

import torch

__all__ = ["get_last_loc", "write_req_to_token"]


def _segments(lens: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For a flat concatenation of segments of ``lens``: (owner, offset-in-segment) per element."""
    ends = torch.cumsum(lens, 0)
    t = torch.arange(total, device=lens.device, dtype=torch.int64)
    owner = torch.searchsorted(ends, t, right=True)
    return owner, t - (ends - lens)[owner]


def _put(table: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor) -> None:
    """``table[rows, cols] = vals`` for the in-bounds entries only.

    On the CPU the common all-valid case costs one reduction; elsewhere the filter is a boolean
    selection (one device synchronisation: the torch path on a GPU is the no-Triton fallback).
    """
    ok = (rows >= 0) & (rows < table.shape[0]) & (cols >= 0) & (cols < table.shape[1])
    if table.device.type != "cpu" or not bool(ok.all()):
        rows, cols, vals = rows[ok], cols[ok], vals[ok]
    table[rows, cols] = vals


def write_req_to_token(  # noqa: PLR0917
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    prefix_slots: torch.Tensor | None = None,
) -> None:
    """Fill each request's row of ``req_to_token`` with its prefix slots and its new slots."""
    device = req_to_token.device
    rows = req_pool_indices.to(device=device, dtype=torch.int64)
    pre = prefix_lens.to(device=device, dtype=torch.int64)
    seq = seq_lens.to(device=device, dtype=torch.int64)
    rows = torch.where(pre >= 0, rows, -1)  # a negative prefix writes nothing (as in Triton)
    if prefix_slots is not None and prefix_slots.numel() > 0:
        owner, col = _segments(pre.clamp(min=0), prefix_slots.numel())
        vals = prefix_slots.to(device=device, dtype=req_to_token.dtype)
        _put(req_to_token, rows[owner], col, vals)
    if out_cache_loc.numel() > 0:
        owner, off = _segments(seq - pre, out_cache_loc.numel())
        vals = out_cache_loc.to(device=device, dtype=req_to_token.dtype)
        _put(req_to_token, rows[owner], pre[owner] + off, vals)


def get_last_loc(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor
) -> torch.Tensor:
    """``req_to_token[r, prefix - 1]`` as int64 per request, -1 where the prefix is empty (or the
    row / prefix lies outside the table)."""
    device = req_to_token.device
    rows = req_pool_indices.to(device=device, dtype=torch.int64)
    pre = prefix_lens.to(device=device, dtype=torch.int64)
    n_rows, max_len = req_to_token.shape
    ok = (pre > 0) & (pre <= max_len) & (rows >= 0) & (rows < n_rows)
    safe_rows = torch.where(ok, rows, 0)
    safe_cols = torch.where(ok, pre - 1, 0)
    if req_to_token.numel() == 0:
        return torch.full_like(rows, -1)
    vals = req_to_token[safe_rows, safe_cols].to(torch.int64)
    return torch.where(ok, vals, torch.full_like(vals, -1))
