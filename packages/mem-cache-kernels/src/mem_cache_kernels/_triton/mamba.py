"""Triton state-slot kernels of :mod:`mem_cache_kernels.mamba`.

One launch per state tensor: program ``(layer * n + pair, column block)`` copies one layer's
state entry of one slot pair, as 4-byte (or 1-byte) words, with 64-bit offsets. Host tensors
must be pinned on a GPU; on the CPU the kernels run under ``TRITON_INTERPRET=1``. A pair with a
negative slot is skipped. ``copy_state_slots`` gathers every source entry into a temporary first
(one launch), then scatters it (a second launch), so overlapping source and target slots are safe.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

__all__ = ["copy_state_slots", "transfer_state_slots"]

_BLOCK = 1024


@triton.jit
def _state_rows_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917
    src_ptr,
    dst_ptr,
    src_idx_ptr,
    dst_idx_ptr,
    n,
    src_layer_stride,
    src_slot_stride,
    dst_layer_stride,
    dst_slot_stride,
    row_words,
    BLOCK: tl.constexpr,
):
    lp = tl.program_id(0).to(tl.int64)
    layer = lp // n
    pair = lp % n
    s = tl.load(src_idx_ptr + pair).to(tl.int64)
    d = tl.load(dst_idx_ptr + pair).to(tl.int64)
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = (cols < row_words) & ((cols * 0 + s) >= 0) & ((cols * 0 + d) >= 0)
    src_row = src_ptr + layer * src_layer_stride + s * src_slot_stride
    dst_row = dst_ptr + layer * dst_layer_stride + d * dst_slot_stride
    words = tl.load(src_row + cols, mask=mask, other=0)
    tl.store(dst_row + cols, words, mask=mask)


def _words(t: torch.Tensor) -> torch.Tensor:
    """``t`` (``[L, S, *state]``, contiguous state entries) as ``[L, S, words]`` of int32 when
    every size, stride and the base address allow it, else of uint8 (a view, no copy)."""
    flat = t.reshape(t.shape[0], t.shape[1], -1) if t.dim() != 3 else t
    b = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
    es = flat.element_size()
    strides = (flat.stride(0) * es, flat.stride(1) * es)
    if b.shape[2] % 4 == 0 and all(s % 4 == 0 for s in strides) and b.data_ptr() % 4 == 0:
        return b.view(torch.int32)
    return b


def _launch(
    src: torch.Tensor, dst: torch.Tensor, s_idx: torch.Tensor, d_idx: torch.Tensor, n: int
) -> None:
    sw, dw = _words(src), _words(dst)
    if sw.dtype != dw.dtype:
        sw = sw.view(torch.uint8) if sw.dtype != torch.uint8 else sw
        dw = dw.view(torch.uint8) if dw.dtype != torch.uint8 else dw
    row_words = sw.shape[2]
    grid = (sw.shape[0] * n, triton.cdiv(row_words, _BLOCK))
    _state_rows_kernel[grid](
        sw,
        dw,
        s_idx,
        d_idx,
        n,
        sw.stride(0),
        sw.stride(1),
        dw.stride(0),
        dw.stride(1),
        row_words,
        BLOCK=_BLOCK,
    )


def _check_pinned(tensors: Sequence[torch.Tensor]) -> None:
    for t in tensors:
        if t.device.type == "cpu" and not t.is_pinned():
            raise ValueError(
                "host state tensors must be pinned for the Triton backend "
                "(pin_memory=True), or use backend='torch'"
            )


def transfer_state_slots(
    src: Sequence[torch.Tensor],
    dst: Sequence[torch.Tensor],
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
) -> None:
    """``dst[i][:, dst_slots[j]] = src[i][:, src_slots[j]]``; source and target must not overlap
    (``copy_state_slots`` is the overlap-safe variant)."""
    n = src_slots.shape[0]
    if n == 0:
        return
    device = next((t.device for t in (*src, *dst) if t.is_cuda), src[0].device)
    if device.type == "cuda":
        _check_pinned([*src, *dst])
    s_idx = src_slots.to(device, non_blocking=True)
    d_idx = dst_slots.to(device, non_blocking=True)
    if device.type == "cuda":
        with torch.cuda.device(device):
            for a, b in zip(src, dst):
                _launch(a, b, s_idx, d_idx, n)
    else:
        for a, b in zip(src, dst):
            _launch(a, b, s_idx, d_idx, n)


def copy_state_slots(
    states: Sequence[torch.Tensor], src_slots: torch.Tensor, dst_slots: torch.Tensor
) -> None:
    """``states[i][:, dst_slots] = old states[i][:, src_slots]``: gather, then scatter."""
    n = src_slots.shape[0]
    if n == 0:
        return
    # a pair with a negative index is skipped in both phases
    src = torch.where(dst_slots < 0, -1, src_slots.to(torch.int64))
    dst = torch.where(src_slots < 0, -1, dst_slots.to(torch.int64))
    tmp = [
        torch.empty((t.shape[0], n, *t.shape[2:]), dtype=t.dtype, device=t.device) for t in states
    ]
    order = torch.arange(n, dtype=torch.int64, device=src_slots.device)
    transfer_state_slots(states, tmp, src, order)
    transfer_state_slots(tmp, states, order, dst)
