"""Torch reference of the host<->device row transfers (layer-first and page-first layouts)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels import _movement
from mem_cache_kernels._torch.jobs import run_jobs

__all__ = [
    "backup_all_layers_to_page_first",
    "load_layer_from_page_first",
    "transfer_rows",
    "transfer_rows_all_layers",
]


def transfer_rows(
    src: Sequence[torch.Tensor],
    dst: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
) -> None:
    """One layer, layer-first both sides: ``dst[r][dst_indices] = src[r][src_indices]``."""
    _movement.transfer_rows(run_jobs, src, dst, src_indices, dst_indices)


def transfer_rows_all_layers(
    src: Sequence[Sequence[torch.Tensor]],
    dst: Sequence[Sequence[torch.Tensor]],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
) -> None:
    """Every layer, ``[role][layer]`` both sides."""
    _movement.transfer_rows_all_layers(run_jobs, src, dst, src_indices, dst_indices)


def load_layer_from_page_first(
    host: Sequence[torch.Tensor],
    device: Sequence[torch.Tensor],
    host_indices: torch.Tensor,
    device_indices: torch.Tensor,
    layer_id: int,
) -> None:
    """Page-first host ``[slots, L, *row]`` at ``layer_id`` -> device layer ``[rows, *row]``."""
    _movement.load_layer_from_page_first(
        run_jobs, host, device, host_indices, device_indices, layer_id
    )


def backup_all_layers_to_page_first(
    device: Sequence[Sequence[torch.Tensor]],
    host: Sequence[torch.Tensor],
    device_indices: torch.Tensor,
    host_indices: torch.Tensor,
) -> None:
    """Device layers ``[role][layer]`` -> page-first host ``[slots, L, *row]`` (every layer)."""
    _movement.backup_all_layers_to_page_first(run_jobs, device, host, device_indices, host_indices)
