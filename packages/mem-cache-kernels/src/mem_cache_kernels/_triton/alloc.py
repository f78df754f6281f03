"""Triton paged allocation kernels (``alloc_extend``, ``alloc_decode``).

Same results as :mod:`mem_cache_kernels._torch.alloc`. Differences from SGLang's kernels:

* ``alloc_extend``: the per-request output offset and first-page rank are exclusive prefix sums
  computed once in the launcher (one ``torch.cumsum``), not re-derived by every program (O(bs^2));
  each program then fills its request's slots in blocks, with a vectorised three-phase formula.
* ``alloc_decode``: one program scans the batch in blocks with ``tl.cumsum`` and a running carry,
  so the page ranks cost a single launch.
* Masked loads always pass ``other=``; batch size and pointer arguments are not specialised (no
  recompilation per batch size or pointer alignment); ``PAGE_SIZE`` is a constexpr power of two
  (1 included), so ``//`` and ``%`` compile to shifts and masks.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

__all__ = ["alloc_decode", "alloc_extend"]

_EXTEND_BLOCK = 256  # slots written per inner iteration of one request's program
_DECODE_BLOCK = 1024  # requests per iteration of the decode scan
_DECODE_SMALL = 128  # block for small batches (decode of a few requests)


@triton.jit(
    do_not_specialize=["pre_ptr", "seq_ptr", "last_ptr", "free_ptr", "starts_ptr", "out_ptr", "bs"]
)
def _alloc_extend_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917
    pre_ptr,  # [bs] prefix lengths
    seq_ptr,  # [bs] new sequence lengths
    last_ptr,  # [bs] slot of the last prefix token (-1: empty prefix)
    free_ptr,  # [>= total new pages] free page ids
    starts_ptr,  # int64 [2, bs]: exclusive prefix sums of new tokens and of new pages
    out_ptr,  # int64 [sum(seq - pre)]
    bs,  # batch size (row stride of starts)
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    pre = tl.load(pre_ptr + pid).to(tl.int64)
    seq = tl.load(seq_ptr + pid).to(tl.int64)
    last = tl.load(last_ptr + pid).to(tl.int64)
    out_start = tl.load(starts_ptr + pid)
    page_start = tl.load(starts_ptr + bs + pid)
    pre_pages = (pre + PAGE_SIZE - 1) // PAGE_SIZE
    old_end = pre_pages * PAGE_SIZE  # positions [pre, old_end) fill the current partial page
    n = seq - pre
    for b in range(0, n, BLOCK):
        offs = b + tl.arange(0, BLOCK).to(tl.int64)
        mask = offs < n
        j = pre + offs
        in_old = j < old_end
        page_idx = page_start + j // PAGE_SIZE - pre_pages
        page = tl.load(free_ptr + page_idx, mask=mask & (~in_old), other=0).to(tl.int64)
        slot = tl.where(in_old, last + 1 + offs, page * PAGE_SIZE + j % PAGE_SIZE)
        tl.store(out_ptr + out_start + offs, slot, mask=mask)


@triton.jit(do_not_specialize=["seq_ptr", "last_ptr", "free_ptr", "out_ptr", "bs"])
def _alloc_decode_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917
    seq_ptr,  # [bs] sequence lengths including the new token
    last_ptr,  # [bs] slot of the previous token
    free_ptr,  # [>= new pages] free page ids
    out_ptr,  # int64 [bs]
    bs,  # batch size
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    carry = tl.zeros((), dtype=tl.int64)  # pages taken by earlier blocks
    for b in range(0, bs, BLOCK):
        offs = b + tl.arange(0, BLOCK)
        mask = offs < bs
        seq = tl.load(seq_ptr + offs, mask=mask, other=1).to(tl.int64)
        last = tl.load(last_ptr + offs, mask=mask, other=0).to(tl.int64)
        need = mask & ((seq - 1) % PAGE_SIZE == 0)
        need_i = need.to(tl.int64)
        rank = carry + tl.cumsum(need_i, 0) - need_i
        page = tl.load(free_ptr + rank, mask=need, other=0).to(tl.int64)
        tl.store(out_ptr + offs, tl.where(need, page * PAGE_SIZE, last + 1), mask=mask)
        carry += tl.sum(need_i, 0)


def _on_device(t: torch.Tensor) -> contextlib.AbstractContextManager[object]:
    """Launch on ``t``'s GPU (Triton uses the current device), or nothing for CPU tensors."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def alloc_extend(  # noqa: PLR0917
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
    num_new_pages: int | None = None,
    num_tokens: int | None = None,
) -> None:
    """Write the new slots of every request into ``out`` (see the torch reference).

    ``num_new_pages`` / ``num_tokens`` are the public op's host-side hints (already checked
    there); the kernel does not need them.
    """
    del num_new_pages, num_tokens
    bs = prefix_lens.shape[0]
    if bs == 0 or out.numel() == 0:
        return
    pre = prefix_lens.to(torch.int64)
    seq = seq_lens.to(torch.int64)
    pre_pages = (pre + page_size - 1) // page_size
    counts = torch.stack([seq - pre, (seq + page_size - 1) // page_size - pre_pages])
    starts = torch.cumsum(counts, dim=1) - counts  # one scan for both prefix sums
    with _on_device(out):
        _alloc_extend_kernel[(bs,)](
            prefix_lens,
            seq_lens,
            last_loc,
            free_pages,
            starts,
            out,
            bs,
            PAGE_SIZE=page_size,
            BLOCK=_EXTEND_BLOCK,
        )


def alloc_decode(  # noqa: PLR0917
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
    num_new_pages: int | None = None,
) -> None:
    """Write one new slot per request into ``out`` (see the torch reference).

    ``num_new_pages`` is the public op's host-side hint (already checked); the kernel computes
    the page ranks itself.
    """
    del num_new_pages
    bs = seq_lens.shape[0]
    if bs == 0:
        return
    block = _DECODE_BLOCK if bs > _DECODE_SMALL else _DECODE_SMALL  # two variants at most
    with _on_device(out):
        _alloc_decode_kernel[(1,)](
            seq_lens, last_loc, free_pages, out, bs, PAGE_SIZE=page_size, BLOCK=block
        )
