"""Debug-mode ownership tracking for page allocators (host-side bitmaps; syncs freely).

Enabled per allocator by ``debug=True`` or for every allocator by the environment variable
``MEM_CACHE_DEBUG=1`` (read by :func:`mem_cache_kernels.checks.debug_enabled`, the one reader of
that switch; messages list slots with :func:`mem_cache_kernels.checks.describe`). The tracker
mirrors who owns what:

* a page is *owned* from the moment it leaves the free list until it is freed;
* a slot is *live* from the moment it is handed out (``alloc*`` returned it) until its page is
  freed; ``ever`` remembers slots that were live once, to tell a double free from a bogus slot.

Every check raises :class:`AllocatorDebugError` (a ``ValueError`` and an ``AssertionError``:
SGLang's debug mode asserts, engines' tests expect ``AssertionError``) naming the offending slots
or pages (at most 16 of them) before any allocator state changes.
"""

from __future__ import annotations

import torch

from mem_cache_kernels.checks import describe

__all__ = [
    "AllocatorDebugError",
    "DebugTracker",
    "check_decode_inputs",
    "check_extend_inputs",
]


class AllocatorDebugError(ValueError, AssertionError):
    """A debug-mode ownership check failed (double free, bogus slot, misaligned input, ...).

    Both a ``ValueError`` (mem-cache's caller-mistake convention) and an ``AssertionError``
    (what SGLang's ``SGLANG_DEBUG_MEMORY_POOL`` asserts raise, and what engines' tests expect).
    """


class DebugTracker:
    """Host bitmaps of owned pages and live slots for an allocator of ``num_pages`` pages."""

    __slots__ = ("_ever", "_live", "_owned", "name", "num_pages", "page_size")

    def __init__(self, name: str, num_pages: int, page_size: int) -> None:
        self.name = name
        self.num_pages = num_pages
        self.page_size = page_size
        self._owned = torch.zeros(num_pages + 1, dtype=torch.bool)
        self._live = torch.zeros((num_pages + 1) * page_size, dtype=torch.bool)
        self._ever = torch.zeros((num_pages + 1) * page_size, dtype=torch.bool)

    def reset(self) -> None:
        self._owned.zero_()
        self._live.zero_()
        self._ever.zero_()

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._owned.clone(), self._live.clone(), self._ever.clone()

    def restore(self, snap: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        self._owned, self._live, self._ever = (t.clone() for t in snap)

    # ---------------------------------------------------------------- allocation side
    def on_take_pages(self, pages: torch.Tensor) -> None:
        """Pages left the free list (internal consistency: they must not be owned already)."""
        p = pages.detach().to("cpu", torch.int64)
        if p.numel() == 0:
            return
        bad = p[self._owned[p] | (p <= 0) | (p > self.num_pages)]
        if bad.numel():
            raise RuntimeError(
                f"{self.name}: free list handed out pages that are owned or out of range: "
                f"{describe(bad)} (the free list is corrupt: a page was freed twice?)"
            )
        self._owned[p] = True

    def on_hand_out(self, slots: torch.Tensor) -> None:
        """``slots`` were returned to a caller: their pages must be owned, the slots not live."""
        s = slots.detach().to("cpu", torch.int64)
        if s.numel() == 0:
            return
        pages = s // self.page_size
        in_range = (s > 0) & (pages <= self.num_pages)
        if not bool(in_range.all()):
            raise AllocatorDebugError(
                f"{self.name}: allocation produced out-of-range slots {describe(s[~in_range])}"
            )
        not_owned = s[~self._owned[pages]]
        if not_owned.numel():
            raise AllocatorDebugError(
                f"{self.name}: allocation wrote slots {describe(not_owned)} in pages this "
                f"caller does not own (wrong last_loc?)"
            )
        uniq, counts = torch.unique(s, return_counts=True)
        dup = torch.unique(torch.cat([s[self._live[s]], uniq[counts > 1]]))
        if dup.numel():
            raise AllocatorDebugError(
                f"{self.name}: allocation would hand out slots {describe(dup)} that are already "
                f"in use (wrong last_loc or prefix_lens?)"
            )
        self._live[s] = True
        self._ever[s] = True

    # ---------------------------------------------------------------- free side
    def check_free_slots(
        self, slots: torch.Tensor, pages: torch.Tensor, *, aligned: bool, dedup: bool = False
    ) -> None:
        """Validate a free of ``slots`` that releases ``pages`` (the allocator's page derivation).

        ``aligned``: the caller derived ``pages`` by stride (``free_segment``), so every page
        ``slots`` touches must be among ``pages``. ``dedup``: set semantics (the paged ``free``):
        a slot listed twice is one slot, not a double free.
        """
        s = slots.detach().to("cpu", torch.int64).reshape(-1)
        if dedup:
            s = torch.unique(s)
        p = pages.detach().to("cpu", torch.int64).reshape(-1)
        ps = self.page_size
        zero = s[(s >= 0) & (s < ps)]
        if zero.numel():
            raise AllocatorDebugError(
                f"{self.name}: free of slots in the padding page 0: {describe(zero)}"
            )
        oob = s[(s < 0) | (s // ps > self.num_pages)]
        if oob.numel():
            raise AllocatorDebugError(f"{self.name}: free of out-of-range slots {describe(oob)}")
        self._check_not_live_twice(s)
        if aligned:
            self.check_derivation(s, p)
        self.check_free_pages(p)
        # Freeing part of a page still in use: a live slot of a freed page that is not in `s`.
        page_slots = (p[:, None] * ps + torch.arange(ps)[None, :]).reshape(-1)
        still = page_slots[self._live[page_slots] & ~torch.isin(page_slots, s)]
        if still.numel():
            raise AllocatorDebugError(
                f"{self.name}: freeing part of page(s) {describe(torch.unique(still // ps))} "
                f"whose slots {describe(still)} are still in use"
            )

    def check_derivation(self, slots: torch.Tensor, pages: torch.Tensor) -> None:
        """``pages`` (stride-derived by ``free_segment``) must be exactly the pages ``slots``
        touch: the caller's stated structure (consecutive positions of one request) holds."""
        s = slots.detach().to("cpu", torch.int64).reshape(-1)
        p = pages.detach().to("cpu", torch.int64).reshape(-1)
        derived = torch.unique(s // self.page_size)
        if p.numel() != derived.numel() or not torch.equal(torch.sort(p).values, derived):
            raise AllocatorDebugError(
                f"{self.name}: free_segment expects one request's slots of consecutive positions "
                f"starting at start_pos (each page's slots together); got slots {describe(s)} "
                f"(pages {describe(derived)}, derived {describe(p)}); "
                f"use free() for arbitrary slot sets"
            )

    def _check_not_live_twice(self, s: torch.Tensor) -> None:
        uniq, counts = torch.unique(s, return_counts=True)
        if bool((counts > 1).any()):
            raise AllocatorDebugError(
                f"{self.name}: double free: slots {describe(uniq[counts > 1])} "
                f"appear more than once in one free"
            )
        dead = s[~self._live[s]]
        if dead.numel():
            twice = dead[self._ever[dead]]
            if twice.numel():
                raise AllocatorDebugError(f"{self.name}: double free of slots {describe(twice)}")
            raise AllocatorDebugError(
                f"{self.name}: free of slots {describe(dead)} that were never handed out"
            )

    def check_free_pages(self, pages: torch.Tensor) -> None:
        """Validate releasing whole ``pages`` (no slot check)."""
        p = pages.detach().to("cpu", torch.int64).reshape(-1)
        if p.numel() == 0:
            return
        zero = p[p == 0]
        if zero.numel():
            raise AllocatorDebugError(f"{self.name}: free of the padding page 0 (slot 0)")
        oob = p[(p < 0) | (p > self.num_pages)]
        if oob.numel():
            raise AllocatorDebugError(f"{self.name}: free of out-of-range pages {describe(oob)}")
        uniq, counts = torch.unique(p, return_counts=True)
        if bool((counts > 1).any()):
            raise AllocatorDebugError(
                f"{self.name}: double free: pages {describe(uniq[counts > 1])} "
                f"appear more than once in one free"
            )
        free = p[~self._owned[p]]
        if free.numel():
            raise AllocatorDebugError(
                f"{self.name}: double free (or never allocated) of pages {describe(free)}"
            )

    def on_free_pages(self, pages: torch.Tensor) -> None:
        p = pages.detach().to("cpu", torch.int64).reshape(-1)
        if p.numel() == 0:
            return
        self._owned[p] = False
        slots = (p[:, None] * self.page_size + torch.arange(self.page_size)[None, :]).reshape(-1)
        self._live[slots] = False


# ---------------------------------------------------------------- input checks (debug mode)
def check_extend_inputs(  # noqa: PLR0917 - mirrors alloc_extend
    page_size: int,
    prefix_lens: torch.Tensor,
    prefix_lens_cpu: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    last_loc: torch.Tensor,
) -> None:
    """Debug mode's checks of an ``alloc_extend`` call that need device data (copied to the
    host): the device lengths equal their ``*_cpu`` copies, ``0 <= prefix <= seq`` and
    ``last_loc`` is the slot of position ``prefix - 1`` modulo the page (-1 exactly for an empty
    prefix). ``ValueError`` naming the requests; changes nothing."""
    pre = prefix_lens.detach().to("cpu", torch.int64)
    seq = seq_lens.detach().to("cpu", torch.int64)
    last = last_loc.detach().to("cpu", torch.int64)
    if not torch.equal(pre, prefix_lens_cpu.to(torch.int64)) or not torch.equal(
        seq, seq_lens_cpu.to(torch.int64)
    ):
        raise ValueError("prefix_lens/seq_lens differ from their *_cpu copies")
    bad = torch.nonzero((seq < pre) | (pre < 0)).reshape(-1)
    if bad.numel():
        raise ValueError(f"requests {describe(bad)} have seq_lens < prefix_lens or negative")
    ps = page_size
    empty_ok = (pre == 0) == (last == -1)
    misaligned = torch.nonzero(((last + 1) % ps != pre % ps) | ~empty_ok).reshape(-1)
    if misaligned.numel():
        raise ValueError(
            f"misaligned alloc_extend inputs for requests {describe(misaligned)}: need "
            f"(last_loc + 1) % {ps} == prefix_lens % {ps} and last_loc == -1 iff prefix is "
            f"empty; last_loc={describe(last[misaligned])}, "
            f"prefix_lens={describe(pre[misaligned])}"
        )


def check_decode_inputs(
    page_size: int, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
) -> None:
    """Debug mode's checks of an ``alloc_decode`` call that need device data: ``seq_lens``
    equals ``seq_lens_cpu`` and ``last_loc`` is the slot of position ``seq - 2`` modulo the
    page (``seq >= 1``; ``last_loc >= 0`` unless ``seq == 1``). ``ValueError`` naming the
    requests; changes nothing."""
    seq = seq_lens.detach().to("cpu", torch.int64)
    last = last_loc.detach().to("cpu", torch.int64)
    if not torch.equal(seq, seq_lens_cpu.to(torch.int64)):
        raise ValueError("seq_lens differs from seq_lens_cpu")
    ps = page_size
    misaligned = torch.nonzero(
        ((last + 2) % ps != seq % ps) | (seq < 1) | ((seq > 1) & (last < 0))
    ).reshape(-1)
    if misaligned.numel():
        raise ValueError(
            f"misaligned alloc_decode inputs for requests {describe(misaligned)}: need "
            f"(last_loc + 2) % {ps} == seq_lens % {ps}; last_loc={describe(last[misaligned])}, "
            f"seq_lens={describe(seq[misaligned])}"
        )
