"""``SWATokenToKVPoolAllocator``: full-attention and sliding-window sub-allocators kept in step.

Public slot ids are *full-pool* slots. Every allocation takes slots from both inner allocators
with the same lengths (so both page "in step": identical in-page offsets) and records
``full_to_swa_index_mapping[full] = swa``. The mapping (int64, ``size + page_size + 1`` entries,
0 = unmapped, trailing -1 so that ``last_loc = -1`` translates to -1) is owned by the allocator
and registered into the ``SWAKVPool`` (``kvcache.register_mapping``), which reads it.

Safer than SGLang: the capacity of both sides is checked on the host before anything runs, and
should an inner allocation still fail the side that succeeded is rolled back (SGLang's
``alloc_decode`` leaks the full side); ``free_swa`` clears the mapping of every slot of the freed
full pages.

Cost note: releasing window slots needs the number of mapped window pages on the host, so
``free``/``free_swa`` make one device->host sync per call (one per step inside a free group).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from mem_cache_allocator._composite import make_inner, new_mapping
from mem_cache_allocator._page_inputs import check_extend_inputs
from mem_cache_allocator._paired import PairedAllocators, check_own_state
from mem_cache_allocator._prefill_budget import SWAPrefillBudget
from mem_cache_allocator._scheduler_hooks import (
    EvictParams,
    capacity_pair,
    check_config,
    check_tree_cache,
    evict_shortfall,
    supports_prefix_sharing,
)
from mem_cache_allocator.base import (
    BaseTokenToKVPoolAllocator,
    check_cpu_lengths,
    check_index_tensor,
)
from mem_cache_allocator.page_allocator import PageAllocatorState
from mem_cache_kernels.checks import check_int, check_optional_int

if TYPE_CHECKING:
    from mem_cache_pool.swa import BaseSWAKVPool

__all__ = ["SWAAllocatorState", "SWATokenToKVPoolAllocator"]


@dataclass(frozen=True, slots=True)
class _Tokens:
    """The ``config`` an inner allocator's ``resize`` reads."""

    max_total_num_tokens: int


@dataclass(frozen=True, slots=True)
class SWAAllocatorState:
    """Opaque result of :meth:`SWATokenToKVPoolAllocator.backup_state`."""

    owner: int
    full: PageAllocatorState
    swa: PageAllocatorState
    mapping: torch.Tensor


class SWATokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """``SWATokenToKVPoolAllocator(size, size_swa, page_size, dtype, device, kvcache,
    need_sort=False, req_to_token_pool=None, *, debug=False)``; ``kvcache`` is a
    ``BaseSWAKVPool`` or ``None``.

    ``req_to_token_pool`` serves SGLang's per-request window ring (window capacity counted in
    request rows, ``kvcache.swa_req_ring_size`` set), which we do not implement: a pool that
    asks for a ring raises ``NotImplementedError``; ``swa_req_ring`` is ``False`` and
    ``swa_ring_cost_tokens`` 0, SGLang's answers with the ring off.
    """

    def __init__(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        size: int,
        size_swa: int,
        page_size: int,
        dtype: torch.dtype,
        device: str | torch.device,
        kvcache: BaseSWAKVPool | None,
        need_sort: bool = False,
        req_to_token_pool: Any = None,
        *,
        debug: bool = False,
    ) -> None:
        super().__init__(size, page_size, dtype, device, kvcache, need_sort)
        check_int("size_swa", size_swa, minimum=0)
        if getattr(kvcache, "swa_req_ring_size", None) is not None:
            raise NotImplementedError(
                "SWATokenToKVPoolAllocator: a per-request SWA ring (kvcache.swa_req_ring_size) "
                "is not supported"
            )
        self._req_to_token_pool = req_to_token_pool
        self._size_full = size
        self._size_swa = size_swa
        self.size = min(size, size_swa)
        full_pool = None if kvcache is None else getattr(kvcache, "full_kv_pool", None)
        swa_pool = None if kvcache is None else kvcache.swa_kv_pool
        self.full_attn_allocator = make_inner(
            size, page_size, dtype, self.device, full_pool, need_sort, debug
        )
        self.swa_attn_allocator = make_inner(
            size_swa, page_size, dtype, self.device, swa_pool, need_sort, debug
        )
        self.full_to_swa_index_mapping = new_mapping(size + page_size, self.device)
        self._pair = PairedAllocators(
            self.full_attn_allocator,
            self.swa_attn_allocator,
            self.full_to_swa_index_mapping,
            self.translate_loc_from_full_to_swa,
        )
        self._swa_group: list[torch.Tensor] = []
        self._swa_page_group: list[torch.Tensor] = []  # window page ids of segment frees
        self._page_offsets = torch.arange(page_size, dtype=torch.int64, device=self.device)
        if kvcache is not None:
            kvcache.register_mapping(self.full_to_swa_index_mapping)

    # ------------------------------------------------------------------ capacity
    @property
    def size_full(self) -> int:
        return self._size_full

    @property
    def size_swa(self) -> int:
        """Window-side capacity in tokens (SGLang 0.5.23's ``size_swa``)."""
        return self._size_swa

    def available_size(self) -> int:
        return min(self.full_available_size(), self.swa_available_size())

    def full_available_size(self) -> int:
        """Free tokens of the full-attention side (its allocator's ``available_size``)."""
        return self.full_attn_allocator.available_size()

    def swa_available_size(self) -> int:
        """Free tokens of the sliding-window side (its allocator's ``available_size``)."""
        return self.swa_attn_allocator.available_size()

    @property
    def swa_req_ring(self) -> bool:
        """Whether the window side is a per-request ring: ``False`` (not supported here)."""
        return False

    @property
    def swa_ring_cost_tokens(self) -> int:
        """Window tokens one request's ring costs: 0 without a ring."""
        return 0

    def new_pages_available(self, num_full_pages: int, num_swa_pages: int) -> bool:
        """Whether both sides have that many free pages (host-side)."""
        check_int("num_full_pages", num_full_pages, minimum=0)
        check_int("num_swa_pages", num_swa_pages, minimum=0)
        return self._pair.fits(num_full_pages, num_swa_pages)

    def swa_capacity_and_available(
        self, *, full_capacity: int | None = None, swa_capacity: int | None = None
    ) -> tuple[tuple[int, int], tuple[int, int]]:
        """``((full_capacity, full_available_size()), (swa_capacity, swa_available_size()))``:
        the scheduler's capacities with this allocator's available sizes (a ``None`` capacity:
        ``size_full`` / ``size_swa``)."""
        return capacity_pair(
            (self.size_full, self.full_available_size()),
            (self.size_swa, self.swa_available_size()),
            full_capacity,
            swa_capacity,
        )

    # ------------------------------------------------------------------ scheduler hooks
    def create_prefill_budget(
        self, tree_cache: Any, *, num_mixed_decode_tokens: int = 0
    ) -> SWAPrefillBudget:
        """A :class:`~mem_cache_allocator._prefill_budget.SWAPrefillBudget`: the full and the
        window side priced separately (each its own buffer)."""
        check_tree_cache(tree_cache, "full_evictable_size", "swa_evictable_size")
        check_int("num_mixed_decode_tokens", num_mixed_decode_tokens, minimum=0)
        return SWAPrefillBudget(self, tree_cache, num_mixed_decode_tokens=num_mixed_decode_tokens)

    def evict_to_free_tokens(self, tree_cache: Any, num_tokens: int) -> None:
        """One ``tree_cache.evict_for_alloc(EvictParams(num_tokens=, swa_num_tokens=))`` with
        each side's shortfall against ``num_tokens`` (nothing when neither is short, or without
        a prefix-sharing cache)."""
        check_int("num_tokens", num_tokens, minimum=0)
        check_tree_cache(tree_cache, "supports_prefix_sharing", optional=True)
        if not supports_prefix_sharing(tree_cache):
            return
        full_short = max(0, num_tokens - self.full_available_size())
        swa_short = max(0, num_tokens - self.swa_available_size())
        if full_short or swa_short:
            evict_shortfall(
                tree_cache, EvictParams(num_tokens=full_short, swa_num_tokens=swa_short)
            )

    def reclaim_for_prealloc(
        self, tree_cache: Any, full_tokens: int, swa_tokens: int
    ) -> str | None:
        """Free window room for a decode-side preallocation of ``swa_tokens``: evicts the
        window shortfall from ``tree_cache``; ``None`` when ready, else a description of the
        shortfall. The full side is the caller's budget (its own buffer), not reclaimed."""
        check_int("full_tokens", full_tokens, minimum=0)
        check_int("swa_tokens", swa_tokens, minimum=0)
        check_tree_cache(tree_cache, "evict")
        available = self.swa_available_size()
        if available < swa_tokens:
            evict_shortfall(tree_cache, EvictParams(swa_num_tokens=swa_tokens - available))
            available = self.swa_available_size()
        if available < swa_tokens:
            return f"SWA eviction insufficient: needed={swa_tokens}, available={available}"
        return None

    # ------------------------------------------------------------------ mapping
    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """Window slots of full slots ``kv_indices`` (0 = not in the window, -1 for -1).

        An index past the mapping raises ``ValueError`` naming ``kv_indices`` (no extra cost:
        torch's own bounds check, re-raised)."""
        check_index_tensor("kv_indices", kv_indices, self.device)
        mapping = self.full_to_swa_index_mapping
        try:
            return mapping[kv_indices]
        except IndexError as exc:
            bound = mapping.shape[0] - 1
            raise ValueError(f"kv_indices must hold full slots in [-1, {bound}): {exc}") from exc

    def set_full_to_swa_mapping(
        self, full_indices: torch.Tensor, swa_indices: torch.Tensor
    ) -> None:
        """``mapping[full_indices] = swa_indices`` (HiCache load-back rebuilds it this way)."""
        check_index_tensor("full_indices", full_indices, self.device)
        check_index_tensor("swa_indices", swa_indices, self.device)
        if full_indices.shape != swa_indices.shape:
            raise ValueError(
                f"full_indices and swa_indices must have the same shape, got "
                f"{tuple(full_indices.shape)} and {tuple(swa_indices.shape)}"
            )
        if full_indices.numel():
            self.full_to_swa_index_mapping[full_indices] = swa_indices.to(torch.int64)

    def clear_full_to_swa_mapping(self, full_indices: torch.Tensor) -> None:
        """``mapping[full_indices] = 0`` (the window slots are not freed: the caller's)."""
        check_index_tensor("full_indices", full_indices, self.device)
        if full_indices.numel():
            self.full_to_swa_index_mapping.index_fill_(0, full_indices.reshape(-1).long(), 0)

    def translate_swa_indices_for_transfer(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """Window-buffer slots of full slots ``kv_indices`` for a PD transfer
        (:meth:`translate_loc_from_full_to_swa`)."""
        return self.translate_loc_from_full_to_swa(kv_indices)

    # ------------------------------------------------------------------ allocation
    def alloc(self, need_size: int) -> torch.Tensor | None:
        return self._pair.alloc(need_size)

    def alloc_extend(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        lens = (prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu)
        return self._pair.alloc_extend(lens, last_loc, extend_num_tokens)

    def alloc_extend_swa_tail(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        swa_tail_len: int,
        swa_tail_end: int | None = None,
    ) -> torch.Tensor | None:
        """Full slots for the whole extend, window slots only for a tail of it.

        Batch size 1 (PD decode pre-allocation). The window slots are a fresh allocation
        (prefix 0, ``last_loc`` -1 in the window space) for the extend's tokens
        ``[swa_tail_end - swa_tail_len, swa_tail_end)``; ``swa_tail_end`` defaults to
        ``extend_num_tokens`` (newer SGLang passes it when padding follows the tail). Every other
        token of the extend is unmapped (0).
        """
        bs = check_cpu_lengths("seq_lens_cpu", seq_lens_cpu)
        if bs != 1:
            raise ValueError(f"alloc_extend_swa_tail supports one request, got {bs}")
        check_cpu_lengths("prefix_lens_cpu", prefix_lens_cpu, 1)
        check_int("swa_tail_len", swa_tail_len)
        check_optional_int("swa_tail_end", swa_tail_end)
        ps = self.page_size
        lens = (prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu)
        # every input check before the capacity pre-check (out of room answers None only for
        # valid input); the full side's alloc_extend repeats them (cheap, no device sync)
        full_pages, _ = check_extend_inputs(*lens, last_loc, extend_num_tokens, ps)
        end = extend_num_tokens if swa_tail_end is None else swa_tail_end
        if not 0 <= end <= extend_num_tokens:
            raise ValueError(
                f"swa_tail_end must be an int in [0, extend_num_tokens={extend_num_tokens}], "
                f"got {swa_tail_end!r}"
            )
        if not 0 <= swa_tail_len <= end:
            raise ValueError(f"swa_tail_len must be in [0, swa_tail_end={end}], got {swa_tail_len}")
        if not self._pair.fits(full_pages, -(-swa_tail_len // ps)):
            return None
        if swa_tail_len == 0:
            full_only = self.full_attn_allocator.alloc_extend(*lens, last_loc, extend_num_tokens)
            if full_only is not None:
                self.full_to_swa_index_mapping.index_fill_(0, full_only, 0)
            return full_only
        dev = self.device
        zero = torch.zeros(1, dtype=torch.int64)
        tail = torch.tensor([swa_tail_len], dtype=torch.int64)
        window_last_loc = torch.full((1,), -1, dtype=torch.int64, device=dev)
        got = self._pair.run_in_step(
            lambda: self.full_attn_allocator.alloc_extend(*lens, last_loc, extend_num_tokens),
            lambda: self.swa_attn_allocator.alloc_extend(
                zero.to(dev), zero, tail.to(dev), tail, window_last_loc, swa_tail_len
            ),
        )
        if got is None:
            return None
        full, swa = got
        start = end - swa_tail_len
        mapping = self.full_to_swa_index_mapping
        mapping.index_fill_(0, full, 0)
        mapping[full[start:end]] = swa
        return full

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        return self._pair.alloc_decode(seq_lens, seq_lens_cpu, last_loc)

    # ------------------------------------------------------------------ free
    def free(self, free_index: torch.Tensor) -> None:
        """Free full slots (any slot set, as the paged ``free``) and their window slots.

        The window side first (``free_swa``: every slot of the touched full pages, mapping
        entries cleared), then the full side (``free_full``). Outside a free group both sides
        are validated (range on CPU tensors, capacity counts, debug ownership) before either
        changes: a failed call changes nothing. Inside a group both are queued; the mapping is
        resolved and cleared at queue time (a later allocation in the group may map the same
        full slots again), the window slots are released at :meth:`free_group_end`.
        """
        idx = self.full_attn_allocator.check_free_input("free_index", free_index)
        if idx is None:
            return
        if self._free_group is not None:
            self._queue_swa(idx)
            self.full_attn_allocator.free(idx)
            return
        full = self.full_attn_allocator
        full_pages = full.prepare_free(idx, free_index)
        keys, window = self._window_of(idx)
        window_pages = self._pair.prepare_secondary_free(window)
        self.full_to_swa_index_mapping.index_fill_(0, keys, 0)
        if window_pages is not None:
            self.swa_attn_allocator.commit_free(window_pages)
        full.commit_free(full_pages)

    def free_swa(self, free_index: torch.Tensor) -> None:
        """Release the window slots mapped from every full page ``free_index`` touches.

        The full slots stay allocated; their mapping entries (whole pages) become 0. Outside a
        group: one filter and one dedup (device->host syncs). Inside a group: queued, released
        with the group's other window frees at :meth:`free_group_end` (one sorted free).
        """
        idx = self.full_attn_allocator.check_free_input("free_index", free_index)
        if idx is None:
            return
        if self._free_group is not None:
            self._queue_swa(idx)
            return
        keys, window = self._window_of(idx)
        window_pages = self._pair.prepare_secondary_free(window)
        self.full_to_swa_index_mapping.index_fill_(0, keys, 0)
        if window_pages is not None:
            self.swa_attn_allocator.commit_free(window_pages)

    def free_full(self, free_index: torch.Tensor) -> None:
        """Release only the full-side slots (their window slots were released by ``free_swa``,
        as SGLang's scheduler does when a request's window part left earlier)."""
        self.full_attn_allocator.free(free_index)

    def free_swa_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """:meth:`free_swa` of a request's kv-row segment (positions ``[start_pos, start_pos +
        len(free_index))``; ``start_pos`` a non-negative int): the same window pages, released
        as SGLang releases a segment's: page ids in position order (one per full page, by
        stride; no dedup, no sort), in front of the free list (``need_sort``: staged). Inside a
        group they are queued as page ids and released at :meth:`free_group_end` behind the
        group's set frees. A segment that does not start on a page boundary (SGLang asserts it
        does) is released as :meth:`free_swa` releases a set."""
        check_int("start_pos", start_pos, minimum=0)
        if self.page_size == 1 or start_pos % self.page_size:
            self.free_swa(free_index)
            return
        idx = self.full_attn_allocator.check_free_input("free_index", free_index)
        if idx is None:
            return
        keys, pages = self._segment_window_pages(idx)
        if self._free_group is not None:
            self._swa_page_group.append(pages)
        elif pages.numel():
            self.swa_attn_allocator.free_page_ids(pages)  # validates before any change
        self.full_to_swa_index_mapping.index_fill_(0, keys, 0)

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """Free a request's kv-row segment on both sides, as SGLang's SWA allocator does: the
        window side by :meth:`free_swa_segment` (page ids in position order), the full side by
        its ``free_segment`` (the same). Outside a group a failed call changes nothing. A
        segment that does not start on a page boundary (SGLang asserts it does) is released
        as :meth:`free` releases a set."""
        check_int("start_pos", start_pos, minimum=0)
        if self.page_size == 1 or start_pos % self.page_size:
            self.free(free_index)
            return
        idx = self.full_attn_allocator.check_free_input("free_index", free_index)
        if idx is None:
            return
        full = self.full_attn_allocator
        if self._free_group is not None:
            self.free_swa_segment(idx, start_pos=start_pos)
            full.free_segment(idx, start_pos=start_pos)
            return
        keys, pages = self._segment_window_pages(idx)
        window = self.swa_attn_allocator
        before = window.backup_state() if pages.numel() else None
        if pages.numel():
            window.free_page_ids(pages)
        try:
            full.free_segment(idx, start_pos=start_pos)
        except BaseException:
            if before is not None:
                window.restore_state(before)
            raise
        self.full_to_swa_index_mapping.index_fill_(0, keys, 0)

    def _segment_window_pages(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(every full slot of the segment's pages, the window page of each full page that has
        one, in position order). ``idx`` starts on a page boundary (page size > 1)."""
        ps = self.page_size
        reps = idx[::ps]
        window = self.full_to_swa_index_mapping[reps]
        base = (reps >> (ps.bit_length() - 1)) * ps
        keys = (base[:, None] + self._page_offsets).reshape(-1)
        return keys, window[window > 0] >> (ps.bit_length() - 1)

    def free_full_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """:meth:`free_full` of a kv-row segment: the full side's ``free_segment`` (its window
        peers were released before)."""
        self.full_attn_allocator.free_segment(free_index, start_pos=start_pos)

    def _window_of(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(every full slot of the pages ``idx`` touches, their mapped window slots).

        Sync-free: duplicates are kept (the window side's free deduplicates pages)."""
        ps = self.page_size
        if ps == 1:
            keys = idx
        else:
            base = (idx >> (ps.bit_length() - 1)) * ps
            keys = (base[:, None] + self._page_offsets).reshape(-1)
        return keys, self.full_to_swa_index_mapping[keys]

    def _queue_swa(self, idx: torch.Tensor) -> None:
        keys, window = self._window_of(idx)
        self._swa_group.append(window)  # a new tensor (advanced indexing): the queue owns it
        self.full_to_swa_index_mapping.index_fill_(0, keys, 0)

    def free_group_begin(self) -> None:
        super().free_group_begin()
        self.full_attn_allocator.free_group_begin()
        self._swa_group = []
        self._swa_page_group = []

    def free_group_end(self) -> None:
        """Release the group: the full side's queue by its own ``free_group_end``; the window
        side in SGLang's order: the segment frees' page ids (call order), then the pages of the
        set frees (deduplicated, ascending) in front of them. On an error nothing is released
        and the group stays open on both sides.

        What stays here is SWA-specific: the window queues. They cannot be the window
        allocator's own free group: window slots are found through the mapping at queue time
        (the mapping is cleared then, a later allocation in the group may reuse the full slots)
        and only their mapped entries (``> 0``, a data-dependent filter) are freed, once per
        group instead of once per call; and the window release must wait until the full side's
        group end has succeeded, where the window allocator's ``free_group_end`` validates and
        releases in one step."""
        self._open_free_group()  # RuntimeError without free_group_begin()
        if not self._swa_page_group:
            self._pair.end_free_group(self._swa_group)  # raises with both groups still open
        else:
            listed = torch.cat(self._swa_page_group)
            pages = None
            if self._swa_group:
                queued = torch.cat(self._swa_group)
                pages = self._pair.prepare_secondary_free(queued)
            if pages is not None:  # one block: the set's pages in front of the listed ones
                listed = torch.cat([pages, listed])
            window = self.swa_attn_allocator
            before = window.backup_state()
            window.free_page_ids(listed)  # validates (count, debug) before any change
            try:
                self.full_attn_allocator.free_group_end()
            except BaseException:
                window.restore_state(before)
                raise
        self._free_group = None
        self._swa_group = []
        self._swa_page_group = []

    @property
    def free_group(self) -> list[torch.Tensor] | None:
        """Read-only view under SGLang's name: ``None`` outside a group, else the queued
        window slots (mapping already resolved)."""
        return None if self._free_group is None else list(self._swa_group)

    @property
    def swa_free_group(self) -> list[torch.Tensor]:
        """SGLang's queue of window slots resolved in the open free group (``[]`` outside)."""
        return [] if self._free_group is None else list(self._swa_group)

    @property
    def swa_page_ids_group(self) -> list[torch.Tensor]:
        """SGLang's queue of exact window page ids (segment frees, page size > 1) in the open
        free group (``[]`` outside)."""
        return [] if self._free_group is None else list(self._swa_page_group)

    @property
    def is_not_in_free_group(self) -> bool:
        """SGLang 0.5.14's flag: ``True`` outside a free group."""
        return self._free_group is None

    # ------------------------------------------------------------------ state
    def merge_and_sort_free(self) -> None:
        self._pair.merge_and_sort_free()

    def clear(self) -> None:
        self._pair.clear()
        self._free_group = None
        self._swa_group = []
        self._swa_page_group = []

    def resize(self, config: Any) -> None:
        """Resize both sides (``config.full_max_total_num_tokens`` /
        ``config.swa_max_total_num_tokens``) and :meth:`clear`. The full->window mapping is
        registered in the pool and cannot grow: a full size past the one it was built for
        raises ``ValueError`` before any change."""
        sizes = check_config(config, "full_max_total_num_tokens", "swa_max_total_num_tokens")
        size_full = sizes["full_max_total_num_tokens"]
        size_swa = sizes["swa_max_total_num_tokens"]
        limit = self.full_to_swa_index_mapping.shape[0] - 1 - self.page_size
        if size_full > limit:
            raise ValueError(
                f"config.full_max_total_num_tokens={size_full} exceeds the registered mapping's "
                f"capacity {limit}"
            )
        self._size_full, self._size_swa = size_full, size_swa
        self.size = min(size_full, size_swa)
        self.num_pages = self.size // self.page_size
        self.full_attn_allocator.resize(_Tokens(size_full))
        self.swa_attn_allocator.resize(_Tokens(size_swa))
        self.clear()

    def backup_state(self) -> SWAAllocatorState:
        full, swa, mapping = self._pair.snapshot()
        return SWAAllocatorState(owner=id(self), full=full, swa=swa, mapping=mapping)

    def restore_state(self, state: Any) -> None:
        own = check_own_state(state, SWAAllocatorState, self)
        self._pair.restore(own.full, own.swa, own.mapping)

    def debug_print(self) -> str:
        """SGLang 0.5.23's debug line: ``"#full-available-size: N, #swa-available-size: M, "``."""
        return self._pair.describe("full", "swa")
