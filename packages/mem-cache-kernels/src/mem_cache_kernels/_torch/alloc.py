"""Torch reference of the paged slot allocation ops (``alloc_extend``, ``alloc_decode``).

Fully vectorised: one pass of tensor ops, no per-request Python loop. Semantics (position ``j`` of a
request with prefix ``pre``, new length ``seq``, ``ps`` = page size, ``pre_pages = ceil(pre/ps)``)::

    j in [pre, pre_pages*ps)   -> last_loc + 1 + (j - pre)          (phase 1: current partial page)
    j in [pre_pages*ps, seq)   -> free_pages[page_start + j//ps - pre_pages]*ps + j % ps
                                                                    (phases 2 and 3: new pages)

where ``page_start`` is the exclusive prefix sum of ``ceil(seq/ps) - pre_pages`` over requests, so
the batch consumes exactly ``free_pages[0 : total_new_pages]`` in request order.

Implementation notes (measured on CPU, 32K output slots): the page size is a power of two, so
``//`` and ``%`` are shifts and masks (int64 division is ~15x slower); per-request values are
spread to slots with ``index_select`` (~7x faster than advanced indexing); the phase choice is a
branch-free sign mask instead of a boolean ``where``. Small CPU batches (at most ``SMALL``
requests + pages) take a list-based path instead: a 1-request call costs ~25 tensor ops (~100 us
on the dev machine) vectorised but a few microseconds as Python arithmetic. Both paths are tested
against each other.
"""

from __future__ import annotations

from array import array

import torch

__all__ = ["SMALL", "alloc_decode", "alloc_extend", "extend_slots_small"]

SMALL = 256  # CPU calls with at most this many loop steps (requests + pages) use the list path


def _from_list(values: list[int]) -> torch.Tensor:
    """int64 CPU tensor of a non-empty list (4x faster than ``torch.tensor(list)``)."""
    return torch.frombuffer(array("q", values), dtype=torch.int64)


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, 0) - x


def _owners(ext: torch.Tensor, starts: torch.Tensor, n: int) -> torch.Tensor:
    """For each of the ``n`` output slots, the request whose segment holds it."""
    marks = torch.zeros(n, dtype=torch.int64, device=ext.device)
    live = starts < n  # empty requests at the end start at n
    marks.index_add_(0, starts[live], torch.ones_like(starts[live]))
    return torch.cumsum(marks, 0) - 1


def alloc_extend(  # noqa: PLR0917
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
) -> None:
    """Write the new slots of every request into ``out`` (request-major, position ascending)."""
    n = out.numel()
    if n == 0:
        return
    if out.device.type == "cpu" and prefix_lens.numel() + n // page_size <= SMALL:
        slots = extend_slots_small(
            prefix_lens.tolist(), seq_lens.tolist(), last_loc.tolist(), free_pages, page_size
        )
        out.copy_(_from_list(slots))
        return
    shift = page_size.bit_length() - 1
    mask = page_size - 1
    device = out.device
    pre = prefix_lens.to(device=device, dtype=torch.int64)
    seq = seq_lens.to(device=device, dtype=torch.int64)
    last = last_loc.to(device=device, dtype=torch.int64)
    ext = seq - pre
    starts = _exclusive_cumsum(ext)
    pre_pages = (pre + mask) >> shift
    new_pages = ((seq + mask) >> shift) - pre_pages
    # per request: j = t - a (sequence position of output t); phase 1 while j < b; old slot = j + c;
    # new page index = d + (j >> shift)
    a = starts - pre
    b = torch.minimum(seq, pre_pages << shift)
    c = last + 1 - pre
    d = _exclusive_cumsum(new_pages) - pre_pages
    owner = _owners(ext, starts, n)
    j = torch.arange(n, dtype=torch.int64, device=device) - a.index_select(0, owner)
    in_old = (j - b.index_select(0, owner)) >> 63  # all ones in phase 1, else 0
    old = j + c.index_select(0, owner)
    new = j & mask
    if free_pages.numel() > 0:
        page_idx = (d.index_select(0, owner) + (j >> shift)).clamp_(0, free_pages.numel() - 1)
        pages = free_pages.to(device).index_select(0, page_idx).to(torch.int64)
        new |= pages << shift
    out.copy_(new ^ ((old ^ new) & in_old))


def extend_slots_small(
    pre: list[int], seq: list[int], last: list[int], free_pages: torch.Tensor, page_size: int
) -> list[int]:
    """List-based ``alloc_extend`` for small CPU batches (same result as the vectorised path)."""
    ps = page_size
    need = sum(-(-s // ps) + (p // -ps) for p, s in zip(pre, seq))  # ceil(s/ps) - ceil(p/ps)
    free = free_pages[:need].tolist()
    out: list[int] = []
    rank = 0
    for p, s, last_slot in zip(pre, seq, last):
        old_end = min(s, -(-p // ps) * ps)  # phase 1 fills the current page up to here
        out.extend(range(last_slot + 1, last_slot + 1 + old_end - p))
        for j in range(old_end, s, ps):  # page-aligned from here on
            base = free[rank] * ps
            rank += 1
            out.extend(range(base, base + min(ps, s - j)))
    return out


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
    if device.type == "cpu" and seq.numel() <= SMALL:
        free = free_pages[: seq.numel()].tolist()
        slots: list[int] = []
        rank = 0
        for s, last_slot in zip(seq.tolist(), last.tolist()):
            if (s - 1) % page_size == 0:  # the new token starts a fresh page
                slots.append(free[rank] * page_size)
                rank += 1
            else:
                slots.append(last_slot + 1)
        out.copy_(_from_list(slots))
        return
    need = ((seq - 1) & (page_size - 1)) == 0  # the new token starts a fresh page
    if free_pages.numel() == 0:
        out.copy_(last + 1)
        return
    ranks = _exclusive_cumsum(need.to(torch.int64)).clamp_(max=free_pages.numel() - 1)
    page = free_pages.to(device).index_select(0, ranks).to(torch.int64)
    out.copy_(torch.where(need, page * page_size, last + 1))
