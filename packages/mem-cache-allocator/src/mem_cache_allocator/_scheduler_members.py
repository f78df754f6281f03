"""The members of :class:`~mem_cache_allocator.page_allocator.PageAllocatorCore` that SGLang's
scheduler and caches call off the alloc/free hot path (private; a mixin of the core).

* Views under SGLang's names (``free_pages``, ``release_pages``, ``free_group``,
  ``staged_pages``, ...) and ``resize``: host-side reads of the core's state.
* Exact-page frees: ``free_page_ids`` and ``free_segment(s)`` (page ids by stride at
  caller-stated positions, no dedup, no device sync) and the deprecated ``free_unaligned``.
* Free groups: ``free_group_end``'s flush (:meth:`SchedulerMembers._flush_free_group`), one
  free of the union of the queued frees, as SGLang.

Every member reads or changes the state that :class:`PageAllocatorCore` owns and documents
(``_free``, ``_release``, ``_free_group``, ``_debug``); the checks and the release they share
with ``free`` (``_index_input``, ``_check_count``, ``commit_free``, ``_unique_pages``, ...) are
the core's, declared below for the type checker only. Kept out of ``page_allocator`` so that
the module an ``alloc_extend`` / ``free`` runs through holds only what those calls run.
"""

from __future__ import annotations

import warnings
from array import array
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from mem_cache_allocator._debug import DebugTracker
from mem_cache_allocator._free_list import ChunkedFreeList
from mem_cache_allocator._scheduler_hooks import check_config
from mem_cache_allocator.base import BaseTokenToKVPoolAllocator
from mem_cache_kernels.checks import SMALL_BATCH, check_int
from mem_cache_kernels.pages import trim_segments

__all__ = ["SchedulerMembers"]

_SLOTS = "slots"  # free-group entry kinds: slot ids (``free``; page ids for paged) ...
_PAGES = "pages"  # ... or exact page ids (``free_segment(s)`` / ``free_page_ids``)


class SchedulerMembers(BaseTokenToKVPoolAllocator):
    """The cold members of :class:`PageAllocatorCore` (see the module doc); not used alone."""

    if TYPE_CHECKING:  # the core's state and shared checks, defined by PageAllocatorCore
        num_pages: int
        _page_shift: int
        _free: ChunkedFreeList
        _release: list[torch.Tensor]
        _num_release: int
        _free_empty: torch.Tensor
        _debug: DebugTracker | None
        _FREE_TO_FRONT: ClassVar[bool]
        _SORT_FREES: ClassVar[bool]

        def commit_free(self, pages: torch.Tensor) -> None: ...

        def _free_input(self, name: str, t: object) -> torch.Tensor | None: ...

        def _index_input(
            self, name: str, t: object, *, page_ids: bool, check_range: bool = True
        ) -> torch.Tensor | None: ...

        def _check_cpu_range(self, name: str, t: torch.Tensor, *, page_ids: bool) -> None: ...

        def _check_count(self, n: int, queued: int = 0) -> None: ...

        def _push(self, pages: torch.Tensor) -> None: ...

        def _unique_pages(self, parts: list[torch.Tensor]) -> torch.Tensor: ...

    # ------------------------------------------------------------------ views and resize
    @property
    def free_pages(self) -> torch.Tensor:
        """Read-only view under SGLang's name: the free list front-to-back (staged pages not
        included; a tensor the allocator never writes, O(free pages) on first access)."""
        return self._free.to_tensor()

    @property
    def release_pages(self) -> torch.Tensor:
        """Read-only view under SGLang's name: the staged (``need_sort``) pages, a new tensor."""
        if not self._release:
            return self._free_empty
        return torch.cat(self._release) if len(self._release) > 1 else self._release[0]

    @property
    def free_group(self) -> list[torch.Tensor] | None:
        """Read-only view under SGLang's name: ``None`` outside a free group, else the queued
        tensors (page ids for paged ``free``/``free_segment``, slots for the token allocator)."""
        group = self._free_group
        return None if group is None else [t for t, _ in group]

    @property
    def is_not_in_free_group(self) -> bool:
        """SGLang 0.5.14's flag: ``True`` outside a free group."""
        return self._free_group is None

    @property
    def debug_mode(self) -> bool:
        """SGLang's name of :attr:`debug` (its ``SGLANG_DEBUG_MEMORY_POOL`` checks)."""
        return self._debug is not None

    @property
    def staged_pages(self) -> list[torch.Tensor]:
        """SGLang's ``need_sort`` staging list: the staged page-id tensors (a new list; the
        tensors are the allocator's, treat them as read-only)."""
        return list(self._release)

    @property
    def num_staged_pages(self) -> int:
        """Pages in :attr:`staged_pages` (host-side)."""
        return self._num_release

    @property
    def free_page_ids_group(self) -> list[torch.Tensor]:
        """SGLang's queue of exact page-id frees (``free_segment(s)`` / ``free_page_ids``) in
        the open free group; ``[]`` outside a group."""
        group = self._free_group
        return [] if group is None else [t for t, kind in group if kind is _PAGES]

    def get_all_free_pages(self) -> torch.Tensor:
        """Every free page id: the free list front-to-back, then the staged pages (a copy)."""
        return self.free_pages_tensor()

    def resize(self, config: Any) -> None:
        """Resize to ``config.max_total_num_tokens`` tokens (``num_pages`` whole pages) and
        :meth:`clear`: the free list, staging and debug bookkeeping are rebuilt for the new
        capacity. The pool is the caller's to resize. Outstanding slots are forgotten."""
        size = check_config(config, "max_total_num_tokens")["max_total_num_tokens"]
        self.size = size
        self.num_pages = size // self.page_size
        self._free = ChunkedFreeList(self.device, arena_size=self.num_pages)
        if self._debug is not None:
            self._debug = DebugTracker(type(self).__name__, self.num_pages, self.page_size)
        self.clear()

    def free_pages_tensor(self) -> torch.Tensor:
        """The free list front-to-back followed by staged pages (a copy; O(free pages))."""
        parts = [self._free.to_tensor(), *self._release]
        return torch.cat(parts) if len(parts) > 1 else parts[0].clone()

    # ------------------------------------------------------------------ exact-page frees
    def free_unaligned(self, free_index: torch.Tensor) -> None:
        """Deprecated alias of :meth:`free` (``free`` accepts unaligned slots since SGLang's
        contract became ours); warns once per call and is removed after one release."""
        warnings.warn(
            "free_unaligned is deprecated: free accepts the same input (SGLang's contract); "
            "call free",
            DeprecationWarning,
            stacklevel=2,
        )
        self.free(free_index)

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        """Release exactly ``page_ids`` (no dedup, kept in the given order); sync-free."""
        pages = self._index_input("page_ids", page_ids, page_ids=True)
        if pages is None:
            return
        pages = pages.clone() if pages is page_ids else pages
        if self._free_group is not None:
            self._free_group.append((pages, _PAGES))
            return
        if self._debug is not None:
            self._debug.check_free_pages(pages)
        self._check_count(pages.shape[0])
        self.commit_free(pages)

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """Free one request's slots of positions ``[start_pos, start_pos + len(free_index))``.

        Sync-free: the caller states the structure (``free_index[k]`` is the slot of position
        ``start_pos + k`` of one request, so a page's slots sit together), and the page ids are
        taken by stride on the host-known positions: the first slot, then the first slot of every
        page boundary after ``start_pos``. Releases exactly ``unique(free_index // page_size)``
        (a segment starting inside a page releases that page too), in position order.
        """
        check_int("start_pos", start_pos, minimum=0)
        idx = self._index_input("free_index", free_index, page_ids=False, check_range=False)
        if idx is None:
            return
        host = self._segment_pages_host(idx, start_pos)
        pages = self._segment_pages(idx, start_pos) if host is None else host
        self._release_page_list([pages], free_index, [(idx, pages)], ranged=host is not None)

    def free_segments(self, segments: Iterable[tuple[torch.Tensor, int]]) -> None:
        """Free ascending ``(free_index, start_pos)`` segments of one request's kv row.

        A page shared by two consecutive segments (one ends inside it, the next starts in it) is
        released once; every other page as :meth:`free_segment` would. Sync-free; one release
        (one free-list insertion) for all segments, pages in position order.
        """
        parts: list[torch.Tensor] = []
        checked: list[tuple[torch.Tensor, torch.Tensor]] = []
        ranged = True  # every part's pages range-checked on the host already
        if self._debug is not None and isinstance(segments, list | tuple):
            segments = list(segments)  # the debug check sees the untrimmed slots
        for free_index, start_pos in trim_segments(segments, self.page_size):
            idx = self._index_input("segments", free_index, page_ids=False, check_range=False)
            if idx is None:
                continue
            pages = self._segment_pages_host(idx, start_pos)
            if pages is None:
                pages = self._segment_pages(idx, start_pos)
                ranged = False
            parts.append(pages)
            checked.append((idx, pages))
        if parts:
            whole: list[torch.Tensor] | None = None
            if self._debug is not None and isinstance(segments, list):
                whole = []
                for seg in segments:
                    i = self._free_input("segments", seg[0])
                    if i is not None:
                        whole.append(i)
            self._release_page_list(parts, None, checked, whole, ranged=ranged)

    def _release_page_list(
        self,
        parts: list[torch.Tensor],
        caller: torch.Tensor | None,
        checked: list[tuple[torch.Tensor, torch.Tensor]],
        whole: list[torch.Tensor] | None = None,
        *,
        ranged: bool = False,
    ) -> None:
        """Release the pages ``parts`` of a ``free_segment(s)`` call (``ranged``: their range
        was checked on the host already, by :meth:`_segment_pages_host`)."""
        pages = torch.cat(parts) if len(parts) > 1 else parts[0]
        if pages is caller:
            pages = pages.clone()
        if self._free_group is not None:
            self._free_group.append((pages, _PAGES))
            return
        if not ranged and pages.device.type == "cpu":
            self._check_cpu_range("free_segment", pages, page_ids=True)
        if self._debug is not None:
            for idx, p in checked:
                self._debug.check_derivation(idx, p)
            slots = whole or [idx for idx, _ in checked]
            self._debug.check_free_slots(
                torch.cat(slots) if len(slots) > 1 else slots[0], pages, aligned=False
            )
        self._check_count(pages.shape[0])
        self.commit_free(pages)

    def _segment_pages_host(self, idx: torch.Tensor, start_pos: int) -> torch.Tensor | None:
        """:meth:`_segment_pages` of a CPU segment of at most ``SMALL_BATCH`` pages (page size
        > 1), on a list: one ``tolist`` of the pages' first slots, the shift and the range check
        on ints, one int64 tensor built from them. ``None`` for other segments, and for a page
        outside ``[1, num_pages]`` (the tensor path's check raises naming it). Inside a
        scheduler step this costs about half the two tensor ops and the reduction it replaces,
        whose code the step finds cold (``tools.bench.sglang_step``)."""
        ps = self.page_size
        n = idx.shape[0]
        if ps == 1 or not idx.is_cpu or n > SMALL_BATCH * ps:
            return None
        first_boundary = (ps - (start_pos & (ps - 1))) & (ps - 1)  # 0: starts on a boundary
        if first_boundary:
            firsts: list[int] = idx[:1].tolist()
            if first_boundary < n:
                firsts += idx[first_boundary::ps].tolist()
        else:
            firsts = idx[::ps].tolist()
        shift = self._page_shift
        pages = [s >> shift for s in firsts]
        if min(pages) < 1 or max(pages) > self.num_pages:
            return None
        return torch.frombuffer(array("q", pages), dtype=torch.int64)

    def _segment_pages(self, idx: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Page ids of the segment ``idx`` of positions from ``start_pos`` (position order)."""
        ps = self.page_size
        if ps == 1:
            return idx.clone()  # the free list / the group owns what it keeps
        head = start_pos & (ps - 1)
        if head == 0:
            return idx[::ps] >> self._page_shift
        first_boundary = ps - head  # local index of the first slot of the next page
        if first_boundary >= idx.shape[0]:
            return idx[:1] >> self._page_shift
        return torch.cat((idx[:1], idx[first_boundary::ps])) >> self._page_shift

    # ------------------------------------------------------------------ free groups
    def _flush_free_group(self, group: list[Any]) -> None:
        """Apply the group's frees as SGLang does: one free of their union.

        Paged: the pages of every ``free`` in the group, deduplicated and ascending, go first
        (one ``torch.unique``: the group's one sync), then the pages of ``free_segment(s)`` /
        ``free_page_ids`` calls that the ``free`` calls did not release already, in call order,
        in front of them. Token allocator: every slot in call order, appended. On an error
        (double free by the count, debug ownership) nothing is released and the group stays
        open.
        """
        try:
            pages = self._group_pages(group)
        except BaseException:
            self._free_group = group
            raise
        if pages is not None:
            for part in pages:
                self._push(part)

    def _group_pages(self, group: list[Any]) -> list[torch.Tensor] | None:
        cpu = self.device.type == "cpu"
        if not self._SORT_FREES:
            merged = torch.cat([t for t, _ in group]) if len(group) > 1 else group[0][0]
            if merged.dtype is not torch.int64:  # int32 slots queued as given
                merged = merged.to(torch.int64)
            if cpu:
                self._check_cpu_range("free_index", merged, page_ids=False)
            if self._debug is not None:
                self._debug.check_free_slots(merged, merged, aligned=False)
            self._check_count(merged.shape[0])
            if self._debug is not None:
                self._debug.on_free_pages(merged)
            if not (self.need_sort or self._FREE_TO_FRONT):
                self._free.extend_back([t for t, _ in group])
                return None
            return [merged]
        slot_parts = [t for t, kind in group if kind is _SLOTS]
        page_parts = [t for t, kind in group if kind is _PAGES]
        out: list[torch.Tensor] = []
        unique_pages: torch.Tensor | None = None
        if slot_parts:
            unique_pages = self._unique_pages(slot_parts)
            out.append(unique_pages)
        if page_parts:
            listed = torch.cat(page_parts) if len(page_parts) > 1 else page_parts[0]
            if cpu:
                self._check_cpu_range("free_segment / free_page_ids", listed, page_ids=True)
            if unique_pages is not None:  # a page both kinds release goes once
                listed = listed[~torch.isin(listed, unique_pages)]
            out.append(listed)
        merged = torch.cat(out) if len(out) > 1 else out[0]
        if self._debug is not None:
            self._debug.check_free_pages(merged)
        self._check_count(merged.shape[0])
        if self._debug is not None:
            self._debug.on_free_pages(merged)
        return out
