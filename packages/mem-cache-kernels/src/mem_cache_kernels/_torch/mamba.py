"""Torch reference of the Mamba / linear-attention state-slot ops (:mod:`mem_cache_kernels.mamba`).

A state tensor is ``[layers, slots, *state]``; these functions move whole ``[*state]`` entries of
every layer between slots with plain advanced indexing (the oracle of the Triton kernels). They do
not validate: :mod:`mem_cache_kernels.mamba` does. A pair with a negative slot is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["copy_state_slots", "transfer_state_slots"]


def _live(src: torch.Tensor, dst: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = src.to(torch.int64)
    d = dst.to(torch.int64)
    keep = (s >= 0) & (d >= 0)
    if bool(keep.all()):
        return s, d
    return s[keep], d[keep]


def transfer_state_slots(
    src: Sequence[torch.Tensor],
    dst: Sequence[torch.Tensor],
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
) -> None:
    """``dst[i][:, dst_slots[j]] = src[i][:, src_slots[j]]`` for every tensor pair ``i``."""
    for s_t, d_t in zip(src, dst):
        s, d = _live(src_slots.to(s_t.device), dst_slots.to(s_t.device))
        if s.numel() == 0:
            continue
        rows = s_t.index_select(1, s)
        d_t[:, d.to(d_t.device)] = rows.to(d_t.device)


def copy_state_slots(
    states: Sequence[torch.Tensor], src_slots: torch.Tensor, dst_slots: torch.Tensor
) -> None:
    """``states[i][:, dst_slots] = old states[i][:, src_slots]`` (the gather runs first)."""
    transfer_state_slots(states, states, src_slots, dst_slots)
