"""Triton implementations of :mod:`mem_cache_kernels.deepseek_v4` (pure byte movement).

Launchers receive validated, contiguous tensors from the public ops. Pack/unpack move bytes; the
page-row scatter/gather moves 4-byte words (a record is 146 words: 144 value words + 2 scale
words; every run starts at a multiple of 4 bytes). All offsets are computed in int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["pack_records", "read_records", "unpack_records", "write_records"]

_NOPE = 448
_VALUE = 576
_SCALES = 7
_TOKEN = 584
_VALUE_WORDS = _VALUE // 4  # 144
_TOKEN_WORDS = _TOKEN // 4  # 146
_SCALE_WORDS = _TOKEN_WORDS - _VALUE_WORDS  # 2


@triton.jit
def _pack_kernel(  # type: ignore[no-untyped-def]
    nope_ptr, scales_ptr, rope_ptr, out_ptr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    in_nope = offs < 448
    in_rope = (offs >= 448) & (offs < 576)
    in_scale = (offs >= 576) & (offs < 583)
    nope = tl.load(nope_ptr + row * 448 + offs, mask=in_nope, other=0)
    rope = tl.load(rope_ptr + row * 128 + (offs - 448), mask=in_rope, other=0)
    scale = tl.load(scales_ptr + row * 7 + (offs - 576), mask=in_scale, other=0)
    val = tl.where(in_nope, nope, tl.where(in_rope, rope, scale))
    tl.store(out_ptr + row * 584 + offs, val, mask=offs < 584)


@triton.jit
def _unpack_kernel(  # type: ignore[no-untyped-def]
    rec_ptr, nope_ptr, scales_ptr, rope_ptr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    val = tl.load(rec_ptr + row * 584 + offs, mask=offs < 584, other=0)
    tl.store(nope_ptr + row * 448 + offs, val, mask=offs < 448)
    tl.store(rope_ptr + row * 128 + (offs - 448), val, mask=(offs >= 448) & (offs < 576))
    tl.store(scales_ptr + row * 7 + (offs - 576), val, mask=(offs >= 576) & (offs < 583))


@triton.jit
def _row_words(loc_ptr, row, page_size, row_words, offs):  # type: ignore[no-untyped-def]
    """Word offsets in the page buffer of the 146 words of the record at ``loc[row]``."""
    slot = tl.load(loc_ptr + row).to(tl.int64)
    page = slot // page_size
    off = slot % page_size
    base = page * row_words
    value_dst = base + off * 144 + offs
    scale_dst = base + page_size * 144 + off * 2 + (offs - 144)
    return slot, tl.where(offs < 144, value_dst, scale_dst)


@triton.jit
def _write_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917
    buf_ptr, loc_ptr, rec_ptr, page_size, row_words, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    slot, dst = _row_words(loc_ptr, row, page_size, row_words, offs)
    mask = (offs < 146) & ((offs * 0 + slot) >= 0)  # broadcast the slot test to the block
    val = tl.load(rec_ptr + row * 146 + offs, mask=mask, other=0)
    tl.store(buf_ptr + dst, val, mask=mask)


@triton.jit
def _read_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917
    buf_ptr, loc_ptr, out_ptr, page_size, row_words, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    slot, src = _row_words(loc_ptr, row, page_size, row_words, offs)
    mask = (offs < 146) & ((offs * 0 + slot) >= 0)  # broadcast the slot test to the block
    val = tl.load(buf_ptr + src, mask=mask, other=0)
    tl.store(out_ptr + row * 146 + offs, val, mask=mask)


def pack_records(
    nope: torch.Tensor, scales: torch.Tensor, rope: torch.Tensor, out: torch.Tensor
) -> None:
    """``out[n, 584]`` <- nope bytes ``[n, 448]``, scales ``[n, 7]``, rope bytes ``[n, 128]``."""
    _pack_kernel[(out.shape[0],)](nope, scales, rope, out, BLOCK=1024)


def unpack_records(
    rec: torch.Tensor, nope: torch.Tensor, scales: torch.Tensor, rope: torch.Tensor
) -> None:
    """Inverse of :func:`pack_records` (all uint8, contiguous)."""
    _unpack_kernel[(rec.shape[0],)](rec, nope, scales, rope, BLOCK=1024)


def write_records(
    buffer: torch.Tensor, loc: torch.Tensor, rec: torch.Tensor, page_size: int
) -> None:
    """Scatter records into page rows (split layout); negative ``loc`` skipped."""
    words = buffer.view(torch.int32)
    _write_kernel[(loc.shape[0],)](
        words, loc, rec.view(torch.int32), page_size, words.stride(0), BLOCK=256
    )


def read_records(
    buffer: torch.Tensor, loc: torch.Tensor, out: torch.Tensor, page_size: int
) -> None:
    """Gather records from page rows into ``out`` (rows of negative ``loc`` untouched)."""
    words = buffer.view(torch.int32)
    _read_kernel[(loc.shape[0],)](
        words, loc, out.view(torch.int32), page_size, words.stride(0), BLOCK=256
    )
