"""The state-slot free list of :class:`~mem_cache_pool.hybrid.HybridReqToTokenPool`.

The allocator package's ``MambaSlotAllocator`` is the full-featured one (backup/restore, chunked
free list), but the pool package may not import the allocator package (layering), so the pool
carries this small one with the same order as SGLang 0.5.23's ``MambaSlotAllocator``: slots
``1..size``, ``alloc(n)`` takes the *prefix* of the free list, ``free`` appends, and
``alloc_group_begin`` / ``alloc_group_end`` pre-allocate for ``alloc(1)`` calls. An engine may
replace ``pool.mamba_allocator`` by a ``mem_cache_allocator.MambaSlotAllocator`` (same methods).
"""

from __future__ import annotations

import torch

from mem_cache_kernels import checks

__all__ = ["MambaSlotFreeList"]


class MambaSlotFreeList:
    """Free list of state slots ``1..size`` (int64 tensors on ``device``)."""

    def __init__(self, size: int, device: str | torch.device) -> None:
        self.size = checks.check_int("size", size, minimum=0)
        self.device = checks.check_device_arg("device", device)
        self._group: list[torch.Tensor] | None = None
        self.free_slots = torch.empty(0, dtype=torch.int64, device=self.device)
        self.clear()

    def available_size(self) -> int:
        """Free slots (pre-allocated group slots not counted)."""
        return int(self.free_slots.shape[0])

    def schedulable_available_size(self) -> int:
        """Slots the scheduler may plan with: the free slots."""
        return self.available_size()

    def clear(self) -> None:
        """Every slot free again, in order ``1..size``."""
        self.free_slots = torch.arange(1, self.size + 1, dtype=torch.int64, device=self.device)
        self._group = None

    def alloc_group_begin(self, num_reqs: int) -> None:
        """Pre-allocate ``num_reqs`` slots for the following ``alloc(1)`` calls."""
        checks.check_int("num_reqs", num_reqs, minimum=0)
        self._group = None
        if num_reqs > 0:
            got = self._take(num_reqs)
            if got is not None:
                self._group = [got[i : i + 1] for i in range(num_reqs)]

    def alloc_group_end(self) -> None:
        """Return the pre-allocated slots not handed out (appended)."""
        group, self._group = self._group, None
        if group:
            self.free(torch.cat(group))

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots from the head of the free list, or ``None`` when fewer are free."""
        checks.check_int("need_size", need_size, minimum=0)
        if self._group and need_size == 1:
            return self._group.pop(0)
        return self._take(need_size)

    def _take(self, n: int) -> torch.Tensor | None:
        if n > self.free_slots.shape[0]:
            return None
        out = self.free_slots[:n]
        self.free_slots = self.free_slots[n:]
        return out

    def free(self, free_index: torch.Tensor) -> None:
        """Append ``free_index`` (0-d or 1-D int32/int64 slots in ``[1, size]``)."""
        if isinstance(free_index, torch.Tensor) and free_index.dim() == 0:
            free_index = free_index.reshape(1)
        idx = checks.check_index("free_index", free_index)
        if idx.numel() == 0:
            return
        checks.check_index_values("free_index", idx, limit=self.size + 1, minimum=1)
        self.free_slots = torch.cat(
            (self.free_slots, idx.to(device=self.device, dtype=torch.int64))
        )
