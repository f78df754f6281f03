"""``DeepSeekV4HiSparseTokenToKVPoolAllocator``: HiSparse over DeepSeek-V4's c4 compressed cache.

Wraps the *logical* allocator of a ``DeepSeekV4TokenToKVPool`` (paged or SWA-style; its slots
are the ids requests see) and adds a *device* paged allocator over the pool's
``HiSparseC4DevicePool`` (page ``page_size // 4``). Compression ratio 4: logical full slot ``f``
has a compressed entry iff ``(f + 1) % 4 == 0``, at logical compressed slot ``f // 4``.
``full_to_hisparse_device_index_mapping`` (int64, ``size // 4 + page_size // 4 + 1`` entries,
0 = no device slot, trailing -1) maps logical compressed slots to device slots; it is registered
into the c4 pool, which translates through it on every key read/write.

SGLang builds the stack as ``SWATokenToKVPoolAllocator(..., kvcache=<DeepSeekV4TokenToKVPool>)``
(the pool's ``full_kv_pool`` is ``None``) wrapped by this class; any logical allocator over the
pool works (the conformance kit also uses a paged one).

* ``available_size()`` and ``full_available_size()`` are ``min(logical, 4 x device available)``
  (tokens); ``swa_available_size``, ``translate_loc_from_full_to_swa``, ``free_swa``,
  ``size_swa``, ``alloc_extend_swa_tail`` are the logical allocator's.
* ``alloc_extend``: logical slots, then device slots for the ``seq // 4 - prefix // 4`` new
  compressed tokens of every request (capacity of both checked on the host first, SGLang's
  pre-check; a failure leaves nothing changed). The device ``last_loc`` is
  ``mapping[(L - 3) // 4]`` (``mem_cache_kernels.pages.compressed_last_loc_on_device``). A
  request whose compressed prefix ends inside a device page on an entry without device slot (a
  logical-only decode token) gets a fresh device page; SGLang hands out the padding page there.
* ``alloc(n)``: whole logical pages plus the matching device pages (an extension: SGLang's class
  has no ``alloc``; it lets the allocator conformance kit drive this class).
* ``alloc_decode`` / ``alloc_logical_only``: logical slots only (the HiSparse coordinator places
  decode tokens on the device through :meth:`alloc_device_buffer`, which takes the request's
  logical *compressed* slots, as SGLang's coordinator passes them).
* ``free`` / ``free_segment``: the logical pages *and* the device slots mapped from the freed
  compressed entries, clearing their mapping (as SGLang 0.5.23; calling ``free_hisparse`` first
  is harmless). ``free`` and ``free_full`` are queued inside a free group and applied at
  ``free_group_end`` as one free (set semantics).
* ``free_hisparse`` / ``free_compressed`` / ``free_hisparse_indices`` release device slots at
  once (whole pages; ``torch.unique``: one sync per call).

Deliberate deviations (package README, "HiSparse and DeepSeek-V4"): the fresh device page above;
``alloc_device_buffer`` pads inside the newest entry's page (SGLang can list a slot twice) and
returns ``None`` when the device is short (SGLang asserts).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from mem_cache_allocator._composite import check_need_size, new_mapping
from mem_cache_allocator._hisparse_common import HiSparseAllocatorCommon
from mem_cache_allocator._hisparse_device import check_slots
from mem_cache_allocator._paired import PairedAllocators, check_own_state
from mem_cache_allocator._prefill_budget import SWAPrefillBudget
from mem_cache_allocator._scheduler_hooks import capacity_pair, check_tree_cache
from mem_cache_allocator.base import (
    BaseTokenToKVPoolAllocator,
    check_index_tensor,
    check_segments_iterable,
)
from mem_cache_allocator.paged import PagedTokenToKVPoolAllocator
from mem_cache_kernels.checks import check_int
from mem_cache_kernels.pages import compressed_last_loc_on_device, trim_segments
from mem_cache_pool.deepseek_v4 import (
    DeepSeekV4TokenToKVPool,
    HiSparseC4DevicePool,
    compressed_last_loc,
)

__all__ = ["DeepSeekV4HiSparseAllocatorState", "DeepSeekV4HiSparseTokenToKVPoolAllocator"]

_RATIO = 4


@dataclass(frozen=True, slots=True)
class DeepSeekV4HiSparseAllocatorState:
    """Opaque result of :meth:`DeepSeekV4HiSparseTokenToKVPoolAllocator.backup_state`."""

    owner: int
    logical: Any
    device: Any
    mapping: torch.Tensor


class DeepSeekV4HiSparseTokenToKVPoolAllocator(HiSparseAllocatorCommon):
    """``DeepSeekV4HiSparseTokenToKVPoolAllocator(logical_attn_allocator, *, debug=False)``.

    ``logical_attn_allocator.get_kvcache()`` must be a ``DeepSeekV4TokenToKVPool`` whose
    ``c4_kv_pool`` is a ``HiSparseC4DevicePool`` (``TypeError`` otherwise). ``page_size`` is the
    logical page size; ``hisparse_page_size`` the c4 device page size (``page_size // 4``).
    """

    compress_ratio = _RATIO

    def __init__(
        self, logical_attn_allocator: BaseTokenToKVPoolAllocator, *, debug: bool = False
    ) -> None:
        if not isinstance(logical_attn_allocator, BaseTokenToKVPoolAllocator):
            raise TypeError(
                "logical_attn_allocator must be a BaseTokenToKVPoolAllocator, got "
                f"{type(logical_attn_allocator).__name__}"
            )
        logical = logical_attn_allocator
        pool = logical.get_kvcache()
        if not isinstance(pool, DeepSeekV4TokenToKVPool):
            raise TypeError(
                "logical_attn_allocator.get_kvcache() must be a DeepSeekV4TokenToKVPool, got "
                f"{type(pool).__name__}"
            )
        c4_pool = pool.c4_kv_pool
        if not isinstance(c4_pool, HiSparseC4DevicePool):
            raise TypeError(
                "the pool's c4_kv_pool must be a HiSparseC4DevicePool (enable_hisparse=True), "
                f"got {type(c4_pool).__name__}"
            )
        if logical.page_size % _RATIO or c4_pool.page_size != logical.page_size // _RATIO:
            raise ValueError(
                f"the c4 pool's page size must be page_size // 4 = {logical.page_size // _RATIO}"
                f" (page_size={logical.page_size}), got {c4_pool.page_size}"
            )
        super().__init__(
            logical.size, logical.page_size, logical.dtype, logical.device, pool, logical.need_sort
        )
        self.logical_attn_allocator = logical
        self.hisparse_page_size = c4_pool.page_size
        self._device_page_size = c4_pool.page_size
        self.hisparse_attn_allocator = PagedTokenToKVPoolAllocator(
            c4_pool.size,
            c4_pool.page_size,
            logical.dtype,
            self.device,
            c4_pool,
            logical.need_sort,
            debug=debug,
        )
        self.debug = debug
        self._full_free_group: list[torch.Tensor] = []
        self.c4_logical_size = pool.size // _RATIO
        self.full_to_hisparse_device_index_mapping = new_mapping(
            self.c4_logical_size + self.hisparse_page_size, self.device
        )
        c4_pool.register_mapping(self.full_to_hisparse_device_index_mapping)
        self._pair = PairedAllocators(
            logical, self.hisparse_attn_allocator, self.full_to_hisparse_device_index_mapping
        )
        self._full_slots = self.c4_logical_size * _RATIO + self.page_size  # range of full slots

    # ------------------------------------------------------------------ capacity / delegation
    @property
    def size_hisparse(self) -> int:
        """Device compressed slots (the c4 pool's size)."""
        return self.hisparse_attn_allocator.size

    @property
    def size_full(self) -> int:
        """The logical allocator's full-side capacity (tokens)."""
        return self.logical_attn_allocator.size_full

    def available_size(self) -> int:
        """``min(logical available, 4 x device available)`` (tokens)."""
        return self._pair.available_size(_RATIO)

    def _delegate(self, name: str) -> Any:
        inner = getattr(self.logical_attn_allocator, name, None)
        if inner is None:
            raise AttributeError(
                f"the wrapped {type(self.logical_attn_allocator).__name__} has no {name}"
            )
        return inner

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """The logical allocator's ``translate_loc_from_full_to_swa``: window slots (int64) of
        full slots; ``AttributeError`` if the logical allocator is not an SWA one."""
        return self._delegate("translate_loc_from_full_to_swa")(kv_indices)  # type: ignore[no-any-return]

    def free_swa(self, free_indices: torch.Tensor) -> None:
        """The logical allocator's ``free_swa`` (applied at once, as in SGLang)."""
        check_index_tensor("free_indices", free_indices, self.device)
        self._delegate("free_swa")(free_indices)

    def free_swa_segment(self, free_indices: torch.Tensor, *, start_pos: int) -> None:
        """The logical allocator's ``free_swa_segment`` (applied at once, as in SGLang)."""
        check_index_tensor("free_indices", free_indices, self.device)
        self._delegate("free_swa_segment")(free_indices, start_pos=start_pos)

    def translate_swa_indices_for_transfer(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """The logical allocator's ``translate_swa_indices_for_transfer``."""
        return self._delegate("translate_swa_indices_for_transfer")(kv_indices)  # type: ignore[no-any-return]

    def reclaim_for_prealloc(
        self, tree_cache: Any, full_tokens: int, swa_tokens: int
    ) -> str | None:
        """The logical allocator's ``reclaim_for_prealloc`` (the c4 device side needs no
        reclaim: :meth:`full_available_size` prices it into the caller's budget)."""
        return self._delegate("reclaim_for_prealloc")(  # type: ignore[no-any-return]
            tree_cache, full_tokens, swa_tokens
        )

    def create_prefill_budget(
        self, tree_cache: Any, *, num_mixed_decode_tokens: int = 0
    ) -> SWAPrefillBudget:
        """A :class:`~mem_cache_allocator._prefill_budget.SWAPrefillBudget` over this wrapper
        (whose full-side capacity includes the compressed device pool)."""
        check_tree_cache(tree_cache, "full_evictable_size", "swa_evictable_size")
        check_int("num_mixed_decode_tokens", num_mixed_decode_tokens, minimum=0)
        return SWAPrefillBudget(self, tree_cache, num_mixed_decode_tokens=num_mixed_decode_tokens)

    @property
    def hisparse_kvcache(self) -> Any:
        """The c4 device pool (``get_kvcache().c4_kv_pool``)."""
        return self.hisparse_attn_allocator.get_kvcache()

    @property
    def full_free_group(self) -> list[torch.Tensor]:
        """SGLang's queue of ``free_full`` calls in the open free group (``[]`` outside)."""
        return list(self._full_free_group)

    def full_available_size(self) -> int:
        """``min(logical full-side available, 4 x device available)`` (SGLang 0.5.23)."""
        inner = getattr(self.logical_attn_allocator, "full_available_size", None)
        logical = self.logical_attn_allocator.available_size() if inner is None else int(inner())
        return min(logical, _RATIO * self.hisparse_attn_allocator.available_size())

    def swa_available_size(self) -> int:
        """The logical allocator's free window-side tokens (``AttributeError`` if not SWA)."""
        return int(self._delegate("swa_available_size")())

    @property
    def size_swa(self) -> int:
        """The logical allocator's window-side capacity, tokens (``AttributeError`` if not SWA)."""
        return int(self._delegate("size_swa"))

    @property
    def full_to_swa_index_mapping(self) -> torch.Tensor:
        """The logical allocator's full -> window slot mapping (int64, on its device; the live
        tensor, not a copy; ``AttributeError`` if not SWA)."""
        return self._delegate("full_to_swa_index_mapping")  # type: ignore[no-any-return]

    def swa_capacity_and_available(
        self, *, full_capacity: int | None = None, swa_capacity: int | None = None
    ) -> tuple[tuple[int, int], tuple[int, int]]:
        """``((full_capacity, full_available_size()), (swa_capacity, swa_available_size()))``:
        the scheduler's capacities with this stack's available sizes (SGLang's answer; a
        ``None`` capacity: ``size_full`` / ``size_swa``).
        """
        return capacity_pair(
            (self.size_full, self.full_available_size()),
            (self.size_swa, self.swa_available_size()),
            full_capacity,
            swa_capacity,
        )

    # ------------------------------------------------------------------ translation
    def get_last_loc_compressed(self, last_locs: torch.Tensor) -> torch.Tensor:
        """Logical compressed ``last_locs``: ``(L - 3) // 4``; -1 stays -1."""
        check_index_tensor("last_locs", last_locs, self.device)
        return compressed_last_loc(last_locs, _RATIO)

    def get_last_loc_hisparse_device(self, last_locs: torch.Tensor) -> torch.Tensor:
        """Device slot of the compressed ``last_locs`` of full ``last_locs`` (-1 stays -1)."""
        check_index_tensor("last_locs", last_locs, self.device)
        check_slots(last_locs, "last_locs", self._full_slots, check=self.debug)
        return self.full_to_hisparse_device_index_mapping[self.get_last_loc_compressed(last_locs)]

    def _compressed_of(self, full: torch.Tensor) -> torch.Tensor:
        """Logical compressed slots of the entry-completing slots of ``full`` (syncs)."""
        idx = full.to(device=self.device, dtype=torch.int64)
        return idx[(idx + 1) % _RATIO == 0] // _RATIO

    # ------------------------------------------------------------------ allocation
    def alloc(self, need_size: int) -> torch.Tensor | None:
        """Whole logical pages and the device pages of their compressed entries."""
        check_need_size(need_size)
        if need_size % self.page_size:
            raise ValueError(
                f"need_size must be a multiple of page_size={self.page_size}, got {need_size}"
            )
        pages = need_size // self.page_size
        if not self._pair.fits(pages, pages):
            return None
        got = self._pair.run_in_step(
            lambda: self.logical_attn_allocator.alloc(need_size),
            lambda: self.hisparse_attn_allocator.alloc(need_size // _RATIO),
        )
        if got is None:
            return None
        logical, dev = got
        self.full_to_hisparse_device_index_mapping[logical[_RATIO - 1 :: _RATIO] // _RATIO] = dev
        return logical

    def alloc_extend(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Logical slots, and device slots for the ``seq // 4 - prefix // 4`` new compressed
        entries of every request (capacity of both checked on the host first; SGLang's
        pre-check). A request whose compressed prefix ends inside a device page on an entry
        without device slot gets a fresh device page (SGLang: slots of the padding page)."""
        lens = (prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu)
        return self._alloc_extend_in_step(*lens, last_loc, extend_num_tokens, _RATIO)

    def _device_extend_last_loc(
        self, prefix_lens: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor:
        """The device allocator's ``last_loc`` (see
        :func:`mem_cache_kernels.pages.compressed_last_loc_on_device`)."""
        mapped = self.get_last_loc_hisparse_device(last_loc)
        return compressed_last_loc_on_device(prefix_lens, mapped, self.hisparse_page_size, _RATIO)

    def alloc_extend_swa_tail(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        swa_tail_len: int | None = None,
        **kwargs: Any,
    ) -> torch.Tensor | None:
        """The logical allocator's ``alloc_extend_swa_tail`` (PD decode pre-allocation; no c4
        device slots, as in SGLang). Extra keywords (e.g. ``swa_tail_end``) are forwarded."""
        if swa_tail_len is not None:
            kwargs["swa_tail_len"] = swa_tail_len
        result: torch.Tensor | None = self._delegate("alloc_extend_swa_tail")(
            prefix_lens=prefix_lens,
            prefix_lens_cpu=prefix_lens_cpu,
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens_cpu,
            last_loc=last_loc,
            extend_num_tokens=extend_num_tokens,
            **kwargs,
        )
        return result

    def alloc_device_buffer(
        self, allocated_indices: torch.Tensor, need_size: int
    ) -> torch.Tensor | None:
        """Turn one request's c4 device slots into a buffer of exactly ``need_size`` slots.

        ``allocated_indices``: the request's *logical compressed* slots in position order (what
        SGLang's coordinator passes: ``translate_loc_from_full_to_compressed`` of its full
        slots). Their device slots (unmapped ones skipped) are taken over and the mapping
        cleared. When there are more than ``need - c4_page + 1`` of them, the newest is swapped
        into index ``need - c4_page`` (the position SGLang's coordinator reads). With at least
        ``need_size`` slots the first ``need_size`` are the buffer and the surplus pages holding
        no buffer slot are freed; otherwise the rest of the newest entry's page pads the buffer
        and new pages supply the remainder. ``need_size``: a positive multiple of
        ``hisparse_page_size``. Returns ``None`` (nothing changed) when the device is out of
        pages (SGLang asserts). Syncs.

        Deviation: SGLang pads from the *last listed* slot, which after the swap is an older one,
        so the buffer can list a slot twice (``[4, 5, 6, 7, 9, 8, 9, 10]``); here the padding
        follows the newest entry (``[4, 5, 6, 7, 9, 8, 10, 11]``).
        """
        cps = self.hisparse_page_size
        check_int("need_size", need_size, minimum=1)
        if need_size % cps:
            raise ValueError(
                f"need_size must be a multiple of the c4 page size {cps}, got {need_size}"
            )
        return self._take_device_buffer(allocated_indices, need_size, need_size - cps)

    # ------------------------------------------------------------------ free
    def free(self, free_index: torch.Tensor) -> None:
        """Free logical slots (the logical allocator's ``free``) and the device slots of their
        compressed entries (``free_hisparse``), as SGLang 0.5.23 does. Inside a free group the
        call is queued (copied) and applied at ``free_group_end`` as one free."""
        check_index_tensor("free_index", free_index, self.device)
        if free_index.numel() == 0:
            return
        check_slots(free_index, "free_index", self._full_slots, check=self.debug)
        if self._free_group is not None:
            self._free_group.append(free_index.to(self.device, torch.int64, copy=True))
            return
        self.logical_attn_allocator.free(free_index)
        self.free_hisparse(free_index)

    def free_full(self, free_indices: torch.Tensor) -> None:
        """The logical allocator's ``free_full`` (full side of a request whose window slots
        ``free_swa`` released); queued inside a free group."""
        check_index_tensor("free_indices", free_indices, self.device)
        if free_indices.numel() == 0:
            return
        if self._free_group is not None:
            self._full_free_group.append(free_indices.to(self.device, torch.int64, copy=True))
            return
        self._delegate("free_full")(free_indices)

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """Free a request's slots of positions ``[start_pos, ...)`` (page-aligned start)."""
        if self._free_group is not None:
            super().free_segment(free_index, start_pos=start_pos)  # checks, then queues
            return
        self._delegate("free_segment")(free_index, start_pos=start_pos)
        self.free_hisparse(free_index)

    def free_segments(self, segments: Iterable[tuple[torch.Tensor, int]]) -> None:
        """The logical allocator's ``free_segments`` and the device slots of *every* given slot's
        compressed entry (a page two segments share is released once on the logical side, but
        all its entries' device slots go). Queued as one free inside a free group."""
        check_segments_iterable(segments)
        segs = list(segments)
        if not segs:
            return
        trim_segments(segs, self.page_size)  # validates the segments first
        slots = torch.cat([idx.to(self.device, torch.int64).reshape(-1) for idx, _ in segs])
        if self._free_group is not None:
            self.free(slots)  # set semantics at group end: the same pages, every entry
            return
        self._delegate("free_segments")(segs)
        self.free_hisparse(slots)

    def free_group_begin(self) -> None:
        super().free_group_begin()
        self._full_free_group = []

    def _flush_free_group(self, group: list[Any]) -> None:
        """One free of the group's slots with SGLang's set semantics (the logical allocator's
        ``free``: the sorted unique pages of all of them)."""
        slots = torch.cat(group) if len(group) > 1 else group[0]
        self.logical_attn_allocator.free(slots)
        self.free_hisparse(slots)

    def free_group_end(self) -> None:
        super().free_group_end()
        full = self._full_free_group
        self._full_free_group = []
        if full:
            self.free_full(torch.cat(full))

    def free_hisparse(self, free_indices: torch.Tensor) -> None:
        """Release the device slots of the compressed entries of logical full slots
        ``free_indices`` and clear their mapping (never deferred)."""
        check_index_tensor("free_indices", free_indices, self.device)
        if free_indices.numel() == 0:
            return
        check_slots(free_indices, "free_indices", self._full_slots, check=self.debug)
        self.free_compressed(self._compressed_of(free_indices))

    def free_compressed(self, compressed_indices: torch.Tensor) -> None:
        """Release the device slots of logical compressed slots ``compressed_indices`` and
        clear their mapping (never deferred)."""
        pages = self._device_pages_of(compressed_indices, "compressed_indices")
        self._release(compressed_indices, pages)

    # ------------------------------------------------------------------ state
    def clear(self) -> None:
        super().clear()
        self._full_free_group = []

    def backup_state(self) -> DeepSeekV4HiSparseAllocatorState:
        return DeepSeekV4HiSparseAllocatorState(id(self), *self._pair.snapshot())

    def restore_state(self, state: Any) -> None:
        own = check_own_state(state, DeepSeekV4HiSparseAllocatorState, self)
        self._pair.restore(own.logical, own.device, own.mapping)
