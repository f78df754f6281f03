"""Torch reference of the paged slot allocation ops (``alloc_extend``, ``alloc_decode``).

Fully vectorised: one pass of tensor ops, no per-request Python loop. Semantics (position ``j`` of a
request with prefix ``pre``, new length ``seq``, ``ps`` = page size, ``pre_pages = ceil(pre/ps)``)::

    j in [pre, pre_pages*ps)   -> last_loc + 1 + (j - pre)          (phase 1: current partial page)
    j in [pre_pages*ps, seq)   -> free_pages[page_start + j//ps - pre_pages]*ps + j % ps
                                                                    (phases 2 and 3: new pages)

where ``page_start`` is the exclusive prefix sum of ``ceil(seq/ps) - pre_pages`` over requests, so
the batch consumes exactly ``free_pages[0 : total_new_pages]`` in request order.
"""

from __future__ import annotations

import torch

__all__ = ["alloc_decode", "alloc_extend"]


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, 0) - x


def _gather_pages(
    free_pages: torch.Tensor, page_idx: torch.Tensor, used: torch.Tensor
) -> torch.Tensor:
    """``free_pages[page_idx]`` (int64) on lanes where ``used``, else 0 (never out of range)."""
    if free_pages.numel() == 0:
        return torch.zeros_like(page_idx)
    safe = torch.where(used, page_idx, torch.zeros_like(page_idx))
    return free_pages[safe].to(torch.int64)


def alloc_extend(  # noqa: PLR0917
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
) -> None:
    """Write the new slots of every request into ``out`` (request-major, position ascending)."""
    ps = page_size
    device = out.device
    pre = prefix_lens.to(device=device, dtype=torch.int64)
    seq = seq_lens.to(device=device, dtype=torch.int64)
    last = last_loc.to(device=device, dtype=torch.int64)
    ext = seq - pre
    ext_start = _exclusive_cumsum(ext)
    pre_pages = (pre + ps - 1) // ps
    new_pages = (seq + ps - 1) // ps - pre_pages
    page_start = _exclusive_cumsum(new_pages)

    n = out.numel()
    if n == 0:
        return
    t = torch.arange(n, device=device, dtype=torch.int64)
    # owner[t] = the request whose output range [ext_start, ext_start + ext) holds t
    owner = torch.searchsorted(ext_start + ext, t, right=True)
    j = t - ext_start[owner] + pre[owner]  # sequence position of output t
    in_old_page = j < pre_pages[owner] * ps
    page_idx = page_start[owner] + j // ps - pre_pages[owner]
    page = _gather_pages(free_pages.to(device), page_idx, ~in_old_page)
    out.copy_(torch.where(in_old_page, last[owner] + 1 + (j - pre[owner]), page * ps + j % ps))


def alloc_decode(
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
) -> None:
    """Write one new slot per request into ``out`` (``seq_lens`` include the new token)."""
    device = out.device
    seq = seq_lens.to(device=device, dtype=torch.int64)
    last = last_loc.to(device=device, dtype=torch.int64)
    if seq.numel() == 0:
        return
    need = (seq - 1) % page_size == 0  # the new token starts a fresh page
    rank = _exclusive_cumsum(need.to(torch.int64))
    page = _gather_pages(free_pages.to(device), rank, need)
    out.copy_(torch.where(need, page * page_size, last + 1))
