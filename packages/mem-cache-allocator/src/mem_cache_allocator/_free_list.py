"""The free list of the page allocators: :class:`ChunkedFreeList`, an ordered sequence of int64
page ids kept as a deque of immutable 1-D chunks (a free is O(pages freed), never O(free list)).

Used by :class:`mem_cache_allocator.page_allocator.PageAllocatorCore` (and the Mamba allocator);
re-exported there, where its role in the allocator's state is documented.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import torch

__all__ = ["ChunkedFreeList", "FreeListSnapshot"]

FreeListSnapshot = tuple[tuple[torch.Tensor, ...], int, int]
"""``(chunks front-to-back, ids already taken from the front chunk, total length)``: an
immutable view of a :class:`ChunkedFreeList`."""

_ARENA_MIN = 1 << 14  # ids per arena at least (an arena holds many pushes)
MERGE_AHEAD = 1024  # ids a take that spans chunks may join beyond what it needs (8 KiB)


class ChunkedFreeList:
    """An ordered sequence of int64 page ids on ``device``, stored as a deque of 1-D chunks.

    ``arena_size`` (optional): ids per ``push_back`` arena, typically the allocator's capacity
    (frees between two arena switches then never exceed it).
    """

    __slots__ = (
        "_arena",
        "_arena_pos",
        "_arena_size",
        "_chunks",
        "_device",
        "_empty",
        "_len",
        "_off",
        "_tail",
    )

    def __init__(
        self, device: torch.device, initial: Iterable[torch.Tensor] = (), arena_size: int = 0
    ) -> None:
        self._device = device
        self._empty = torch.empty(0, dtype=torch.int64, device=device)
        self._chunks: deque[torch.Tensor] = deque()
        self._off = 0  # ids of chunks[0] already taken
        self._len = 0  # ids in the list (chunks minus the taken ones)
        self._arena_size = max(arena_size, _ARENA_MIN)
        self._arena: torch.Tensor | None = None
        self._arena_pos = 0  # next arena index to write (only ever grows)
        self._tail = -1  # arena start of chunks[-1] if it ends at _arena_pos, else -1
        for chunk in initial:
            self.push_back(chunk)

    def __len__(self) -> int:
        return self._len

    @property
    def num_chunks(self) -> int:
        return len(self._chunks)

    def push_front(self, chunk: torch.Tensor) -> None:
        """Put ``chunk`` (1-D int64, owned by the list from now on) before every page id."""
        n = chunk.shape[0]
        if not n:
            return
        off = self._off
        if off:  # the front chunk keeps only its untaken ids
            self._chunks[0] = self._chunks[0][off:]
            self._off = 0
            if len(self._chunks) == 1 and self._tail >= 0:
                self._tail += off  # it is also the back chunk (an arena view)
        if not self._chunks:
            self._tail = -1
        self._chunks.appendleft(chunk)
        self._len += n

    def push_back(self, chunk: torch.Tensor) -> None:
        """Put the ids of ``chunk`` (1-D int64) after every page id.

        Into an empty list the chunk goes by reference (no copy; the list owns it from now on).
        Otherwise its ids are copied into the arena and the back chunk widened when it ends there.
        """
        self.extend_back((chunk,))

    def extend_back(self, parts: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> None:
        """Put the ids of ``parts`` (1-D int64 tensors, in this order) after every page id.

        One write into the arena (a slice assignment for one part, ``torch.cat(out=)`` for
        several) plus the widened back-chunk view; into an empty list the parts go by reference
        (one part) or as one new tensor.
        """
        n = 0
        for part in parts:
            n += part.shape[0]
        if not n:
            return
        chunks = self._chunks
        if not chunks:
            first = parts[0] if len(parts) == 1 else torch.cat(parts)
            chunks.append(first if first.dtype is torch.int64 else first.to(torch.int64))
            self._len = n
            self._off = 0
            self._tail = -1
            return
        arena = self._arena
        pos = self._arena_pos
        if arena is None or pos + n > arena.shape[0]:
            arena = self._arena = torch.empty(
                max(self._arena_size, n), dtype=torch.int64, device=self._device
            )
            pos = 0
            self._tail = -1
        end = pos + n
        if len(parts) == 1:
            arena[pos:end] = parts[0]
        else:
            torch.cat(parts, out=arena[pos:end])
        start = self._tail
        if start >= 0:  # the back chunk ends where this push starts: widen it
            chunks[-1] = arena[start:end]
        else:
            chunks.append(arena[pos:end])
            self._tail = pos
        self._arena_pos = end
        self._len += n

    def head(self, n: int) -> torch.Tensor:
        """The first ``n`` page ids as one contiguous tensor, without removing them.

        Coalesces the chunks it touches into one front chunk (same logical content; of a long
        chunk only the ids the take needs, so a take copies O(n + MERGE_AHEAD) ids). Requires
        ``0 <= n <= len(self)``; the caller checks (a ``RuntimeError`` here is an internal bug).
        """
        if n < 0 or n > self._len:
            raise RuntimeError(f"free list head({n}) out of range (length {self._len})")
        chunks = self._chunks
        if n == 0:
            return self._empty  # shared, immutable (no elements)
        off = self._off
        first = chunks[0]
        if first.shape[0] - off >= n:
            return first[off : off + n]
        parts = [first[off:] if off else chunks[0]]
        chunks.popleft()
        got = parts[0].shape[0]
        while got < n:
            chunk = chunks.popleft()
            need = n - got
            if chunk.shape[0] - need > MERGE_AHEAD:
                # a long chunk (the arena's back chunk after many frees): join only the ids the
                # take needs and keep the rest as a view, instead of copying the whole chunk
                if not chunks and self._tail >= 0:
                    self._tail += need  # the rest still ends at the arena position
                chunks.appendleft(chunk[need:])
                parts.append(chunk[:need])
                got = n
                break
            parts.append(chunk)
            got += chunk.shape[0]
        # merge ahead: following small chunks (freed runs) join the same cat, so the next takes
        # are slices instead of one more cat each
        limit = max(n, MERGE_AHEAD)
        while chunks and got + chunks[0].shape[0] <= limit:
            chunk = chunks.popleft()
            parts.append(chunk)
            got += chunk.shape[0]
        if not chunks:
            self._tail = -1  # the back chunk was merged (a new tensor, not the arena)
        merged = torch.cat(parts)
        chunks.appendleft(merged)
        self._off = 0
        return merged[:n]

    def drop(self, n: int) -> None:
        """Remove the first ``n`` page ids (``0 <= n <= len(self)``)."""
        if n < 0 or n > self._len:
            raise RuntimeError(f"free list drop({n}) out of range (length {self._len})")
        chunks = self._chunks
        left = n + self._off
        while left:
            m = chunks[0].shape[0]
            if m > left:
                break
            chunks.popleft()
            left -= m
        self._off = left
        self._len -= n
        if not chunks:
            self._tail = -1

    def take(self, n: int) -> torch.Tensor:
        """Remove and return the first ``n`` page ids (a tensor the caller may keep)."""
        chunks = self._chunks
        if n > 0 and chunks:  # inside the front chunk (most takes): one slice, no coalescing
            off = self._off
            end = off + n
            first = chunks[0]
            if end < first.shape[0]:
                self._off = end
                self._len -= n
                return first[off:end]
        out = self.head(n)
        self.drop(n)
        return out

    def to_tensor(self) -> torch.Tensor:
        """All page ids front-to-back as one tensor (O(len)); the list keeps them."""
        return self.head(self._len)

    def clear(self) -> None:
        self._chunks.clear()
        self._len = 0
        self._off = 0
        self._arena = None  # never rewrite memory that old chunks or results may view
        self._arena_pos = 0
        self._tail = -1

    def snapshot(self) -> FreeListSnapshot:
        return tuple(self._chunks), self._off, self._len

    def restore(self, snap: FreeListSnapshot) -> None:
        chunks, off, length = snap
        self._chunks = deque(chunks)
        self._off = off
        self._len = length
        self._tail = -1  # the back chunk may no longer end at the arena position
