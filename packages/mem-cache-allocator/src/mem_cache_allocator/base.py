"""``BaseTokenToKVPoolAllocator``: the contract every KV slot allocator of mem-cache follows.

Index space (shared with :mod:`mem_cache_pool`):

* A *slot* is an int64 row index into every per-layer buffer of the pool the allocator serves.
  With page size ``ps``, page ``p`` owns slots ``[p * ps, (p + 1) * ps)``; page 0 (slots
  ``[0, ps)``) is the padding page and is never handed out.
* ``alloc*`` return int64 tensors on the allocator's ``device`` (or ``None`` when there is not
  enough room; a ``None`` leaves every structure unchanged). A returned tensor may be a view of
  the allocator's (never mutated) free-list storage, as in SGLang: treat it as read-only.
* Position congruence: for a request, the slot of sequence position ``j`` satisfies
  ``slot % ps == j % ps``; ``last_loc = -1`` means "empty prefix".
* ``available_size()`` is in tokens (free pages x ``ps``), computed on the host: it never reads
  device memory.

Freeing (SGLang 0.5.23 semantics): ``free(slots)`` takes any slot set (any order, int32/int64,
partial pages, several requests concatenated, duplicates) and releases every page a slot of it
touches, once. ``free_segment(slots, start_pos=)`` / ``free_segments([(slots, start_pos), ...])``
release the same pages for a request's consecutive positions; the caller stating the positions
lets page allocators avoid the device->host sync of a deduplication.

Free groups: between ``free_group_begin()`` and ``free_group_end()`` every ``free*`` call is
queued (the queued data is copied, so callers may pass views of rows they overwrite later) and
applied once at ``free_group_end()``, pages deduplicated over the whole group. Nesting is an
error (``RuntimeError``).

``backup_state()`` returns an opaque token that ``restore_state()`` accepts to put the allocator
back into that state (free lists, staged frees, debug bookkeeping); it is cheap (references, no
copies outside debug mode).

Errors: caller mistakes raise ``ValueError``/``TypeError`` naming the argument; misuse of the
group protocol and corrupt internal state raise ``RuntimeError``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from mem_cache_allocator._page_arithmetic import check_start_pos, trim_segments
from mem_cache_kernels.checks import check_device_arg, check_int, check_page_size

if TYPE_CHECKING:
    from mem_cache_pool.base import KVCache

__all__ = ["BaseTokenToKVPoolAllocator"]


class BaseTokenToKVPoolAllocator(abc.ABC):
    """Abstract slot allocator over a device KV pool (SGLang's ``BaseTokenToKVPoolAllocator``).

    Constructor arguments (SGLang order): ``size`` (tokens of capacity), ``page_size`` (a power of
    two, 1 for token granularity), ``dtype`` (the pool's KV dtype; unused by the allocation logic),
    ``device`` (where slot tensors live), ``kvcache`` (the pool, or ``None`` for an allocator used
    without one), ``need_sort`` (stage frees and merge them sorted when the free list runs short;
    SGLang sets it for PD disaggregation).

    Only ``alloc``, ``free`` and ``clear`` are abstract (as in SGLang); the other methods SGLang's
    base leaves raising ``NotImplementedError`` raise it here too, so an engine's subclass that
    SGLang's base accepts is accepted.
    """

    #: SGLang's scheduler reads this from out-of-tree allocators: ``False`` means allocations are
    #: page-aligned (``alloc_extend`` / ``alloc_decode`` follow the page layout), not legacy
    #: real-length token allocations.
    uses_legacy_real_length_alloc: ClassVar[bool] = False

    def __init__(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        device: str | torch.device,
        kvcache: KVCache | None,
        need_sort: bool,
    ) -> None:
        self.size = check_int("size", size, minimum=0)
        self.page_size = check_page_size(page_size)
        self.dtype = dtype
        self.device = check_device_arg("device", device)
        self.need_sort = bool(need_sort)
        self._kvcache = kvcache
        self._free_group: list[Any] | None = None

    # ------------------------------------------------------------------ capacity
    @property
    def size_full(self) -> int:
        """Capacity in tokens of the (full-attention) pool."""
        return self.size

    def available_size(self) -> int:
        """Free tokens (free + staged pages x page_size); host-side, never syncs.

        Default (SGLang's): ``(len(self.free_pages) + len(self.release_pages)) * page_size``
        for subclasses that keep those tensors; ``NotImplementedError`` otherwise.
        """
        free = getattr(self, "free_pages", None)
        if free is None:
            raise NotImplementedError(f"{type(self).__name__} does not implement available_size")
        release = getattr(self, "release_pages", None)
        return (len(free) + (0 if release is None else len(release))) * self.page_size

    def get_kvcache(self) -> KVCache | None:
        """The device pool this allocator hands out slots of (``None`` without a pool)."""
        return self._kvcache

    # ------------------------------------------------------------------ allocation
    @abc.abstractmethod
    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots (a multiple of page_size; whole pages, contiguous per page)."""

    def alloc_extend(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Slots for positions ``[prefix_lens[i], seq_lens[i])`` of every request ``i``.

        ``*_cpu`` are CPU copies of the device lengths (used for the host-side page count);
        ``last_loc[i]`` is the slot of position ``prefix_lens[i] - 1`` or -1.
        Output: int64 ``[extend_num_tokens]``, request-major, position ascending.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement alloc_extend")

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        """One slot per request for position ``seq_lens[i] - 1`` (``seq_lens`` include it)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement alloc_decode")

    # ------------------------------------------------------------------ free
    @abc.abstractmethod
    def free(self, free_index: torch.Tensor) -> None:
        """Release the pages of ``free_index`` (see the concrete class for the exact contract)."""

    def free_full(self, free_index: torch.Tensor) -> None:
        """Free slots whose secondary (window) peers are already released; a plain ``free``
        for single-pool allocators (SGLang's default)."""
        self.free(free_index)

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """Free a request's slots of positions ``[start_pos, start_pos + len(free_index))``.

        Releases exactly the pages ``unique(free_index // page_size)`` (a segment that starts or
        ends inside a page releases that page whole). ``start_pos`` is a non-negative int
        (``ValueError`` otherwise). Default: a plain :meth:`free`.
        """
        check_start_pos(start_pos)
        self.free(free_index)

    def free_segments(self, segments: Iterable[tuple[torch.Tensor, int]]) -> None:
        """Free ascending, disjoint ``(free_index, start_pos)`` segments of one request's row.

        A page two consecutive segments share is released once (the later segment's slots in it
        are dropped before its :meth:`free_segment`). ``ValueError`` for overlapping or
        descending segments, ``TypeError`` for malformed pairs (every segment is checked before
        the first is freed).
        """
        for free_index, start_pos in list(trim_segments(segments, self.page_size)):
            self.free_segment(free_index, start_pos=start_pos)

    def free_group_begin(self) -> None:
        """Start queueing frees until :meth:`free_group_end`; nesting raises ``RuntimeError``."""
        if self._free_group is not None:
            raise RuntimeError(
                f"{type(self).__name__}.free_group_begin() called while a free group is open"
            )
        self._free_group = []

    def free_group_end(self) -> None:
        """Apply every free queued since :meth:`free_group_begin` (one batched free)."""
        group = self._open_free_group()
        self._free_group = None
        if group:
            self._flush_free_group(group)

    def _open_free_group(self) -> list[Any]:
        """The open free group's queue; ``RuntimeError`` when no group is open (the check of
        every ``free_group_end``)."""
        group = self._free_group
        if group is None:
            raise RuntimeError(
                f"{type(self).__name__}.free_group_end() called without free_group_begin()"
            )
        return group

    def _flush_free_group(self, group: list[Any]) -> None:
        """Apply the queued entries of a closed group (subclasses that queue must override)."""
        raise RuntimeError(f"{type(self).__name__} queued frees it cannot flush")

    def merge_and_sort_free(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Merge staged frees into the free list, sorted (``need_sort`` allocators)."""

    # ------------------------------------------------------------------ state
    @abc.abstractmethod
    def clear(self) -> None:
        """Return every page to the free list (initial state)."""

    def backup_state(self) -> Any:
        """An opaque snapshot for :meth:`restore_state`."""
        raise NotImplementedError(f"{type(self).__name__} does not implement backup_state")

    def restore_state(self, state: Any) -> None:
        """Return to the state captured by :meth:`backup_state` of this allocator."""
        raise NotImplementedError(f"{type(self).__name__} does not implement restore_state")

    # ------------------------------------------------------------------ pool pass-through
    def get_cpu_copy(self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None) -> Any:
        """The pool's ``get_cpu_copy(indices)`` (request retraction / offload).

        ``mamba_indices`` is forwarded only when given (pools with Mamba state take it; KV pools
        do not), so ``get_cpu_copy(indices)`` works over every pool.
        """
        copy = self._pool_method("get_cpu_copy")
        if mamba_indices is None:
            return copy(indices)
        return copy(indices, mamba_indices=mamba_indices)

    def load_cpu_copy(
        self, kv_cache_cpu: Any, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> Any:
        """The pool's ``load_cpu_copy`` (inverse of :meth:`get_cpu_copy`; ``mamba_indices``
        forwarded only when given)."""
        load = self._pool_method("load_cpu_copy")
        if mamba_indices is None:
            return load(kv_cache_cpu, indices)
        return load(kv_cache_cpu, indices, mamba_indices=mamba_indices)

    def _pool_method(self, name: str) -> Any:
        pool = self._kvcache
        if pool is None:
            raise RuntimeError(f"{type(self).__name__}.{name}: this allocator has no kvcache")
        method = getattr(pool, name, None)
        if method is None:
            raise NotImplementedError(f"{type(pool).__name__} does not implement {name}")
        return method

    def debug_print(self) -> str:
        return f"#available-size: {self.available_size()}, "
