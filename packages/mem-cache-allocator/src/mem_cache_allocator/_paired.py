"""``PairedAllocators``: a primary and a secondary slot allocator kept in step, plus their mapping.

The composite allocators (SWA: full + window; HiSparse: logical + device; DeepSeek-V4 HiSparse:
logical + c4 device) each own one of these and delegate their shared bookkeeping to it. It is a
component, not a base class: the public methods and attributes stay on the public classes, which
keep ``BaseTokenToKVPoolAllocator`` as their only base.

* ``primary``: the allocator whose slots callers see (full-attention / logical); any
  ``BaseTokenToKVPoolAllocator`` (a ``PageAllocatorCore`` for SWA and HiSparse).
* ``secondary``: the ``PageAllocatorCore`` over the second pool (window / device slots).
* ``mapping``: int64 primary->secondary slot map of the owner (``_composite.new_mapping``:
  0 = unmapped, trailing -1 so that ``mapping[-1] == -1``). Mutated in place, never replaced (the
  pool holds a reference to it).
* ``translate``: the hook turning a primary ``last_loc`` into the secondary's, for the same-shape
  allocations (``alloc_extend`` / ``alloc_decode``); default ``mapping[last_loc]``.

Transactions (:meth:`run_in_step`): both sides are backed up, the primary call runs, then the
secondary call; ``None`` from either side, or an exception from the secondary, restores both
sides (no state change) and returns ``None`` / re-raises. The same-shape methods check the
capacity of both sides on the host first and record ``mapping[primary] = secondary``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

from mem_cache_allocator._composite import check_need_size
from mem_cache_allocator._page_inputs import (
    check_decode_inputs,
    check_decode_structure,
    check_extend_inputs,
)
from mem_cache_allocator.base import BaseTokenToKVPoolAllocator
from mem_cache_allocator.page_allocator import PageAllocatorCore, PageAllocatorState
from mem_cache_kernels.pages import decode_counts

__all__ = ["ExtendLens", "PairedAllocators", "check_own_state", "free_page_count"]

_S = TypeVar("_S")

Backups = tuple[Any, PageAllocatorState]
#: ``(prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu)`` of an ``alloc_extend`` call.
ExtendLens = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def free_page_count(allocator: BaseTokenToKVPoolAllocator) -> int:
    """Free (and staged) pages of any allocator, host-side (``available_size // page_size``)."""
    if isinstance(allocator, PageAllocatorCore):
        return allocator.free_page_count()
    return allocator.available_size() // allocator.page_size


def check_own_state(state: object, state_type: type[_S], owner: object) -> _S:
    """``state`` if it is a ``state_type`` made by ``owner.backup_state()``, else ``ValueError``."""
    if not isinstance(state, state_type) or getattr(state, "owner", None) != id(owner):
        raise ValueError(
            f"state must come from this allocator's backup_state(), got {type(state).__name__}"
        )
    return state


def _live(slots: torch.Tensor) -> torch.Tensor:
    """The mapped entries of secondary ``slots`` (0 = unmapped, -1 = the sentinel): a new
    tensor (boolean indexing; a data-dependent shape, so it syncs on a GPU)."""
    return slots[slots > 0]


class PairedAllocators:
    """Two allocators kept in step and the primary->secondary mapping (see the module doc)."""

    __slots__ = ("mapping", "primary", "secondary", "translate")

    def __init__(
        self,
        primary: BaseTokenToKVPoolAllocator,
        secondary: PageAllocatorCore,
        mapping: torch.Tensor,
        translate: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.primary = primary
        self.secondary = secondary
        self.mapping = mapping
        self.translate = self._lookup if translate is None else translate

    def _lookup(self, last_loc: torch.Tensor) -> torch.Tensor:
        return self.mapping[last_loc]

    # ------------------------------------------------------------------ capacity
    def fits(self, primary_pages: int, secondary_pages: int) -> bool:
        """Whether both sides have that many free pages (host-side)."""
        return (
            primary_pages <= free_page_count(self.primary)
            and secondary_pages <= self.secondary.free_page_count()
        )

    def available_size(self, secondary_scale: int = 1) -> int:
        """``min(primary tokens, secondary_scale * secondary tokens)``."""
        return min(self.primary.available_size(), secondary_scale * self.secondary.available_size())

    # ------------------------------------------------------------------ transactions
    def backups(self) -> Backups:
        return self.primary.backup_state(), self.secondary.backup_state()

    def rollback(self, backups: Backups) -> None:
        self.primary.restore_state(backups[0])
        self.secondary.restore_state(backups[1])

    def run_in_step(
        self,
        primary_call: Callable[[], torch.Tensor | None],
        secondary_call: Callable[[], torch.Tensor | None],
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(primary slots, secondary slots)``, or ``None`` with both sides restored."""
        backups = self.backups()
        first = primary_call()
        if first is None:
            self.rollback(backups)
            return None
        try:
            second = secondary_call()
        except BaseException:
            self.rollback(backups)
            raise
        if second is None:
            self.rollback(backups)
            return None
        return first, second

    def _record(self, got: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor | None:
        if got is None:
            return None
        first, second = got
        self.mapping[first] = second
        return first

    # ------------------------------------------------------------------ same-shape allocation
    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots on both sides (whole pages); returns the primary slots."""
        check_need_size(need_size)
        pages = -(-need_size // self.primary.page_size)
        if not self.fits(pages, pages):
            return None
        return self._record(
            self.run_in_step(
                lambda: self.primary.alloc(need_size), lambda: self.secondary.alloc(need_size)
            )
        )

    def alloc_extend(
        self, lens: ExtendLens, last_loc: torch.Tensor, extend_num_tokens: int
    ) -> torch.Tensor | None:
        """The same extend on both sides; the secondary gets ``translate(last_loc)``."""
        # the host-side input checks run before the capacity pre-check, so that out of room
        # answers None only for valid input (the primary repeats them: cheap, no device sync)
        pages, _ = check_extend_inputs(*lens, last_loc, extend_num_tokens, self.primary.page_size)
        if not self.fits(pages, pages):
            return None
        second_last_loc = self.translate(last_loc)
        return self._record(
            self.run_in_step(
                lambda: self.primary.alloc_extend(*lens, last_loc, extend_num_tokens),
                lambda: self.secondary.alloc_extend(*lens, second_last_loc, extend_num_tokens),
            )
        )

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        """One decode slot per request on both sides (secondary ``last_loc`` translated).

        Each side's ``need_sort`` merge trigger runs first, as SGLang's inner ``alloc_decode``
        calls run it before they give up, so a ``None`` here leaves the same merged state.
        """
        # every host-side input check before the pre-check can answer None
        bs = check_decode_structure(seq_lens, seq_lens_cpu, last_loc)
        check_decode_inputs(seq_lens, seq_lens_cpu)
        for side in (self.primary, self.secondary):
            if isinstance(side, PageAllocatorCore):
                side.merge_for_decode(bs)
        pages = decode_counts(seq_lens_cpu, self.primary.page_size, name="seq_lens_cpu")
        if not self.fits(pages, pages):
            return None
        second_last_loc = self.translate(last_loc)
        return self._record(
            self.run_in_step(
                lambda: self.primary.alloc_decode(seq_lens, seq_lens_cpu, last_loc),
                lambda: self.secondary.alloc_decode(seq_lens, seq_lens_cpu, second_last_loc),
            )
        )

    # ------------------------------------------------------------------ free
    def release(self, keys: torch.Tensor) -> None:
        """Free the secondary slots mapped from primary ``keys``, then clear those entries."""
        self.free_secondary(self.mapping[keys])
        self.mapping[keys] = 0

    def free_secondary(self, slots: torch.Tensor) -> None:
        """Free secondary ``slots`` (entries <= 0 ignored) with set semantics (syncs)."""
        live = _live(slots)
        if live.numel():
            self.secondary.free(live)

    def prepare_secondary_free(self, slots: torch.Tensor) -> torch.Tensor | None:
        """The validating half of :meth:`free_secondary` (outside a secondary free group): the
        secondary pages it would release, checked (range, capacity count, debug ownership) but
        not released (``secondary.commit_free`` does); ``None`` when no slot is live. Syncs."""
        live = _live(slots)
        if live.numel() == 0:
            return None
        return self.secondary.prepare_free(live)

    def end_free_group(self, secondary_queue: list[torch.Tensor]) -> None:
        """Close the primary's free group together with secondary slots queued beside it.

        Failure atomic: the secondary free is validated first (:meth:`prepare_secondary_free`
        of the concatenated queue: one dedup, one sync), then the primary's own
        ``free_group_end`` runs (on an error it raises with its group still open), and only then
        are the secondary pages released. On an error nothing is released on either side.
        """
        pages = None
        if secondary_queue:
            queued = torch.cat(secondary_queue) if len(secondary_queue) > 1 else secondary_queue[0]
            pages = self.prepare_secondary_free(queued)
        self.primary.free_group_end()
        if pages is not None:
            self.secondary.commit_free(pages)

    # ------------------------------------------------------------------ state
    def merge_and_sort_free(self) -> None:
        self.primary.merge_and_sort_free()
        self.secondary.merge_and_sort_free()

    def clear(self) -> None:
        """Both sides back to their initial state; every mapping entry 0 (the -1 stays)."""
        self.primary.clear()
        self.secondary.clear()
        self.mapping[:-1].fill_(0)

    def snapshot(self) -> tuple[Any, PageAllocatorState, torch.Tensor]:
        """``(primary state, secondary state, mapping copy)`` for :meth:`restore`."""
        first, second = self.backups()
        return first, second, self.mapping.clone()

    def restore(self, first: Any, second: PageAllocatorState, mapping: torch.Tensor) -> None:
        self.rollback((first, second))
        self.mapping.copy_(mapping)

    def describe(self, primary_label: str, secondary_label: str) -> str:
        """The ``debug_print`` line: available tokens of both sides."""
        return (
            f"#{primary_label}-available-size: {self.primary.available_size()}, "
            f"#{secondary_label}-available-size: {self.secondary.available_size()}, "
        )
