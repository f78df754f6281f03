"""A device free list of page ids kept as a deque of immutable chunks, with its length on the host.

SGLang keeps the free list as one device tensor and rebuilds it with ``torch.cat`` on every free
(O(free list) per free). Here a free is O(pages freed): the freed page ids become one new chunk at
the front (paged allocator: freed pages are reused first) or at the back (token allocator: freed
slots are reused last). Allocation materialises only the first ``n`` page ids (one ``torch.cat``
over the chunks it touches, O(n + chunks touched)).

Chunks are never written in place, so a snapshot (``backup``) is a tuple of tensor references and
costs O(chunks), never a copy. All lengths are host-side metadata: no method here reads device
memory or synchronises with the device.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import torch

__all__ = ["ChunkedFreeList", "FreeListSnapshot"]

FreeListSnapshot = tuple[tuple[torch.Tensor, ...], int]
"""``(chunks front-to-back, total length)``: an immutable view of a :class:`ChunkedFreeList`."""


class ChunkedFreeList:
    """An ordered sequence of int64 page ids on ``device``, stored as a deque of 1-D chunks."""

    __slots__ = ("_chunks", "_device", "_len")

    def __init__(self, device: torch.device, initial: Iterable[torch.Tensor] = ()) -> None:
        self._device = device
        self._chunks: deque[torch.Tensor] = deque()
        self._len = 0
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
        if n:
            self._chunks.appendleft(chunk)
            self._len += n

    def push_back(self, chunk: torch.Tensor) -> None:
        """Put ``chunk`` (1-D int64, owned by the list from now on) after every page id."""
        n = chunk.shape[0]
        if n:
            self._chunks.append(chunk)
            self._len += n

    def head(self, n: int) -> torch.Tensor:
        """The first ``n`` page ids as one contiguous tensor, without removing them.

        Coalesces the chunks it touches into one front chunk (same logical content). Requires
        ``0 <= n <= len(self)``; the caller checks (a ``RuntimeError`` here is an internal bug).
        """
        if n < 0 or n > self._len:
            raise RuntimeError(f"free list head({n}) out of range (length {self._len})")
        if n == 0:
            return torch.empty(0, dtype=torch.int64, device=self._device)
        chunks = self._chunks
        first = chunks[0]
        if first.shape[0] >= n:
            return first[:n]
        parts: list[torch.Tensor] = []
        got = 0
        while got < n:
            chunk = chunks.popleft()
            parts.append(chunk)
            got += chunk.shape[0]
        merged = torch.cat(parts)
        chunks.appendleft(merged)
        return merged[:n]

    def drop(self, n: int) -> None:
        """Remove the first ``n`` page ids (``0 <= n <= len(self)``)."""
        if n < 0 or n > self._len:
            raise RuntimeError(f"free list drop({n}) out of range (length {self._len})")
        chunks = self._chunks
        left = n
        while left:
            first = chunks[0]
            m = first.shape[0]
            if m <= left:
                chunks.popleft()
                left -= m
            else:
                chunks[0] = first[left:]
                left = 0
        self._len -= n

    def take(self, n: int) -> torch.Tensor:
        """Remove and return the first ``n`` page ids (a tensor the caller may keep)."""
        out = self.head(n)
        self.drop(n)
        return out

    def to_tensor(self) -> torch.Tensor:
        """All page ids front-to-back as one tensor (O(len)); the list keeps them."""
        return self.head(self._len)

    def clear(self) -> None:
        self._chunks.clear()
        self._len = 0

    def snapshot(self) -> FreeListSnapshot:
        return tuple(self._chunks), self._len

    def restore(self, snap: FreeListSnapshot) -> None:
        chunks, length = snap
        self._chunks = deque(chunks)
        self._len = length
