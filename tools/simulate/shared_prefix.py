"""A radix-cache-like shared prefix: the page-aligned system preamble common to every session.

Every conversation starts with the same ``shared_prefix_tokens`` tokens (their K/V content
depends on the position only, see ``ContentModel``), so their device pages are identical across
sessions. This cache keeps one device copy of the first ``tokens`` (page-aligned) of them:

* insertion at request finish (``insert``): the first request that finishes with the whole
  shared part computed hands its pages to the cache; a later one that computed its own copy (it
  was admitted before the cache held the prefix, or loaded its history from the host or L3) has
  the duplicate pages of its page-aligned prefix freed by the engine through the allocator's
  ``free``, and its session entry borrows the cache's pages instead, as SGLang's radix cache
  frees the KV indices a finished request computed for a prefix the tree already holds;
* a match at admission (``match``): a request without a cached session prefix reuses the cached
  pages (a partial match for a short prompt), so it prefills only the rest;
* holders: every running request and every device session entry that borrows the cache's pages
  holds one reference (``acquire`` / ``release``); the pages are freed (``evict``) only when no
  one holds them, under memory pressure or when the engine drains.

The cache only does bookkeeping; the engine calls the allocator. ``tokens_held`` is what the
slot-conservation check counts for it.
"""

from __future__ import annotations

import torch

__all__ = ["SharedPrefixCache"]


class SharedPrefixCache:
    """One device copy of the first ``tokens`` tokens every session shares (0: disabled)."""

    def __init__(self, shared_tokens: int, page_size: int) -> None:
        if shared_tokens < 0:
            raise ValueError(f"shared_tokens must be >= 0, got {shared_tokens}")
        self.page_size = page_size
        self.tokens = shared_tokens // page_size * page_size
        self.slots: torch.Tensor | None = None
        self.refs = 0

    @property
    def enabled(self) -> bool:
        return self.tokens > 0

    @property
    def tokens_held(self) -> int:
        """Device slots the cache owns (0 or ``tokens``)."""
        return self.tokens if self.slots is not None else 0

    def match(self, input_len: int) -> torch.Tensor | None:
        """The cached slots a request of ``input_len`` prompt tokens reuses (page-aligned, at
        least one token left to prefill), with a reference taken; ``None`` on a miss."""
        if self.slots is None:
            return None
        n = min(self.tokens, (input_len - 1) // self.page_size * self.page_size)
        if n <= 0:
            return None
        self.refs += 1
        return self.slots[:n]

    def insert(
        self, slots: torch.Tensor, aligned: int, borrowed: int
    ) -> tuple[int, torch.Tensor | None]:
        """Insert a finished sequence's page-aligned prefix ``slots[:aligned]`` whose first
        ``borrowed`` slots are the cache's (the holder's reference passes to the result).

        Returns ``(shared, duplicates)``: the leading tokens its session entry borrows from the
        cache from now on (``slots[:shared]`` are then the cache's; a reference is held when
        ``shared > 0``) and the request's own slots of tokens the cache already held, which the
        caller frees (``None`` when there are none: the cache adopted them or nothing matched).
        """
        if not self.enabled:
            return 0, None
        if self.slots is None:
            if borrowed:
                raise RuntimeError("a holder borrowed from an empty shared-prefix cache")
            if aligned < self.tokens:
                return 0, None
            self.slots = slots[: self.tokens].clone()  # adopted: the cache owns these pages now
            self.refs += 1
            return self.tokens, None
        n = min(self.tokens, aligned)
        if n < borrowed:
            raise RuntimeError(f"{borrowed} borrowed shared tokens past the aligned prefix {n}")
        if not borrowed and n:
            self.refs += 1
        return n, (slots[borrowed:n] if n > borrowed else None)

    def cached_slots(self, n: int) -> torch.Tensor:
        """The cache's first ``n`` slots."""
        if self.slots is None or n > self.tokens:
            raise RuntimeError(f"cached_slots({n}) of a cache holding {self.tokens_held} tokens")
        return self.slots[:n]

    def release(self) -> None:
        if self.refs <= 0 or self.slots is None:
            raise RuntimeError(f"release() of the shared-prefix cache with {self.refs} holders")
        self.refs -= 1

    def evict(self) -> torch.Tensor | None:
        """Drop the cached pages when no one holds them; returns the slots to free."""
        if self.slots is None or self.refs:
            return None
        slots, self.slots = self.slots, None
        return slots
