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
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from mem_cache_allocator import _scheduler_hooks as _hooks
from mem_cache_kernels.checks import (
    check_bool,
    check_device_arg,
    check_index,
    check_int,
    check_page_size,
)

# the one check of segments lives in kernels.pages (trim_segments runs it); re-exported here for
# the allocator modules that check before they iterate
from mem_cache_kernels.pages import (
    check_segments_iterable as check_segments_iterable,  # noqa: PLC0414 - explicit re-export
)
from mem_cache_kernels.pages import trim_segments

if TYPE_CHECKING:
    from mem_cache_allocator._prefill_budget import PrefillBudget
    from mem_cache_pool.base import KVCache

# check_cpu_lengths, check_index_tensor, check_segments_iterable: shared by the package's
# allocator modules, not exported
__all__ = ["BaseTokenToKVPoolAllocator"]

_INT_DTYPES = (
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
)


# ---------------------------------------------------------------- argument checks of the API
# (allocator-specific shapes of :mod:`mem_cache_kernels.checks`; every allocator module uses them)
def check_cpu_lengths(name: str, t: torch.Tensor, bs: int | None = None) -> int:
    """Validate a 1-D CPU integer length tensor (``bs`` entries when given); return its length.

    The allocator-specific part is the device: the page counts are host-side, so the tensor must
    be a CPU tensor (``ValueError``); the rest is :func:`mem_cache_kernels.checks.check_index`.
    """
    if isinstance(t, torch.Tensor) and t.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU tensor (host-side page count), got {t.device}")
    check_index(name, t, dtypes=_INT_DTYPES, length=bs)
    return int(t.shape[0])


def check_index_tensor(name: str, t: object, device: torch.device) -> None:
    """``TypeError``/``ValueError`` naming ``name`` unless ``t`` is an int32/int64 tensor (any
    shape) with data (not on the meta device, unless the allocator's ``device`` is meta: the
    sync-free tests run allocators there). Host-only: reads no tensor data."""
    flat = t.reshape(-1) if isinstance(t, torch.Tensor) and t.dim() != 1 else t
    check_index(name, flat, allow_meta=device.type == "meta")


def _optional(**kwargs: Any) -> dict[str, Any]:
    """The keyword arguments that are not ``None`` (forwarded only when given)."""
    return {k: v for k, v in kwargs.items() if v is not None}


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

    #: SGLang's base keeps its free list in these (``None`` for composites, whose free lists
    #: live in their inner allocators); subclasses that keep tensors there (an engine's own
    #: SGLang-style subclass, or ours as read-only views) make the default
    #: :meth:`available_size` and :meth:`get_all_free_pages` work.
    free_pages: Any = None
    release_pages: Any = None

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
        #: Pages of capacity (``size // page_size``; SGLang's ``resize`` keeps it up to date).
        self.num_pages = self.size // self.page_size

    @property
    def free_group(self) -> list[Any] | None:
        """``None`` outside a free group, else the frees queued in it (SGLang's attribute)."""
        group = self._free_group
        return None if group is None else list(group)

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

    def get_all_free_pages(self) -> torch.Tensor | None:
        """Every free page id (free list, then staged frees): a debug / invariant census.

        ``None`` when the allocator has no page free list of its own (the composites, as in
        SGLang, where ``free_pages`` is ``None``)."""
        free = self.free_pages
        if free is None:
            return None
        release = self.release_pages
        if release is None or len(release) == 0:
            return free  # type: ignore[no-any-return]
        return torch.cat((free, release))

    # ------------------------------------------------------------------ scheduler hooks
    # SGLang 0.5.23's scheduler calls these on every allocator, with no type switches of its
    # own; the defaults are SGLang's base answers (static pools, no byte accounting).
    def create_prefill_budget(
        self, tree_cache: Any, *, num_mixed_decode_tokens: int = 0
    ) -> PrefillBudget:
        """The memory budget of one prefill pass over this allocator and ``tree_cache``
        (:class:`mem_cache_allocator._prefill_budget.PrefillBudget`: one token pool); SGLang's
        ``PrefillAdder`` reads and updates it. Reads no state until used."""
        from mem_cache_allocator._prefill_budget import PrefillBudget

        _hooks.check_tree_cache(tree_cache, "evictable_size", "supports_mamba")
        check_int("num_mixed_decode_tokens", num_mixed_decode_tokens, minimum=0)
        return PrefillBudget(self, tree_cache, num_mixed_decode_tokens=num_mixed_decode_tokens)

    def request_slot_reserve(self, *, has_req_pool_slot: bool, prefill_tokens: int = 0) -> int:
        """Extra KV slots a request needs beyond its prefill (request-owned workspace such as
        speculative scratch); ``prefill_tokens`` counts the cached prefix and the selected
        extension. 0: a plain pool has no workspace."""
        check_bool("has_req_pool_slot", has_req_pool_slot)
        check_int("prefill_tokens", prefill_tokens, minimum=0)
        return 0

    def max_new_tokens_for_memory(
        self,
        input_tokens: int,
        max_new_tokens: int,
        *,
        token_capacity: int,
        sliding_window_size: int | None,
        chunk_size: int | None,
    ) -> int | None:
        """``max_new_tokens`` clipped to what an empty pool of ``token_capacity`` tokens (the
        scheduler's configured capacity) leaves after the prompt in whole pages, a page of
        headroom and the padding slot; at least 0. ``None`` would mean the prompt can never fit
        (only byte-accounted pools answer it); window and chunk sizes do not matter here."""
        check_int("input_tokens", input_tokens, minimum=0)
        check_int("max_new_tokens", max_new_tokens, minimum=0)
        check_int("token_capacity", token_capacity, minimum=0)
        return _hooks.max_new_tokens_for_memory(
            input_tokens, max_new_tokens, token_capacity, self.page_size
        )

    def prealloc_fits_assumes_reclaim(self) -> bool:
        """Whether :meth:`prealloc_fits` describes the state after reclaiming evictable pages
        (so admitting on it still owes the reclaim). ``False``: it describes the pool as is."""
        return False

    def prealloc_ceiling_fits(self, full_tokens: int, swa_tokens: int) -> bool | None:
        """Whether a demand this size could ever be preallocated; ``None``: this pool has no
        ceiling of its own (the caller's token capacity is the only bound)."""
        check_int("full_tokens", full_tokens, minimum=0)
        check_int("swa_tokens", swa_tokens, minimum=0)
        return None

    def prealloc_fits(
        self,
        tree_cache: Any,
        full_tokens: int,
        swa_tokens: int,
        *,
        full_budget_tokens: int,
        swa_budget_tokens: int | None = None,
    ) -> bool:
        """Whether a decode-side preallocation fits the scheduler's budgets: each side against
        its own budget (``swa_budget_tokens`` ``None``: no window side). ``tree_cache`` is not
        read: what it could reclaim is already inside the budgets."""
        check_int("full_tokens", full_tokens, minimum=0)
        check_int("swa_tokens", swa_tokens, minimum=0)
        check_int("full_budget_tokens", full_budget_tokens)
        if swa_budget_tokens is not None:
            check_int("swa_budget_tokens", swa_budget_tokens)
        return full_tokens <= full_budget_tokens and (
            swa_budget_tokens is None or swa_tokens <= swa_budget_tokens
        )

    def get_extend_allocation_demand(
        self,
        prefix_lens_cpu: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        *,
        conservative_num_tokens: int,
        shard_size: int,
    ) -> int:
        """Tokens to make allocatable (by eviction) before a paged extend: the scheduler's
        ``conservative_num_tokens`` (page-interleaved pools, which we do not have, refine it).
        Reads no tensor values; the arguments are checked for kind, dtype, device and shape."""
        p, q, n = prefix_lens_cpu, seq_lens_cpu, conservative_num_tokens
        if (  # inline on good arguments (every extend); else the checks name the argument
            type(p) is torch.Tensor
            and type(q) is torch.Tensor
            and p.is_cpu
            and q.is_cpu
            and p.dtype in _INT_DTYPES
            and q.dtype in _INT_DTYPES
            and p.dim() == 1
            and q.shape == p.shape
            and type(shard_size) is int
            and shard_size >= 1
            and type(n) is int
            and n >= 0
        ):
            return n
        bs = check_cpu_lengths("prefix_lens_cpu", prefix_lens_cpu)
        check_cpu_lengths("seq_lens_cpu", seq_lens_cpu, bs)
        check_int("shard_size", shard_size, minimum=1)
        return check_int("conservative_num_tokens", conservative_num_tokens, minimum=0)

    def evict_to_free_tokens(self, tree_cache: Any, num_tokens: int) -> bool | None:
        """Evict unlocked prefix-cache entries until ``num_tokens`` are available or nothing
        evictable remains: ``tree_cache.evict_for_alloc(EvictParams(num_tokens=shortfall))``
        when :meth:`available_size` is short. No-op without a cache that shares prefixes.

        Returns ``None`` (capacity still to be checked by the caller), as SGLang's base. Only
        the cache mutates (it frees through this allocator)."""
        check_int("num_tokens", num_tokens, minimum=0)
        _hooks.check_tree_cache(tree_cache, "supports_prefix_sharing", optional=True)
        if not _hooks.supports_prefix_sharing(tree_cache):
            return None
        shortfall = num_tokens - self.available_size()
        if shortfall > 0:
            _hooks.evict_shortfall(tree_cache, _hooks.EvictParams(num_tokens=shortfall))
        return None

    def check_decode_capacity(
        self,
        *,
        num_tokens: int,
        tree_cache: Any,
        requests: Any = None,
        spec_algorithm: Any = None,
    ) -> bool:
        """Whether the next decode step's ``num_tokens`` fit after evicting reclaimable cache
        (:meth:`evict_to_free_tokens`; ``ScheduleBatch.check_decode_mem`` retracts on
        ``False``). ``requests`` / ``spec_algorithm`` serve allocators whose demand is not one
        token count; unused here."""
        check_int("num_tokens", num_tokens, minimum=0)
        _hooks.check_tree_cache(tree_cache, "supports_prefix_sharing", optional=True)
        self.evict_to_free_tokens(tree_cache, num_tokens)
        return self.available_size() >= num_tokens

    def verify_byte_accounting(self) -> list[str]:
        """Idle-time diagnostic of byte/slot accounting: violations, ``[]`` when healthy.
        Static pools have no byte model, so always ``[]``."""
        return []

    def mamba_full_cache_donor(self) -> Any:
        """The shared-pool capability that reclaims full KV on Mamba byte pressure, or ``None``
        (no pool here shares bytes between KV and Mamba state)."""
        return None

    def translate_kv_indices_for_transfer(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """Slot ids as a PD transfer engine addresses them: the identity (our slots index the
        registered buffers directly)."""
        check_index_tensor("kv_indices", kv_indices, self.device)
        return kv_indices

    def set_hicache_transfer_done_event(self, transfer_key: Hashable, event: Any) -> None:
        """Record an asynchronous HiCache transfer's completion event; a no-op (no allocator
        here defers frees on transfers)."""
        if not isinstance(transfer_key, Hashable):
            raise TypeError(f"transfer_key must be hashable, got {type(transfer_key).__name__}")
        _hooks.check_event(event)

    def resize(self, config: Any) -> None:
        """Resize to ``config.max_total_num_tokens`` tokens and :meth:`clear` (SGLang's
        memory-pool resize; every outstanding slot is forgotten). Subclasses with their own
        storage override it."""
        size = _hooks.check_config(config, "max_total_num_tokens")["max_total_num_tokens"]
        self.size = size
        self.num_pages = size // self.page_size
        self.clear()

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
        check_int("start_pos", start_pos, minimum=0)
        self.free(free_index)

    def free_segments(self, segments: Iterable[tuple[torch.Tensor, int]]) -> None:
        """Free ascending, disjoint ``(free_index, start_pos)`` segments of one request's row.

        A page two consecutive segments share is released once (the later segment's slots in it
        are dropped before its :meth:`free_segment`). ``ValueError`` for overlapping or
        descending segments, ``TypeError`` for malformed pairs (every segment is checked before
        the first is freed).
        """
        for free_index, start_pos in trim_segments(segments, self.page_size):
            self.free_segment(free_index, start_pos=start_pos)

    def free_full_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """:meth:`free_full` of a request's kv-row segment (the :meth:`free_segment` contract:
        positions ``[start_pos, start_pos + len(free_index))``)."""
        check_int("start_pos", start_pos, minimum=0)
        self.free_full(free_index)

    def free_full_segments(self, segments: Iterable[tuple[torch.Tensor, int]]) -> None:
        """:meth:`free_segments` for the full side alone (see :meth:`free_full`)."""
        for free_index, start_pos in trim_segments(segments, self.page_size):
            self.free_full_segment(free_index, start_pos=start_pos)

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
    def get_cpu_copy(
        self,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: Any = None,
    ) -> Any:
        """The pool's ``get_cpu_copy(indices)`` (request retraction / offload).

        ``mamba_indices`` and ``req_pool_index`` (SGLang's ``ScheduleBatch`` passes the
        request's row for pools with request-owned state) are forwarded only when given, so
        ``get_cpu_copy(indices)`` works over every pool. ``RuntimeError`` without a kvcache,
        ``NotImplementedError`` when the pool has no CPU copy.
        """
        return self._pool_method("get_cpu_copy")(
            indices, **_optional(mamba_indices=mamba_indices, req_pool_index=req_pool_index)
        )

    def load_cpu_copy(
        self,
        kv_cache_cpu: Any,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: Any = None,
    ) -> Any:
        """The pool's ``load_cpu_copy`` (inverse of :meth:`get_cpu_copy`; ``mamba_indices`` and
        ``req_pool_index`` forwarded only when given)."""
        return self._pool_method("load_cpu_copy")(
            kv_cache_cpu,
            indices,
            **_optional(mamba_indices=mamba_indices, req_pool_index=req_pool_index),
        )

    def _pool_method(self, name: str) -> Any:
        pool = self._kvcache
        if pool is None:
            raise RuntimeError(f"{type(self).__name__}.{name}: this allocator has no kvcache")
        method = getattr(pool, name, None)
        if method is None:
            raise NotImplementedError(f"{type(pool).__name__} does not implement {name}")
        return method

    def debug_print(self) -> str:
        """SGLang 0.5.23's debug line: ``"#available-size: N, "`` (reads only)."""
        return f"#available-size: {self.available_size()}, "
