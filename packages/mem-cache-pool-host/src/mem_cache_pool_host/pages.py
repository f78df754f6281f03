"""Storage (L3) page API of host pools: whole pages as flat tensors or zero-copy byte ranges.

Mixed into :class:`~mem_cache_pool_host.base.HostKVCache`. A page is addressed by its first
host slot ``index`` (a multiple of ``page_size``). The flat page format is layout independent
(roles concatenated, each ``[layer_num, page_size, *row]`` in the store dtype), so a page saved
from one layout restores into another; ``get_page_buffer_meta`` is layout native (zero copy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from mem_cache_pool_host import _pages
from mem_cache_pool_host.layout import Layout

if TYPE_CHECKING:
    from mem_cache_pool_host.slots import HostSlotAllocator

__all__ = ["StoragePageMixin"]


class StoragePageMixin:
    """Page API over ``self.buffers`` (see the module docstring)."""

    if TYPE_CHECKING:
        layout: Layout
        buffers: tuple[torch.Tensor, ...]
        page_size: int
        size: int
        layer_num: int
        store_dtype: torch.dtype
        row_shapes: tuple[tuple[int, ...], ...]
        row_bytes: tuple[int, ...]
        _slots: HostSlotAllocator

        def _check_open(self) -> None: ...

    def _page_of(self, index: int) -> int:
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"index must be an int host slot, got {type(index).__name__}")
        if index % self.page_size or not 0 <= index < self.size:
            raise ValueError(
                f"index must be the first slot of a page: a multiple of page_size="
                f"{self.page_size} in [0, {self.size}), got {index}"
            )
        return index // self.page_size

    @property
    def page_numel(self) -> int:
        """Elements (store dtype) of one flat page: all roles, all layers, ``page_size`` tokens."""
        return sum(b // self.buffers[0].element_size() for b in self.row_bytes) * (
            self.layer_num * self.page_size
        )

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        """The page starting at host slot ``index``, in the layout-independent page format.

        ``flat=True``: 1-D, ``page_numel`` store-dtype elements (roles concatenated, each
        ``[layer_num, page_size, *row]``). ``flat=False``: ``[roles, layer_num, page_size, *row]``
        (``ValueError`` when roles have different row shapes). Always a copy.
        """
        self._check_open()
        parts = _pages.read_page(self.layout, self.buffers, self._page_of(index), self.page_size)
        if flat:
            return torch.cat([p.reshape(-1) for p in parts])
        if len(set(self.row_shapes)) != 1:
            raise ValueError(f"flat=False needs equal row shapes per role, got {self.row_shapes}")
        return torch.stack(parts)

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        """A zeroed flat page (``page_numel`` elements of the store dtype)."""
        return torch.zeros(self.page_numel, dtype=self.store_dtype)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        """Write a flat page (as from ``get_data_page``) into the page starting at ``index``."""
        self._check_open()
        page = self._page_of(index)
        if not isinstance(data_page, torch.Tensor):
            raise TypeError(f"data_page must be a torch.Tensor, got {type(data_page).__name__}")
        flat = data_page.reshape(-1)
        if flat.dtype != self.store_dtype:
            if flat.element_size() != self.buffers[0].element_size():
                raise ValueError(
                    f"data_page dtype must be {self.store_dtype}, got {data_page.dtype}"
                )
            flat = flat.view(self.store_dtype)
        if flat.numel() != self.page_numel:
            raise ValueError(f"data_page must have {self.page_numel} elements, got {flat.numel()}")
        _pages.write_page(self.layout, self.buffers, page, self.page_size, flat.cpu())

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """``(ptrs, sizes)`` in bytes for zero-copy backends, layout native (see ``_pages``).

        ``indices``: host slots of whole pages (as returned by ``alloc``).
        """
        self._check_open()
        idx = (
            indices
            if isinstance(indices, torch.Tensor)
            else torch.tensor(list(indices), dtype=torch.int64)
        )
        pages = self._slots.pages_of(idx).tolist()
        return _pages.page_buffer_meta(self.layout, self.buffers, pages, self.page_size)

    def is_stride_page_aligned(self, page_size_bytes: int = 4096) -> bool:
        """Whether every zero-copy range starts at a multiple of ``page_size_bytes``."""
        self._check_open()
        return _pages.stride_page_aligned(
            self.layout, self.buffers, self.page_size, page_size_bytes
        )
