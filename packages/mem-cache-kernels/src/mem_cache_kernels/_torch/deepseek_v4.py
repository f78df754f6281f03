"""Torch references of the DeepSeek-V4 record ops (:mod:`mem_cache_kernels.deepseek_v4`).

Same names and signatures as the Triton launchers in :mod:`mem_cache_kernels._triton.deepseek_v4`;
arguments arrive validated and contiguous from the public ops (layout in
:mod:`~.deepseek_v4`). Pure byte movement, so both backends give identical bytes.
"""

from __future__ import annotations

import torch

__all__ = ["pack_records", "read_records", "unpack_records", "write_records"]

_NOPE = 448
_VALUE = 576
_SCALES = 7
_TOKEN = 584
_SCALE_PART = _TOKEN - _VALUE  # 7 scale bytes + 1 pad byte


def pack_records(
    nope: torch.Tensor, scales: torch.Tensor, rope: torch.Tensor, out: torch.Tensor
) -> None:
    """``out[n, 584]`` <- nope bytes ``[n, 448]``, scales ``[n, 7]``, rope bytes ``[n, 128]``."""
    out[:, :_NOPE] = nope
    out[:, _NOPE:_VALUE] = rope
    out[:, _VALUE : _VALUE + _SCALES] = scales
    out[:, _TOKEN - 1] = 0


def unpack_records(
    rec: torch.Tensor, nope: torch.Tensor, scales: torch.Tensor, rope: torch.Tensor
) -> None:
    """Inverse of :func:`pack_records` (all uint8, contiguous)."""
    nope.copy_(rec[:, :_NOPE])
    rope.copy_(rec[:, _NOPE:_VALUE])
    scales.copy_(rec[:, _VALUE : _VALUE + _SCALES])


def _split_views(buffer: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Views ``[pages, ps, 576]`` (value parts) and ``[pages, ps, 8]`` (scale parts)."""
    values_end = page_size * _VALUE
    scales_end = values_end + page_size * _SCALE_PART
    pages = buffer.shape[0]
    values = buffer[:, :values_end].view(pages, page_size, _VALUE)
    scale_parts = buffer[:, values_end:scales_end].view(pages, page_size, _SCALE_PART)
    return values, scale_parts


def write_records(
    buffer: torch.Tensor, loc: torch.Tensor, rec: torch.Tensor, page_size: int
) -> None:
    """Scatter records into page rows (split layout); negative ``loc`` skipped."""
    keep = loc >= 0
    slots, rec = loc[keep].long(), rec[keep]
    values, scale_parts = _split_views(buffer, page_size)
    page, off = slots // page_size, slots % page_size
    values[page, off] = rec[:, :_VALUE]
    scale_parts[page, off] = rec[:, _VALUE:]


def read_records(
    buffer: torch.Tensor, loc: torch.Tensor, out: torch.Tensor, page_size: int
) -> None:
    """Gather records from page rows into ``out`` (rows of negative ``loc`` untouched)."""
    keep = loc >= 0
    slots = loc[keep].long()
    values, scale_parts = _split_views(buffer, page_size)
    page, off = slots // page_size, slots % page_size
    out[keep] = torch.cat([values[page, off], scale_parts[page, off]], dim=1)
