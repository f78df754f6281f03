"""Whole-page views of host buffers for storage (L3) backends.

The *flat page* (format: :mod:`mem_cache_pool_host.page_format`) is, for each role in order, that
role's page in the layout's native row order, flattened: ``[layer_num, page_size, *row]`` for
``layer_first`` and ``page_first_direct``, ``[page_size, layer_num, *row]`` for ``page_first``
(SGLang 0.5.23's bytes for the same layout).

Buffer meta (pointers, ``HostKVCache.get_page_buffer_meta``) is layout native too (zero-copy):
per page, ``layer_first`` lists one range per layer and role (``k0 v0 k1 v1 ...``, SGLang's
order); the page-major layouts one range per role. :func:`stride_page_aligned` says whether every
such range is aligned.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_pool_host.layout import Layout

__all__ = ["read_page", "role_page", "stride_page_aligned", "write_page"]


def role_page(layout: Layout, host: torch.Tensor, page: int, page_size: int) -> torch.Tensor:
    """View of one role's page ``page`` in the layout's row order: ``[L, page_size, *row]``
    (``layer_first``, may be strided; ``page_first_direct``) or ``[page_size, L, *row]``
    (``page_first``, contiguous)."""
    start = page * page_size
    if layout == "layer_first":
        return host[:, start : start + page_size]
    if layout == "page_first":
        return host[start : start + page_size]
    return host[page]


def read_page(
    layout: Layout, host: Sequence[torch.Tensor], page: int, page_size: int
) -> list[torch.Tensor]:
    """Per-role views of ``page`` in the layout's row order (see :func:`role_page`)."""
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


def stride_page_aligned(
    layout: Layout, host: Sequence[torch.Tensor], page_size: int, alignment: int
) -> bool:
    """Whether every range of ``get_page_buffer_meta`` starts at a multiple of ``alignment``."""
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
