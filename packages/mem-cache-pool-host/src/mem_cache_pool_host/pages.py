"""Storage (L3) page API of host pools: whole pages as flat tensors or zero-copy byte ranges.

Mixed into :class:`~mem_cache_pool_host.base.HostKVCache`. A page is addressed by its first
host slot ``index`` (a multiple of ``page_size``). The flat page bytes follow SGLang 0.5.23's
host-layout-dependent order; the format is named and versioned by ``page_format``
(:mod:`mem_cache_pool_host.page_format`), whose ``tag`` a storage tier records with each page.
Pages restore unchanged into pools with an equal tag (``layer_first`` and ``page_first_direct``
pools share one); :func:`~mem_cache_pool_host.page_format.convert_flat_page` reorders a
``page_first`` page for the others and back. ``get_page_buffer_meta`` is layout native (zero
copy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from mem_cache_pool_host import _pages
from mem_cache_pool_host.layout import Layout
from mem_cache_pool_host.page_format import PageFormat, page_order

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
        roles: tuple[str, ...]
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
    def page_format(self) -> PageFormat:
        """The format of this pool's flat pages (record ``page_format.tag`` with each page)."""
        return PageFormat.make(
            order=page_order(self.layout),
            roles=self.roles,
            layer_num=self.layer_num,
            page_size=self.page_size,
            row_shapes=self.row_shapes,
            store_dtype=self.store_dtype,
        )

    @property
    def page_numel(self) -> int:
        """Elements (store dtype) of one flat page: all roles, all layers, ``page_size`` tokens."""
        return sum(b // self.buffers[0].element_size() for b in self.row_bytes) * (
            self.layer_num * self.page_size
        )

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        """The page starting at host slot ``index`` in the format ``page_format`` (SGLang's
        bytes for this layout; see :mod:`mem_cache_pool_host.page_format`). Always a copy.

        ``flat=True``: 1-D, ``page_numel`` store-dtype elements: roles one after the other, each
        ``[layer_num, page_size, *row]`` (``layer_first``, ``page_first_direct``) or
        ``[page_size, layer_num, *row]`` (``page_first``). ``flat=False``: the same data shaped
        ``[roles, *page_format.role_shape(0)]`` (``ValueError`` when roles have different row
        shapes).
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
        """Write a flat page of this pool's ``page_format`` (as from ``get_data_page``) into the
        page starting at ``index``. Validated first (``TypeError``/``ValueError`` naming
        ``index`` or ``data_page``); a failed call writes nothing."""
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
        """``(ptrs, sizes)`` in bytes for zero-copy backends, layout native, SGLang 0.5.23's list.

        ``indices``: host slots of whole pages (as returned by ``alloc``). Per page, in order:
        ``layer_first``: one range per layer and role (``k0 v0 k1 v1 ...``; MLA ``kv0 kv1 ...``)
        of ``page_size * row_bytes``; ``page_first`` / ``page_first_direct``: one range per role
        (``k v``; MLA ``kv``) of ``layer_num * page_size * row_bytes``, whose concatenation is the
        page's flat page.
        """
        self._check_open()
        if isinstance(indices, torch.Tensor):
            idx = indices
        else:
            if isinstance(indices, (str, bytes)) or not isinstance(indices, Sequence):
                raise TypeError(
                    f"indices must be a tensor or a sequence of ints, got {type(indices).__name__}"
                )
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
                raise TypeError("indices must be a tensor or a sequence of ints")
            idx = torch.tensor(list(indices), dtype=torch.int64)
        pages = self._slots.pages_of(idx).tolist()
        return _pages.page_buffer_meta(self.layout, self.buffers, pages, self.page_size)

    def is_stride_page_aligned(self, page_size_bytes: int = 4096) -> bool:
        """Whether every zero-copy range starts at a multiple of ``page_size_bytes``."""
        self._check_open()
        if isinstance(page_size_bytes, bool) or not isinstance(page_size_bytes, int):
            raise TypeError(f"page_size_bytes must be an int, got {type(page_size_bytes).__name__}")
        if page_size_bytes < 1:
            raise ValueError(f"page_size_bytes must be >= 1, got {page_size_bytes}")
        return _pages.stride_page_aligned(
            self.layout, self.buffers, self.page_size, page_size_bytes
        )
