"""Lazy access to the allocation kernels of :mod:`mem_cache_kernels`.

``import mem_cache_allocator`` must not import kernel code: the kernels package is imported on
the first allocation that needs it (backend ``"auto"``: Triton for GPU tensors, the torch
reference for CPU tensors; ``MEM_CACHE_KERNELS_BACKEND`` overrides).

The allocators compute every batch's page and token counts on the host (from the ``*_cpu``
lengths) before calling, and pass them as the kernels' ``num_new_pages`` / ``num_tokens`` hints:
the kernels then check them in O(1) instead of reading the lengths again.
"""

from __future__ import annotations

import torch

__all__ = ["alloc_decode", "alloc_extend"]


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
