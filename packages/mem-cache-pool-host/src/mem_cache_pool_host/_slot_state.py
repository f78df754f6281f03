"""``SlotState``: a host pool's slot state under SGLang's names (private; a base of
:class:`~mem_cache_pool_host.base.HostKVCache`'s and of
:class:`~mem_cache_pool_host.mamba.MambaPoolHost`'s read-only members).

SGLang's cache controller and radix tree read a host pool's free-list state by name
(``free_slots``, ``release_slots``, ``slot_used``, ``mem_state``) and its size in the logical
slot space of decode context parallelism (``logical_size``, ``logical_page_size``). Here every
one is a snapshot read from the pool's :class:`~mem_cache_pool_host.slots.HostSlotAllocator`
(CPU, never written back), the same for KV and state pools.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from mem_cache_pool_host.slots import HostSlotAllocator

__all__ = ["SlotState"]


class SlotState:
    """SGLang's slot-state members of a host pool (see the module doc); not used alone."""

    if TYPE_CHECKING:  # the pool's geometry and slot allocator, set by its constructor
        size: int
        page_size: int
        dcp_size: int
        _slots: HostSlotAllocator

    @property
    def logical_size(self) -> int:
        """Slots the radix tree and controller see (SGLang's ``size * dcp_size``; no decode
        context parallelism here, so ``size``)."""
        return self.size * self.dcp_size

    @property
    def logical_page_size(self) -> int:
        """Page size in that logical space (SGLang's ``page_size * dcp_size``: ``page_size``;
        1 for a state pool, a slot per state)."""
        return self.page_size * self.dcp_size

    @property
    def free_slots(self) -> torch.Tensor:
        """Free slots not yet merged back (CPU int64, whole pages, in hand-out order; a copy).
        With :attr:`release_slots` they make up ``available_size()``."""
        return self._slots.free_slots()

    @property
    def release_slots(self) -> list[torch.Tensor]:
        """Slots freed since the last merge, one tensor per ``free`` call (merged lazily by the
        next ``alloc`` that needs them; copies)."""
        return self._slots.release_slots()

    @property
    def num_release_slots(self) -> int:
        """Total slots in :attr:`release_slots`."""
        return sum(int(t.numel()) for t in self._slots.release_slots())

    @property
    def slot_used(self) -> torch.Tensor:
        """Per slot, whether it is allocated (bool ``[logical_size]``; a copy). SGLang's
        ``HostKVCache`` keeps this for its double-free check (its ``MambaPoolHost`` does not;
        ours do: ``free`` of a free slot raises ``ValueError``)."""
        return self._slots.slot_used()

    @property
    def mem_state(self) -> torch.Tensor:
        """SGLang's per-slot ``uint8`` state tensor, which its base allocates zeroed and nothing
        updates: zeros of ``[logical_size]`` (a fresh tensor)."""
        return torch.zeros(self.logical_size, dtype=torch.uint8)
