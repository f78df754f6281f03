"""Access to the allocation kernels of :mod:`mem_cache_kernels`.

The kernel functions are looked up on the first allocation that needs them (backend ``"auto"``:
Triton for GPU tensors, the torch reference for CPU tensors; ``MEM_CACHE_KERNELS_BACKEND``
overrides). ``import mem_cache_allocator`` loads the kernels package only as far as
:mod:`mem_cache_kernels.checks` does, and never triton.

The allocators compute every batch's page and token counts on the host (from the ``*_cpu``
lengths) before calling, and pass them as the kernels' ``num_new_pages`` / ``num_tokens`` hints:
the kernels then check them in O(1) instead of reading the lengths again.
"""

from __future__ import annotations

import os
from typing import Any

import torch

try:  # optional (a CPU allocator without numpy decodes through the kernels)
    import numpy as _np
except ImportError:  # pragma: no cover - numpy ships with every torch wheel we test
    _np = None  # type: ignore[assignment]

__all__ = ["alloc_decode", "alloc_extend", "host_alloc_decode", "host_path"]

_BACKEND_ENV = "MEM_CACHE_KERNELS_BACKEND"  # mem_cache_kernels' override (read without importing)


def host_path(allocator: Any) -> bool:
    """Whether a decode of this allocator may run on the host (:func:`host_alloc_decode`): a CPU
    allocator whose kernels would take the torch backend (``MEM_CACHE_KERNELS_BACKEND`` unset,
    ``auto`` or ``torch``; ``triton`` under the interpreter goes through the kernels)."""
    if _np is None or allocator.device.type != "cpu":
        return False
    return os.environ.get(_BACKEND_ENV, "auto") in ("auto", "torch", "")


def host_alloc_decode(
    last_loc: torch.Tensor, starts: Any, pages: torch.Tensor, shift: int
) -> torch.Tensor:
    """The decode slots of CPU tensors in numpy: ``last_loc + 1``, and ``pages << shift`` (first
    slot of the next free page, request order) for the requests whose new token starts a page
    (``starts``, a numpy bool mask with ``len(pages)`` true entries, computed by the allocator's
    host checks from ``seq_lens_cpu``). The same slots as ``mem_cache_kernels.alloc_decode``
    (one formula; tested against it), without its per-call argument checks and torch ops, which
    the allocator has already done on the host."""
    out = _np.add(last_loc.numpy(), 1, dtype=_np.int64)
    if pages.shape[0]:
        out[starts] = pages.numpy() << shift
    return torch.from_numpy(out)


def alloc_extend(  # noqa: PLR0917 - SGLang-compatible positional signature
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
    num_new_pages: int,
) -> None:
    import mem_cache_kernels

    mem_cache_kernels.alloc_extend(
        prefix_lens,
        seq_lens,
        last_loc,
        free_pages,
        out,
        page_size,
        num_new_pages=num_new_pages,
        num_tokens=out.shape[0],
    )


def alloc_decode(  # noqa: PLR0917
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
    num_new_pages: int,
) -> None:
    import mem_cache_kernels

    mem_cache_kernels.alloc_decode(
        seq_lens, last_loc, free_pages, out, page_size, num_new_pages=num_new_pages
    )
