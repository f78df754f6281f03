"""Torch reference of the request-table ops (``write_req_to_token``, ``get_last_loc``)."""

from __future__ import annotations

import torch

__all__ = ["get_last_loc", "write_req_to_token"]


def _segments(lens: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For a flat concatenation of segments of ``lens``: (owner, offset-in-segment) per element."""
    ends = torch.cumsum(lens, 0)
    t = torch.arange(total, device=lens.device, dtype=torch.int64)
    owner = torch.searchsorted(ends, t, right=True)
    return owner, t - (ends - lens)[owner]


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
    if prefix_slots is not None and prefix_slots.numel() > 0:
        owner, col = _segments(pre, prefix_slots.numel())
        req_to_token[rows[owner], col] = prefix_slots.to(device=device, dtype=req_to_token.dtype)
    if out_cache_loc.numel() > 0:
        owner, off = _segments(seq - pre, out_cache_loc.numel())
        req_to_token[rows[owner], pre[owner] + off] = out_cache_loc.to(
            device=device, dtype=req_to_token.dtype
        )


def get_last_loc(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor
) -> torch.Tensor:
    """``req_to_token[r, prefix - 1]`` as int64 per request, -1 where the prefix is empty."""
    device = req_to_token.device
    rows = req_pool_indices.to(device=device, dtype=torch.int64)
    pre = prefix_lens.to(device=device, dtype=torch.int64)
    vals = req_to_token[rows, (pre - 1).clamp(min=0)].to(torch.int64)
    return torch.where(pre > 0, vals, torch.full_like(vals, -1))
