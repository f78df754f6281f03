"""The host ranges of a one-page storage call, remembered per page.

A one-page ``batch_get_v1`` is the controller's common call, and at 128 KiB a page's read and
checksum cost about 7 us: :func:`~mem_cache_storage.backend.host_page_ranges` (the pool's slot
check, three attribute reads, the format's lookup, a
:class:`~mem_cache_storage.backend.PageBatch`) was a fifth of the call. :class:`OnePage` keeps,
for the last of our host pools it saw, the pool's page format and, by page id, the page's
ranges: a pool's range table is fixed while it is open (its buffers never move) and the caller
holds the pool's ``io_guard``, which refuses a closed pool. Every call has its slots
checked by the pool's own ``page_ids`` (one ``tolist`` for a page), which raises the pool's
precise error. SGLang's pools (no range table), slots of another length and any other pool take
:func:`~mem_cache_storage.backend.host_page_ranges`.
"""

from __future__ import annotations

from typing import Any

import torch

from mem_cache_kernels.checks import INDEX_DTYPES
from mem_cache_storage._page_format import PageFormat, PageRanges
from mem_cache_storage.backend import host_page_ranges

__all__ = ["OnePage"]

#: a host pool's ``page_range_table()``: ``(base, stride, nbytes)`` per range of a page
_Table = tuple[tuple[int, int, int], ...]
#: (pool, its range table, page size, page format, ranges by page id)
_State = tuple[Any, _Table, int, PageFormat, dict[int, PageRanges]]


#: pages remembered per pool before the memo starts over (an entry: a page's ranges)
MAX_PAGES = 8192


class OnePage:
    """``host_page_ranges(pool, host_indices, 1)`` as ``(page ranges, format)``, remembered
    (see the module docstring). Safe under concurrent calls: its state is one tuple, replaced
    whole (pool, range table, page size, format, and by page id the page's ranges)."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state: _State | None = None

    def __call__(self, pool: Any, host_indices: torch.Tensor) -> tuple[PageRanges, PageFormat]:
        """Call under the pool's ``io_guard`` (the ranges are the pool's memory)."""
        st = self._state
        if (
            st is not None
            and pool is st[0]
            and type(host_indices) is torch.Tensor
            and host_indices.dtype in INDEX_DTYPES  # any other kind: host_page_ranges names it
            and host_indices.dim() == 1
            and host_indices.numel() == st[2]
        ):
            (page,) = pool.page_ids(host_indices)  # the pool's checks of the slots
            ranges = st[4].get(page)
            if ranges is None:
                ranges = self._remember(page, st)
            return ranges, st[3]
        return self._miss(pool, host_indices)

    @staticmethod
    def _remember(page: int, st: _State) -> PageRanges:
        pages = st[4]
        if len(pages) >= MAX_PAGES:
            pages.clear()
        ranges = pages[page] = tuple(
            (base + page * stride, nbytes) for base, stride, nbytes in st[1]
        )
        return ranges

    def _miss(self, pool: Any, host_indices: torch.Tensor) -> tuple[PageRanges, PageFormat]:
        """The general path; it starts remembering ``pool`` when the pool has a range table."""
        batch, fmt = host_page_ranges(pool, host_indices, 1)
        table_of = getattr(pool, "page_range_table", None)
        table = table_of() if callable(table_of) else None
        if table is not None:
            self._state = (pool, table, int(pool.page_size), fmt, {})
        return batch[0], fmt
