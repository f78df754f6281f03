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

__all__ = ["HiSparseHostPoolMixin"]


def _check_row(req_to_host_pool: torch.Tensor, req_pool_idx: int) -> None:
    rows = req_to_host_pool.shape[0]
    if isinstance(req_pool_idx, bool) or not isinstance(req_pool_idx, int):
        raise TypeError(f"req_pool_idx must be an int, got {type(req_pool_idx).__name__}")
    if not 0 <= req_pool_idx < rows:
        raise ValueError(f"req_pool_idx must be in [0, {rows}), got {req_pool_idx}")


def _check_tables(req_to_host_pool: torch.Tensor, allocated_len: torch.Tensor) -> None:
    for name, t in (
        ("req_to_host_pool", req_to_host_pool),
        ("req_to_host_pool_allocated_len", allocated_len),
    ):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if req_to_host_pool.dtype != torch.int64 or req_to_host_pool.dim() != 2:
        raise ValueError(
            "req_to_host_pool must be a 2-D int64 tensor, got "
            f"{req_to_host_pool.dtype} of shape {tuple(req_to_host_pool.shape)}"
        )
    if allocated_len.dtype != torch.int64 or allocated_len.dim() != 1:
        raise ValueError(
            "req_to_host_pool_allocated_len must be a 1-D int64 tensor, got "
            f"{allocated_len.dtype} of shape {tuple(allocated_len.shape)}"
        )
    if req_to_host_pool.device.type != "cpu" or allocated_len.device.type != "cpu":
        raise ValueError("req_to_host_pool and req_to_host_pool_allocated_len must be on the CPU")
    if allocated_len.shape[0] != req_to_host_pool.shape[0]:
        raise ValueError(
            f"req_to_host_pool_allocated_len has {allocated_len.shape[0]} rows, "
            f"req_to_host_pool {req_to_host_pool.shape[0]}"
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
        if isinstance(num_pages, bool) or not isinstance(num_pages, int):
            raise TypeError(f"num_pages must be an int, got {type(num_pages).__name__}")
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
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
        if start_pos < 0 or num_tokens < 0:
            raise ValueError(
                f"start_pos and num_tokens must be >= 0, got {start_pos} and {num_tokens}"
            )
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
        req_to_host_pool_allocated_len: torch.Tensor,
        req_pool_idx: int,
    ) -> torch.Tensor:
        """All host slots backing row ``req_pool_idx`` (whole pages, a copy)."""
        _check_tables(req_to_host_pool, req_to_host_pool_allocated_len)
        _check_row(req_to_host_pool, req_pool_idx)
        have = int(req_to_host_pool_allocated_len[req_pool_idx])
        return req_to_host_pool[req_pool_idx, :have].clone()

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
