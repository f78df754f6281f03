"""Test support (beside the tests, not shipped in the package): small SGLang-0.5.23-semantics
reference allocators (vectorised torch).

Written from the behaviour described in SGLang's allocator (not from our implementation): one
free-list tensor rebuilt with ``torch.cat`` per free, ``torch.unique`` page dedup, free groups
applied as one free of the concatenated group. Used by the equivalence tests and
``tools/bench/allocator`` (the benchmark's baseline). Deliberately simple and slow; never used by
the allocators themselves.

Semantics mirrored (SGLang 0.5.23):

* ``free(slots)``: paged ``unique(slots // ps)`` prepended (``need_sort``: staged); token
  allocator (``token=True``): slots appended in the given order, no dedup.
* ``free_segment(slots, start_pos=)``: the pages of the slots in position order (no sort),
  released as exact page ids; ``free_segments`` drops a page the previous segment released.
* Free group: ``free`` calls queue copies; ``free_group_end`` frees ``unique`` of their union,
  then the page-id releases (``free_segment(s)`` / ``free_page_ids``) not already freed.
* ``need_sort`` merge triggers: ``alloc``: ``n > len(free)``; ``alloc_extend``:
  ``extend // ps + bs + 1 > len(free)``; ``alloc_decode``: ``bs > len(free)``.
* SWA: ``free`` = ``free_swa`` + ``free_full``; ``free_swa`` expands to whole full pages, reads and
  clears the mapping at call time, releases mapped window slots at once or at group end (one
  free); ``alloc_decode`` runs both sides' merge triggers before giving up. Known SGLang bug not
  mirrored: its SWA ``alloc_decode`` keeps the side that succeeded when the other fails (here
  neither side changes).
"""

from __future__ import annotations

import torch

__all__ = [
    "ReferenceAllocator",
    "ReferenceSWAAllocator",
    "naive_alloc_decode",
    "naive_alloc_extend",
]


def naive_alloc_extend(  # noqa: PLR0917 - mirrors the kernel signature
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    page_size: int,
    total: int,
) -> torch.Tensor:
    """Vectorised extend allocation (SGLang semantics), written independently of the kernels."""
    ps = page_size
    pre = prefix_lens.to(torch.int64)
    seq = seq_lens.to(torch.int64)
    ext = seq - pre
    out_start = torch.cumsum(ext, 0) - ext
    new_pages = (seq + ps - 1) // ps - (pre + ps - 1) // ps
    page_start = torch.cumsum(new_pages, 0) - new_pages
    owner = torch.repeat_interleave(torch.arange(pre.shape[0], device=pre.device), ext)
    pos = torch.arange(total, device=pre.device) - out_start[owner] + pre[owner]
    first_new = (pre + ps - 1) // ps  # first page index (in positions / ps) that is a new page
    in_old = pos < first_new[owner] * ps
    old_slot = last_loc.to(torch.int64)[owner] + 1 + (pos - pre[owner])
    page_idx = page_start[owner] + pos // ps - first_new[owner]
    if free_pages.numel():
        page_idx = page_idx.clamp(0, free_pages.numel() - 1)
        new_slot = free_pages[page_idx] * ps + pos % ps
    else:
        new_slot = old_slot
    return torch.where(in_old, old_slot, new_slot)


def naive_alloc_decode(
    seq_lens: torch.Tensor, last_loc: torch.Tensor, free_pages: torch.Tensor, page_size: int
) -> torch.Tensor:
    """Vectorised decode allocation (one token per request)."""
    need = (seq_lens.to(torch.int64) - 1) % page_size == 0
    nxt = last_loc.to(torch.int64) + 1
    if free_pages.numel() == 0:
        return nxt
    rank = torch.cumsum(need.to(torch.int64), 0) - need.to(torch.int64)
    rank = rank.clamp(max=free_pages.numel() - 1)
    return torch.where(need, free_pages[rank] * page_size, nxt)


def _position_order_pages(slots: torch.Tensor, page_size: int) -> torch.Tensor:
    """Pages of consecutive-position slots, each once, in position order."""
    pages = slots.to(torch.int64) // page_size
    if pages.numel() <= 1:
        return pages.clone()
    keep = torch.ones_like(pages, dtype=torch.bool)
    keep[1:] = pages[1:] != pages[:-1]
    return pages[keep]


class ReferenceAllocator:
    """SGLang-0.5.23-like paged (``token=False``) or token (``token=True``) allocator."""

    def __init__(
        self,
        size: int,
        page_size: int,
        device: str | torch.device = "cpu",
        *,
        need_sort: bool = False,
        token: bool = False,
    ) -> None:
        self.page_size = page_size
        self.device = torch.device(device)
        self.need_sort = need_sort
        self.token = token
        self.num_pages = size // page_size
        self.group: list[tuple[torch.Tensor, bool]] | None = None
        self.clear()

    def clear(self) -> None:
        self.free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64, device=self.device)
        self.staged: list[torch.Tensor] = []
        self.group = None

    def available_size(self) -> int:
        return (len(self.free_pages) + sum(len(p) for p in self.staged)) * self.page_size

    def merge_and_sort_free(self) -> None:
        if self.staged:
            self.free_pages = torch.sort(torch.cat((self.free_pages, *self.staged))).values
            self.staged = []

    # ------------------------------------------------------------------ allocation
    def alloc(self, need_size: int) -> torch.Tensor | None:
        ps = self.page_size
        n = need_size // ps
        if self.need_sort and n > len(self.free_pages):
            self.merge_and_sort_free()
        if n > len(self.free_pages):
            return None
        pages = self.free_pages[:n]
        self.free_pages = self.free_pages[n:]
        if ps == 1:
            return pages
        offs = torch.arange(ps, dtype=torch.int64, device=self.device)
        return (pages[:, None] * ps + offs).reshape(-1)

    def alloc_extend(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        ps = self.page_size
        bs = len(seq_lens_cpu)
        if self.need_sort and extend_num_tokens // ps + bs + 1 > len(self.free_pages):
            self.merge_and_sort_free()
        num_new = int(
            ((seq_lens_cpu + ps - 1) // ps - (prefix_lens_cpu + ps - 1) // ps).sum().item()
        )
        if num_new > len(self.free_pages):
            return None
        out = naive_alloc_extend(
            prefix_lens, seq_lens, last_loc, self.free_pages[:num_new], ps, extend_num_tokens
        )
        self.free_pages = self.free_pages[num_new:]
        return out

    def decode_merge(self, bs: int) -> None:
        if self.need_sort and bs > len(self.free_pages):
            self.merge_and_sort_free()

    def decode_pages(self, seq_lens_cpu: torch.Tensor) -> int:
        return int(((seq_lens_cpu - 1) % self.page_size == 0).sum().item())

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        ps = self.page_size
        self.decode_merge(len(seq_lens_cpu))
        num_new = self.decode_pages(seq_lens_cpu)
        if num_new > len(self.free_pages):
            return None
        if ps == 1:
            out = self.free_pages[:num_new]
        else:
            out = naive_alloc_decode(seq_lens, last_loc, self.free_pages[:num_new], ps)
        self.free_pages = self.free_pages[num_new:]
        return out

    # ------------------------------------------------------------------ free
    def _release(self, pages: torch.Tensor) -> None:
        if not pages.numel():
            return
        if self.need_sort:
            self.staged.append(pages)
        elif self.token:
            self.free_pages = torch.cat((self.free_pages, pages))
        else:
            self.free_pages = torch.cat((pages, self.free_pages))

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        idx = free_index.to(torch.int64)
        if self.group is not None:
            self.group.append((idx.clone(), False))
            return
        self._release(idx.clone() if self.token else torch.unique(idx // self.page_size))

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        if page_ids.numel() == 0:
            return
        pages = page_ids.to(torch.int64).clone()
        if self.group is not None:
            self.group.append((pages, True))
            return
        self._release(pages)

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        if self.token:
            self.free(free_index)
            return
        self.free_page_ids(_position_order_pages(free_index, self.page_size))

    def free_segments(self, segments: list[tuple[torch.Tensor, int]]) -> None:
        if self.token:
            for free_index, _ in segments:
                self.free(free_index)
            return
        parts: list[torch.Tensor] = []
        last_page = -1
        for free_index, _ in segments:
            if free_index.numel() == 0:
                continue
            pages = _position_order_pages(free_index, self.page_size)
            if int(pages[0]) == last_page:
                pages = pages[1:]
            if pages.numel():
                parts.append(pages)
            last_page = int(free_index[-1]) // self.page_size
        if parts:
            self.free_page_ids(torch.cat(parts))

    def free_group_begin(self) -> None:
        self.group = []

    def free_group_end(self) -> None:
        group, self.group = self.group, None
        if not group:
            return
        if self.token:
            self._release(torch.cat([t for t, _ in group]))
            return
        slots = [t for t, is_pages in group if not is_pages]
        listed = [t for t, is_pages in group if is_pages]
        union = torch.unique(torch.cat(slots) // self.page_size) if slots else None
        if union is not None:
            self._release(union)
        if listed:
            pages = torch.cat(listed)
            if union is not None:
                pages = pages[~torch.isin(pages, union)]
            self._release(pages)


class ReferenceSWAAllocator:
    """SGLang-0.5.23-like ``SWATokenToKVPoolAllocator`` over two :class:`ReferenceAllocator`."""

    def __init__(
        self, size: int, size_swa: int, page_size: int, *, need_sort: bool = False
    ) -> None:
        token = page_size == 1
        self.page_size = page_size
        self.full = ReferenceAllocator(size, page_size, need_sort=need_sort, token=token)
        self.swa = ReferenceAllocator(size_swa, page_size, need_sort=need_sort, token=token)
        self.mapping = torch.zeros(size + page_size + 1, dtype=torch.int64)
        self.mapping[-1] = -1
        self.group: list[torch.Tensor] | None = None
        self.full_group: list[torch.Tensor] = []

    def available_size(self) -> int:
        return min(self.full.available_size(), self.swa.available_size())

    def full_available_size(self) -> int:
        return self.full.available_size()

    def swa_available_size(self) -> int:
        return self.swa.available_size()

    def _fits(self, pages: int) -> bool:
        ps = self.page_size
        return (
            pages <= self.full.available_size() // ps and pages <= self.swa.available_size() // ps
        )

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if not self._fits(need_size // self.page_size):
            return None
        a, b = self.full.alloc(need_size), self.swa.alloc(need_size)
        assert a is not None and b is not None
        self.mapping[a] = b
        return a

    def alloc_extend(  # noqa: PLR0917
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        ps = self.page_size
        pages = int(((seq_lens_cpu + ps - 1) // ps - (prefix_lens_cpu + ps - 1) // ps).sum())
        if not self._fits(pages):
            return None
        swa_last = self.mapping[last_loc]
        lens = (prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu)
        a = self.full.alloc_extend(*lens, last_loc, extend_num_tokens)
        b = self.swa.alloc_extend(*lens, swa_last, extend_num_tokens)
        assert a is not None and b is not None
        self.mapping[a] = b
        return a

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        bs = len(seq_lens_cpu)
        self.full.decode_merge(bs)
        self.swa.decode_merge(bs)
        pages = self.full.decode_pages(seq_lens_cpu)
        if pages > len(self.full.free_pages) or pages > len(self.swa.free_pages):
            return None
        swa_last = self.mapping[last_loc]
        a = self.full.alloc_decode(seq_lens, seq_lens_cpu, last_loc)
        b = self.swa.alloc_decode(seq_lens, seq_lens_cpu, swa_last)
        assert a is not None and b is not None
        self.mapping[a] = b
        return a

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        self.free_swa(free_index)
        self.free_full(free_index)

    def free_swa(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        ps = self.page_size
        idx = free_index.to(torch.int64)
        if ps == 1:
            keys = idx
        else:
            pages = torch.unique(idx // ps)
            keys = (pages[:, None] * ps + torch.arange(ps)).reshape(-1)
        window = self.mapping[keys].clone()
        self.mapping[keys] = 0
        if self.group is not None:
            self.group.append(window)
        else:
            self.swa.free(window[window > 0])

    def free_full(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self.group is not None:
            self.full_group.append(free_index.to(torch.int64).clone())
        else:
            self.full.free(free_index)

    def free_group_begin(self) -> None:
        self.group = []
        self.full_group = []

    def free_group_end(self) -> None:
        group, self.group = self.group, None
        if group:
            window = torch.cat(group)
            self.swa.free(window[window > 0])
        if self.full_group:
            self.full.free(torch.cat(self.full_group))
        self.full_group = []
