"""``MambaSlots``: the sizes and host slots of a :class:`~mem_cache_pool_host.mamba.MambaPoolHost`
(private; the base of its storage page API).

Sizes (``get_size_per_token``: every Mamba layer's conv and temporal state of one slot), the slot
calls (``alloc`` / ``free`` / ``clear`` / ``is_allocated`` / ``available_size``, the
:class:`~mem_cache_pool_host.slots.HostSlotAllocator`'s, double frees raise), and the read-only
members under SGLang's names: ``fd``, and the slot state (``free_slots``, ``release_slots``,
``slot_used``, ``mem_state``, ``logical_size``, ...) of
:class:`~mem_cache_pool_host._slot_state.SlotState`, shared with the KV pools.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mem_cache_pool_host._slot_state import SlotState

if TYPE_CHECKING:
    from mem_cache_pool_host.memory import HostAllocation, MmapHostTensorAllocator

__all__ = ["MambaSlots"]


class MambaSlots(SlotState):
    """Sizes and slots of :class:`~mem_cache_pool_host.mamba.MambaPoolHost` (see the module
    doc); not used alone."""

    if TYPE_CHECKING:  # MambaPoolHost's state, set by its constructor (and SlotState's)
        num_mamba_layers: int
        temporal_buffer: torch.Tensor
        conv_buffer: list[torch.Tensor]
        temporal_state_elem_size: int
        conv_state_elem_sizes: list[int]
        temporal_dtype: torch.dtype
        _conv_dtypes: list[torch.dtype]
        allocator: MmapHostTensorAllocator
        _allocations: list[HostAllocation]

    # ------------------------------------------------------------------ sizes and slots
    def get_size_per_token(self) -> int:
        """Bytes of one host slot: every layer's conv and temporal state."""
        conv = sum(n * d.itemsize for n, d in zip(self.conv_state_elem_sizes, self._conv_dtypes))
        temporal = self.temporal_state_elem_size * self.temporal_dtype.itemsize
        return (conv + temporal) * self.num_mamba_layers

    def get_ksize_per_token(self) -> int:
        """Same as :meth:`get_size_per_token` (states have no K/V split)."""
        return self.get_size_per_token()

    def get_hybrid_pool_buffer(self) -> list[torch.Tensor]:
        """Every host tensor a storage backend must register (temporal, then conv)."""
        return [self.temporal_buffer, *self.conv_buffer]

    @property
    def nbytes(self) -> int:
        """Bytes of host memory held."""
        return sum(a.nbytes for a in self._allocations)

    def available_size(self) -> int:
        """Free host slots."""
        return self._slots.available_size()

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` host slots (CPU int64) or ``None`` with no change when fewer are free."""
        return self._slots.alloc(need_size)

    def free(self, indices: torch.Tensor) -> int:
        """Free host slots (``ValueError`` for a double free; nothing freed then)."""
        return self._slots.free(indices)

    def clear(self) -> None:
        """Every host slot free."""
        self._slots.clear()

    def is_allocated(self, indices: torch.Tensor) -> bool:
        """Whether every slot of ``indices`` is allocated."""
        return self._slots.is_allocated(indices)

    @property
    def fd(self) -> int | None:
        """Shared-memory file descriptor of the host buffers (``getattr(allocator, "fd",
        None)`` as SGLang's base reads it): ``None`` for the default allocator."""
        fd = getattr(self.allocator, "fd", None)
        return fd if isinstance(fd, int) else None

    @property
    def device_row_stride_bytes(self) -> int:
        """Not defined for state pools: ``AttributeError``, as SGLang's ``MambaPoolHost`` (its
        base answers ``token_stride_size``, a KV row width states do not have; each conv and
        temporal tensor has its own slot stride). ``getattr(pool, name, default)`` gives the
        default, as with SGLang's."""
        raise AttributeError(
            "MambaPoolHost has no single device row stride (conv and temporal states each have "
            "their own); SGLang's MambaPoolHost has none either"
        )
