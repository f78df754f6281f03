"""MambaPoolHost: host backup and load of request states, bit-exact (torch and the Triton
interpreter), sized like SGLang's, slot bookkeeping, storage pages and zero-copy metadata."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

from mem_cache_pool import Mamba2CacheParams, Mamba2StateShape, MambaPool
from mem_cache_pool_host import LayerDoneCounter, MambaPoolHost, MambaStateBufferInfo

LAYERS = [0, 2, 3]

# Without a GPU the Triton kernels run interpreted (read when a kernel module is first imported)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _device(size: int = 8) -> MambaPool:
    shape = Mamba2StateShape.create(
        tp_world_size=1,
        intermediate_size=8,
        n_groups=1,
        num_heads=2,
        head_dim=4,
        state_size=4,
        conv_kernel=4,
    )
    pool = MambaPool(
        size=size,
        spec_state_size=2,
        cache_params=Mamba2CacheParams(shape=shape, layers=LAYERS),
        mamba_layer_ids=LAYERS,
        device="cpu",
    )
    g = torch.Generator().manual_seed(size)
    for t in [*pool.mamba_cache.conv, pool.mamba_cache.temporal]:
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    return pool


def _states(pool: MambaPool) -> list[torch.Tensor]:
    return [*pool.mamba_cache.conv, pool.mamba_cache.temporal]


def _host(pool: MambaPool, **kw: object) -> MambaPoolHost:
    return MambaPoolHost(pool, 2.0, 0, device_capacity=pool.size, pin_memory=False, **kw)  # type: ignore[arg-type]


def test_sizing_and_layout_follow_sglang() -> None:
    dev = _device()
    host = _host(dev)
    assert host.size == 2 * 8 + 1 and host.page_size == 1
    per = (16 * 3 * 2 + 2 * 4 * 4 * 4) * 3
    assert host.get_size_per_token() == per
    assert host.temporal_buffer.shape == (17, 3, 1, 2, 4, 4)
    assert host.conv_buffer[0].shape == (17, 3, 1, 16, 3)
    by_gb = MambaPoolHost(dev, 2.0, per * 10 / 1e9, device_capacity=8, pin_memory=False)
    assert by_gb.size == 11
    with pytest.raises(ValueError, match="layout"):
        _host(dev, layout="layer_first")
    info = MambaStateBufferInfo.from_pool(dev)
    assert MambaPoolHost(info, 1.0, 0, device_capacity=4, pin_memory=False).size == 5


@pytest.mark.parametrize("io_backend", ["kernel", "direct"])
def test_backup_then_load_is_bit_exact(io_backend: str) -> None:
    dev = _device()
    host = _host(dev)
    slots = host.alloc(3)
    assert slots is not None
    device_slots = torch.tensor([5, 1, 7])
    host.backup_from_device_all_layer(dev, slots, device_slots, io_backend=io_backend)
    saved = [t[:, device_slots].clone() for t in _states(dev)]
    for t in _states(dev):
        t.zero_()
    target = torch.tensor([2, 3, 4])
    counter: LayerDoneCounter = host.layer_done_counter
    counter.begin()
    for layer in range(len(LAYERS)):
        host.load_to_device_per_layer(dev, slots, target, layer, io_backend=io_backend)
        counter.wait_until(layer)
    for t, want in zip(_states(dev), saved):
        assert torch.equal(t[:, target], want)
        assert not t[:, [0, 1, 5, 6, 7, 8]].any()


def test_backup_and_load_through_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("triton") is None:
        pytest.fail("triton is not installed: the Triton path of the host tier cannot be tested")
    monkeypatch.setenv("MEM_CACHE_KERNELS_BACKEND", "triton")
    dev = _device()
    host = _host(dev)
    slots = host.alloc(2)
    assert slots is not None
    host.backup_from_device_all_layer(dev, slots, torch.tensor([3, 6]))
    ref = _host(dev)
    ref_slots = ref.alloc(2)
    assert ref_slots is not None
    ref.backup_from_device_all_layer(dev, ref_slots, torch.tensor([3, 6]), io_backend="direct")
    assert torch.equal(host.temporal_buffer, ref.temporal_buffer)
    assert torch.equal(host.conv_buffer[0], ref.conv_buffer[0])
    other = _device(8)
    for t in _states(other):
        t.zero_()
    host.load_to_device_per_layer(other, slots, torch.tensor([1, 2]), 1)
    assert torch.equal(other.mamba_cache.temporal[1, [1, 2]], dev.mamba_cache.temporal[1, [3, 6]])
    assert not other.mamba_cache.temporal[0].any()
    assert "mem_cache_kernels._triton.mamba" in sys.modules  # the Triton kernels ran


def test_storage_pages_round_trip() -> None:
    dev = _device()
    host = _host(dev)
    slots = host.alloc(2)
    assert slots is not None
    host.backup_from_device_all_layer(dev, slots, torch.tensor([2, 4]))
    page = host.get_data_page(int(slots[0]))
    assert page.dtype == torch.uint8 and page.numel() == host.get_size_per_token()
    assert host.get_dummy_flat_data_page().numel() == page.numel()
    fresh = _host(dev)
    (dst,) = fresh.alloc(1).tolist()  # type: ignore[union-attr]
    fresh.set_from_flat_data_page(dst, page)
    assert torch.equal(fresh.temporal_buffer[dst], host.temporal_buffer[int(slots[0])])
    assert torch.equal(fresh.conv_buffer[0][dst], host.conv_buffer[0][int(slots[0])])
    with pytest.raises(ValueError, match="bytes"):
        fresh.set_from_flat_data_page(dst, page[:-1])
    ptrs, sizes = host.get_page_buffer_meta(slots)
    assert len(ptrs) == 4 and sizes == [3 * 32 * 4, 3 * 48 * 2] * 2
    # the ranges concatenated are the flat page
    t0 = int(slots[0])
    assert ptrs[0] == host.temporal_buffer[t0].data_ptr()
    assert ptrs[1] == host.conv_buffer[0][t0].data_ptr()


def test_slot_errors_change_nothing() -> None:
    dev = _device()
    host = _host(dev)
    slots = host.alloc(2)
    assert slots is not None
    before = host.available_size()
    with pytest.raises(ValueError):
        host.free(torch.tensor([int(slots[0]), int(slots[0])]))
    assert host.available_size() == before
    assert host.alloc(host.size + 1) is None
    unallocated = torch.tensor([host.size - 1])
    with pytest.raises(ValueError, match="host_indices"):
        host.backup_from_device_all_layer(dev, unallocated, torch.tensor([1]))
    with pytest.raises(ValueError, match="device_indices"):
        host.backup_from_device_all_layer(dev, slots, torch.tensor([1]))
    with pytest.raises(ValueError, match="layer_id"):
        host.load_to_device_per_layer(dev, slots, torch.tensor([1, 2]), 3)
    assert host.free(slots) == 2


def test_sglang_host_members_answer_feature_off() -> None:
    dev = _device()
    host = _host(dev)
    assert (host.dcp_size, host.dcp_rank) == (1, 0)
    assert host.shared_allocation_domain is None and host.storage_format_tag is None
    assert host.stores_page_envelope is False and host.device_rows_packed is True
    assert host.pool_label == "mamba" and host.fd is None
    assert host.device_capacity_tokens == dev.size
    assert (host.logical_size, host.logical_page_size) == (host.size, 1)
    assert torch.equal(host.mem_state, torch.zeros(host.size, dtype=torch.uint8))
    assert not hasattr(host, "device_row_stride_bytes")
    # storage element size: the temporal state over every layer (first zero-copy range)
    assert host.get_page_buffer_element_size() == 3 * 32 * 4
    with pytest.raises(NotImplementedError):
        host.get_page_buffer_element_size(2)


def test_free_list_state_tracks_alloc_and_free() -> None:
    host = _host(_device())
    assert torch.equal(host.free_slots, torch.arange(host.size))
    assert host.release_slots == [] and host.num_release_slots == 0
    a = host.alloc(3)
    b = host.alloc(2)
    assert a is not None and b is not None
    assert torch.equal(host.free_slots, torch.arange(5, host.size))
    assert host.slot_used.tolist() == [True] * 5 + [False] * (host.size - 5)
    host.free(a)
    assert [t.tolist() for t in host.release_slots] == [a.tolist()]
    assert host.num_release_slots == 3
    assert len(host.free_slots) + host.num_release_slots == host.available_size()
    assert host.slot_used[a].tolist() == [False] * 3 and bool(host.slot_used[b].all())


def test_physical_hooks_move_the_same_bytes() -> None:
    dev = _device()
    host = _host(dev)
    slots = host.alloc(2)
    assert slots is not None
    src = torch.tensor([6, 1])
    h, d = host.prepare_transfer_indices(slots, src, "kernel")
    assert h is slots and d is src
    with pytest.raises(TypeError):
        host.prepare_transfer_indices(slots, src, 1)  # type: ignore[arg-type]
    host.backup_from_device_all_layer_physical(dev, h, d, "direct")
    saved = [t[:, src].clone() for t in _states(dev)]
    for t in _states(dev):
        t.zero_()
    target = torch.tensor([3, 4])
    for layer in range(len(LAYERS)):
        host.load_to_device_per_layer_physical(dev, slots, target, layer, "direct")
        host.layer_done_counter.wait_until(layer)
    for t, want in zip(_states(dev), saved):
        assert torch.equal(t[:, target], want)
