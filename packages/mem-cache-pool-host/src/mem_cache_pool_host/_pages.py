"""Whole-page views of host buffers for storage (L3) backends.

The *flat page* format is layout independent: for each role in order, that role's page as
``[layer_num, page_size, *row]`` flattened, concatenated (store dtype elements). A page saved from
a ``page_first`` pool can be restored into a ``layer_first`` pool of the same model.

Buffer meta (pointers) is layout *native* (zero-copy): it describes where the page's bytes sit in
this pool's layout, so it is only meaningful to a backend reading and writing the same layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_pool_host.layout import Layout

__all__ = ["page_buffer_meta", "read_page", "role_page", "stride_page_aligned", "write_page"]


def role_page(layout: Layout, host: torch.Tensor, page: int, page_size: int) -> torch.Tensor:
    """View of one role's page ``page`` as ``[L, page_size, *row]`` (may be strided)."""
    start = page * page_size
    if layout == "layer_first":
        return host[:, start : start + page_size]
    if layout == "page_first":
        return host[start : start + page_size].transpose(0, 1)
    return host[page]


def read_page(
    layout: Layout, host: Sequence[torch.Tensor], page: int, page_size: int
) -> list[torch.Tensor]:
    """Per-role ``[L, page_size, *row]`` views of ``page``."""
    return [role_page(layout, h, page, page_size) for h in host]


def write_page(
    layout: Layout, host: Sequence[torch.Tensor], page: int, page_size: int, flat: torch.Tensor
) -> None:
    """Copy a flat page (already validated: right dtype and numel) into ``page``."""
    offset = 0
    for h in host:
        dst = role_page(layout, h, page, page_size)
        n = dst.numel()
        dst.copy_(flat[offset : offset + n].view(dst.shape))
        offset += n


def page_buffer_meta(
    layout: Layout, host: Sequence[torch.Tensor], pages: Sequence[int], page_size: int
) -> tuple[list[int], list[int]]:
    """``(ptrs, sizes)`` of the contiguous byte ranges holding ``pages`` (layout native).

    ``layer_first``: per page, per role, per layer one range of ``page_size * row_bytes``.
    ``page_first`` / ``page_first_direct``: per page, per role one range of
    ``layer_num * page_size * row_bytes``.
    """
    ptrs: list[int] = []
    sizes: list[int] = []
    for page in pages:
        for h in host:
            item = h.element_size()
            if layout == "layer_first":
                layer_stride = h.stride(0) * item
                row_bytes = h.stride(1) * item
                base = h.data_ptr() + page * page_size * row_bytes
                for layer in range(h.shape[0]):
                    ptrs.append(base + layer * layer_stride)
                    sizes.append(page_size * row_bytes)
            else:
                page_bytes = h.stride(0) * item * (page_size if layout == "page_first" else 1)
                ptrs.append(h.data_ptr() + page * page_bytes)
                sizes.append(page_bytes)
    return ptrs, sizes


def stride_page_aligned(
    layout: Layout, host: Sequence[torch.Tensor], page_size: int, alignment: int
) -> bool:
    """Whether every range from :func:`page_buffer_meta` starts at a multiple of ``alignment``."""
    for h in host:
        item = h.element_size()
        if h.data_ptr() % alignment:
            return False
        strides: tuple[int, ...]
        if layout == "layer_first":
            strides = (h.stride(0) * item, h.stride(1) * item * page_size)
        elif layout == "page_first":
            strides = (h.stride(0) * item * page_size,)
        else:
            strides = (h.stride(0) * item,)
        if any(s % alignment for s in strides):
            return False
    return True
