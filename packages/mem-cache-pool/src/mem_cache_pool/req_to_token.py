"""``ReqToTokenPool``: the request -> token-slot table (mirrors SGLang's ``ReqToTokenPool``).

``req_to_token`` is an int32 tensor ``[size + 1, max_context_len]`` on the pool's device: row ``r``
holds, for the request owning row ``r``, the KV slot of each sequence position. Row 0 is the
padding row (padded batches use request index 0); rows ``1..size`` are handed out by ``alloc``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, overload

import torch

from mem_cache_pool._checks import check_int

__all__ = ["ReqLike", "ReqToTokenPool"]


class ReqLike(Protocol):
    """A request object as SGLang's scheduler passes it: carries its table row (or ``None``)."""

    req_pool_idx: int | None


_Index = int | slice | torch.Tensor | tuple[int | slice | torch.Tensor, ...]


class ReqToTokenPool:
    """Fixed table of request rows; row allocation is host-side (a Python free list).

    Args:
        size: number of allocatable rows (``>= 1``); the table has ``size + 1`` rows.
        max_context_len: columns (maximum tokens per request, including any speculative headroom).
        device: where ``req_to_token`` lives.
        enable_memory_saver: accepted for SGLang compatibility; no effect.

    Row allocation accepts both SGLang conventions:

    * ``alloc(reqs)`` (current SGLang): ``reqs`` is a sequence of request objects with a
      ``req_pool_idx`` attribute. Requests whose ``req_pool_idx`` is ``None`` get a fresh row
      (assigned to the attribute); requests that already own a row (a chunked prefill continuing)
      keep it. Returns every request's row, in order.
    * ``alloc(need_size)`` (older SGLang): ``need_size`` fresh rows as a list of ints.

    Both return ``None`` without any state change when too few rows are free. ``free`` accepts a
    row id, a list of row ids or a request object (its ``req_pool_idx`` is reset to ``None``);
    freeing a row that is not allocated is a ``ValueError`` (nothing is freed then).
    """

    def __init__(
        self,
        size: int,
        max_context_len: int,
        device: str | torch.device,
        enable_memory_saver: bool = False,
    ) -> None:
        self.size = check_int("size", size, 1)
        self.max_context_len = check_int("max_context_len", max_context_len, 1)
        self.device = torch.device(device)
        self.enable_memory_saver = enable_memory_saver
        self.req_to_token = torch.zeros(
            (size + 1, max_context_len), dtype=torch.int32, device=self.device
        )
        self.free_slots: list[int] = []
        self._free_set: set[int] = set()
        self.clear()

    def available_size(self) -> int:
        """Number of free rows."""
        return len(self.free_slots)

    @overload
    def alloc(self, reqs: int) -> list[int] | None: ...

    @overload
    def alloc(self, reqs: Sequence[ReqLike]) -> list[int] | None: ...

    def alloc(self, reqs: int | Sequence[ReqLike]) -> list[int] | None:
        """Hand out rows (see the class docstring); ``None`` when too few rows are free."""
        if isinstance(reqs, int) and not isinstance(reqs, bool):
            need = check_int("need_size", reqs, 0)
            if need > len(self.free_slots):
                return None
            return self._take(need)
        if isinstance(reqs, (str, bytes)) or not isinstance(reqs, Sequence):
            raise TypeError(
                f"reqs must be an int or a sequence of requests, got {type(reqs).__name__}"
            )
        for i, req in enumerate(reqs):
            if not hasattr(req, "req_pool_idx"):
                raise TypeError(f"reqs[{i}] must have a req_pool_idx attribute")
            idx = req.req_pool_idx
            if idx is not None and (not 1 <= idx <= self.size or idx in self._free_set):
                raise ValueError(
                    f"reqs[{i}].req_pool_idx must be None or an allocated row in [1, {self.size}],"
                    f" got {idx}"
                )
        need = sum(1 for req in reqs if req.req_pool_idx is None)
        if need > len(self.free_slots):
            return None
        fresh = iter(self._take(need))
        for req in reqs:
            if req.req_pool_idx is None:
                req.req_pool_idx = next(fresh)
        return [int(req.req_pool_idx) for req in reqs if req.req_pool_idx is not None]

    def _take(self, n: int) -> list[int]:
        taken, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        self._free_set.difference_update(taken)
        return taken

    def free(self, free_index: int | Sequence[int] | ReqLike) -> None:
        """Return rows to the free list (see the class docstring)."""
        req: ReqLike | None = None
        if isinstance(free_index, int) and not isinstance(free_index, bool):
            rows = [free_index]
        elif isinstance(free_index, Sequence):
            rows = list(free_index)
        elif hasattr(free_index, "req_pool_idx"):
            req = free_index
            if req.req_pool_idx is None:
                raise ValueError("free_index.req_pool_idx must be an allocated row, got None")
            rows = [req.req_pool_idx]
        else:
            raise TypeError(
                "free_index must be an int, a sequence of ints or a request, "
                f"got {type(free_index).__name__}"
            )
        for r in rows:
            if isinstance(r, bool) or not isinstance(r, int):
                raise TypeError(f"free_index rows must be ints, got {type(r).__name__}")
            if not 1 <= r <= self.size:
                raise ValueError(f"free_index rows must lie in [1, {self.size}], got {r}")
            if r in self._free_set:
                raise ValueError(f"free_index row {r} is not allocated (double free)")
        if len(set(rows)) != len(rows):
            raise ValueError(f"free_index must not repeat a row, got {rows}")
        self.free_slots.extend(rows)
        self._free_set.update(rows)
        if req is not None:
            req.req_pool_idx = None

    def write(self, indices: _Index, values: torch.Tensor | int) -> None:
        """``req_to_token[indices] = values`` (plain tensor indexing; values cast to int32)."""
        if isinstance(values, torch.Tensor):
            values = values.to(torch.int32)
        self.req_to_token[indices] = values

    def clear(self) -> None:
        """Free every row (the table contents are left as they are)."""
        self.free_slots = list(range(1, self.size + 1))
        self._free_set = set(self.free_slots)
