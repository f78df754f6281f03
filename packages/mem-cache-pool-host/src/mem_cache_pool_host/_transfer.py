"""Dispatch of host<->device transfers to the kernels package, per layout and IO backend.

Host tensors are the pool's per-role tensors in its layout (see ``layout.py``); device buffers are
``KVBufferDesc.buffers`` (``[role][layer]``, each ``[rows, *row]``). ``backend`` is already the
effective backend (``layout.effective_io_backend``). Kernel argument errors are re-raised under
the host pool's argument names (``caller_names``: ``src_indices`` -> ``host_indices`` etc.).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

import mem_cache_kernels as K
from mem_cache_pool_host.layout import IOBackend, Layout

__all__ = ["backup_all_layers", "load_one_layer"]


def load_one_layer(
    *,
    layout: Layout,
    backend: IOBackend,
    host: Sequence[torch.Tensor],
    device_layer: Sequence[torch.Tensor],
    host_indices: torch.Tensor,
    device_indices: torch.Tensor,
    layer: int,
    page_size: int,
) -> None:
    """Copy host rows ``host_indices`` of local ``layer`` to device rows ``device_indices``."""
    with K.caller_names(src_indices="host_indices", dst_indices="device_indices"):
        if layout == "layer_first":
            host_layer = [h[layer] for h in host]
            if backend == "kernel":
                K.transfer_rows(host_layer, device_layer, host_indices, device_indices)
            else:
                K.direct_transfer_rows(
                    [[h] for h in host_layer],
                    [[d] for d in device_layer],
                    host_indices,
                    device_indices,
                    page_size,
                )
        elif layout == "page_first":
            K.load_layer_from_page_first(host, device_layer, host_indices, device_indices, layer)
        else:
            K.direct_load_layer_from_page_first_direct(
                host, device_layer, host_indices, device_indices, layer, page_size
            )


def backup_all_layers(
    *,
    layout: Layout,
    backend: IOBackend,
    device: Sequence[Sequence[torch.Tensor]],
    host: Sequence[torch.Tensor],
    host_layer_views: Sequence[Sequence[torch.Tensor]],
    device_indices: torch.Tensor,
    host_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Copy device rows ``device_indices`` of every layer to host rows ``host_indices``.

    ``host_layer_views[r][l]`` is ``host[r][l]`` (only used by ``layer_first``).
    """
    with K.caller_names(src_indices="device_indices", dst_indices="host_indices"):
        if layout == "layer_first":
            if backend == "kernel":
                K.transfer_rows_all_layers(device, host_layer_views, device_indices, host_indices)
            else:
                K.direct_transfer_rows(
                    device, host_layer_views, device_indices, host_indices, page_size
                )
        elif layout == "page_first":
            K.backup_all_layers_to_page_first(device, host, device_indices, host_indices)
        else:
            K.direct_backup_all_layers_to_page_first_direct(
                device, host, device_indices, host_indices, page_size
            )
