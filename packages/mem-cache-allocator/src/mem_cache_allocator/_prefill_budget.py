"""Memory reservations of one prefill pass (private; SGLang 0.5.23's ``mem_cache.prefill_budget``).

An allocator's ``create_prefill_budget(tree_cache, num_mixed_decode_tokens=)`` returns one of
these; SGLang's ``PrefillAdder`` (``managers/schedule_policy.py``) reads and updates it while it
admits requests: ``remaining_total`` / ``remaining_current`` / ``remaining_swa``,
``has_capacity()``, ``check_prefill(...)``, ``can_allocate_prefill(...)``,
``available_chunk_tokens(...)``, ``fit_chunk(...)``, ``reserve(...)``,
``prepare_load_back(...)``, ``load_back_needs_full_tokens`` and the ``total_offset`` it adjusts
directly.

The budget never mutates the allocator or the cache: every ``remaining_*`` reads the live
``available_size()`` plus what the cache could evict, minus what this pass has reserved so far
(``total_offset``: prefill plus generation headroom of every admitted request; ``current_offset``:
prefill only). Only the attributes and methods named above are read by SGLang; the types are
ours (no SGLang import), the arithmetic is SGLang's.

* :class:`PrefillBudget`: one token pool (token, paged, HiSparse allocators).
* :class:`SWAPrefillBudget`: separate full and sliding-window pools (SWA allocators): the full
  side as above, the window side reserved by :func:`estimate_swa_kv_tokens`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PrefillBudget", "SWAPrefillBudget", "estimate_swa_kv_tokens"]


def _ceil_pages(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size) * page_size


def estimate_swa_kv_tokens(
    extend_input_len: int,
    max_new_tokens: int,
    *,
    sliding_window_size: int | None,
    page_size: int,
    allocation_limit: int | None = None,
    host_hit_length: int = 0,
) -> int:
    """Peak window-side tokens one request holds during its prefill and decode.

    Without a window (``None`` or ``<= 0``): everything, ``extend + max_new + page_size``.
    With one: the part of the (possibly chunk-limited) extension that slides out of the window,
    plus at most one window of live tokens, plus a page of headroom; a host-cache hit of
    ``host_hit_length`` tokens adds its pages (they are loaded into the window pool).
    """
    if sliding_window_size is None or sliding_window_size <= 0:
        reserved = extend_input_len + max_new_tokens + page_size
    else:
        allocated = extend_input_len
        if allocation_limit is not None:
            allocated = min(extend_input_len, allocation_limit)
        tail = max(allocated - sliding_window_size, 0)
        reserved = tail + min(extend_input_len + max_new_tokens, sliding_window_size) + page_size
    if host_hit_length > 0:
        reserved += _ceil_pages(host_hit_length, page_size)
    return reserved


class PrefillBudget:
    """One token pool; offsets count this pass's pending allocations and decode headroom.

    ``PrefillBudget(allocator, tree_cache, *, num_mixed_decode_tokens=0)``: the mixed-in decode
    tokens of this step are reserved from the start.
    """

    #: SGLang's admission skips the full-side load-back spec when this is False.
    load_back_needs_full_tokens = False

    def __init__(self, allocator: Any, tree_cache: Any, *, num_mixed_decode_tokens: int = 0):
        self.allocator = allocator
        self.tree_cache = tree_cache
        self.page_size: int = allocator.page_size
        self.total_offset: int = num_mixed_decode_tokens
        self.current_offset: int = num_mixed_decode_tokens
        self.swa_offset: int = 0

    def ceil_paged_tokens(self, tokens: int) -> int:
        """``tokens`` rounded up to whole pages."""
        return _ceil_pages(tokens, self.page_size)

    def prepare_load_back(
        self,
        *,
        full_tokens: int,
        extend_input_len: int,
        max_new_tokens: int,
        swa_host_hit_length: int,
        chunk_limit: int | None,
    ) -> bool:
        """Make room for a host-cache load-back; always ready for pools with static sides."""
        return True

    def _available_and_evictable(self) -> int:
        cache = self.tree_cache
        evictable = (
            cache.full_evictable_size() if cache.supports_mamba() else cache.evictable_size()
        )
        return int(self.allocator.available_size()) + int(evictable)

    @property
    def remaining_total(self) -> int:
        """Free plus evictable tokens minus everything reserved (prefill and generation)."""
        return self._available_and_evictable() - self.total_offset

    @property
    def remaining_current(self) -> int:
        """Free plus evictable tokens minus the prefill tokens reserved in this pass."""
        return self._available_and_evictable() - self.current_offset

    @property
    def remaining_swa(self) -> int:
        """Window-side tokens left (0: a single pool has no window side)."""
        return 0

    def has_capacity(self) -> bool:
        """Whether both remaining counts are positive."""
        return self.remaining_total > 0 and self.remaining_current > 0

    def check_prefill(
        self,
        *,
        extend_input_len: int,
        total_tokens: int,
        max_new_tokens: int,
        input_tokens: int,
        swa_host_hit_length: int,
        chunk_limit: int | None,
        auxiliary_swa_host_hit_length: int = 0,
    ) -> tuple[bool, int | None]:
        """``(admit, chunk bound)``: ``(False, None)`` unless ``total_tokens`` is below
        :attr:`remaining_total`; then the window side's verdict (:meth:`_check_window`; a single
        pool admits with ``chunk_limit``)."""
        if total_tokens >= self.remaining_total:
            return False, None
        return self._check_window(
            extend_input_len, max_new_tokens, swa_host_hit_length, chunk_limit
        )

    def _check_window(
        self,
        extend_input_len: int,
        max_new_tokens: int,
        swa_host_hit_length: int,
        chunk_limit: int | None,
    ) -> tuple[bool, int | None]:
        """The window side of :meth:`check_prefill` (none here: admit with ``chunk_limit``)."""
        return True, chunk_limit

    def _window_admits(
        self, extend_input_len: int, max_new_tokens: int, chunk_limit: int | None
    ) -> bool:
        """The window side of :meth:`can_allocate_prefill` (none here: always)."""
        return True

    def _chunk_room(self) -> int:
        """Tokens a chunk may take now (the full side: :attr:`remaining_total`)."""
        return int(self.remaining_total)

    #: what :meth:`available_chunk_tokens` answers without room: a single-pool continuation
    #: must progress to release its KV (``True``: its ``chunk_limit``), a windowed one waits.
    _chunk_progresses_when_full = True

    def can_allocate_prefill(
        self,
        *,
        paged_input: int,
        extend_input_len: int,
        max_new_tokens: int,
        chunk_limit: int | None,
    ) -> bool:
        """Whether ``paged_input`` tokens fit both remaining counts (and the window side)."""
        return paged_input <= min(
            self.remaining_current, self.remaining_total
        ) and self._window_admits(extend_input_len, max_new_tokens, chunk_limit)

    def available_chunk_tokens(self, chunk_limit: int) -> int | None:
        """The chunk the pools allow (``min(chunk_limit, room)``, room: :meth:`_chunk_room`);
        when nothing is left ``chunk_limit`` for a single pool (a continuation must progress to
        release its KV), ``None`` for a windowed one (it waits)."""
        available = min(chunk_limit, self._chunk_room())
        if available > 0:
            return available
        return chunk_limit if self._chunk_progresses_when_full else None

    def fit_chunk(
        self, *, extend_input_len: int, max_new_tokens: int, chunk_limit: int
    ) -> int | None:
        """The chunk a shared byte budget allows; a static pool does not bound it."""
        return chunk_limit

    def reserve(
        self,
        extend_input_len: int,
        max_new_tokens: int,
        *,
        extra_tokens: int = 0,
        chunk_limit: int | None = None,
        is_chunked_continuation: bool = False,
    ) -> None:
        """Reserve an admitted request: its prefill in pages plus a page and ``extra_tokens``
        now (both offsets), its ``max_new_tokens`` for later (total only); then the window side
        (:meth:`_reserve_window`)."""
        immediate = self.ceil_paged_tokens(extend_input_len) + self.page_size + extra_tokens
        self.total_offset += immediate + max_new_tokens
        self.current_offset += immediate
        self._reserve_window(extend_input_len, max_new_tokens, chunk_limit, is_chunked_continuation)

    def _reserve_window(
        self,
        extend_input_len: int,
        max_new_tokens: int,
        chunk_limit: int | None,
        is_chunked_continuation: bool,
    ) -> None:
        """The window side of :meth:`reserve` (none here)."""


class SWAPrefillBudget(PrefillBudget):
    """Separate full and sliding-window pools (``all_swa``: every layer is windowed, so the
    full side is the window pool).

    The full side is priced as :class:`PrefillBudget` over ``full_available_size()`` plus
    ``tree_cache.full_evictable_size()``; the window side over ``swa_available_size()`` plus
    ``tree_cache.swa_evictable_size()``, each admitted request reserving
    :func:`estimate_swa_kv_tokens` (``tree_cache.sliding_window_size``). With a per-request window
    ring (``allocator.swa_req_ring``) a request costs ``allocator.swa_ring_cost_tokens``.
    """

    def __init__(self, *args: Any, all_swa: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.all_swa = all_swa
        self.req_ring = bool(getattr(self.allocator, "swa_req_ring", False))

    def _available_and_evictable(self) -> int:
        cache, alloc = self.tree_cache, self.allocator
        if self.all_swa:
            return int(alloc.swa_available_size()) + int(cache.swa_evictable_size())
        return int(alloc.full_available_size()) + int(cache.full_evictable_size())

    @property
    def remaining_swa(self) -> int:
        evictable = 0 if self.req_ring else int(self.tree_cache.swa_evictable_size())
        return int(self.allocator.swa_available_size()) + evictable - self.swa_offset

    def swa_tokens(
        self,
        extend_input_len: int,
        max_new_tokens: int,
        *,
        chunk_limit: int | None = None,
        swa_host_hit_length: int = 0,
    ) -> int:
        """Window-side tokens one request reserves."""
        if self.req_ring:
            return int(self.allocator.swa_ring_cost_tokens)
        return estimate_swa_kv_tokens(
            extend_input_len,
            max_new_tokens,
            sliding_window_size=self.tree_cache.sliding_window_size,
            page_size=self.page_size,
            allocation_limit=chunk_limit,
            host_hit_length=swa_host_hit_length,
        )

    def _fits(self, needed: int) -> bool:
        """Whether a window need of ``needed`` tokens fits :attr:`remaining_swa` now (a window
        ring may fill the pool exactly; a shared window pool keeps one token)."""
        return needed <= self.remaining_swa if self.req_ring else needed < self.remaining_swa

    def swa_never_fits(self, extend_input_len: int, max_new_tokens: int, **kwargs: Any) -> bool:
        """Whether the request's window need exceeds the whole window pool (``size_swa``)."""
        needed = self.swa_tokens(extend_input_len, max_new_tokens, **kwargs)
        size_swa = int(self.allocator.size_swa)
        return needed > size_swa if self.req_ring else needed >= size_swa

    def _chunk_cap(self, max_new_tokens: int, swa_host_hit_length: int = 0) -> int:
        headroom = self.swa_tokens(0, max_new_tokens, swa_host_hit_length=swa_host_hit_length)
        cap = int(self.remaining_swa) - headroom
        return max(0, cap // self.page_size * self.page_size)

    def _check_window(
        self,
        extend_input_len: int,
        max_new_tokens: int,
        swa_host_hit_length: int,
        chunk_limit: int | None,
    ) -> tuple[bool, int | None]:
        """The window need against :attr:`remaining_swa`. A request whose window need can never
        fit may still be admitted with a smaller chunk (only with ``chunk_limit``); transient
        pressure waits."""
        extend = self.ceil_paged_tokens(extend_input_len)
        kw: dict[str, Any] = {
            "chunk_limit": chunk_limit,
            "swa_host_hit_length": swa_host_hit_length,
        }
        if self._fits(self.swa_tokens(extend, max_new_tokens, **kw)):
            return True, chunk_limit
        cap = 0
        if self.swa_never_fits(extend, max_new_tokens, **kw):
            cap = self._chunk_cap(max_new_tokens, swa_host_hit_length)
        if chunk_limit is None or cap <= 0:
            return False, None
        return True, min(chunk_limit, cap)

    def has_capacity(self) -> bool:
        return super().has_capacity() and self.remaining_swa > 0

    _chunk_progresses_when_full = False

    def _chunk_room(self) -> int:
        """The full side's room, bounded by the window side less a page (no bound with a
        window ring: the request owns its ring)."""
        room = int(self.remaining_total)
        if not self.req_ring:
            room = min(room, int(self.remaining_swa) - self.page_size)
        return room

    def _window_admits(
        self, extend_input_len: int, max_new_tokens: int, chunk_limit: int | None
    ) -> bool:
        needed = self.swa_tokens(extend_input_len, max_new_tokens, chunk_limit=chunk_limit)
        return needed <= self.remaining_swa

    def _reserve_window(
        self,
        extend_input_len: int,
        max_new_tokens: int,
        chunk_limit: int | None,
        is_chunked_continuation: bool,
    ) -> None:
        """The window side by :meth:`swa_tokens` (a chunked continuation with a window ring
        already owns its ring)."""
        if not (self.req_ring and is_chunked_continuation):
            self.swa_offset += self.swa_tokens(
                self.ceil_paged_tokens(extend_input_len), max_new_tokens, chunk_limit=chunk_limit
            )
