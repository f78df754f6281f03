"""The shared implementation of the token and paged allocators (one free list of page ids).

State (all lengths on the host):

* ``_free``: a :class:`ChunkedFreeList` of free page ids (slot ids when ``page_size == 1``);
  allocation takes its prefix.
* ``_release``: staged frees (``need_sort`` only), merged into ``_free`` and sorted when an
  allocation finds ``_free`` too short (SGLang's trigger conditions, so the same calls give the
  same slots).

Subclasses choose where freed pages go (``_FREE_TO_FRONT``: paged reuses freed pages first, the
token allocator last) and whether a free's page ids are sorted (``_SORT_FREES``: the paged
allocator's ``torch.unique`` order, reproduced sync-free with ``torch.sort`` of stride-derived ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from mem_cache_allocator import _kernels
from mem_cache_allocator._debug import DebugTracker, debug_enabled, describe
from mem_cache_allocator._free_list import ChunkedFreeList, FreeListSnapshot
from mem_cache_allocator._pages import (
    check_cpu_lengths,
    num_new_pages_decode,
    num_new_pages_extend,
)
from mem_cache_allocator.base import BaseTokenToKVPoolAllocator

if TYPE_CHECKING:
    from mem_cache_pool.base import KVCache

__all__ = ["PageAllocatorCore", "PageAllocatorState"]


@dataclass(frozen=True, slots=True)
class PageAllocatorState:
    """Opaque result of ``backup_state()`` (tensor references; debug bitmaps are copies)."""

    owner: int
    free: FreeListSnapshot
    release: tuple[torch.Tensor, ...]
    num_release: int
    debug: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None


def _check_index(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    return t


_INDEX = (torch.int64, torch.int32)


def _lengths_ok(bs: int, cpu: object, *tensors: object) -> bool:
    """Fast path of the argument checks (all fine): ``cpu`` a 1-D CPU integer tensor of ``bs``
    entries, ``tensors`` 1-D int32/int64 tensors of ``bs`` entries. ``False``: run the detailed
    checks (they raise with messages naming the argument)."""
    if not (
        isinstance(cpu, torch.Tensor)
        and cpu.dtype in _INDEX
        and cpu.dim() == 1
        and cpu.shape[0] == bs
        and cpu.is_cpu
    ):
        return False
    for t in tensors:
        if not (isinstance(t, torch.Tensor) and t.dtype in _INDEX and t.dim() == 1):
            return False
        if t.shape[0] != bs:
            return False
    return True


class PageAllocatorCore(BaseTokenToKVPoolAllocator):
    """Page-granular free-list allocator; see :class:`PagedTokenToKVPoolAllocator`."""

    _FREE_TO_FRONT: ClassVar[bool] = True
    _SORT_FREES: ClassVar[bool] = True

    def __init__(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        device: str | torch.device,
        kvcache: KVCache | None,
        need_sort: bool = False,
        *,
        debug: bool = False,
    ) -> None:
        super().__init__(size, page_size, dtype, device, kvcache, need_sort)
        self.num_pages = size // page_size
        self._page_shift = page_size.bit_length() - 1  # slot >> shift == slot // page_size
        self._free = ChunkedFreeList(self.device, arena_size=self.num_pages)
        self._release: list[torch.Tensor] = []
        self._num_release = 0
        self._page_offsets = torch.arange(page_size, dtype=torch.int64, device=self.device)
        self._debug: DebugTracker | None = (
            DebugTracker(type(self).__name__, self.num_pages, page_size)
            if debug_enabled(debug)
            else None
        )
        self.clear()

    # ------------------------------------------------------------------ queries
    @property
    def debug(self) -> bool:
        """Whether debug-mode ownership checks run (constructor flag or ``MEM_CACHE_DEBUG``)."""
        return self._debug is not None

    @property
    def capacity(self) -> int:
        """Tokens this allocator can hand out at most: ``(size // page_size) * page_size``."""
        return self.num_pages * self.page_size

    def available_size(self) -> int:
        return (len(self._free) + self._num_release) * self.page_size

    def free_page_count(self) -> int:
        """Pages on the free list plus staged pages (host-side)."""
        return len(self._free) + self._num_release

    def free_pages_tensor(self) -> torch.Tensor:
        """The free list front-to-back followed by staged pages (a copy; O(free pages))."""
        parts = [self._free.to_tensor(), *self._release]
        return torch.cat(parts) if len(parts) > 1 else parts[0].clone()

    # ------------------------------------------------------------------ state
    def clear(self) -> None:
        self._free.clear()
        self._free.push_back(
            torch.arange(1, self.num_pages + 1, dtype=torch.int64, device=self.device)
        )
        self._release = []
        self._num_release = 0
        self._free_group = None
        if self._debug is not None:
            self._debug.reset()

    def backup_state(self) -> PageAllocatorState:
        return PageAllocatorState(
            owner=id(self),
            free=self._free.snapshot(),
            release=tuple(self._release),
            num_release=self._num_release,
            debug=None if self._debug is None else self._debug.snapshot(),
        )

    def restore_state(self, state: Any) -> None:
        if not isinstance(state, PageAllocatorState) or state.owner != id(self):
            raise ValueError(
                f"state must come from this allocator's backup_state(), got {type(state).__name__}"
            )
        self._free.restore(state.free)
        self._release = list(state.release)
        self._num_release = state.num_release
        if self._debug is not None and state.debug is not None:
            self._debug.restore(state.debug)

    def merge_and_sort_free(self) -> None:
        if not self._num_release:
            return
        merged = torch.sort(torch.cat([self._free.to_tensor(), *self._release])).values
        self._free.clear()
        self._free.push_back(merged)
        self._release = []
        self._num_release = 0

    # ------------------------------------------------------------------ allocation
    def _pages_to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        if self.page_size == 1:
            return pages  # a view of an immutable free-list chunk (as in SGLang)
        return (pages[:, None] * self.page_size + self._page_offsets).reshape(-1)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if isinstance(need_size, bool) or not isinstance(need_size, int) or need_size < 0:
            raise ValueError(f"need_size must be a non-negative int, got {need_size!r}")
        ps = self.page_size
        if need_size % ps:
            raise ValueError(
                f"need_size must be a multiple of page_size={ps} (whole pages), got {need_size}"
            )
        n = need_size // ps
        if self.need_sort and n > len(self._free):
            self.merge_and_sort_free()
        if n > len(self._free):
            return None
        pages = self._free.head(n)
        out = self._pages_to_slots(pages)
        if self._debug is not None:
            self._debug_commit(pages, out)
        self._free.drop(n)
        return out

    def alloc_extend(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        num_new_pages: int | None = None,
    ) -> torch.Tensor | None:
        bs = check_cpu_lengths("seq_lens_cpu", seq_lens_cpu)
        if not _lengths_ok(bs, prefix_lens_cpu, prefix_lens, seq_lens, last_loc):
            check_cpu_lengths("prefix_lens_cpu", prefix_lens_cpu, bs)
            named = (("prefix_lens", prefix_lens), ("seq_lens", seq_lens), ("last_loc", last_loc))
            for name, t in named:
                if _check_index(name, t).shape[0] != bs:
                    raise ValueError(f"{name} must have {bs} entries, got {t.shape[0]}")
        ps = self.page_size
        if self.need_sort and extend_num_tokens // ps + bs + 1 > len(self._free):
            self.merge_and_sort_free()
        pages, tokens = num_new_pages_extend(prefix_lens_cpu, seq_lens_cpu, ps)
        if tokens != extend_num_tokens:
            raise ValueError(
                f"extend_num_tokens must equal sum(seq_lens_cpu - prefix_lens_cpu) = {tokens}, "
                f"got {extend_num_tokens}"
            )
        if num_new_pages is not None and num_new_pages != pages:
            raise ValueError(
                f"num_new_pages must be {pages} for these lengths, got {num_new_pages}"
            )
        if pages > len(self._free):
            return None
        if self._debug is not None:
            self._debug_check_extend(prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc)
        head = self._free.head(pages)
        if ps == 1:
            out = head
        else:
            out = torch.empty(tokens, dtype=torch.int64, device=self.device)
            if tokens:
                _kernels.alloc_extend(prefix_lens, seq_lens, last_loc, head, out, ps, pages)
        if self._debug is not None:
            self._debug_commit(head, out)
        self._free.drop(pages)
        return out

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        ok = isinstance(seq_lens_cpu, torch.Tensor) and seq_lens_cpu.dim() == 1
        bs = seq_lens_cpu.shape[0] if ok else -1
        if not _lengths_ok(bs, seq_lens_cpu, seq_lens, last_loc):
            bs = check_cpu_lengths("seq_lens_cpu", seq_lens_cpu)
            for name, t in (("seq_lens", seq_lens), ("last_loc", last_loc)):
                if _check_index(name, t).shape[0] != bs:
                    raise ValueError(f"{name} must have {bs} entries, got {t.shape[0]}")
        if self.need_sort and bs > len(self._free):
            self.merge_and_sort_free()
        ps = self.page_size
        pages = num_new_pages_decode(seq_lens_cpu, ps)
        if pages > len(self._free):
            return None
        if self._debug is not None:
            self._debug_check_decode(seq_lens, seq_lens_cpu, last_loc)
        head = self._free.head(pages)
        if ps == 1:
            out = head
        else:
            out = torch.empty(bs, dtype=torch.int64, device=self.device)
            if bs:
                _kernels.alloc_decode(seq_lens, last_loc, head, out, ps, pages)
        if self._debug is not None:
            self._debug_commit(head, out)
        self._free.drop(pages)
        return out

    # ------------------------------------------------------------------ free
    def free(self, free_index: torch.Tensor) -> None:
        """Release the pages of ``free_index``: page-aligned runs of one owner's slots.

        Contract (sync-free fast path): ``free_index`` lists, for each page it releases, that
        page's slots together, and the first slot of every page sits at an input position that is
        a multiple of ``page_size`` (a request's slots from a page-aligned position, whole pages,
        or such runs concatenated where every run but the last has a multiple of ``page_size``
        entries). Page ids are ``free_index[::page_size] // page_size``, sorted ascending (the
        order SGLang's ``torch.unique`` gives). A partial last page is released whole. Debug mode
        verifies the contract; :meth:`free_unaligned` takes arbitrary slot sets (syncs).
        """
        _check_index("free_index", free_index)
        if free_index.numel() == 0:
            return
        pages = self._stride_pages(free_index)
        if self._debug is not None:
            self._debug.check_free_slots(free_index, pages, aligned=True)
            self._debug.on_free_pages(pages)
        self._release_pages(pages, from_slots=True)

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        """Release exactly ``page_ids`` (no dedup, kept in the given order)."""
        _check_index("page_ids", page_ids)
        if page_ids.numel() == 0:
            return
        pages = page_ids.to(device=self.device, dtype=torch.int64, copy=True)
        if self._debug is not None:
            self._debug.check_free_pages(pages)
            self._debug.on_free_pages(pages)
        self._release_pages(pages, from_slots=False)

    def free_unaligned(self, free_index: torch.Tensor) -> None:
        """Legacy set-shaped free: every page any slot of ``free_index`` touches is released.

        Uses ``torch.unique`` (a device->host sync on GPUs); prefer :meth:`free`.
        """
        _check_index("free_index", free_index)
        if free_index.numel() == 0:
            return
        idx = free_index.to(device=self.device, dtype=torch.int64)
        pages = torch.unique(idx // self.page_size) if self._SORT_FREES else idx.clone()
        if self._debug is not None:
            self._debug.check_free_slots(idx, pages, aligned=False)
            self._debug.on_free_pages(pages)
        self._release_pages(pages, from_slots=True)

    def _stride_pages(self, free_index: torch.Tensor) -> torch.Tensor:
        """Page ids of a page-aligned-runs input; always a new tensor (queued frees own it)."""
        ps = self.page_size
        if free_index.dtype is torch.int64 and free_index.device == self.device:
            return free_index.clone() if ps == 1 else free_index[::ps] >> self._page_shift
        idx = free_index.to(device=self.device, dtype=torch.int64)
        return idx if ps == 1 else idx[::ps] >> self._page_shift

    def _release_pages(self, pages: torch.Tensor, *, from_slots: bool) -> None:
        if self._free_group is not None:
            self._free_group.append((pages, from_slots))
            return
        if from_slots and self._SORT_FREES:
            pages = torch.sort(pages).values
        self._push(pages)

    def _push(self, pages: torch.Tensor) -> None:
        if self.need_sort:
            self._release.append(pages)
            self._num_release += pages.shape[0]
        elif self._FREE_TO_FRONT:
            self._free.push_front(pages)
        else:
            self._free.push_back(pages)

    def _flush_free_group(self, group: list[Any]) -> None:
        slot_pages = [p for p, from_slots in group if from_slots]
        page_ids = [p for p, from_slots in group if not from_slots]
        if not (self.need_sort or self._FREE_TO_FRONT or self._SORT_FREES):
            self._free.extend_back(page_ids + slot_pages)  # one write into the free list's arena
            return
        if page_ids:
            self._push(torch.cat(page_ids) if len(page_ids) > 1 else page_ids[0])
        if slot_pages:
            merged = torch.cat(slot_pages) if len(slot_pages) > 1 else slot_pages[0]
            if self._SORT_FREES:
                merged = torch.sort(merged).values
            self._push(merged)

    # ------------------------------------------------------------------ debug helpers
    def _debug_commit(self, pages: torch.Tensor, slots: torch.Tensor) -> None:
        assert self._debug is not None
        snap = self._debug.snapshot()
        try:
            self._debug.on_take_pages(pages)
            self._debug.on_hand_out(slots)
        except BaseException:
            self._debug.restore(snap)
            raise

    def _debug_check_extend(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
    ) -> None:
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
        ps = self.page_size
        empty_ok = (pre == 0) == (last == -1)
        misaligned = torch.nonzero(((last + 1) % ps != pre % ps) | ~empty_ok).reshape(-1)
        if misaligned.numel():
            raise ValueError(
                f"misaligned alloc_extend inputs for requests {describe(misaligned)}: need "
                f"(last_loc + 1) % {ps} == prefix_lens % {ps} and last_loc == -1 iff prefix is "
                f"empty; last_loc={describe(last[misaligned])}, "
                f"prefix_lens={describe(pre[misaligned])}"
            )

    def _debug_check_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> None:
        seq = seq_lens.detach().to("cpu", torch.int64)
        last = last_loc.detach().to("cpu", torch.int64)
        if not torch.equal(seq, seq_lens_cpu.to(torch.int64)):
            raise ValueError("seq_lens differs from seq_lens_cpu")
        ps = self.page_size
        misaligned = torch.nonzero(
            ((last + 2) % ps != seq % ps) | (seq < 1) | ((seq > 1) & (last < 0))
        ).reshape(-1)
        if misaligned.numel():
            raise ValueError(
                f"misaligned alloc_decode inputs for requests {describe(misaligned)}: need "
                f"(last_loc + 2) % {ps} == seq_lens % {ps}; last_loc={describe(last[misaligned])}, "
                f"seq_lens={describe(seq[misaligned])}"
            )
