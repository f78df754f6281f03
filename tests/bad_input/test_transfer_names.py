"""Argument errors of host-pool transfers name the host pool's arguments (``host_indices``,
``device_indices``), never a kernel's (``src_indices``, ``slots``, ...): each transfer method
validates its own arguments before it calls the kernels' trusted body, for every layout and IO
backend, and for the Mamba host pool's state transfers."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from mem_cache_pool import Mamba2CacheParams, Mamba2StateShape, MambaPool, MHATokenToKVPool
from mem_cache_pool_host import MambaPoolHost, MHATokenToKVPoolHost

KERNEL_NAMES = ("src_indices", "dst_indices", "slots", "out_slots", "src_slots", "loc")
COMBOS = [("layer_first", "kernel"), ("layer_first", "direct"), ("page_first", "kernel"),
          ("page_first_direct", "direct")]  # fmt: skip


def _idx(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _bad_calls(host: object, device: object, layer: bool) -> list[Callable[[], None]]:
    """Mismatched lengths, an out-of-range host slot, an out-of-range device row."""

    def call(h: torch.Tensor, d: torch.Tensor) -> Callable[[], None]:
        if layer:
            return lambda: host.load_to_device_per_layer(device, h, d, 0)  # type: ignore[attr-defined]
        return lambda: host.backup_from_device_all_layer(device, h, d)  # type: ignore[attr-defined]

    return [
        call(_idx(0, 1, 2, 3), _idx(4, 5)),
        call(_idx(10**6, 1, 2, 3), _idx(4, 5, 6, 7)),
        call(_idx(0, 1, 2, 3), _idx(10**6, 5, 6, 7)),
    ]


def _assert_names(fn: Callable[[], None]) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        fn()
    message = str(info.value)
    assert "host_indices" in message or "device_indices" in message, message
    for kernel_name in KERNEL_NAMES:
        assert kernel_name not in message.replace("host_indices", "").replace(
            "device_indices", ""
        ), message


@pytest.mark.parametrize(("layout", "io_backend"), COMBOS)
@pytest.mark.parametrize("layer", [False, True], ids=["backup", "load"])
def test_kv_host_transfer_errors_name_host_and_device_indices(
    layout: str, io_backend: str, layer: bool
) -> None:
    device = MHATokenToKVPool(32, 4, torch.bfloat16, 1, 4, 2, "cpu")
    host = MHATokenToKVPoolHost(device, 2.0, 0, 4, layout, pin_memory=False, io_backend=io_backend)
    for fn in _bad_calls(host, device, layer):
        _assert_names(fn)


def _mamba() -> tuple[MambaPool, MambaPoolHost]:
    shape = Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=8, n_groups=1, num_heads=2, head_dim=4,
        state_size=4, conv_kernel=4,
    )  # fmt: skip
    pool = MambaPool(
        size=8, spec_state_size=2, cache_params=Mamba2CacheParams(shape=shape, layers=[0, 1]),
        mamba_layer_ids=[0, 1], device="cpu",
    )  # fmt: skip
    return pool, MambaPoolHost(pool, 2.0, 0, device_capacity=pool.size, pin_memory=False)


@pytest.mark.parametrize("layer", [False, True], ids=["backup", "load"])
def test_mamba_host_transfer_errors_name_host_and_device_indices(layer: bool) -> None:
    pool, host = _mamba()
    slots = host.alloc(4)
    assert slots is not None

    def call(h: torch.Tensor, d: torch.Tensor) -> Callable[[], None]:
        if layer:
            return lambda: host.load_to_device_per_layer(pool, h, d, 0)
        return lambda: host.backup_from_device_all_layer(pool, h, d)

    for fn in (
        call(slots, _idx(1, 2)),
        call(slots, _idx(1, 2, 3, 10**6)),
        call(_idx(10**6, 1, 2, 3), _idx(1, 2, 3, 4)),
    ):
        _assert_names(fn)
