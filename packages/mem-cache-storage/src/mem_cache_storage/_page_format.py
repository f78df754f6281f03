"""How a page's bytes are laid out and named: :data:`PageRanges` (a page as host memory ranges),
:class:`PageFormat` (kind, dtype and range sizes, and the 64-bit id stored with every page: a page
stored in another format is a miss, never reinterpreted bytes), one cached instance per format,
and the copying path's pages (:func:`tensor_page_ranges`: a contiguous CPU tensor, format
``flat`` or ``flat:<tag>``). The host pool's pages are :mod:`mem_cache_storage.backend`'s
(``PageBatch``, ``host_page_ranges``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch

__all__ = ["PageFormat", "PageRanges", "tensor_page_ranges"]

PageRanges = tuple[tuple[int, int], ...]
"""One page: ``((ptr, nbytes), ...)`` host memory ranges, in page order."""


@dataclass(frozen=True, slots=True)
class PageFormat:
    """How a page's bytes are laid out: ``kind`` (``"flat"`` or ``"native:<layout>"``), element
    ``dtype`` and the byte size of each range."""

    kind: str
    dtype: str
    sizes: tuple[int, ...]
    #: bytes of one page (the sum of ``sizes``)
    nbytes: int = field(init=False, repr=False, compare=False)
    #: a 64-bit id of (kind, dtype, sizes), stored with every page
    format_id: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        text = f"{self.kind}|{self.dtype}|{','.join(map(str, self.sizes))}"
        object.__setattr__(self, "nbytes", sum(self.sizes))
        object.__setattr__(self, "format_id",
                           int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little"))

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


@lru_cache(maxsize=256)
def _page_format(kind: str, dtype: str, sizes: tuple[int, ...]) -> PageFormat:
    """One :class:`PageFormat` per distinct format (its id is a SHA-256: computed once)."""
    return PageFormat(kind, dtype, sizes)
