"""``MambaSlotAllocator``: request-level state slots (one per request) for Mamba / linear attention.

Deliberately not a :class:`BaseTokenToKVPoolAllocator` (no pages, no pool reference). Slots are
``1..size`` (slot 0 is the dummy write target of padded requests); ``alloc(n)`` takes the prefix
of the free list and ``free(slots)`` appends (SGLang's order), both O(slots) with a host-side count
(no ``torch.cat`` of the whole free list per free).

``alloc_group_begin(num_reqs)`` pre-allocates ``num_reqs`` slots in one call so that the
following ``alloc(1)`` calls (one per request, during prefix matching) are O(1);
``alloc_group_end()`` returns the unused ones (appended, as SGLang does). If the pre-allocation
does not fit, the group is empty and ``alloc(1)`` falls through to the normal path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mem_cache_allocator._free_list import ChunkedFreeList, FreeListSnapshot
from mem_cache_kernels.checks import (
    check_device_arg,
    check_index,
    check_int,
    debug_enabled,
    describe,
    host_bounds,
)

__all__ = ["MambaSlotAllocator", "MambaSlotAllocatorState"]


@dataclass(frozen=True, slots=True)
class MambaSlotAllocatorState:
    """Opaque result of :meth:`MambaSlotAllocator.backup_state`."""

    owner: int
    free: FreeListSnapshot
    group_unused: torch.Tensor  # pre-allocated group slots not yet handed out (free again)
    live: torch.Tensor | None


class MambaSlotAllocator:
    """Free list of request-level state slots ``1..size`` on ``device``."""

    def __init__(self, size: int, device: str | torch.device, *, debug: bool = False) -> None:
        self.size = check_int("size", size, minimum=0)
        self.device = check_device_arg("device", device)
        self._free = ChunkedFreeList(self.device)
        self._group: torch.Tensor | None = None
        self._group_pos = 0
        self._live: torch.Tensor | None = (
            torch.zeros(size + 1, dtype=torch.bool) if debug_enabled(debug) else None
        )
        # debug only: slots ever handed out (tells a double free from a never-allocated slot)
        self._ever: torch.Tensor | None = (
            torch.zeros(size + 1, dtype=torch.bool) if self._live is not None else None
        )
        self.clear()

    @property
    def debug(self) -> bool:
        """Whether checked mode is on (live/ever-allocated slot tracking, double-free detection)."""
        return self._live is not None

    @property
    def free_slots(self) -> torch.Tensor:
        """SGLang's free list under its name: the free slots front-to-back (a tensor the
        allocator never writes; O(free slots))."""
        return self._free.to_tensor()

    def available_size(self) -> int:
        """Free slots (host-side; pre-allocated group slots are not counted)."""
        return len(self._free)

    def schedulable_available_size(self) -> int:
        """Slots the scheduler may plan with (SGLang 0.5.23's admission query): the free slots,
        as for every allocator whose slots are not shared with another pool."""
        return len(self._free)

    def clear(self) -> None:
        """Reset to all slots ``1..size`` free (slot 0 stays reserved), drop any open group and
        debug tracking. Mutates the allocator; O(size)."""
        self._free.clear()
        self._free.push_back(torch.arange(1, self.size + 1, dtype=torch.int64, device=self.device))
        self._group = None
        self._group_pos = 0
        if self._live is not None:
            self._live.zero_()
        if self._ever is not None:
            self._ever.zero_()

    # ------------------------------------------------------------------ allocation
    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots (int64 on ``device``) or ``None`` when fewer are free."""
        check_int("need_size", need_size, minimum=0)
        group = self._group
        if group is not None and need_size == 1 and self._group_pos < group.shape[0]:
            out = group[self._group_pos : self._group_pos + 1]
            self._group_pos += 1
            return out
        return self._do_alloc(need_size)

    def _do_alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size > len(self._free):
            return None
        out = self._free.take(need_size).clone()
        if self._live is not None and self._ever is not None:
            host = out.cpu()
            self._live[host] = True
            self._ever[host] = True
        return out

    def alloc_group_begin(self, num_reqs: int) -> None:
        """Pre-allocate ``num_reqs`` slots for the next ``alloc(1)`` calls (nesting: error)."""
        if self._group is not None:
            raise RuntimeError("alloc_group_begin() called while an alloc group is open")
        check_int("num_reqs", num_reqs, minimum=0)
        self._group_pos = 0
        got = self._do_alloc(num_reqs) if num_reqs > 0 else None
        self._group = got if got is not None else torch.empty(0, dtype=torch.int64)

    def alloc_group_end(self) -> None:
        """Return the unused pre-allocated slots (appended to the free list)."""
        group = self._group
        self._group = None
        if group is not None and self._group_pos < group.shape[0]:
            self.free(group[self._group_pos :])
        self._group_pos = 0

    # ------------------------------------------------------------------ free
    def free(self, free_index: torch.Tensor) -> None:
        """Append ``free_index`` (int32/int64 slots) to the free list (copied)."""
        one = isinstance(free_index, torch.Tensor) and free_index.dim() == 0
        check_index(  # a 0-d tensor is one slot
            "free_index",
            free_index.reshape(1) if one else free_index,
            allow_meta=self.device.type == "meta",
        )
        if free_index.numel() == 0:
            return
        if self._live is None and free_index.is_cpu:  # host-side range check: no device sync
            lo, hi = host_bounds(free_index)
            if lo <= 0 or hi > self.size:
                bad = free_index[(free_index <= 0) | (free_index > self.size)]
                raise ValueError(
                    f"free_index has invalid slots {describe(bad)} (valid: [1, {self.size}])"
                )
        slots = free_index.reshape(-1).to(device=self.device, dtype=torch.int64, copy=True)
        if self._live is not None:
            host = slots.cpu()
            bad = host[(host <= 0) | (host > self.size)]
            if bad.numel():
                raise ValueError(
                    f"MambaSlotAllocator: free_index has invalid slots {describe(bad)} "
                    f"(valid: [1, {self.size}])"
                )
            assert self._ever is not None
            never = host[~self._ever[host]]
            if never.numel():
                raise ValueError(
                    f"MambaSlotAllocator: free of never-allocated slots {describe(never)}"
                )
            uniq, counts = torch.unique(host, return_counts=True)
            dup = torch.cat([uniq[counts > 1], host[~self._live[host]]])
            if dup.numel():
                raise ValueError(f"MambaSlotAllocator: double free of slots {describe(dup)}")
            self._live[host] = False
        self._free.push_back(slots)

    # ------------------------------------------------------------------ state
    def backup_state(self) -> MambaSlotAllocatorState:
        """Snapshot; inside an alloc group the group's unused slots count as free (a restore
        returns them to the free list and empties the open group, so none leaks)."""
        group = self._group
        unused = (
            group[self._group_pos :].clone()
            if group is not None
            else torch.empty(0, dtype=torch.int64, device=self.device)
        )
        live = None if self._live is None else self._live.clone()
        return MambaSlotAllocatorState(
            owner=id(self), free=self._free.snapshot(), group_unused=unused, live=live
        )

    def restore_state(self, state: Any) -> None:
        """Back to ``state``: its free list plus its group's unused slots; an open group stays
        open but empty (its slots are accounted for by the restored free list)."""
        if not isinstance(state, MambaSlotAllocatorState) or state.owner != id(self):
            raise ValueError(
                f"state must come from this allocator's backup_state(), got {type(state).__name__}"
            )
        self._free.restore(state.free)
        if state.group_unused.numel():
            self._free.push_back(state.group_unused.clone())
        if self._group is not None:
            self._group = torch.empty(0, dtype=torch.int64, device=self.device)
            self._group_pos = 0
        if self._live is not None and state.live is not None:
            self._live = state.live.clone()
            if state.group_unused.numel():
                self._live[state.group_unused.cpu()] = False
