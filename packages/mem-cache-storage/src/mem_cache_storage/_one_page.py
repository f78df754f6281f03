"""The host ranges of a one-page storage call, remembered per page.

A one-page ``batch_get_v1`` is the controller's common call, and a 512 KiB page's read and
checksum take about 25 us here: :func:`~mem_cache_storage.backend.host_page_ranges` (the pool's
slot check, three attribute reads, the format's lookup, a
:class:`~mem_cache_storage.backend.PageBatch`) was a fifth of the call, and the pool's slot
check alone (a ``tolist`` of the slots and a compare with the page's) still 3-4 us once the
read had evicted the interpreter's working set from the CPU caches.

:class:`OnePage` keeps, for the last of our host pools it saw, the pool's page format and the
ranges of every page it was asked for, keyed by the page's slots as the index tensor holds them
in memory (the *canonical bytes*: ``page_size`` consecutive int64, or int32, values from the
page's first slot, native byte order). A call reads the tensor's bytes (one copy, no tensor
op) and looks them up: a hit means the tensor holds exactly the slots of a page the pool's own
:meth:`page_ids` accepted before, and the pool's page geometry is fixed while it is open (its
buffers never move; the caller holds the pool's ``io_guard``, which refuses a closed pool). Only
a tensor whose memory *is* its values is read that way: a plain 1-D CPU tensor, strided and
contiguous, without the negative bit, with storage. Any other tensor, a miss, SGLang's pools
(no range table) and any other pool take the pool's checks (``page_ids``, which raises its
precise error) or :func:`~mem_cache_storage.backend.host_page_ranges`; an entry is added only
after ``page_ids`` accepted the slots, under the canonical bytes of the page it returned.
"""

from __future__ import annotations

import ctypes
from array import array
from typing import Any

import torch

from mem_cache_kernels.checks import INDEX_DTYPES
from mem_cache_storage._page_format import PageFormat, PageRanges
from mem_cache_storage.backend import host_page_ranges

__all__ = ["OnePage"]

#: a host pool's ``page_range_table()``: ``(base, stride, nbytes)`` per range of a page
_Table = tuple[tuple[int, int, int], ...]
#: (pool, its range table, page size, page format, ranges by the canonical bytes of the slots)
_State = tuple[Any, _Table, int, PageFormat, dict[bytes, PageRanges]]

#: pages remembered per pool before the memo starts over (an entry: a page's slots as bytes,
#: at most 8 * page_size, and its ranges)
MAX_PAGES = 8192
#: the ``array`` type code of each index dtype (its native machine type)
_TYPECODES = {torch.int64: "q", torch.int32: "i"}
_STRIDED = torch.strided
_string_at = ctypes.string_at


class OnePage:
    """``host_page_ranges(pool, host_indices, 1)`` as ``(page ranges, format)``, remembered
    (see the module docstring). Safe under concurrent calls: its state is one tuple, replaced
    whole (pool, range table, page size, format, and by slots the page's ranges)."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state: _State | None = None

    def __call__(self, pool: Any, host_indices: torch.Tensor) -> tuple[PageRanges, PageFormat]:
        """Call under the pool's ``io_guard`` (the ranges are the pool's memory)."""
        st = self._state
        h = host_indices
        if (
            st is not None
            and pool is st[0]
            and type(h) is torch.Tensor
            and h.dtype in INDEX_DTYPES  # any other kind: host_page_ranges names it
            and h.is_cpu
            and h.layout is _STRIDED
            and h.dim() == 1
            and h.numel() == st[2]
        ):
            ptr = h.data_ptr()  # 0: no storage (a zero tensor)
            if ptr and h.is_contiguous() and not h.is_neg():
                ranges = st[4].get(_string_at(ptr, st[2] * h.element_size()))
                if ranges is not None:
                    return ranges, st[3]
            (page,) = pool.page_ids(h)  # the pool's checks of the slots
            return self._remember(page, h.dtype, st), st[3]
        return self._miss(pool, host_indices)

    @staticmethod
    def _remember(page: int, dtype: torch.dtype, st: _State) -> PageRanges:
        """The ranges of ``page`` (accepted by the pool), remembered under its canonical
        bytes as ``dtype`` slots."""
        pages, ps = st[4], st[2]
        if len(pages) >= MAX_PAGES:
            pages.clear()
        ranges = tuple((base + page * stride, nbytes) for base, stride, nbytes in st[1])
        pages[array(_TYPECODES[dtype], range(page * ps, page * ps + ps)).tobytes()] = ranges
        return ranges

    def _miss(self, pool: Any, host_indices: torch.Tensor) -> tuple[PageRanges, PageFormat]:
        """The general path; it starts remembering ``pool`` when the pool has a range table."""
        batch, fmt = host_page_ranges(pool, host_indices, 1)
        table_of = getattr(pool, "page_range_table", None)
        table = table_of() if callable(table_of) else None
        if table is not None:
            self._state = (pool, table, int(pool.page_size), fmt, {})
        return batch[0], fmt
