"""``SGLangViews``: the read-only members SGLang's cache controller and storage backends read
off a host pool (private; a base of :class:`~mem_cache_pool_host.base.HostKVCache`).

* The slot state under SGLang's names (``free_slots``, ``release_slots``, ``slot_used``,
  ``mem_state``, ``logical_size``, ...): :class:`~mem_cache_pool_host._slot_state.SlotState`,
  shared with the state pool.
* SGLang's transfer geometry: the JIT / staging answers of a pool without those kernels,
  ``token_stride_size``, ``layout_dim``, ``get_ksize_per_token`` and the per-layer host views
  and pointer tables the MHA / MLA pools expose as ``*_data_refs`` / ``*_data_ptrs``.

Kept out of ``base`` so that the module a transfer runs through holds only what it runs.
"""

from __future__ import annotations

import torch

from mem_cache_pool_host._buffers import HostBuffers
from mem_cache_pool_host._slot_state import SlotState

__all__ = ["SGLangViews"]


class SGLangViews(HostBuffers, SlotState):
    """SGLang's read-only members of :class:`~mem_cache_pool_host.base.HostKVCache` (see the
    module doc); not used alone."""

    def get_size_per_token(self) -> int:
        """Host bytes one token occupies across all layers (``size_per_token``)."""
        return self.size_per_token

    # ------------------------------------------------------------- SGLang's transfer geometry
    can_use_jit: bool = False
    """SGLang's own JIT HiCache kernels are not used here (our kernels are mem_cache_kernels')."""
    can_use_write_back_jit: bool = False
    """No staged write-back kernel: SGLang's controller then moves host indices to the device
    for ``kernel`` IO, as for every pool without it."""
    staging_page_capacity: int = 0
    staging_token_capacity: int = 0
    page_unified_layout: None = None
    """SGLang's ``page_unified`` layout geometry; that layout is not supported (``None``)."""
    device_rows_packed: bool = True
    """Device rows are contiguous (``KVBufferDesc`` guarantees it)."""

    @property
    def token_stride_size(self) -> int:
        """Bytes of one token's row of one layer (first role; MHA ``H * D * itemsize``)."""
        return self.row_bytes[0]

    @property
    def layout_dim(self) -> int:
        """Bytes of one token's rows across all layers (first role), SGLang's ``layout_dim``."""
        return self.row_bytes[0] * self.layer_num

    @property
    def device_row_stride_bytes(self) -> int:
        """Bytes between consecutive device rows (packed: ``token_stride_size``)."""
        return self.token_stride_size

    def get_ksize_per_token(self) -> int:
        """Bytes per token of the first role across layers (MHA: K, half of a symmetric pool;
        MLA: everything)."""
        return self.row_bytes[0] * self.layer_num

    def _role_layer_refs(self, role: int) -> list[torch.Tensor]:
        """Per-layer views of one role's host tensor, as SGLang's ``*_data_refs``."""
        self._check_open()
        buf = self.buffers[role]
        view = buf if self.layout == "layer_first" else buf.transpose(0, 1)
        return [view[i] for i in range(self.layer_num)]

    def _role_layer_ptrs(self, role: int) -> torch.Tensor:
        """uint64 table of :meth:`_role_layer_refs` data pointers on the device pool's device."""
        ptrs = [t.data_ptr() for t in self._role_layer_refs(role)]
        table = torch.tensor(ptrs, dtype=torch.int64).view(torch.uint64)
        return table.to(self.device_desc.device)

    def _device_role_ptrs(self, role: int) -> torch.Tensor:
        n = self.layer_num
        return self.device_desc.data_ptrs[role * n : (role + 1) * n]
