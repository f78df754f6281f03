"""Triton request-table kernels (``write_req_to_token``, ``get_last_loc``).

``write_req_to_token`` runs one program per request; the offsets of each request's segment in
the flat ``out_cache_loc`` / ``prefix_slots`` arrays are exclusive prefix sums computed once in the
launcher (SGLang recomputes them per program). Row offsets are int64. The kernels never touch
memory outside the table: a request whose row is outside ``[0, rows)`` (or whose prefix length is
negative) writes nothing, positions at or past ``max_len`` are not written, and ``get_last_loc``
reads -1 for such a request. The public ops reject those inputs before launching wherever that is
free (CPU tensors, or any device under ``MEM_CACHE_DEBUG=1``); on a GPU these guards are what stands
between a bad row index and another request's memory.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

__all__ = ["get_last_loc", "write_req_to_token"]

_BLOCK = 256
_LAST_BLOCK = 128


@triton.jit(
    do_not_specialize=[
        "rows_ptr",
        "pre_ptr",
        "seq_ptr",
        "new_ptr",
        "prefix_ptr",
        "starts_ptr",
        "bs",
        "n_rows",
        "max_len",
    ]
)
def _write_req_to_token_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917
    table_ptr,  # [rows, max_len] req_to_token
    table_stride,  # row stride of req_to_token (elements)
    rows_ptr,  # [bs] req_pool_indices
    pre_ptr,  # [bs] prefix lengths
    seq_ptr,  # [bs] sequence lengths
    new_ptr,  # [sum(seq - pre)] new slots, flat
    prefix_ptr,  # [sum(pre)] prefix slots, flat (unused when not HAS_PREFIX)
    starts_ptr,  # int64 [2, bs]: exclusive prefix sums of (seq - pre) and of pre
    bs,
    n_rows,  # rows of req_to_token: a row outside [0, n_rows) writes nothing
    max_len,  # columns of req_to_token: positions >= max_len are not written
    HAS_PREFIX: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    row = tl.load(rows_ptr + pid).to(tl.int64)
    pre = tl.load(pre_ptr + pid).to(tl.int64)
    seq = tl.load(seq_ptr + pid).to(tl.int64)
    ok = (row >= 0) & (row < n_rows) & (pre >= 0)
    row = tl.where(ok, row, 0)
    # elements this program may write: none for a bad row, never past max_len
    n_pre = tl.where(ok, tl.minimum(pre, max_len), 0)
    n_new = tl.where(ok, tl.minimum(seq, max_len) - pre, 0)
    dst = table_ptr + row * table_stride
    out_dtype = table_ptr.dtype.element_ty
    if HAS_PREFIX:
        prefix_start = tl.load(starts_ptr + bs + pid)
        for b in range(0, n_pre, BLOCK):
            offs = b + tl.arange(0, BLOCK).to(tl.int64)
            mask = offs < n_pre
            vals = tl.load(prefix_ptr + prefix_start + offs, mask=mask, other=0)
            tl.store(dst + offs, vals.to(out_dtype), mask=mask)
    new_start = tl.load(starts_ptr + pid)
    for b in range(0, n_new, BLOCK):
        offs = b + tl.arange(0, BLOCK).to(tl.int64)
        mask = offs < n_new
        vals = tl.load(new_ptr + new_start + offs, mask=mask, other=0)
        tl.store(dst + pre + offs, vals.to(out_dtype), mask=mask)


@triton.jit(do_not_specialize=["rows_ptr", "pre_ptr", "out_ptr", "bs", "n_rows", "max_len"])
def _get_last_loc_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917
    table_ptr,  # [rows, max_len] req_to_token
    table_stride,  # row stride (elements)
    rows_ptr,  # [bs] req_pool_indices
    pre_ptr,  # [bs] prefix lengths
    out_ptr,  # int64 [bs]
    bs,
    n_rows,  # rows of req_to_token: a row outside [0, n_rows) reads as -1
    max_len,  # columns of req_to_token: a prefix outside [1, max_len] reads as -1
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < bs
    row = tl.load(rows_ptr + offs, mask=mask, other=0).to(tl.int64)
    pre = tl.load(pre_ptr + offs, mask=mask, other=0).to(tl.int64)
    has_prefix = mask & (pre > 0) & (pre <= max_len) & (row >= 0) & (row < n_rows)
    last = tl.load(table_ptr + row * table_stride + pre - 1, mask=has_prefix, other=-1)
    tl.store(out_ptr + offs, last.to(tl.int64), mask=mask)


def _on_device(t: torch.Tensor) -> contextlib.AbstractContextManager[object]:
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def write_req_to_token(  # noqa: PLR0917
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    prefix_slots: torch.Tensor | None = None,
) -> None:
    """Fill each request's row of ``req_to_token`` with its prefix slots and its new slots."""
    bs = req_pool_indices.shape[0]
    if bs == 0:
        return
    pre = prefix_lens.to(torch.int64)
    counts = torch.stack([seq_lens.to(torch.int64) - pre, pre])
    starts = torch.cumsum(counts, dim=1) - counts
    has_prefix = prefix_slots is not None and prefix_slots.numel() > 0
    with _on_device(req_to_token):
        _write_req_to_token_kernel[(bs,)](
            req_to_token,
            req_to_token.stride(0),
            req_pool_indices,
            prefix_lens,
            seq_lens,
            out_cache_loc,
            prefix_slots if has_prefix else out_cache_loc,
            starts,
            bs,
            req_to_token.shape[0],
            req_to_token.shape[1],
            HAS_PREFIX=has_prefix,
            BLOCK=_BLOCK,
        )


def get_last_loc(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor
) -> torch.Tensor:
    """``req_to_token[r, prefix - 1]`` as int64 per request, -1 where the prefix is empty."""
    bs = req_pool_indices.shape[0]
    out = torch.empty(bs, dtype=torch.int64, device=req_to_token.device)
    if bs == 0:
        return out
    with _on_device(req_to_token):
        _get_last_loc_kernel[(triton.cdiv(bs, _LAST_BLOCK),)](
            req_to_token,
            req_to_token.stride(0),
            req_pool_indices,
            prefix_lens,
            out,
            bs,
            req_to_token.shape[0],
            req_to_token.shape[1],
            BLOCK=_LAST_BLOCK,
        )
    return out
