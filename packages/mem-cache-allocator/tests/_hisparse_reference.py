"""Pure-Python models of SGLang 0.5.23's HiSparse allocators (test support).

Written from the behaviour described in ``shared/reference/sglang_mem_cache.md`` (B.4, B.5,
B.8, B.9) as refined by issue 19, not from SGLang's code. Plain lists of ints, no torch, so a
mismatch against the real classes is easy to read.

* :class:`RefPaged` -- ``PagedTokenToKVPoolAllocator`` with 0.5.23's set-semantics ``free``
  (the sorted unique pages of the given slots), ``need_sort`` staging, the allocation kernels'
  slot order and free groups that apply one deduplicated free at ``free_group_end``.
* :class:`RefHiSparse` / :class:`RefDeepSeekV4HiSparse` -- the two HiSparse allocators.

Where SGLang returns wrong data the models follow *our* documented deviations (package README,
"HiSparse and DeepSeek-V4"), each behind a flag so a test can show SGLang's answer too:

* ``fresh_page`` -- an ``alloc_extend`` continuing a prefix whose last token has no device slot
  gets a fresh device page (SGLang: slots of the padding page 0).
* device buffers: surplus pages holding a buffer slot are kept; padding stays inside the newest
  entry's page; a short device returns ``None`` (SGLang asserts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class RefPaged:
    """SGLang 0.5.23 ``PagedTokenToKVPoolAllocator`` (page size >= 1)."""

    def __init__(self, size: int, page_size: int, need_sort: bool) -> None:
        self.size = size
        self.ps = page_size
        self.need_sort = need_sort
        self.num_pages = size // page_size
        self.free_pages: list[int] = list(range(1, self.num_pages + 1))
        self.release: list[int] = []
        self.group: list[int] | None = None

    def available_size(self) -> int:
        return (len(self.free_pages) + len(self.release)) * self.ps

    def free_list(self) -> list[int]:
        return self.free_pages + self.release

    def merge_and_sort_free(self) -> None:
        if self.release:
            self.free_pages = sorted(self.free_pages + self.release)
            self.release = []

    def _take(self, n: int) -> list[int]:
        pages, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return pages

    def alloc(self, need_size: int) -> list[int] | None:
        n = need_size // self.ps
        if self.need_sort and n > len(self.free_pages):
            self.merge_and_sort_free()
        if n > len(self.free_pages):
            return None
        return [p * self.ps + o for p in self._take(n) for o in range(self.ps)]

    def alloc_extend(
        self, pre: Sequence[int], seq: Sequence[int], last: Sequence[int]
    ) -> list[int] | None:
        ps = self.ps
        tokens = sum(seq) - sum(pre)
        if self.need_sort and tokens // ps + len(seq) + 1 > len(self.free_pages):
            self.merge_and_sort_free()
        pages = sum(_ceil(s, ps) - _ceil(p, ps) for p, s in zip(pre, seq, strict=True))
        if pages > len(self.free_pages):
            return None
        new = self._take(pages)
        out: list[int] = []
        rank = 0
        for p, s, lst in zip(pre, seq, last, strict=True):
            n1 = min(s, _ceil(p, ps) * ps) - p  # fill the prefix's partial page
            out += [lst + 1 + k for k in range(n1)]
            mine = new[rank : rank + _ceil(s, ps) - _ceil(p, ps)]
            rank += len(mine)
            pos = p + n1
            for page in mine:
                while pos < s:
                    out.append(page * ps + pos % ps)
                    pos += 1
                    if pos % ps == 0:
                        break
        return out

    def alloc_decode(self, seq: Sequence[int], last: Sequence[int]) -> list[int] | None:
        ps = self.ps
        if self.need_sort and len(seq) > len(self.free_pages):
            self.merge_and_sort_free()
        need = [(s - 1) % ps == 0 for s in seq]
        if sum(need) > len(self.free_pages):
            return None
        new = iter(self._take(sum(need)))
        return [next(new) * ps if nd else lst + 1 for nd, lst in zip(need, last, strict=True)]

    def free(self, slots: Sequence[int]) -> None:
        if not slots:
            return
        if self.group is not None:
            self.group += list(slots)
            return
        pages = sorted({s // self.ps for s in slots})
        if self.need_sort:
            self.release += pages
        else:
            self.free_pages = pages + self.free_pages

    def free_group_begin(self) -> None:
        self.group = []

    def free_group_end(self) -> None:
        group, self.group = self.group, None
        if group:
            self.free(group)


def _orphans(
    pre: Sequence[int], seq: Sequence[int], dev_last: Sequence[int], ps: int
) -> list[bool]:
    """Requests continuing a partial page, with new tokens, whose last token has no device
    slot."""
    return [p % ps != 0 and s > p and d <= 0 for p, s, d in zip(pre, seq, dev_last, strict=True)]


def _device_extend(
    dev: RefPaged,
    pre: Sequence[int],
    seq: Sequence[int],
    dev_last: Sequence[int],
    fresh_page: bool,
) -> list[int] | None:
    """The device side of ``alloc_extend`` (with the fresh-page deviation when asked)."""
    ps = dev.ps
    orphan = _orphans(pre, seq, dev_last, ps) if fresh_page else [False] * len(pre)
    pre2 = [p - p % ps if o else p for p, o in zip(pre, orphan, strict=True)]
    last2 = [
        (-1 if p2 == 0 else ps - 1) if o else d
        for p2, o, d in zip(pre2, orphan, dev_last, strict=True)
    ]
    out = dev.alloc_extend(pre2, seq, last2)
    if out is None:
        return None
    kept: list[int] = []
    pos = 0
    for p, p2, s in zip(pre, pre2, seq, strict=True):
        kept += out[pos + (p - p2) : pos + (s - p2)]
        pos += s - p2
    return kept


def _device_pages(pre: Sequence[int], seq: Sequence[int], dev_last: Sequence[int], ps: int) -> int:
    orphan = _orphans(pre, seq, dev_last, ps)
    pre2 = [p - p % ps if o else p for p, o in zip(pre, orphan, strict=True)]
    return sum(_ceil(s, ps) - _ceil(p, ps) for p, s in zip(pre2, seq, strict=True))


def _surplus_pages(buffer: list[int], surplus: list[int], ps: int) -> list[int]:
    keep = {s // ps for s in buffer}
    return sorted({s // ps for s in surplus} - keep)


def _pad(newest: int, count: int, ps: int) -> list[int]:
    room = ps - 1 - newest % ps
    return list(range(newest + 1, newest + 1 + min(count, room)))


class RefHiSparse:
    """SGLang 0.5.23 ``HiSparseTokenToKVPoolAllocator`` (with our documented deviations)."""

    def __init__(
        self, size: int, page_size: int, need_sort: bool, ratio: int = 2, fresh_page: bool = True
    ) -> None:
        self.ps = page_size
        self.logical = RefPaged(size * ratio, page_size, need_sort)
        self.device = RefPaged(size, page_size, need_sort)
        self.mapping = [0] * (size * ratio + page_size) + [-1]
        self.fresh_page = fresh_page

    def available_size(self) -> int:
        return min(self.logical.available_size(), self.device.available_size())

    def alloc(self, need_size: int) -> list[int] | None:
        logical = self.logical.alloc(need_size)
        if logical is None:
            return None
        dev = self.device.alloc(need_size)
        if dev is None:
            self.logical.free(logical)
            return None
        for f, d in zip(logical, dev, strict=True):
            self.mapping[f] = d
        return logical

    def alloc_extend(
        self, pre: Sequence[int], seq: Sequence[int], last: Sequence[int]
    ) -> list[int] | None:
        ps = self.ps
        pages = sum(_ceil(s, ps) - _ceil(p, ps) for p, s in zip(pre, seq, strict=True))
        if (
            pages > self.logical.available_size() // ps
            or pages > self.device.available_size() // ps
        ):
            return None
        dev_last = [self.mapping[x] for x in last]
        if self.fresh_page:
            dev_pages = _device_pages(pre, seq, dev_last, ps)
            if dev_pages > self.device.available_size() // ps:
                return None
        logical = self.logical.alloc_extend(pre, seq, last)
        assert logical is not None
        dev = _device_extend(self.device, pre, seq, dev_last, self.fresh_page)
        assert dev is not None
        for f, d in zip(logical, dev, strict=True):
            self.mapping[f] = d
        return logical

    def alloc_decode(self, seq: Sequence[int], last: Sequence[int]) -> list[int] | None:
        return self.logical.alloc_decode(seq, last)

    def alloc_device_buffer(self, indices: Sequence[int], need: int) -> list[int] | None:
        ps = self.ps
        dev = [d for d in (self.mapping[i] for i in indices) if d > 0]
        if len(dev) >= need:
            for i in indices:
                self.mapping[i] = 0
            buffer, surplus = dev[:need], dev[need:]
            pages = _surplus_pages(buffer, surplus, ps)
            if pages:
                self.device.free([p * ps for p in pages])
            return buffer
        if len(dev) % ps:
            dev = dev + _pad(dev[-1], ps - len(dev) % ps, ps)
        extra = need - len(dev)
        if _ceil(extra, ps) > self.device.available_size() // ps:
            return None
        got = self.device.alloc(_ceil(extra, ps) * ps)
        assert got is not None
        for i in indices:
            self.mapping[i] = 0
        return dev + got[:extra]

    def free_hisparse(self, slots: Sequence[int]) -> None:
        dev = [self.mapping[s] for s in slots]
        self.free_hisparse_indices(dev)
        for s in slots:
            self.mapping[s] = 0

    def free_hisparse_indices(self, dev: Sequence[int]) -> None:
        self.device.free([d for d in dev if d > 0])

    def free(self, slots: Sequence[int]) -> None:
        if not slots:
            return
        self.logical.free(slots)
        self.free_hisparse(slots)

    def free_group_begin(self) -> None:
        """A no-op in SGLang (frees must clear the mapping at once)."""

    def free_group_end(self) -> None:
        """A no-op in SGLang."""


class RefDeepSeekV4HiSparse:
    """SGLang 0.5.23 ``DeepSeekV4HiSparseTokenToKVPoolAllocator`` over a paged logical
    allocator (with our documented deviations)."""

    R = 4

    def __init__(
        self,
        logical_size: int,
        page_size: int,
        c4_size: int,
        need_sort: bool,
        logical: Any = None,
    ) -> None:
        self.ps = page_size
        self.cps = page_size // self.R
        # ``logical``: a model with RefPaged's list interface (default: a paged allocator; the
        # tests pass an adapter over the package's SGLang-0.5.23 SWA reference)
        self.logical = RefPaged(logical_size, page_size, need_sort) if logical is None else logical
        self.device = RefPaged(c4_size, self.cps, need_sort)
        self.mapping = [0] * (logical_size // self.R + self.cps) + [-1]
        self.group: list[int] | None = None

    def available_size(self) -> int:
        return min(self.logical.available_size(), self.R * self.device.available_size())

    def full_available_size(self) -> int:
        inner = getattr(self.logical, "full_available_size", self.logical.available_size)
        return min(inner(), self.R * self.device.available_size())

    def _compressed(self, slots: Sequence[int]) -> list[int]:
        return [s // self.R for s in slots if (s + 1) % self.R == 0]

    def alloc_extend(
        self, pre: Sequence[int], seq: Sequence[int], last: Sequence[int]
    ) -> list[int] | None:
        ps, cps, r = self.ps, self.cps, self.R
        c_pre, c_seq = [p // r for p in pre], [s // r for s in seq]
        pages = sum(_ceil(s, ps) - _ceil(p, ps) for p, s in zip(pre, seq, strict=True))
        dev_pages = sum(_ceil(s, cps) - _ceil(p, cps) for p, s in zip(c_pre, c_seq, strict=True))
        if pages > self.logical.available_size() // ps:
            return None
        if dev_pages > self.device.available_size() // cps:
            return None
        dev_last = [self.mapping[(x - (r - 1)) // r] for x in last]
        if _device_pages(c_pre, c_seq, dev_last, cps) > self.device.available_size() // cps:
            return None
        logical = self.logical.alloc_extend(pre, seq, last)
        assert logical is not None
        dev = _device_extend(self.device, c_pre, c_seq, dev_last, True)
        assert dev is not None
        for c, d in zip(self._compressed(logical), dev, strict=True):
            self.mapping[c] = d
        return logical

    def alloc_decode(self, seq: Sequence[int], last: Sequence[int]) -> list[int] | None:
        return self.logical.alloc_decode(seq, last)

    def alloc_device_buffer(self, compressed: Sequence[int], need: int) -> list[int] | None:
        cps = self.cps
        dev = [d for d in (self.mapping[c] for c in compressed) if d > 0]
        n = len(dev)
        newest = dev[-1] if n else 0
        reserved = need - cps
        if n > reserved + 1:
            dev[reserved], dev[n - 1] = dev[n - 1], dev[reserved]
        if n >= need:
            for c in compressed:
                self.mapping[c] = 0
            buffer, surplus = dev[:need], dev[need:]
            pages = _surplus_pages(buffer, surplus, cps)
            if pages:
                self.device.free([p * cps for p in pages])
            return buffer
        if n % cps:
            dev = dev + _pad(newest, cps - n % cps, cps)
        extra = need - len(dev)
        if _ceil(extra, cps) > self.device.available_size() // cps:
            return None
        got = self.device.alloc(_ceil(extra, cps) * cps)
        assert got is not None
        for c in compressed:
            self.mapping[c] = 0
        return dev + got[:extra]

    def free_compressed(self, compressed: Sequence[int]) -> None:
        dev = [self.mapping[c] for c in compressed]
        self.free_hisparse_indices(dev)
        for c in compressed:
            self.mapping[c] = 0

    def free_hisparse(self, slots: Sequence[int]) -> None:
        self.free_compressed(self._compressed(slots))

    def free_hisparse_indices(self, dev: Sequence[int]) -> None:
        self.device.free([d for d in dev if d > 0])

    def free(self, slots: Sequence[int]) -> None:
        if not slots:
            return
        if self.group is not None:
            self.group += list(slots)
            return
        self.logical.free(slots)
        self.free_hisparse(slots)

    def free_group_begin(self) -> None:
        self.group = []

    def free_group_end(self) -> None:
        group, self.group = self.group, None
        if group:
            self.free(group)
