"""The file backend's page checksum: the 64-bit sum of a page's little-endian 8-byte words.

CRC-32 (``zlib``) runs at about 1-4 GB/s and bounded the file backend's verified reads; this sum
runs at memory speed (one vectorised reduction per range, numpy's when installed, else torch's;
15-60 GB/s here). It is
computed over the page's flat bytes, so it does not depend on how the page is split into ranges
(a layout with ranges that are not whole words takes a slower, equal path). What it catches: any
change inside one aligned 8-byte word (every flipped or altered byte, any burst of up to 8
bytes), a zeroed or foreign page (but for a 2**-64 chance); the byte count is checked apart
(truncation). What it does not catch: two words swapped inside a page (no disk or file-system
failure mode reorders words; a page read at the wrong place is caught by the record's key).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import torch

from mem_cache_storage.backend import PageRanges, view

_np: Any
try:  # optional: faster single-threaded reductions (see _words)
    import numpy as _np
except ImportError:  # pragma: no cover - numpy ships with the dev environment
    _np = None

__all__ = ["sum64", "sum64_bytes", "sum64_many"]

_MASK = (1 << 64) - 1
#: mixes the byte count in, so a page of zeros does not sum to 0
_LEN_MIX = 0x9E3779B97F4A7C15


def _words_torch(buf: memoryview) -> int:
    return int(torch.frombuffer(buf, dtype=torch.int64).sum())


def _rows_torch(buf: memoryview, rows: int, cols: int, stride: int) -> list[int]:
    words = torch.frombuffer(buf, dtype=torch.int64)
    return [int(x) for x in words.as_strided((rows, cols), (stride, 1)).sum(dim=1).tolist()]


def _words_numpy(buf: memoryview) -> int:
    return int(_np.add.reduce(_np.frombuffer(buf, dtype=_np.uint64)))


def _rows_numpy(buf: memoryview, rows: int, cols: int, stride: int) -> list[int]:
    words = _np.frombuffer(buf, dtype=_np.uint64)
    view_ = _np.lib.stride_tricks.as_strided(words, (rows, cols), (stride * 8, 8))
    return [int(x) for x in view_.sum(axis=1).tolist()]


#: the reductions (numpy's when installed: single threaded, so a page's sum never waits for
#: torch's intra-op threads, 2-3x slower at 0.5 MiB on a loaded host; both wrap modulo 2**64)
_words = _words_numpy if _np is not None else _words_torch
_rows = _rows_numpy if _np is not None else _rows_torch


def use_numpy(on: bool) -> bool:
    """Select numpy's (``on``, when installed) or torch's reductions; whether numpy's are in use
    (tests compare both paths)."""
    global _words, _rows
    numpy_on = on and _np is not None
    _words = _words_numpy if numpy_on else _words_torch
    _rows = _rows_numpy if numpy_on else _rows_torch
    return numpy_on


#: by page (its ranges as a tuple: an address and a length each, owning nothing, as
#: :func:`~mem_cache_storage.backend.page_views`' cache): numpy word views of its ranges, last
#: range first, and its byte count mixed (a page with a range that is empty or not whole
#: words is not kept: the general path sums it). A page's sum is then one reduction per range,
#: without building a view and an array each time; the last range first, because a read that
#: just filled the page left its end in the CPU's caches (0.4 us of a 512 KiB page's 8 us)
_PAGES: dict[tuple[tuple[int, int], ...], tuple[tuple[Any, ...], int]] = {}
_PAGES_MAX = 8192


def _page_arrays(key: tuple[tuple[int, int], ...]) -> tuple[tuple[Any, ...], int] | None:
    """The ``_PAGES`` entry of page ``key``, added; ``None`` for a page it does not keep."""
    if any(n & 7 or not n for _, n in key):
        return None
    if len(_PAGES) >= _PAGES_MAX:
        _PAGES.clear()
    arrays = tuple(_np.frombuffer(view(*rng), dtype=_np.uint64) for rng in reversed(key))
    hit = _PAGES[key] = (arrays, sum(n for _, n in key) * _LEN_MIX)
    return hit


def _sum_numpy(page: PageRanges) -> int | None:
    """The word sum and byte count of ``page`` mixed, through cached arrays (numpy's
    reductions); ``None`` for a range that is empty or not whole words (the general path)."""
    key = page if type(page) is tuple else tuple(page)
    hit = _PAGES.get(key)
    if hit is None:
        hit = _page_arrays(key)
        if hit is None:
            return None
    arrays, total = hit
    reduce = _np.add.reduce
    for arr in arrays:
        total += int(reduce(arr))
    return total & _MASK


def sum64(page: PageRanges) -> int:
    """The checksum of ``page`` (an unsigned 64-bit int)."""
    if _words is _words_numpy:
        fast = _sum_numpy(page)
        if fast is not None:
            return fast
    total = 0
    nbytes = 0
    if len(page) > 1 and _words is _words_torch:  # numpy's per-range sums cost less
        one = _one_reduction(page)
        if one is not None:
            return (one + len(page) * page[0][1] * _LEN_MIX) & _MASK
    if all(n % 8 == 0 for _, n in page):
        for ptr, n in page:
            if n:
                total += _words(view(ptr, n))
            nbytes += n
    else:  # ranges that split words: sum the concatenation (zero padded to a whole word)
        flat = bytearray(b"".join(bytes(view(ptr, n)) for ptr, n in page))
        nbytes = len(flat)
        flat += bytes(-nbytes % 8)
        if flat:
            total = _words(memoryview(flat))
    return (total + nbytes * _LEN_MIX) & _MASK


def _one_reduction(page: PageRanges) -> int | None:
    """The word sum of a page whose ranges have one size (whole words) and lie at one stride
    in memory, in any order (a host pool page's ``k`` and ``v``), as one strided reduction;
    ``None`` otherwise. The sum does not depend on the order of the words."""
    n = page[0][1]
    ptrs = sorted(p for p, _ in page)
    stride = ptrs[1] - ptrs[0]
    if n % 8 or stride % 8 or stride < n or n == 0 or any(m != n for _, m in page):
        return None
    for j in range(2, len(ptrs)):
        if ptrs[j] - ptrs[j - 1] != stride:
            return None
    span = stride * (len(ptrs) - 1) + n
    return sum(_rows(view(ptrs[0], span), len(ptrs), n // 8, stride // 8))


def _strided(pages: Sequence[PageRanges], r: int) -> list[int] | None:
    """The word sums of range ``r`` of every page with one reduction, when those ranges lie at
    one stride in memory (a run of a host pool's pages); ``None`` otherwise."""
    p0, n = pages[0][r]
    stride = pages[1][r][0] - p0
    if n % 8 or stride % 8 or stride < n:
        return None
    for j, page in enumerate(pages):
        ptr, size = page[r]
        if size != n or ptr != p0 + j * stride:
            return None
    span = stride * (len(pages) - 1) + n
    return _rows(view(p0, span), len(pages), n // 8, stride // 8)


def sum64_many(pages: Sequence[PageRanges]) -> list[int]:
    """``[sum64(page) for page in pages]``, one reduction per range index when the pages'
    ranges lie at a fixed stride (consecutive host pool pages), else page by page."""
    if len(pages) < 2 or any(len(p) != len(pages[0]) for p in pages):
        return [sum64(p) for p in pages]
    totals = [0] * len(pages)
    for r in range(len(pages[0])):
        sums = _strided(pages, r)
        if sums is None:
            return [sum64(p) for p in pages]
        totals = [a + b for a, b in zip(totals, sums)]
    mix = sum(n for _, n in pages[0]) * _LEN_MIX
    return [(t + mix) & _MASK for t in totals]


def sum64_bytes(data: bytes) -> int:
    """``sum64`` of bytes held in Python (tests and tools)."""
    pad = -len(data) % 8
    words = struct.unpack(f"<{(len(data) + pad) // 8}Q", data + b"\0" * pad)
    return int(sum(words) + len(data) * _LEN_MIX) & _MASK
