"""Bit-exact device -> host -> device round trips for every layout x IO backend x dtype, MHA and
MLA, page sizes 1 and 16, contiguous and scattered indices; checked against an independent
oracle of the host layouts, and nothing outside the target rows is written."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from mem_cache_pool import KVCache
from mem_cache_pool_host import (
    LAYOUTS,
    HostKVCache,
    LayerLoadAbortedError,
    MHATokenToKVPoolHost,
    MLATokenToKVPoolHost,
)

MakePool = Callable[..., Any]
FP8 = getattr(torch, "float8_e4m3fn", torch.uint8)
DTYPES = [torch.bfloat16, torch.float16, torch.float32, FP8]
CASES = [
    (layout, backend)
    for layout in LAYOUTS
    for backend in ("kernel", "direct")
    if (layout, backend) != ("page_first", "direct")  # rejected, see below
]


def host_rows(host: HostKVCache, role: int, layer: int, slots: torch.Tensor) -> torch.Tensor:
    """Independent oracle: the host rows of (role, layer, slots) in the pool's layout."""
    buf = host.buffers[role]
    if host.layout == "layer_first":
        return buf[layer][slots]
    if host.layout == "page_first":
        return buf[slots, layer]
    ps = host.page_size
    return buf[slots // ps, layer, slots % ps]


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1).view(torch.uint8)


def pages_to_slots(pages: list[int], ps: int) -> torch.Tensor:
    return (torch.tensor(pages)[:, None] * ps + torch.arange(ps)).reshape(-1)


def make_host(kind: str, device: KVCache, layout: str) -> HostKVCache:
    cls = MHATokenToKVPoolHost if kind == "mha" else MLATokenToKVPoolHost
    return cls(device, layout=layout)


def snapshot(device: KVCache) -> list[list[torch.Tensor]]:
    return [[b.clone() for b in role] for role in device.get_buffer_desc().buffers]


@pytest.mark.parametrize(("layout", "io_backend"), CASES)
@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("ps", [1, 16])
@pytest.mark.parametrize("scattered", [False, True], ids=["contiguous", "scattered"])
def test_round_trip_is_bit_exact(  # noqa: PLR0917 (pytest parametrization)
    make_pool: MakePool,
    layout: str,
    io_backend: str,
    kind: str,
    dtype: torch.dtype,
    ps: int,
    scattered: bool,
) -> None:
    device = make_pool(kind, dtype, page_size=ps, size=64, layer_num=2, seed=ps)
    host = make_host(kind, device, layout)  # 128 host slots
    desc = device.get_buffer_desc()
    n_pages = 3 if ps == 16 else 12
    if scattered:
        dev_pages = [4, 1, 3] if ps == 16 else [9, 2, 40, 17, 3, 60, 5, 33, 12, 48, 6, 21]
        host_pages = [7, 2, 5] if ps == 16 else [100, 3, 64, 7, 90, 8, 1, 120, 55, 4, 77, 30]
        back_pages = [2, 3, 1] if ps == 16 else [50, 1, 14, 30, 2, 44, 63, 8, 19, 27, 11, 36]
    else:
        dev_pages = list(range(1, 1 + n_pages))
        host_pages = list(range(2, 2 + n_pages))
        back_pages = list(range(2, 2 + n_pages))
    didx = pages_to_slots(dev_pages, ps)
    hidx = pages_to_slots(host_pages, ps)
    original = snapshot(device)

    host.backup_from_device_all_layer(device, hidx, didx, io_backend)
    for r in range(len(desc.roles)):
        for layer in range(desc.layer_num):
            want = as_bytes(original[r][layer][didx])
            assert torch.equal(as_bytes(host_rows(host, r, layer, hidx)), want)

    for role in desc.buffers:  # wipe the device, then load every layer back elsewhere
        for b in role:
            b.view(torch.uint8).zero_()
    target = pages_to_slots(back_pages, ps)
    counter = host.layer_done_counter
    counter.begin()
    for layer in range(desc.layer_num):
        host.load_to_device_per_layer(device, hidx, target, layer, io_backend)
    assert not counter.in_flight
    untouched = torch.ones(desc.size + ps, dtype=torch.bool)
    untouched[target] = False
    for r in range(len(desc.roles)):
        for layer in range(desc.layer_num):
            buf = desc.buffers[r][layer]
            assert torch.equal(as_bytes(buf[target]), as_bytes(original[r][layer][didx]))
            assert not bool(as_bytes(buf[untouched]).any())


def test_page_first_with_direct_is_fixed_up_or_rejected(make_pool: MakePool) -> None:
    device = make_pool("mha", torch.float16, page_size=4, size=16)
    fixed = MHATokenToKVPoolHost(device, layout="page_first", io_backend="direct")
    assert fixed.layout == "page_first_direct"
    kernel_pool = MHATokenToKVPoolHost(device, layout="page_first", io_backend="kernel")
    assert kernel_pool.layout == "page_first"
    slots = torch.arange(4, 8)
    with pytest.raises(ValueError, match="'direct' cannot transfer layout 'page_first'"):
        kernel_pool.backup_from_device_all_layer(device, slots, slots, "direct")
    with pytest.raises(ValueError, match="io_backend must be one of"):
        kernel_pool.backup_from_device_all_layer(device, slots, slots, "kernel_ascend")
    with pytest.raises(ValueError, match="io_backend must be one of"):
        MHATokenToKVPoolHost(device, io_backend="dma")


def test_transfers_accept_descriptors_and_compatible_pools(make_pool: MakePool) -> None:
    device = make_pool("mla", torch.bfloat16, page_size=4, size=16, seed=3)
    twin = make_pool("mla", torch.bfloat16, page_size=4, size=16, seed=None)
    host = MLATokenToKVPoolHost(device.get_buffer_desc(), layout="layer_first")
    slots = torch.arange(4, 12)
    host.backup_from_device_all_layer(device, slots, slots)
    for layer in range(2):
        host.load_to_device_per_layer(twin.get_buffer_desc(), slots, slots, layer)
    for a, b in zip(device.get_buffer_desc().buffers[0], twin.get_buffer_desc().buffers[0]):
        assert torch.equal(as_bytes(a[slots]), as_bytes(b[slots]))
    other = make_pool("mla", torch.float32, page_size=4, size=16, seed=None)
    with pytest.raises(ValueError, match="does not match"):
        host.backup_from_device_all_layer(other, slots, slots)


def test_failed_load_aborts_the_batch_and_copies_nothing(make_pool: MakePool) -> None:
    device = make_pool("mha", torch.float16, page_size=1, size=16, seed=4)
    host = MHATokenToKVPoolHost(device, layout="page_first")
    device.register_layer_transfer_counter(host.layer_done_counter)
    before = snapshot(device)
    host.layer_done_counter.begin()
    with pytest.raises(ValueError):
        host.load_to_device_per_layer(device, torch.tensor([0, 999]), torch.tensor([1, 2]), 0)
    with pytest.raises(LayerLoadAbortedError):
        device.get_key_buffer(0)
    after = snapshot(device)
    assert all(
        torch.equal(as_bytes(a), as_bytes(b))
        for ra, rb in zip(before, after)
        for a, b in zip(ra, rb)
    )
    with pytest.raises(ValueError, match="layer_id"):
        host.load_to_device_per_layer(
            device, torch.tensor([0]), torch.tensor([1]), 2, is_draft=True
        )
    host.layer_done_counter.reset()
    device.get_key_buffer(1)


def test_direct_io_rejects_partial_pages(make_pool: MakePool) -> None:
    device = make_pool("mha", torch.float16, page_size=4, size=16, seed=5)
    host = MHATokenToKVPoolHost(device, layout="page_first_direct")
    before = [b.clone() for b in host.buffers]
    with pytest.raises(ValueError, match="host_indices length must be a multiple of page_size=4"):
        host.backup_from_device_all_layer(device, torch.arange(0, 3), torch.arange(4, 7), "direct")
    with pytest.raises(ValueError, match="device_indices must hold whole pages of 4 consecutive"):
        host.backup_from_device_all_layer(
            device, torch.arange(0, 4), torch.tensor([4, 5, 7, 6]), "direct"
        )
    with pytest.raises(ValueError, match="host_indices pages must start at multiples"):
        host.backup_from_device_all_layer(device, torch.arange(1, 5), torch.arange(4, 8), "direct")
    assert all(torch.equal(a, b) for a, b in zip(before, host.buffers))


@pytest.mark.parametrize(
    ("host_idx", "dev_idx", "error", "match"),
    [
        ([0, 1], [1], ValueError, "equal lengths, got host_indices=2, device_indices=1"),
        ([0, 99], [1, 2], ValueError, r"host_indices values must lie in \[-1, 32\), got min 0"),
        ([0, 1], [1, 20], ValueError, r"device_indices values must lie in \[-1, 20\)"),
        ([0, -2], [1, 2], ValueError, r"host_indices values must lie in \[-1, 32\), got min -2"),
        ([0.0, 1.0], [1, 2], TypeError, "host_indices must be int32 or int64"),
        ([[0, 1]], [1, 2], ValueError, "host_indices must be 1-D"),
        ("meta", [1, 2], ValueError, "host_indices must be a tensor with data"),
    ],
)
@pytest.mark.parametrize("direction", ["load", "backup"])
def test_bad_indices_name_the_callers_argument_and_copy_nothing(  # noqa: PLR0917
    make_pool: MakePool,
    host_idx: Any,
    dev_idx: list[int],
    error: type[Exception],
    match: str,
    direction: str,
) -> None:
    device = make_pool("mha", torch.float16, page_size=4, size=16, seed=7)
    host = MHATokenToKVPoolHost(device, layout="layer_first")
    host_before, dev_before = [b.clone() for b in host.buffers], snapshot(device)
    hidx = torch.tensor([0, 1], device="meta") if host_idx == "meta" else torch.tensor(host_idx)
    didx = torch.tensor(dev_idx)
    with pytest.raises(error, match=match):
        if direction == "load":
            host.load_to_device_per_layer(device, hidx, didx, 0)
        else:
            host.backup_from_device_all_layer(device, hidx, didx)
    assert all(torch.equal(a, b) for a, b in zip(host_before, host.buffers))
    assert all(
        torch.equal(as_bytes(a), as_bytes(b))
        for ra, rb in zip(dev_before, snapshot(device))
        for a, b in zip(ra, rb)
    )
    with pytest.raises(TypeError, match="layer_id must be an int"):
        host.load_to_device_per_layer(device, torch.tensor([0]), torch.tensor([1]), 0.0)  # type: ignore[arg-type]


def test_kernel_io_to_an_accelerator_needs_pinned_memory(make_pool: MakePool) -> None:
    device = make_pool("mha", torch.float16, page_size=4, size=16, seed=None)
    host = MHATokenToKVPoolHost(device, pin_memory=False, layout="layer_first")
    assert not host.pinned
    remote = dataclasses.replace(device.get_buffer_desc(), device=torch.device("meta"))
    slots = torch.arange(4, 8)
    with pytest.raises(ValueError, match="needs it pinned"):
        host.backup_from_device_all_layer(remote, slots, slots, "kernel")


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_negative_indices_are_skipped(make_pool: MakePool, layout: str) -> None:
    device = make_pool("mla", torch.float16, page_size=1, size=16, seed=6)
    host = MLATokenToKVPoolHost(device, layout=layout)
    for b in host.buffers:
        b.view(torch.uint8).fill_(0xAB)
    hidx = torch.tensor([3, 4, 5, 6])
    didx = torch.tensor([7, -1, 9, 10])
    host.backup_from_device_all_layer(device, hidx, didx, "kernel")
    desc = device.get_buffer_desc()
    for layer in range(2):
        rows = as_bytes(host_rows(host, 0, layer, hidx))
        assert torch.equal(rows[[0, 2, 3]], as_bytes(desc.buffers[0][layer][didx[[0, 2, 3]]]))
        assert bool((rows[1] == 0xAB).all())  # skipped pair: host row untouched


def test_a_layer_beyond_the_pool_is_a_no_op_as_in_sglang(make_pool: MakePool) -> None:
    """SGLang's load_to_device_per_layer returns for a non-draft layer outside the pool."""
    device = make_pool("mha", torch.float16, page_size=1, size=16, seed=6)
    host = MHATokenToKVPoolHost(device, layout="layer_first")
    h = host.alloc(2)
    assert h is not None
    host.backup_from_device_all_layer(device, h, torch.tensor([3, 4]), "direct")
    before = snapshot(device)
    for layer in (-1, 2, 99):
        host.load_to_device_per_layer(device, h, torch.tensor([5, 6]), layer, "direct")
    assert all(
        torch.equal(as_bytes(a), as_bytes(b))
        for ra, rb in zip(before, snapshot(device))
        for a, b in zip(ra, rb)
    )
    host.load_to_device_per_layer_physical(device, h, torch.tensor([5, 6]), 1, "direct")
    k = device.get_buffer_desc().buffers[0][1]
    assert torch.equal(as_bytes(k[5:7]), as_bytes(k[3:5]))
