"""Torch reference of the paged slot allocation ops (``alloc_extend``, ``alloc_decode``).

Semantics (position ``j`` of a request with prefix ``pre``, new length ``seq``, ``ps`` = page size,
``pre_pages = ceil(pre/ps)``)::

    j in [pre, pre_pages*ps)   -> last_loc + 1 + (j - pre)          (phase 1: current partial page)
    j in [pre_pages*ps, seq)   -> free_pages[page_start + j//ps - pre_pages]*ps + j % ps
                                                                    (phases 2 and 3: new pages)

where ``page_start`` is the exclusive prefix sum of ``ceil(seq/ps) - pre_pages`` over requests, so
the batch consumes exactly ``free_pages[0 : total_new_pages]`` in request order.

Cost model (CPU, one thread, the dev VM): every torch op costs ~2-5 us whatever its size up to a few
thousand elements, so the implementations minimise the *number* of ops, not the arithmetic:

* ``alloc_extend``, small CPU batches (at most :data:`SMALL` requests, e.g. a prefill chunk of a
  few prompts): the per-request layout is planned with Python ints; up to :data:`LIST_SLOTS`
  output slots it is written from a Python ``array`` (one copy; a scheduler step finds every
  numpy or torch call cold, so a few Python loops cost less there). Larger outputs: the new
  pages are expanded to slots once (``offsets + pages * ps``, one ``[pages, ps]`` op) and ``out``
  is one ``torch.cat`` of slices of that block (requests that continue each other in both
  ``out`` and the block share a slice) and one ``arange`` per partial-page fill: about 4 ops
  plus 1-2 per request.
* ``alloc_extend``, otherwise (sync-free, any device): per-request constants are stacked into one
  ``[bs, 3]`` matrix and spread to the ``n`` output slots by a single ``repeat_interleave``; one
  broadcast add turns them into, per slot, ``j - phase-1 end``, the phase-1 slot and ``j`` shifted
  by the request's page base, so the new-page slot is one ``index_select`` of ``free_pages`` and
  the result one ``where`` (~30 ops whatever the batch size). The page size is a power of two, so
  ``//`` and ``%`` are shifts and masks.
* ``alloc_decode`` with the page count known (``num_new_pages``, the public op passes it): ``out =
  last_loc + 1`` then ``masked_scatter_`` of ``free_pages[:num_new_pages] * ps`` into the requests
  whose new token starts a page (5 ops, no host sync). Without it: exclusive ``cumsum`` ranks and
  ``where`` (sync-free). CPU batches of at most :data:`SMALL_DECODE` requests use Python ints.

The paths are tested against each other (``SMALL``/``SMALL_DECODE`` patched). Arguments are
trusted: the public ops of :mod:`mem_cache_kernels` (or a caller of
:func:`mem_cache_kernels.dispatch.pick` that checked its own) validated them, the page counts
included; nothing here re-derives or re-checks them.
"""

from __future__ import annotations

from array import array

import torch

try:  # optional: CPU batches write through numpy views (cheaper per piece than torch ops)
    import numpy as _np
except ImportError:  # pragma: no cover - numpy ships with every torch wheel we test
    _np = None  # type: ignore[assignment]

__all__ = ["LIST_SLOTS", "SMALL", "SMALL_DECODE", "alloc_decode", "alloc_extend"]

SMALL = 8  # CPU extend batches with at most this many requests take the per-request path
LIST_SLOTS = 512  # ... and write at most this many output slots from a Python int64 array
SMALL_DECODE = 4  # CPU decode batches with at most this many requests take the Python-int path

_OFFSETS: dict[tuple[int, torch.device], torch.Tensor] = {}


def _page_offsets(page_size: int, device: torch.device) -> torch.Tensor:
    """``arange(page_size)`` (int64, cached per device; never written)."""
    key = (page_size, device)
    offs = _OFFSETS.get(key)
    if offs is None:
        offs = _OFFSETS[key] = torch.arange(page_size, dtype=torch.int64, device=device)
    return offs


def _i64(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype is torch.int64 else t.to(torch.int64)


def _from_list(values: list[int]) -> torch.Tensor:
    """int64 CPU tensor of a non-empty list (4x faster than ``torch.tensor(list)``)."""
    return torch.frombuffer(array("q", values), dtype=torch.int64)


def alloc_extend(  # noqa: PLR0917
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
    num_new_pages: int | None = None,
    num_tokens: int | None = None,
) -> None:
    """Write the new slots of every request into ``out`` (request-major, position ascending).

    Trusted arguments (the public op checked them): ``out`` has ``sum(seq - prefix)`` elements,
    ``free_pages`` holds the batch's pages. ``num_new_pages`` / ``num_tokens`` are the public
    op's checked hints; this implementation does not need them (signature parity).
    """
    del num_new_pages, num_tokens
    if out.numel() == 0:
        return
    if out.is_cpu and prefix_lens.shape[0] <= SMALL:
        _extend_small(
            prefix_lens.tolist(),
            seq_lens.tolist(),
            last_loc.tolist(),
            free_pages,
            out,
            page_size,
        )
    else:
        _extend_vectorised(prefix_lens, seq_lens, last_loc, free_pages, out, page_size)


def _extend_small(  # noqa: PLR0917
    pre: list[int],
    seq: list[int],
    last: list[int],
    free_pages: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
) -> None:
    """Per-request path: plan with Python ints, then one ``cat`` of block slices and fills."""
    mask = page_size - 1
    shift = page_size.bit_length() - 1
    # out in order, as pieces: [block start, length] (a slice of the expanded new pages, runs
    # that continue each other in out and in the block merged) or (first slot, length, 0) (an
    # arange: phase 1)
    plan: list[list[int]] = []
    run: list[int] | None = None  # the last block piece, while it can still grow
    o = 0  # output slots planned so far
    k = 0  # new pages planned so far
    for p, s, last_slot in zip(pre, seq, last):
        b = min(s, (p + mask) & ~mask)  # end of phase 1 (the current partial page)
        if b > p:
            plan.append([last_slot + 1, b - p, 0])
            o += b - p
            run = None
        m = s - b  # slots on new pages
        if m > 0:
            kb = k << shift
            if run is not None and run[0] + run[1] == kb:
                run[1] += m  # continues the previous piece in out and in the block
            else:
                run = [kb, m]
                plan.append(run)
            o += m
            k += (m + mask) >> shift
    if out.shape[0] <= LIST_SLOTS:
        _extend_small_list(plan, free_pages, out, page_size, k)
        return
    if _np is not None:
        _extend_small_host(plan, free_pages, out, page_size, k)
        return
    block = None
    if k:
        pages = _i64(free_pages if free_pages.shape[0] == k else free_pages[:k])
        if page_size == 1:
            block = pages
        else:
            offs = _page_offsets(page_size, out.device)
            if len(plan) == 1 and o == k << shift and out.is_contiguous():
                # whole new pages only: expand straight into out
                torch.add(offs, pages.unsqueeze(1), alpha=page_size, out=out.view(k, page_size))
                return
            block = torch.add(offs, pages.unsqueeze(1), alpha=page_size).view(-1)
    parts: list[torch.Tensor] = []
    for piece in plan:
        if len(piece) == 2:
            if block is None:
                raise RuntimeError("alloc_extend planned new-page slots without new pages")
            b0, m = piece
            parts.append(block[b0 : b0 + m] if b0 or m != block.shape[0] else block)
        else:
            first, m, _ = piece
            parts.append(torch.arange(first, first + m, dtype=torch.int64, device=out.device))
    if len(parts) == 1:
        out.copy_(parts[0])
    else:
        torch.cat(parts, out=out)


def _extend_small_list(
    plan: list[list[int]], free_pages: torch.Tensor, out: torch.Tensor, page_size: int, k: int
) -> None:
    """The per-request plan built as a Python ``array`` of slots (one ``tolist`` of the new
    pages, a ``range`` per page or phase-1 fill), then one copy into ``out`` (CPU). Inside a
    scheduler step the numpy writes below cost 50-60 us a call at page sizes 16 and 64 (each
    numpy call finds its code cold: the page expansion alone 28 us); this costs 30-40 us for the
    step's extends (median 156 slots, 90th percentile 458). Up to :data:`LIST_SLOTS` slots only:
    the Python cost grows with the slots and the numpy cost does not, so in a tight loop over
    the allocator trace's prefill chunks (median 808 slots) the numpy writes are faster."""
    shift = page_size.bit_length() - 1
    pages: list[int] = (free_pages if free_pages.shape[0] == k else free_pages[:k]).tolist()
    slots = array("q")
    for piece in plan:
        if len(piece) == 2:  # new pages: block offset b0 (page-aligned), m slots
            b0, m = piece
            if page_size == 1:
                slots.extend(pages[b0 : b0 + m])
                continue
            page = b0 >> shift
            while m > 0:  # whole pages, then at most one partial page at the end
                take = m if m < page_size else page_size
                first = pages[page] << shift
                slots.extend(range(first, first + take))
                m -= take
                page += 1
        else:  # phase 1: consecutive slots after last_loc
            first, m, _ = piece
            slots.extend(range(first, first + m))
    out.copy_(torch.frombuffer(slots, dtype=torch.int64))


def _extend_small_host(
    plan: list[list[int]], free_pages: torch.Tensor, out: torch.Tensor, page_size: int, k: int
) -> None:
    """The per-request plan written through numpy views of ``out`` and ``free_pages`` (CPU):
    the same slots as the torch ops below, without a torch op per piece (~0.5 us per numpy
    slice assignment against a few us per torch op)."""
    assert _np is not None
    o = out.numpy()
    shift = page_size.bit_length() - 1
    block = None
    if k:
        pages = (free_pages if free_pages.shape[0] == k else free_pages[:k]).numpy()
        if pages.dtype != _np.int64:
            pages = pages.astype(_np.int64)
        if page_size == 1:
            block = pages
        else:
            offs = _np.arange(page_size, dtype=_np.int64)
            if len(plan) == 1 and o.shape[0] == k << shift and o.flags.c_contiguous:
                _np.add((pages << shift)[:, None], offs, out=o.reshape(k, page_size))
                return
            block = ((pages << shift)[:, None] + offs).reshape(-1)
    pos = 0
    for piece in plan:
        if len(piece) == 2:
            if block is None:
                raise RuntimeError("alloc_extend planned new-page slots without new pages")
            b0, m = piece
            o[pos : pos + m] = block[b0 : b0 + m]
        else:
            first, m, _ = piece
            o[pos : pos + m] = _np.arange(first, first + m, dtype=_np.int64)
        pos += m


def _extend_vectorised(  # noqa: PLR0917
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
) -> None:
    """Sync-free path: one ``repeat_interleave`` of per-request constants, one gather."""
    n = out.numel()
    mask = page_size - 1
    shift = page_size.bit_length() - 1
    pre = _i64(prefix_lens)
    seq = _i64(seq_lens)
    ext = seq - pre
    u = seq - torch.cumsum(ext, 0)  # j = t + u for output slot t of the request (= pre - start)
    pre_end = (pre + mask) & ~mask  # ceil(pre / ps) * ps
    seq_end = (seq + mask) & ~mask
    page_base = torch.cumsum(seq_end - pre_end, 0) - seq_end  # (P_incl - ceil(seq/ps)) * ps
    cols = torch.stack(
        (
            u - torch.minimum(seq, pre_end),  # + t: j - phase-1 end (< 0 in phase 1)
            _i64(last_loc) - pre + u + 1,  # + t: the phase-1 slot last_loc + 1 + (j - pre)
            u + page_base,  # + t: j + (first new page index - ceil(pre/ps)) * ps
        ),
        1,
    )
    per_slot = torch.repeat_interleave(cols, ext, dim=0, output_size=n)
    per_slot += torch.arange(n, dtype=torch.int64, device=out.device).unsqueeze_(1)
    q = per_slot[:, 2]
    num_free = free_pages.shape[0]
    if num_free:
        page_idx = (q >> shift).clamp_(0, num_free - 1)
        new = (_i64(free_pages.index_select(0, page_idx)) << shift) | (q & mask)
    else:  # every slot is in phase 1 (the caller guarantees enough pages)
        new = q
    torch.where(per_slot[:, 0] < 0, per_slot[:, 1], new, out=out)


def alloc_decode(  # noqa: PLR0917
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
    num_new_pages: int | None = None,
) -> None:
    """Write one new slot per request into ``out`` (``seq_lens`` include the new token).

    ``num_new_pages`` (optional, trusted): the number of requests whose new token starts a page.
    With it the op needs no prefix sum (and no host sync). ``free_pages`` holds at least that
    many pages (the public op checked it).
    """
    bs = out.shape[0]
    if bs == 0:
        return
    mask = page_size - 1
    shift = page_size.bit_length() - 1
    if out.is_cpu and bs <= SMALL_DECODE:
        _decode_small(seq_lens.tolist(), last_loc.tolist(), free_pages, out, page_size)
        return
    if page_size == 1:  # every new token starts a page
        out.copy_(free_pages[:bs])
        return
    need = (seq_lens & mask) == 1  # (seq - 1) % ps == 0: the new token starts a fresh page
    if num_new_pages is not None:
        torch.add(last_loc, 1, out=out)
        if num_new_pages:
            pages = (
                free_pages if free_pages.shape[0] == num_new_pages else free_pages[:num_new_pages]
            )
            out.masked_scatter_(need, _i64(pages) << shift)
        return
    nxt = _i64(last_loc) + 1
    num_free = free_pages.shape[0]
    if num_free == 0:  # no request starts a page (the caller guarantees enough pages)
        out.copy_(nxt)
        return
    rank = torch.cumsum(need, 0)
    rank -= need.to(torch.int64)
    page = _i64(free_pages.index_select(0, rank.clamp_(max=num_free - 1)))
    torch.where(need, page << shift, nxt, out=out)


def _decode_small(
    seq: list[int], last: list[int], free_pages: torch.Tensor, out: torch.Tensor, page_size: int
) -> None:
    mask = page_size - 1
    starts = [(s - 1) & mask == 0 for s in seq]  # the new token starts a fresh page
    need = sum(starts)
    free = free_pages[:need].tolist() if need else []
    slots: list[int] = []
    rank = 0
    for new_page, last_slot in zip(starts, last):
        if new_page:
            slots.append(free[rank] * page_size)
            rank += 1
        else:
            slots.append(last_slot + 1)
    out.copy_(_from_list(slots))
