"""Kernel argument errors from host-pool transfers name the host pool's arguments
(``mem_cache_pool_host._transfer`` wraps the kernel calls in ``caller_names``)."""

from __future__ import annotations

import pytest
import torch

from mem_cache_pool_host._transfer import backup_all_layers, load_one_layer


def _bufs() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    host = [torch.zeros(2, 8, 4)]  # [role][layer, rows, row]
    device = [torch.zeros(8, 4)]  # one layer of one role
    return host, device


def test_load_names_host_and_device_indices() -> None:
    host, device = _bufs()
    with pytest.raises((TypeError, ValueError)) as info:
        load_one_layer(
            layout="layer_first", backend="kernel", host=host, device_layer=device,
            host_indices=torch.tensor([1, 2, 3]), device_indices=torch.tensor([1, 2]),
            layer=0, page_size=1,
        )  # fmt: skip
    message = str(info.value)
    assert "host_indices" in message or "device_indices" in message, message
    assert "src_indices" not in message and "dst_indices" not in message, message


def test_backup_names_host_and_device_indices() -> None:
    host, device = _bufs()
    with pytest.raises((TypeError, ValueError)) as info:
        backup_all_layers(
            layout="layer_first", backend="kernel", device=[[device[0], device[0]]], host=host,
            host_layer_views=[[host[0][0], host[0][1]]], device_indices=torch.tensor([1, 2, 3]),
            host_indices=torch.tensor([1, 2]), page_size=1,
        )  # fmt: skip
    message = str(info.value)
    assert "host_indices" in message or "device_indices" in message, message
    assert "src_indices" not in message and "dst_indices" not in message, message
