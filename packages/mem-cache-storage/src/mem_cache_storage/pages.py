"""Pages as byte ranges: the unit every backend of this package moves.

A page is a tuple of ``(ptr, nbytes)`` host memory ranges (:data:`PageRanges`) plus a
:class:`PageFormat` that says how those bytes are laid out:

* the **copying path** (``get``/``set`` with a tensor, e.g. ``host_pool.get_data_page(i)``): one
  range, format ``flat`` or, when a host pool is registered, ``flat:<page_format.tag>`` (the host
  pool's flat page follows its layout, as SGLang's does, so the tag keeps a ``page_first`` page
  from being read into a ``layer_first`` pool);
* the **zero-copy path** (``batch_get_v1``/``batch_set_v1``): the ranges the host pool's
  ``get_page_buffer_meta`` returns for the page, format ``native:<layout>`` (byte order depends
  on the layout).

A backend stores the format's :attr:`PageFormat.format_id` with the page and treats a page
stored in another format as a miss, so bytes are never reinterpreted across formats.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mem_cache_kernels.checks import check_index

__all__ = ["PageFormat", "PageRanges", "host_page_ranges", "tensor_page_ranges"]

PageRanges = tuple[tuple[int, int], ...]
"""One page: ``((ptr, nbytes), ...)`` host memory ranges, in page order."""


@dataclass(frozen=True, slots=True)
class PageFormat:
    """How a page's bytes are laid out: ``kind`` (``"flat"`` or ``"native:<layout>"``), element
    ``dtype`` and the byte size of each range."""

    kind: str
    dtype: str
    sizes: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)

    @property
    def format_id(self) -> int:
        """A 64-bit id of (kind, dtype, sizes), stored with every page."""
        text = f"{self.kind}|{self.dtype}|{','.join(map(str, self.sizes))}"
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")

    @property
    def tag(self) -> str:
        """``format_id`` as 16 hex characters."""
        return f"{self.format_id:016x}"


def tensor_page_ranges(
    tensor: Any, name: str = "target_location", pool: Any | None = None
) -> tuple[PageRanges, PageFormat]:
    """The single range of a contiguous CPU tensor, format ``flat`` (``flat:<tag>`` with the
    registered host ``pool``'s ``page_format.tag``, when it has one)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU tensor, got device {tensor.device}")
    if not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        raise ValueError(f"{name} must not be empty")
    page_format = getattr(pool, "page_format", None)
    tag = getattr(page_format, "tag", None)
    kind = "flat" if tag is None else f"flat:{tag}"
    return ((tensor.data_ptr(), nbytes),), PageFormat(kind, str(tensor.dtype), (nbytes,))


def host_page_ranges(
    pool: Any, host_indices: torch.Tensor, num_pages: int
) -> tuple[list[PageRanges], PageFormat]:
    """Per-page ranges of ``num_pages`` whole pages of host slots ``host_indices`` in ``pool``
    (through its public ``get_page_buffer_meta``), format ``native:<pool.layout>``."""
    if pool is None:
        raise RuntimeError("no host pool registered: call register_mem_pool_host(pool) first")
    check_index("host_indices", host_indices)
    page_size = int(pool.page_size)
    if host_indices.numel() != num_pages * page_size:
        raise ValueError(
            f"host_indices must be 1-D with len(keys) * page_size = {num_pages * page_size} "
            f"slots, got shape {tuple(host_indices.shape)}"
        )
    # SGLang's host pools name the element type ``dtype``; ours also have ``store_dtype``
    dtype = str(getattr(pool, "store_dtype", getattr(pool, "dtype", "")))
    layout = str(getattr(pool, "layout", ""))
    if num_pages == 0:
        return [], PageFormat(f"native:{layout}", dtype, ())
    ptrs, sizes = pool.get_page_buffer_meta(host_indices.to("cpu", torch.int64))
    if len(ptrs) != len(sizes) or len(ptrs) % num_pages:
        raise RuntimeError(
            f"get_page_buffer_meta returned {len(ptrs)} pointers / {len(sizes)} sizes for "
            f"{num_pages} pages"
        )
    per = len(ptrs) // num_pages
    pages: list[PageRanges] = []
    first: Sequence[int] = sizes[:per]
    for p in range(num_pages):
        lo = p * per
        if sizes[lo : lo + per] != first:
            raise RuntimeError("get_page_buffer_meta returned pages of different sizes")
        pages.append(tuple(zip(ptrs[lo : lo + per], sizes[lo : lo + per])))
    fmt = PageFormat(f"native:{layout}", dtype, tuple(int(s) for s in first))
    return pages, fmt
