"""``MambaStoragePages``: the storage (L3) page API of a
:class:`~mem_cache_pool_host.mamba.MambaPoolHost` (private; its base, itself over
:class:`~mem_cache_pool_host._mamba_slots.MambaSlots`).

A host slot is one page (``page_size`` 1): ``get_data_page`` / ``set_from_flat_data_page`` move it
as one flat ``uint8`` page (temporal bytes, then each conv tensor's: SGLang's order), and
``get_page_buffer_meta`` gives the zero-copy ``(ptrs, sizes)`` of slots in that order, so any
page-granular storage backend carries states.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from mem_cache_kernels.checks import check_index, check_int, check_tensor
from mem_cache_pool_host._mamba_slots import MambaSlots

__all__ = ["MambaStoragePages"]


class MambaStoragePages(MambaSlots):
    """The storage page API of :class:`~mem_cache_pool_host.mamba.MambaPoolHost` (see the
    module doc); not used alone."""

    if TYPE_CHECKING:  # MambaPoolHost's state, set by its constructor (the rest: MambaSlots)
        size_per_token: int

    # ------------------------------------------------------------------ storage (L3) pages
    def _page_tensors(self, index: int) -> list[torch.Tensor]:
        check_int("index", index)
        if not 0 <= index < self.size:
            raise ValueError(f"index must be a host slot in [0, {self.size}), got {index}")
        return [t[index] for t in (self.temporal_buffer, *self.conv_buffer)]

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        """Host slot ``index`` as one ``uint8`` page (temporal bytes, then each conv's;
        SGLang's order). Always a copy."""
        return torch.cat(
            [t.contiguous().view(torch.uint8).reshape(-1) for t in self._page_tensors(index)]
        )

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        """A zeroed page (``page_size * size_per_token`` bytes)."""
        return torch.zeros(self.page_size * self.size_per_token, dtype=torch.uint8)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        """Write a page of :meth:`get_data_page` into host slot ``index`` (checked first: a
        wrong size raises ``ValueError`` and writes nothing)."""
        tensors = self._page_tensors(index)
        check_tensor("data_page", data_page)
        flat = data_page.contiguous().view(torch.uint8).reshape(-1)
        want = self.page_size * self.size_per_token
        if flat.numel() != want:
            raise ValueError(f"data_page must have {want} bytes, got {flat.numel()}")
        start = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            part = flat[start : start + n].clone()
            start += n
            t.copy_(part.view(t.dtype).reshape(t.shape))

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """``(ptrs, sizes)`` for zero-copy storage IO: per slot, temporal then conv ``0..n``
        (temporal dropped when empty), SGLang's order."""
        if isinstance(indices, torch.Tensor):
            slots = check_index("indices", indices).tolist()
        elif isinstance(indices, Sequence) and not isinstance(indices, (str, bytes)):
            slots = [check_int(f"indices[{i}]", x) for i, x in enumerate(indices)]
        else:
            raise TypeError(f"indices must be a tensor or a sequence of ints, got {type(indices)}")
        for s in slots:
            if not 0 <= s < self.size:
                raise ValueError(f"indices must be host slots in [0, {self.size}), got {s}")
        if slots and not self._slots.is_allocated(torch.tensor(slots, dtype=torch.int64)):
            raise ValueError("indices must be allocated host slots")
        return self._page_ranges(slots)

    def _page_ranges(self, slots: list[int]) -> tuple[list[int], list[int]]:
        ptrs: list[int] = []
        sizes: list[int] = []
        parts = [(self.temporal_buffer, self.temporal_state_elem_size, self.temporal_dtype)] + [
            (b, n, d)
            for b, n, d in zip(self.conv_buffer, self.conv_state_elem_sizes, self._conv_dtypes)
        ]
        for s in slots:
            for buf, elems, dtype in parts:
                if elems == 0:
                    continue
                stride = self.num_mamba_layers * elems * dtype.itemsize
                ptrs.append(buf.data_ptr() + s * stride)
                sizes.append(self.page_size * stride)
        return ptrs, sizes

    def get_page_buffer_element_size(self, split_factor: int = 1) -> int | None:
        """Bytes of the first zero-copy range of a slot in :meth:`get_page_buffer_meta`
        (SGLang's storage element size: the temporal state over every layer, or the first conv
        state's when the model has no temporal state). ``split_factor != 1`` asks for
        split-heads ranges, which state pages do not have: ``NotImplementedError`` (SGLang's
        ``MambaPoolHost`` lacks the method it would call)."""
        check_int("split_factor", split_factor, minimum=1)
        if split_factor != 1:
            raise NotImplementedError("MambaPoolHost has no split-heads page ranges")
        _, sizes = self._page_ranges([0])
        return int(sizes[0]) if sizes else None

    def is_stride_page_aligned(self, page_size_bytes: int = 4096) -> bool:
        """Whether every zero-copy range starts at a multiple of ``page_size_bytes``."""
        check_int("page_size_bytes", page_size_bytes, minimum=1)
        for buf, elems, dtype in [
            (self.temporal_buffer, self.temporal_state_elem_size, self.temporal_dtype),
            *zip(self.conv_buffer, self.conv_state_elem_sizes, self._conv_dtypes),
        ]:
            stride = self.num_mamba_layers * elems * dtype.itemsize
            if buf.data_ptr() % page_size_bytes or stride % page_size_bytes:
                return False
        return True
