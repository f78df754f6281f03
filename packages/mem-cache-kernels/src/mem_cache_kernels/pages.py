"""Page arithmetic: how many pages and tokens a batch of requests needs (host-side lengths).

The one home of the page counts every package uses (the kernels' ``alloc_*`` ops, the slot and
page allocators, the HiSparse and paired allocators). Page sizes are powers of two; the counts are
exact for every one, including 1 (SGLang's decode formula ``sum(seq % ps == 1)`` is wrong for
``ps == 1``, where every decode token needs a new page). Lengths are host-readable (CPU) integer
tensors; nothing here reads device memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from mem_cache_kernels.checks import (
    INDEX_DTYPES,
    SMALL_BATCH,
    _np,
    check_index,
    check_int,
    check_page_size,
    describe,
)

__all__ = [
    "compressed_entry_offsets",
    "compressed_last_loc_on_device",
    "decode_counts",
    "decode_page_starts",
    "extend_counts",
    "trim_segments",
]


_INT_DTYPES = (
    *INDEX_DTYPES,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
)


def _host_lengths(name: str, t: object) -> torch.Tensor:
    """``t`` if it is a 1-D CPU integer tensor, else ``TypeError``/``ValueError`` naming
    ``name`` (the fast path is one ``isinstance`` and three attribute reads)."""
    if isinstance(t, torch.Tensor) and t.dtype in INDEX_DTYPES and t.dim() == 1 and t.is_cpu:
        return t
    idx = check_index(name, t, dtypes=_INT_DTYPES)
    if not idx.is_cpu:
        raise ValueError(f"{name} must be a CPU tensor (host-side lengths), got {idx.device}")
    return idx


def extend_counts(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    *,
    names: tuple[str, str] = ("prefix_lens", "seq_lens"),
) -> tuple[int, int]:
    """``(new pages, new tokens)`` of an extend batch from host-readable lengths.

    New pages are ``sum(ceil(seq / ps) - ceil(prefix / ps))``, new tokens ``sum(seq - prefix)``.
    ``ValueError`` (naming ``names``) unless ``0 <= prefix <= seq`` for every request. The one
    place the page arithmetic of an extend lives (kernels and allocators both call it).
    """
    pre_name, seq_name = names
    ps = page_size
    if seq_lens.shape[0] <= SMALL_BATCH:  # a few Python ints beat a chain of small torch ops
        tokens = 0
        pages = 0
        m = ps - 1
        shift = ps.bit_length() - 1
        pre: list[int] = prefix_lens.tolist()
        seq: list[int] = seq_lens.tolist()
        for p, q in zip(pre, seq, strict=True):
            if not 0 <= p <= q:
                break
            tokens += q - p
            pages += ((q + m) >> shift) - ((p + m) >> shift)
        else:
            return pages, tokens
    p64, s64 = prefix_lens.to(torch.int64), seq_lens.to(torch.int64)
    ext = s64 - p64
    if int(torch.minimum(p64, ext).min()) < 0:  # one reduction on the happy path
        bad = torch.nonzero((p64 < 0) | (ext < 0)).reshape(-1)
        raise ValueError(
            f"{pre_name} must satisfy 0 <= {pre_name} <= {seq_name}; requests {describe(bad)} "
            f"have {pre_name}={describe(p64[bad])}, {seq_name}={describe(s64[bad])}"
        )
    mask = ps - 1
    pages = int(((s64 + mask) & ~mask).sum() - ((p64 + mask) & ~mask).sum()) // ps
    return pages, int(ext.sum())


def decode_counts(seq_lens: torch.Tensor, page_size: int, *, name: str = "seq_lens") -> int:
    """New pages of a decode batch from host-readable lengths (``seq_lens`` count the new token).

    A request takes a new page when its new token starts one: ``(seq - 1) % ps == 0``, i.e.
    ``seq & (ps - 1) == 1`` for ``ps >= 2`` and every request for ``ps == 1``. ``ValueError``
    (naming ``name`` and the requests) unless every length is ``>= 1`` (0 would hand out slot 0).
    The one place of the decode page arithmetic (kernels and allocators both call it).
    """
    bs = int(seq_lens.shape[0])
    if not bs:
        return 0
    m = page_size - 1
    if bs <= SMALL_BATCH:
        values: list[int] = seq_lens.tolist()
        if min(values) >= 1:
            return bs if m == 0 else sum(1 for q in values if q & m == 1)
    elif _np is not None:
        a = seq_lens.numpy()
        if int(a.min()) >= 1:
            return bs if m == 0 else int(_np.count_nonzero((a & m) == 1))
    elif int(seq_lens.min()) >= 1:
        return bs if m == 0 else int(torch.count_nonzero((seq_lens & m) == 1))
    s64 = seq_lens.to(torch.int64)
    bad = torch.nonzero(s64 < 1).reshape(-1)
    raise ValueError(
        f"{name} must be >= 1 (they include the new token); requests {describe(bad)} have "
        f"{name}={describe(s64[bad])}"
    )


def decode_page_starts(seq_lens: torch.Tensor, page_size: int) -> tuple[int, Any] | None:
    """The requests of a decode batch whose new token starts a page, in one numpy pass.

    ``seq_lens``: a non-empty 1-D CPU integer tensor (the host copy, counting the new token).
    Returns ``(count, mask)``: ``mask`` a numpy bool array (``seq & (ps - 1) == 1``), ``None``
    for page size 1, where every request starts a page and ``count == len(seq_lens)``. Returns
    ``None`` (the caller runs :func:`decode_counts`, which raises naming the requests) when a
    length is below 1, the batch is empty or numpy is missing. Cost: one reduction and, for
    ``page_size > 1``, one mask and one count; reads no device memory.
    """
    _host_lengths("seq_lens", seq_lens)
    if type(page_size) is not int:
        check_page_size(page_size)
    bs = seq_lens.shape[0]
    if _np is None or not bs:
        return None
    a = seq_lens.numpy()
    if _np.minimum.reduce(a) < 1:
        return None
    if page_size == 1:
        return int(bs), None
    need = (a & (page_size - 1)) == 1
    return int(_np.count_nonzero(need)), need


def check_segments_iterable(segments: object) -> None:
    """``TypeError`` naming ``segments`` unless it is an iterable (not a tensor) of pairs: the
    first check of :func:`trim_segments`, for callers that check before they iterate (a shared
    helper of the allocators, outside ``__all__``: it checks the container only)."""
    if not isinstance(segments, (list, tuple)) and (
        isinstance(segments, torch.Tensor) or not isinstance(segments, Iterable)
    ):
        raise TypeError(
            f"segments must be an iterable of (free_index, start_pos) pairs, "
            f"got {type(segments).__name__}"
        )


def trim_segments(
    segments: Iterable[tuple[torch.Tensor, int]], page_size: int
) -> list[tuple[torch.Tensor, int]]:
    """``(free_index, start_pos)`` segments of one request with shared boundary pages trimmed.

    ``segments`` is an iterable (not a tensor) of pairs: ``free_index`` a 1-D int32/int64 tensor
    of the slots of positions ``start_pos ..`` (meta tensors pass here), ``start_pos`` an int
    >= 0 (``TypeError``/``ValueError`` naming ``segments`` / ``segments[k]``). Segments must be
    ascending and disjoint in positions (``ValueError``). A segment that starts in the page where
    the previous one ended loses its slots in that page (the previous segment releases it); a
    segment entirely inside that page is dropped, as are empty segments. Returns the trimmed
    pairs as a list: every segment is checked before the caller frees the first. Host
    arithmetic on positions and lengths: reads no tensor data.
    """
    check_segments_iterable(segments)
    if type(page_size) is not int or page_size < 1 or page_size & (page_size - 1):
        page_size = check_page_size(page_size)  # raises (or passes an int subclass)
    out: list[tuple[torch.Tensor, int]] = []
    prev_end: int | None = None
    for k, seg in enumerate(segments):
        if not isinstance(seg, (tuple, list)) or len(seg) != 2:
            raise TypeError(f"segments[{k}] must be a (free_index, start_pos) pair, got {seg!r}")
        free_index, start_pos = seg
        if (  # good pairs inline (every release of a request); else the checks name the part
            type(start_pos) is int
            and start_pos >= 0
            and type(free_index) is torch.Tensor
            and free_index.dtype in INDEX_DTYPES
            and free_index.dim() == 1
        ):
            n = free_index.shape[0]
        else:
            check_int(f"segments[{k}] start_pos", start_pos, minimum=0)
            n = int(check_index(f"segments[{k}] free_index", free_index, allow_meta=True).shape[0])
        if n == 0:
            continue
        if prev_end is not None and start_pos < prev_end:
            raise ValueError(
                f"segments must be ascending and disjoint: segments[{k}] starts at {start_pos}, "
                f"before the previous segment's end {prev_end}"
            )
        skip = 0
        if prev_end is not None:
            shared_end = ((prev_end - 1) // page_size + 1) * page_size  # end of the shared page
            skip = min(n, max(0, shared_end - start_pos))
        prev_end = start_pos + n
        if skip < n:
            out.append(((free_index[skip:] if skip else free_index), start_pos + skip))
    return out


def compressed_entry_offsets(
    prefix_lens: torch.Tensor, seq_lens: torch.Tensor, ratio: int
) -> torch.Tensor:
    """Indices into an extend's output of the tokens that complete a compressed entry.

    Request ``i`` owns output rows ``[o_i, o_i + seq_i - prefix_i)`` for positions
    ``prefix_i .. seq_i - 1`` (request-major, as ``alloc_extend`` writes them); entry ``e`` of a
    ``ratio``-compressed cache completes at position ``ratio * e + ratio - 1``. ``prefix_lens`` /
    ``seq_lens``: 1-D CPU integer tensors, ``0 <= prefix <= seq`` (trusted). Returns CPU int64,
    request-major and ascending. Example (ratio 4): prefixes ``[2, 0]``, seqs ``[9, 4]`` ->
    ``[1, 5, 10]``.
    """
    _host_lengths("prefix_lens", prefix_lens)
    _host_lengths("seq_lens", seq_lens)
    check_int("ratio", ratio, minimum=1)
    pre, seq = prefix_lens.to(torch.int64), seq_lens.to(torch.int64)
    counts = seq // ratio - pre // ratio
    starts = torch.cumsum(seq - pre, 0) - (seq - pre)
    total = int(counts.sum())
    first_entry = torch.repeat_interleave(pre // ratio, counts)
    rank = torch.arange(total) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    base = torch.repeat_interleave(starts - pre, counts)
    return base + ratio * (first_entry + rank) + (ratio - 1)


def compressed_last_loc_on_device(
    prefix_lens: torch.Tensor, mapped_last: torch.Tensor, page_size: int, ratio: int
) -> torch.Tensor:
    """``last_loc`` per request for an allocator of ``ratio``-compressed entries in pages of
    ``page_size`` entries (sync-free: tensor expressions on ``mapped_last``'s device).

    ``mapped_last`` is the compressed slot of the request's last full entry (``mapping[(L -
    ratio + 1) // ratio]`` for the full ``last_loc`` ``L``), ``prefix_lens`` the full prefix
    lengths (same device and length):

    * empty compressed prefix (``prefix < ratio``): -1;
    * compressed prefix ending inside a page: ``mapped_last`` (the prefix's last entry then
      shares ``L``'s logical page, so this is its slot);
    * compressed prefix ending on a page boundary: the allocator does not read ``last_loc``
      there (no partial page to continue) and ``mapped_last`` may name another page's entry,
      so the congruent placeholder ``page_size - 1`` is returned.
    """
    check_index("prefix_lens", prefix_lens, allow_meta=True)
    check_index("mapped_last", mapped_last, allow_meta=True)
    check_int("page_size", page_size, minimum=1)
    check_int("ratio", ratio, minimum=1)
    c_prefix = prefix_lens.to(torch.int64) // ratio
    aligned = torch.full_like(mapped_last, page_size - 1)
    dev_last = torch.where(c_prefix % page_size == 0, aligned, mapped_last)
    return torch.where(c_prefix == 0, torch.full_like(mapped_last, -1), dev_last)
