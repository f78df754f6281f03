"""``StoragePages``: the storage (L3) page API of a host pool (private; a base of
:class:`~mem_cache_pool_host.base.HostKVCache`).

Whole pages as flat tensors (``get_data_page`` / ``set_from_flat_data_page``, always copies) or as
zero-copy byte ranges (``get_page_buffer_meta``). A page is addressed by its first host slot
``index`` (a multiple of ``page_size``). The flat page bytes follow SGLang 0.5.23's
host-layout-dependent order, named and versioned by ``page_format``
(:mod:`mem_cache_pool_host.page_format`), whose ``tag`` a storage tier records with each page.
Pages restore unchanged into pools with an equal tag (``layer_first`` and ``page_first_direct``
pools share one); :func:`~mem_cache_pool_host.page_format.convert_flat_page` reorders a
``page_first`` page for the others and back. ``get_page_buffer_meta`` is layout native (zero
copy). The per-call zero-copy members a storage controller's
I/O thread uses (``page_range_table``, ``page_ids``, ``io_guard``) stay in ``base``, on the
module that thread runs through.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from mem_cache_kernels.checks import check_int, check_tensor
from mem_cache_pool_host import _flat_pages
from mem_cache_pool_host._buffers import HostBuffers
from mem_cache_pool_host.page_format import PageFormat, page_order

__all__ = ["StoragePages"]


class StoragePages(HostBuffers):
    """The storage page API of :class:`~mem_cache_pool_host.base.HostKVCache` (see the module
    doc); not used alone."""

    if TYPE_CHECKING:  # declared by HostKVCache

        def _range_table(self) -> tuple[tuple[int, int, int], ...]: ...

    # ------------------------------------------------------------------ storage (L3) pages
    def _page_of(self, index: int | torch.Tensor) -> int:
        if isinstance(index, torch.Tensor):
            # SGLang's storage path passes ``host_indices[i * page_size]``, a 0-d tensor
            if index.numel() != 1 or index.dtype.is_floating_point or index.dtype.is_complex:
                raise TypeError(
                    "index must be an int or a one-element integer tensor, got a tensor of "
                    f"shape {tuple(index.shape)} and dtype {index.dtype}"
                )
            if index.dtype == torch.bool:
                raise TypeError("index must be an int or an integer tensor, got a bool tensor")
            index = int(index.item())
        check_int("index", index)
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

    def get_data_page(self, index: int | torch.Tensor, flat: bool = True) -> torch.Tensor:
        """The page starting at host slot ``index`` (an int or a one-element integer tensor, as
        SGLang's storage path passes) in the format ``page_format`` (SGLang's
        bytes for this layout; see :mod:`mem_cache_pool_host.page_format`). Always a copy.

        ``flat=True``: 1-D, ``page_numel`` store-dtype elements: roles one after the other, each
        ``[layer_num, page_size, *row]`` (``layer_first``, ``page_first_direct``) or
        ``[page_size, layer_num, *row]`` (``page_first``). ``flat=False``: the same data shaped
        ``[roles, *page_format.role_shape(0)]`` (``ValueError`` when roles have different row
        shapes).
        """
        self._check_open()
        page = self._page_of(index)
        parts = _flat_pages.read_page(self.layout, self.buffers, page, self.page_size)
        if flat:
            return torch.cat([p.reshape(-1) for p in parts])
        if len(set(self.row_shapes)) != 1:
            raise ValueError(f"flat=False needs equal row shapes per role, got {self.row_shapes}")
        return torch.stack(parts)

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        """A zeroed flat page (``page_numel`` elements of the store dtype)."""
        return torch.zeros(self.page_numel, dtype=self.store_dtype)

    def set_from_flat_data_page(self, index: int | torch.Tensor, data_page: torch.Tensor) -> None:
        """Write a flat page of this pool's ``page_format`` (as from ``get_data_page``) into the
        page starting at ``index``. Validated first (``TypeError``/``ValueError`` naming
        ``index`` or ``data_page``); a failed call writes nothing."""
        self._check_open()
        page = self._page_of(index)
        check_tensor("data_page", data_page)
        flat = data_page.reshape(-1)
        if flat.dtype != self.store_dtype:
            if flat.element_size() != self.buffers[0].element_size():
                raise TypeError(
                    f"data_page dtype must be {self.store_dtype}, got {data_page.dtype}"
                )
            flat = flat.view(self.store_dtype)
        if flat.numel() != self.page_numel:
            raise ValueError(f"data_page must have {self.page_numel} elements, got {flat.numel()}")
        _flat_pages.write_page(self.layout, self.buffers, page, self.page_size, flat.cpu())

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
            for k, i in enumerate(indices):
                check_int(f"indices[{k}]", i)
            idx = torch.tensor(list(indices), dtype=torch.int64)
        pages = self._slots.pages_of(idx).tolist()  # checked before the table is cached
        table = self._range_table()
        ptrs = [base + page * stride for page in pages for base, stride, _ in table]
        sizes = [nbytes for _, _, nbytes in table] * len(pages)
        return ptrs, sizes

    def get_page_buffer_element_size(self, split_factor: int = 1) -> int | None:
        """Bytes of one zero-copy range of :meth:`get_page_buffer_meta` (the first range of
        page 0), SGLang's storage element size. ``split_factor != 1`` asks for split-heads
        ranges (SGLang's ``page_head`` layout only): ``NotImplementedError`` here."""
        check_int("split_factor", split_factor, minimum=1)
        if split_factor != 1:
            raise NotImplementedError(
                "split-heads page ranges need SGLang's page_head layout, which is not supported"
            )
        _, sizes = self.get_page_buffer_meta(torch.arange(self.page_size, dtype=torch.int64))
        return int(sizes[0]) if sizes else None

    def is_stride_page_aligned(self, page_size_bytes: int = 4096) -> bool:
        """Whether every zero-copy range starts at a multiple of ``page_size_bytes``."""
        self._check_open()
        check_int("page_size_bytes", page_size_bytes, minimum=1)
        return _flat_pages.stride_page_aligned(
            self.layout, self.buffers, self.page_size, page_size_bytes
        )
