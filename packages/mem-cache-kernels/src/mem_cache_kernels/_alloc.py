"""Paged slot allocation ops: ``alloc_extend`` and ``alloc_decode`` (SGLang semantics).

Slots are int64 row ids; page ``p`` owns slots ``[p*page_size, (p+1)*page_size)``. For each request
the new slots are, in order: the rest of its current partial page (``last_loc + 1``, ...), then
whole new pages, then a trailing partial new page. New pages are taken from ``free_pages`` in
request order, so a batch consumes exactly ``free_pages[0 : total_new_pages]`` where a request needs
``ceil(seq / page_size) - ceil(prefix / page_size)`` new pages. ``last_loc = -1`` means an empty
prefix. Example (page size 4): prefix 2, seq 11, last_loc 1, free pages [3, 4] gives
``[2, 3, 12, 13, 14, 15, 16, 17, 18]``.
"""

from __future__ import annotations

import torch

from mem_cache_kernels import _validate as v
from mem_cache_kernels._dispatch import Backend, resolve_backend, triton_impl
from mem_cache_kernels._torch import alloc as ref

__all__ = ["alloc_decode", "alloc_extend"]


def _check_free_pages(available: int, needed: int) -> None:
    if needed > available:
        raise ValueError(
            f"free_pages must hold the {needed} pages this batch needs, got {available}"
        )


def _check_extend_values(pre: list[int], seq: list[int], free: int, out: int, ps: int) -> None:
    """Value checks of an extend batch (CPU only; as lists, cheaper than small tensor ops)."""
    total = 0
    pages = 0
    for p, q in zip(pre, seq):
        if not 0 <= p <= q:
            raise ValueError(
                f"prefix_lens and seq_lens must satisfy 0 <= prefix <= seq, got {p}, {q}"
            )
        total += q - p
        pages += -(-q // ps) + (p // -ps)  # ceil(q / ps) - ceil(p / ps)
    if total != out:
        raise ValueError(f"out must have sum(seq_lens - prefix_lens) = {total} elements, got {out}")
    _check_free_pages(free, pages)


def alloc_extend(  # noqa: PLR0917
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
    *,
    backend: Backend = "auto",
) -> None:
    """Allocate the slots of an extend batch into ``out``.

    Args:
        prefix_lens, seq_lens, last_loc: int32/int64 ``[bs]``; ``seq_lens >= prefix_lens``;
            ``last_loc[i]`` is the slot of position ``prefix_lens[i] - 1`` (``-1`` if the prefix is
            empty).
        free_pages: int32/int64 ``[>= total_new_pages]``, page ids (never 0).
        out: int64 ``[sum(seq_lens - prefix_lens)]``, written request-major, position ascending.
        page_size: a power of two (1 included).

    All tensors must share one device. Only ``out`` is written. On CPU tensors the value checks
    (lengths, ``out`` size, enough free pages) are done before any work; on a GPU they are the
    caller's guarantee (checking would cost a host synchronisation).
    """
    pre = v.check_index("prefix_lens", prefix_lens)
    seq = v.check_index("seq_lens", seq_lens)
    last = v.check_index("last_loc", last_loc)
    free = v.check_index("free_pages", free_pages)
    dst = v.check_index("out", out, allow_int64_only=True)
    v.check_same_length(prefix_lens=pre, seq_lens=seq, last_loc=last)
    ps = v.check_page_size(page_size)
    v.check_same_device(dst.device, prefix_lens=pre, seq_lens=seq, last_loc=last, free_pages=free)
    if dst.device.type == "cpu":
        _check_extend_values(pre.tolist(), seq.tolist(), free.numel(), dst.numel(), ps)
    if resolve_backend(backend, pre, seq, last, free, dst) == "triton":
        triton_impl("alloc").alloc_extend(pre, seq, last, free, dst, ps)
    else:
        ref.alloc_extend(pre, seq, last, free, dst, ps)


def alloc_decode(
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
    *,
    backend: Backend = "auto",
) -> None:
    """Allocate one slot per request (``seq_lens`` count the new token) into ``out``.

    A request whose new token starts a page (``(seq - 1) % page_size == 0``) takes the next page of
    ``free_pages`` (request order) and gets its first slot; the others get ``last_loc + 1``.
    Same device/validation rules as :func:`alloc_extend`.
    """
    seq = v.check_index("seq_lens", seq_lens)
    last = v.check_index("last_loc", last_loc)
    free = v.check_index("free_pages", free_pages)
    dst = v.check_index("out", out, allow_int64_only=True)
    v.check_same_length(seq_lens=seq, last_loc=last, out=dst)
    ps = v.check_page_size(page_size)
    v.check_same_device(dst.device, seq_lens=seq, last_loc=last, free_pages=free)
    if dst.device.type == "cpu":
        seq_list = seq.tolist()
        if seq_list and min(seq_list) < 1:
            raise ValueError(
                f"seq_lens must be >= 1 (they include the new token), got {min(seq_list)}"
            )
        _check_free_pages(free.numel(), sum(1 for q in seq_list if (q - 1) % ps == 0))
    if resolve_backend(backend, seq, last, free, dst) == "triton":
        triton_impl("alloc").alloc_decode(seq, last, free, dst, ps)
    else:
        ref.alloc_decode(seq, last, free, dst, ps)
