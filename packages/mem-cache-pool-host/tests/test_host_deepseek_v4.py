"""DeepSeekV4SingleKVPoolHost: bit-exact device -> host -> device round trips of page rows and
of single token records (split page layout), for every layout."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mem_cache_pool.deepseek_v4 import DeepSeekV4SingleKVPool, HiSparseC4DevicePool
from mem_cache_pool.mla import MLATokenToKVPool
from mem_cache_pool_host.deepseek_v4 import DeepSeekV4SingleKVPoolHost

FP8 = torch.float8_e4m3fn
CASES = [("layer_first", "kernel"), ("layer_first", "direct"), ("page_first", "kernel"),
         ("page_first_direct", "direct")]  # fmt: skip


def _device(seed: int = 0, cls: type[DeepSeekV4SingleKVPool] = DeepSeekV4SingleKVPool) -> Any:
    """size 16, page 4 -> 5 page rows of 2880 bytes, 2 layers, filled with random bytes."""
    pool = cls(16, 4, FP8, 448, 64, 2, "cpu")
    gen = torch.Generator().manual_seed(seed)
    for buf in pool.kv_buffer:
        buf.copy_(torch.randint(0, 256, buf.shape, dtype=torch.uint8, generator=gen))
    return pool


def _layer_view(buf: torch.Tensor, layout: str, layer: int) -> torch.Tensor:
    """Independent oracle of the host layouts: page rows ``[rows, bytes]`` of one layer."""
    if layout == "layer_first":
        return buf[layer]
    return buf[:, layer] if layout == "page_first" else buf[:, layer, 0]


def _host(device: DeepSeekV4SingleKVPool, layout: str, backend: str) -> DeepSeekV4SingleKVPoolHost:
    return DeepSeekV4SingleKVPoolHost(device, layout=layout, io_backend=backend, pin_memory=False)


def test_host_mirrors_page_rows() -> None:
    dev = _device()
    host = _host(dev, "page_first", "kernel")
    # device descriptor: 4 page rows + the padding row; ratio 2 -> 8 host page rows
    assert (host.page_size, host.size, host.tokens_per_page, host.token_size) == (1, 8, 4, 32)
    assert host.row_bytes == (2880,) and host.size_per_token == 2 * 2880
    assert tuple(host.kv_buffer.shape) == (8, 2, 2880) and host.kv_buffer.dtype == torch.uint8
    rows = host.alloc(3)
    assert rows is not None and rows.tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="DeepSeekV4SingleKVPool"):
        DeepSeekV4SingleKVPoolHost(MLATokenToKVPool(8, 4, torch.bfloat16, 8, 4, 1, "cpu"))  # type: ignore[arg-type]


@pytest.mark.parametrize(("layout", "backend"), CASES)
def test_page_round_trip_is_bit_exact(layout: str, backend: str) -> None:
    dev = _device(seed=1)
    host = _host(dev, layout, backend)
    pages = torch.tensor([3, 1, 2])
    host_rows = torch.tensor([5, 0, 6])
    want = [b[pages].clone() for b in dev.kv_buffer]
    host.backup_pages(dev, host_rows, pages, io_backend=backend)
    fresh = _device(seed=2)
    untouched = [b.clone() for b in fresh.kv_buffer]
    target = torch.tensor([4, 2, 1])
    for layer in range(2):
        host.load_pages_per_layer(fresh, host_rows, target, layer, io_backend=backend)
    for layer in range(2):
        assert torch.equal(fresh.kv_buffer[layer][target], want[layer])
        assert torch.equal(fresh.kv_buffer[layer][[0, 3]], untouched[layer][[0, 3]])
    # token records survive the page move, read through the pool
    assert torch.equal(
        fresh.get_key_records(1, torch.tensor([16, 17, 18, 19])),
        dev.get_key_records(1, torch.tensor([12, 13, 14, 15])),
    )


@pytest.mark.parametrize(("layout", "backend"), CASES)
def test_token_round_trip_is_bit_exact(layout: str, backend: str) -> None:
    dev = _device(seed=3)
    host = _host(dev, layout, backend)
    src = torch.tensor([5, 14, 7, 8])  # tokens scattered over pages 1, 3, 1, 2
    host_tokens = torch.tensor([1, 2, 30, 13])  # host rows 0, 0, 7, 3
    before = host.kv_buffer.clone()
    host.backup_tokens_from_device_all_layer(dev, host_tokens, src)
    # only bytes inside the value/scale runs of the four host tokens may change
    allowed = torch.zeros_like(host.kv_buffer, dtype=torch.bool)
    for layer in range(2):
        view = _layer_view(allowed, layout, layer)
        for t in host_tokens.tolist():
            row, off = divmod(t, 4)
            view[row, off * 576 : off * 576 + 576] = True
            view[row, 4 * 576 + off * 8 : 4 * 576 + off * 8 + 8] = True
    changed = host.kv_buffer != before
    assert int(changed.sum()) > 0 and not bool((changed & ~allowed).any())
    fresh = _device(seed=4)
    target = torch.tensor([12, 9, 4, 6])
    for layer in range(2):
        host.load_tokens_to_device_per_layer(fresh, host_tokens, target, layer)
    for layer in range(2):
        assert torch.equal(fresh.get_key_records(layer, target), dev.get_key_records(layer, src))
    untouched = torch.tensor([5, 7, 8, 10, 11, 13, 14, 15])
    assert torch.equal(
        fresh.get_key_records(0, untouched), _device(seed=4).get_key_records(0, untouched)
    )


def test_token_ops_validate_and_abort_the_counter() -> None:
    dev = _device()
    host = _host(dev, "layer_first", "kernel")
    with pytest.raises(ValueError, match=r"host_indices values must lie in \[0, 32\)"):
        host.backup_tokens_from_device_all_layer(dev, torch.tensor([32]), torch.tensor([4]))
    with pytest.raises(ValueError, match="equal lengths"):
        host.backup_tokens_from_device_all_layer(dev, torch.tensor([1, 2]), torch.tensor([4]))
    with pytest.raises(ValueError, match=r"device_indices values must lie in \[0, 20\)"):
        host.backup_tokens_from_device_all_layer(dev, torch.tensor([1]), torch.tensor([20]))
    with pytest.raises(ValueError, match="device_indices must be a tensor with data"):
        host.backup_tokens_from_device_all_layer(
            dev, torch.tensor([1]), torch.tensor([4], device="meta")
        )
    host.layer_done_counter.begin()
    with pytest.raises(ValueError, match=r"layer_id must be <= 1, got"):
        host.load_tokens_to_device_per_layer(dev, torch.tensor([1]), torch.tensor([4]), 2)
    with pytest.raises(Exception, match="abort"):
        host.layer_done_counter.wait_until(0)


def test_hisparse_c4_device_pool_round_trip() -> None:
    dev = _device(seed=5, cls=HiSparseC4DevicePool)
    host = _host(dev, "page_first", "kernel")
    host.backup_tokens_from_device_all_layer(dev, torch.tensor([0, 1]), torch.tensor([6, 7]))
    host.backup_pages(dev, torch.tensor([3]), torch.tensor([4]))
    fresh = _device(seed=6, cls=HiSparseC4DevicePool)
    for layer in range(2):
        host.load_tokens_to_device_per_layer(
            fresh, torch.tensor([0, 1]), torch.tensor([9, 10]), layer
        )
        host.load_pages_per_layer(fresh, torch.tensor([3]), torch.tensor([1]), layer)
    raw_src = dev.get_cpu_copy(torch.tensor([6, 7, 16, 19]))["kv"]  # device slots
    raw_dst = fresh.get_cpu_copy(torch.tensor([9, 10, 4, 7]))["kv"]
    assert all(torch.equal(a, b) for a, b in zip(raw_src, raw_dst))
