"""The host ranges of a one-page storage call, remembered per page.

A one-page ``batch_get_v1`` / ``batch_set_v1`` is the controller's common call, and at 128 KiB a
page's read and checksum cost about 7 us: :func:`~mem_cache_storage.backend.host_page_ranges`
(three attribute reads, the format's lookup, a :class:`~mem_cache_storage.backend.PageBatch`)
was a fifth of the call. :class:`OnePage` keeps, for one of our host pools, the pool's page
format and each page's ranges by page id, while the pool's range table is the same tuple (the
pool builds a new one when its buffers change); every call still checks its slots through the
pool's ``page_ids``. SGLang's pools (no range table), a wrong kind or length of slots, and any
other pool take :func:`~mem_cache_storage.backend.host_page_ranges`, which raises the precise
error.
"""

from __future__ import annotations

from typing import Any

import torch

from mem_cache_storage._page_format import PageFormat, PageRanges
from mem_cache_storage.backend import host_page_ranges

__all__ = ["OnePage"]

#: a host pool's ``page_range_table()``: ``(base, stride, nbytes)`` per range of a page
_Table = tuple[tuple[int, int, int], ...]


def _none() -> None:
    return None


#: pages remembered per pool before the memo starts over (a page's entry is its ranges)
MAX_PAGES = 8192


class OnePage:
    """``host_page_ranges(pool, host_indices, 1)`` as ``(page ranges, format)``, remembered
    (see the module docstring). Safe under concurrent calls: its state is one tuple, replaced
    whole (range table, page size, format, ranges by page id). A range table is one pool's
    tuple, so the table's identity also names the pool."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state: tuple[_Table, int, PageFormat, dict[int, PageRanges]] | None = None

    def __call__(self, pool: Any, host_indices: torch.Tensor) -> tuple[PageRanges, PageFormat]:
        """Call under the pool's ``io_guard`` (the ranges are the pool's memory)."""
        st = self._state
        if (
            st is not None
            and type(host_indices) is torch.Tensor
            and host_indices.numel() == st[1]
            and getattr(pool, "page_range_table", _none)() is st[0]
        ):
            (page,) = pool.page_ids(host_indices)  # the slots' checks
            pages = st[3]
            ranges = pages.get(page)
            if ranges is None:
                if len(pages) >= MAX_PAGES:
                    pages.clear()
                ranges = pages[page] = tuple(
                    (base + page * stride, nbytes) for base, stride, nbytes in st[0]
                )
            return ranges, st[2]
        return self._miss(pool, host_indices)

    def _miss(self, pool: Any, host_indices: torch.Tensor) -> tuple[PageRanges, PageFormat]:
        """The general path; it starts remembering ``pool`` when the pool has a range table."""
        batch, fmt = host_page_ranges(pool, host_indices, 1)
        table_of = getattr(pool, "page_range_table", None)
        table = table_of() if callable(table_of) else None
        if table is not None:
            self._state = (table, int(pool.page_size), fmt, {})
        return batch[0], fmt
