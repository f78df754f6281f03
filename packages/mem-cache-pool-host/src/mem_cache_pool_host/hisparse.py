"""HiSparse host side: per-request host rows grown in whole pages.

For hierarchical sparse attention every request keeps its full KV on the host and swaps the
selected top-k pages into a small device buffer. The host rows live in two CPU int64 tables the
caller (the HiSparse coordinator) owns:

* ``req_to_host_pool[r, pos]``: host slot of token ``pos`` of request row ``r`` (``-1`` = none);
* ``req_to_host_pool_allocated_len[r]``: tokens backed so far (always whole pages).

:meth:`HiSparseHostPoolMixin.alloc_paged_token_slots` extends a row by whole host pages as
positions are needed and returns token-granular slots; because pages are appended in order,
position ``j`` of a request always sits at offset ``j % page_size`` in its page.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import torch

from mem_cache_kernels.checks import check_index, check_int, check_on_device, check_tensor

__all__ = ["HiSparseHostPoolMixin"]

_INT64 = (torch.int64,)


def _check_row(req_to_host_pool: torch.Tensor, req_pool_idx: int) -> None:
    check_int("req_pool_idx", req_pool_idx, minimum=0, maximum=req_to_host_pool.shape[0] - 1)


def _check_tables(req_to_host_pool: torch.Tensor, allocated_len: torch.Tensor) -> None:
    """Both tables CPU int64 (``TypeError`` for a non-tensor or another dtype), the first 2-D,
    the second 1-D with one entry per row (``ValueError``)."""
    cpu = torch.device("cpu")
    check_tensor("req_to_host_pool", req_to_host_pool)
    if req_to_host_pool.dtype != torch.int64:
        raise TypeError(f"req_to_host_pool must be int64, got {req_to_host_pool.dtype}")
    if req_to_host_pool.dim() != 2:
        raise ValueError(
            f"req_to_host_pool must be 2-D, got shape {tuple(req_to_host_pool.shape)}"
        )
    check_on_device("req_to_host_pool", req_to_host_pool, cpu)
    check_index("req_to_host_pool_allocated_len", allocated_len, dtypes=_INT64, device=cpu)
    if allocated_len.shape[0] != req_to_host_pool.shape[0]:
        raise ValueError(
            f"req_to_host_pool_allocated_len must have one entry per row of req_to_host_pool "
            f"({req_to_host_pool.shape[0]}), got {allocated_len.shape[0]}"
        )


class HiSparseHostPoolMixin:
    """Mix into a :class:`~mem_cache_pool_host.base.HostKVCache` (before it in the bases)."""

    if TYPE_CHECKING:
        page_size: int
        lock: threading.RLock

        def alloc(self, need_size: int) -> torch.Tensor | None: ...

        def free(self, indices: torch.Tensor) -> int: ...

    def alloc_page(self, num_pages: int) -> torch.Tensor | None:
        """``num_pages`` whole pages of host slots (CPU int64), or ``None``."""
        check_int("num_pages", num_pages, minimum=0)
        return self.alloc(num_pages * self.page_size)

    def alloc_paged_token_slots(
        self,
        req_to_host_pool: torch.Tensor,
        req_to_host_pool_allocated_len: torch.Tensor,
        req_pool_idx: int,
        start_pos: int,
        num_tokens: int,
    ) -> torch.Tensor | None:
        """Host slots for positions ``[start_pos, start_pos + num_tokens)`` of row
        ``req_pool_idx``, allocating whole pages as needed.

        Mutates both tables (new slots written, allocated length raised to a page multiple).
        Returns a CPU int64 tensor of ``num_tokens`` slots, or ``None`` (tables untouched) when
        the host pool is short. ``ValueError`` if the row cannot hold the positions.
        """
        _check_tables(req_to_host_pool, req_to_host_pool_allocated_len)
        _check_row(req_to_host_pool, req_pool_idx)
        max_len = req_to_host_pool.shape[1]
        check_int("start_pos", start_pos, minimum=0)
        check_int("num_tokens", num_tokens, minimum=0)
        end = start_pos + num_tokens
        ps = self.page_size
        with self.lock:
            have = int(req_to_host_pool_allocated_len[req_pool_idx])
            if have % ps:
                raise ValueError(
                    f"req_to_host_pool_allocated_len[{req_pool_idx}]={have} is not a multiple "
                    f"of page_size={ps}"
                )
            if end > have:
                new_len = -(-end // ps) * ps
                if new_len > max_len:
                    raise ValueError(
                        f"positions up to {end} (rounded to {new_len}) exceed the row length "
                        f"{max_len} of req_to_host_pool"
                    )
                slots = self.alloc(new_len - have)
                if slots is None:
                    return None
                req_to_host_pool[req_pool_idx, have:new_len] = slots
                req_to_host_pool_allocated_len[req_pool_idx] = new_len
            return req_to_host_pool[req_pool_idx, start_pos:end].clone()

    def allocated_host_indices(
        self,
        req_to_host_pool: torch.Tensor,
        req_pool_idx: int,
        allocated_len: int | torch.Tensor,
    ) -> torch.Tensor:
        """SGLang's: the host slots backing the first ``allocated_len`` tokens of row
        ``req_pool_idx``, rounded up to whole pages (capped at the row length), without the
        ``-1`` entries (a copy). ``allocated_len`` is an int or a one-element tensor (e.g.
        ``req_to_host_pool_allocated_len[r]``)."""
        check_tensor("req_to_host_pool", req_to_host_pool)
        if req_to_host_pool.dim() != 2:
            raise ValueError(
                f"req_to_host_pool must be 2-D, got shape {tuple(req_to_host_pool.shape)}"
            )
        _check_row(req_to_host_pool, req_pool_idx)
        if isinstance(allocated_len, torch.Tensor):
            if allocated_len.numel() != 1 or allocated_len.dtype.is_floating_point:
                raise TypeError(
                    "allocated_len must be an int or a one-element integer tensor, got shape "
                    f"{tuple(allocated_len.shape)} dtype {allocated_len.dtype}"
                )
            allocated_len = int(allocated_len.item())
        check_int("allocated_len", allocated_len, minimum=0)
        ps = self.page_size
        host_len = min(-(-allocated_len // ps) * ps, req_to_host_pool.shape[1])
        row = req_to_host_pool[req_pool_idx, :host_len]
        return row[row >= 0].clone()

    def free_paged_token_slots(
        self,
        req_to_host_pool: torch.Tensor,
        req_to_host_pool_allocated_len: torch.Tensor,
        req_pool_idx: int,
    ) -> int:
        """Free every page of row ``req_pool_idx``, reset it to ``-1``; returns slots freed."""
        _check_tables(req_to_host_pool, req_to_host_pool_allocated_len)
        _check_row(req_to_host_pool, req_pool_idx)
        with self.lock:
            have = int(req_to_host_pool_allocated_len[req_pool_idx])
            if have == 0:
                return 0
            freed = self.free(req_to_host_pool[req_pool_idx, :have].clone())
            req_to_host_pool[req_pool_idx, :have] = -1
            req_to_host_pool_allocated_len[req_pool_idx] = 0
            return freed
