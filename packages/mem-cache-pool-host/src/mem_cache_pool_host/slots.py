"""Page-granular, thread-safe allocator of host slots with per-page ownership state.

Host slots are ``[0, num_pages * page_size)``; page ``p`` owns slots ``[p * ps, (p + 1) * ps)``.
Unlike device pools there is no padding page: every host page can be handed out. Indices are
CPU int64 tensors.

Contract:

* ``alloc(n)``: ``n`` must be a multiple of ``page_size``; returns ``n`` slots (whole pages, each
  page's slots ascending) or ``None`` with no state change when fewer than ``n`` slots are free.
* ``free(indices)``: ``indices`` must be whole pages (each run of ``page_size`` entries is one
  page's slots in order) of pages currently allocated, with no page twice. Anything else (double
  free, never-allocated page, misaligned slots) raises ``ValueError`` and frees nothing.
* Freed pages are merged lazily and handed out again in ascending page order, so later
  allocations see long runs of consecutive pages (good for direct IO and storage backends).
* All methods hold one ``threading.RLock``.
"""

from __future__ import annotations

import threading

import torch

from mem_cache_kernels.checks import INDEX_DTYPES, check_index, check_index_values, check_int

__all__ = ["HostSlotAllocator"]

#: at most this many slots are checked as Python ints in :meth:`HostSlotAllocator.pages_of`
_SMALL = 1024
#: at most this many pages of more slots are checked by their first slots as ints
#: (:meth:`HostSlotAllocator._few_pages`: a storage call's batch, 128 pages by default); more
#: pages take the tensor ops, whose cost grows more slowly (ps=1, 2048 pages: 73 against 390 us)
_FEW_PAGES = 128
_NOT_WHOLE = ("indices must be whole pages: runs of page_size={ps} consecutive ascending slots "
              "starting at a multiple of page_size")
_TWICE = "indices name the same page more than once"


class HostSlotAllocator:
    """See the module docstring."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        check_int("num_pages", num_pages, minimum=1)
        check_int("page_size", page_size, minimum=1)
        self.num_pages = num_pages
        self.page_size = page_size
        self.size = num_pages * page_size
        self.lock = threading.RLock()
        self._offsets = torch.arange(page_size, dtype=torch.int64)
        self._free_pages = torch.empty(0, dtype=torch.int64)
        self._released: list[torch.Tensor] = []
        self._num_free = 0
        self.page_used = torch.zeros(num_pages, dtype=torch.bool)
        """Per page, whether it is allocated (CPU bool ``[num_pages]``): the allocator's own
        state, for callers that test ownership on a hot path without a call into this module
        (``bool(page_used[pages].all())``). Read it under :attr:`lock`; never write it."""
        self.clear()

    def clear(self) -> None:
        """Return every page to the free list (forgets all ownership)."""
        with self.lock:
            self._free_pages = torch.arange(self.num_pages, dtype=torch.int64)
            self._released = []
            self._num_free = self.num_pages
            self.page_used.zero_()

    def available_size(self) -> int:
        """Free slots (a multiple of ``page_size``)."""
        with self.lock:
            return self._num_free * self.page_size

    def alloc(self, need_size: int) -> torch.Tensor | None:
        check_int("need_size", need_size, minimum=0)
        if need_size % self.page_size:
            raise ValueError(
                f"need_size must be a multiple of page_size={self.page_size}, got {need_size}"
            )
        need_pages = need_size // self.page_size
        with self.lock:
            if need_pages > self._num_free:
                return None
            if need_pages > self._free_pages.numel():
                self._merge_released()
            pages = self._free_pages[:need_pages]
            self._free_pages = self._free_pages[need_pages:]
            self._num_free -= need_pages
            self.page_used[pages] = True
            return self._pages_to_slots(pages)

    def free(self, indices: torch.Tensor) -> int:
        """Free whole pages given by their slots; returns the number of slots freed."""
        pages = self.pages_of(indices)
        with self.lock:
            if pages.numel() == 0:
                return 0
            used = self.page_used[pages]
            if not bool(used.all()):
                bad = pages[~used][:8].tolist()
                raise ValueError(
                    f"indices include pages that are not allocated (double free or never "
                    f"allocated): pages {bad}"
                )
            self.page_used[pages] = False
            self._released.append(pages.clone())
            self._num_free += pages.numel()
            return int(pages.numel()) * self.page_size

    def is_allocated(self, indices: torch.Tensor) -> bool:
        """Whether every page of the (page-aligned) ``indices`` is currently allocated."""
        pages = self.pages_of(indices)
        with self.lock:
            return bool(self.page_used[pages].all())

    def free_slots(self) -> torch.Tensor:
        """Slots of the merged free list (int64, in hand-out order; a copy)."""
        with self.lock:
            return self._pages_to_slots(self._free_pages)

    def release_slots(self) -> list[torch.Tensor]:
        """Slots freed since the last merge, one tensor per ``free`` call (copies)."""
        with self.lock:
            return [self._pages_to_slots(p) for p in self._released]

    def slot_used(self) -> torch.Tensor:
        """Per slot, whether its page is allocated (bool ``[size]``; a copy)."""
        with self.lock:
            return self.page_used.repeat_interleave(self.page_size)

    def pages_of(self, indices: torch.Tensor) -> torch.Tensor:
        """Validate page-aligned slot ``indices`` and return their page ids (CPU int64).

        ``TypeError`` unless ``indices`` is an int32/int64 tensor; ``ValueError`` unless it is a
        1-D tensor with data of whole pages in range, each page's slots consecutive and
        ascending, no page twice.
        """
        small = self._check_shape_and_small_pages(indices)
        if small is not None:
            return torch.tensor(small, dtype=torch.int64)
        return self._tensor_pages(indices)

    def page_ids(self, indices: torch.Tensor, *, trusted: bool = False) -> list[int]:
        """:meth:`pages_of` as Python ints; ``trusted``: ``indices`` is known to be a 1-D int64
        CPU tensor of whole, distinct, in-range pages (no check, one ``tolist``)."""
        ps = self.page_size
        if trusted:  # a short list: one tolist (a strided tensor slice costs more)
            firsts = indices.tolist()[::ps] if indices.numel() <= _SMALL else (
                indices[::ps].tolist())
            return [s // ps for s in firsts]
        if (  # one page of CPU slots (a storage call's usual batch): no further call
            type(indices) is torch.Tensor
            and indices.is_cpu
            and indices.dtype in INDEX_DTYPES
            and indices.dim() == 1
            and indices.shape[0] == ps
        ):
            page = self._one_page(indices.tolist())
            if page is not None:
                return [page]
        small = self._check_shape_and_small_pages(indices)
        if small is not None:
            return small
        out: list[int] = self._tensor_pages(indices).tolist()
        return out

    def _one_page(self, slots: list[int]) -> int | None:
        """The page id of ``page_size`` slots when they are one whole page in range (its slots
        consecutive and ascending), else ``None``."""
        ps, s = self.page_size, slots[0]
        if s >= 0 and not s % ps and s + ps <= self.size and slots == list(range(s, s + ps)):
            return s // ps
        return None

    def _check_shape_and_small_pages(self, indices: torch.Tensor) -> list[int] | None:
        """Check the kind, shape and length of ``indices``; for a few CPU slots that are whole,
        distinct pages in range, also their page ids (else ``None``: the tensor checks of
        :meth:`_tensor_pages` decide, and raise the precise error)."""
        if not (  # inline on a 1-D CPU index tensor (a storage call's); else the full check
            type(indices) is torch.Tensor
            and indices.is_cpu
            and indices.dtype in INDEX_DTYPES
            and indices.dim() == 1
        ):
            check_index("indices", indices)
        ps = self.page_size
        n = indices.numel()
        if n % ps:
            raise ValueError(f"indices length must be a multiple of page_size={ps}, got {n}")
        if 0 < n <= _SMALL and indices.is_cpu:
            return self._small_pages(indices.tolist())
        return None

    def _tensor_pages(self, indices: torch.Tensor) -> torch.Tensor:
        """The value checks of :meth:`pages_of` as tensor ops (kind and shape already checked);
        at most :data:`_FEW_PAGES` pages take :meth:`_few_pages`."""
        ps = self.page_size
        idx = indices.to("cpu", torch.int64)
        if idx.numel() == 0:
            return idx
        rows = idx.view(-1, ps)
        if rows.shape[0] <= _FEW_PAGES:
            return self._few_pages(idx, rows)
        check_index_values("indices", idx, limit=self.size)
        starts = rows[:, 0]
        if bool((starts % ps).any()) or not torch.equal(rows, starts[:, None] + self._offsets):
            raise ValueError(_NOT_WHOLE.format(ps=ps))
        pages = starts // ps
        if torch.unique(pages).numel() != pages.numel():
            raise ValueError(_TWICE)
        return pages

    def _few_pages(self, idx: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """:meth:`_tensor_pages` of a few pages (``rows``: ``idx`` as ``[pages, page_size]``):
        the pages' first slots as ints (aligned, in range, distinct) and one tensor compare of
        every slot with its page's first slot plus its offset; the range check of every value
        runs only when those fail, for its precise error. Three computing tensor ops instead of
        nine: inside a 32-page storage read, where each op finds its code cold, the nine took
        7 of the read's 60 us per 512 KiB page."""
        ps, size = self.page_size, self.size
        starts: list[int] = rows[:, 0].tolist()
        if not (
            all(s >= 0 and not s % ps and s + ps <= size for s in starts)
            and (ps == 1 or torch.equal(rows, rows[:, :1] + self._offsets))
        ):
            check_index_values("indices", idx, limit=size)  # a value out of range: its error
            raise ValueError(_NOT_WHOLE.format(ps=ps))
        if len(set(starts)) != len(starts):
            raise ValueError(_TWICE)
        return torch.tensor([s // ps for s in starts], dtype=torch.int64)

    def _small_pages(self, slots: list[int]) -> list[int] | None:
        """The page ids of ``slots`` (a few pages, as Python ints) when they are whole, distinct
        pages in range, else ``None``: a storage call of one page costs one ``tolist`` here
        instead of about ten small torch ops (same accepted set as the tensor checks)."""
        ps, size = self.page_size, self.size
        if len(slots) == ps:  # one page (a storage call's usual batch)
            page = self._one_page(slots)
            return None if page is None else [page]
        starts = slots[::ps]
        for k, s in enumerate(starts):
            if s < 0 or s % ps or s + ps > size:
                return None
            if ps > 1 and slots[k * ps : (k + 1) * ps] != list(range(s, s + ps)):
                return None
        if len(set(starts)) != len(starts):
            return None
        return [s // ps for s in starts]

    def _pages_to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        return (pages[:, None] * self.page_size + self._offsets).reshape(-1)

    def _merge_released(self) -> None:
        merged = torch.cat([self._free_pages, *self._released])
        self._free_pages = torch.sort(merged).values
        self._released = []
