"""Lazy access to the allocation kernels of :mod:`mem_cache_kernels`.

``import mem_cache_allocator`` must not import kernel code: the kernels package is imported on
the first allocation that needs it (backend ``"auto"``: Triton for GPU tensors, the torch
reference for CPU tensors; ``MEM_CACHE_KERNELS_BACKEND`` overrides).
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
) -> None:
    import mem_cache_kernels

    mem_cache_kernels.alloc_extend(prefix_lens, seq_lens, last_loc, free_pages, out, page_size)


def alloc_decode(
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
) -> None:
    import mem_cache_kernels

    mem_cache_kernels.alloc_decode(seq_lens, last_loc, free_pages, out, page_size)
