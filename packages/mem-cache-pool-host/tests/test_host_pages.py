"""Storage page API: flat pages are layout independent, buffer meta points at the page bytes."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pytest
import torch

from mem_cache_pool_host import LAYOUTS, HostKVCache, MHATokenToKVPoolHost, MLATokenToKVPoolHost

MakePool = Callable[..., Any]

FP8 = getattr(torch, "float8_e4m3fn", torch.uint8)


def host_row(host: HostKVCache, role: int, layer: int, slot: int) -> torch.Tensor:
    """Independent oracle of where (role, layer, slot) lives in each layout."""
    buf = host.buffers[role]
    if host.layout == "layer_first":
        return buf[layer, slot]
    if host.layout == "page_first":
        return buf[slot, layer]
    return buf[slot // host.page_size, layer, slot % host.page_size]


def expected_flat_page(host: HostKVCache, index: int) -> torch.Tensor:
    parts = [
        host_row(host, r, layer, index + t).reshape(-1)
        for r in range(len(host.roles))
        for layer in range(host.layer_num)
        for t in range(host.page_size)
    ]
    return torch.cat(parts)


def make_host(make_pool, kind: str, layout: str, dtype: torch.dtype, ps: int = 4) -> HostKVCache:
    device = make_pool(kind, dtype, page_size=ps, size=16, seed=None)
    cls = MHATokenToKVPoolHost if kind == "mha" else MLATokenToKVPoolHost
    host = cls(device, layout=layout)
    gen = torch.Generator().manual_seed(1)
    for buf in host.buffers:
        raw = buf.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    return host


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8])
def test_data_page_matches_the_layout_oracle(
    make_pool, kind: str, layout: str, dtype: torch.dtype
) -> None:
    host = make_host(make_pool, kind, layout, dtype)
    for index in (0, 8, host.size - host.page_size):
        page = host.get_data_page(index)
        assert page.dim() == 1 and page.numel() == host.page_numel
        assert page.dtype == host.store_dtype
        assert same_bytes(page, expected_flat_page(host, index))
        shaped = host.get_data_page(index, flat=False)
        assert shaped.shape[:3] == (len(host.roles), host.layer_num, host.page_size)
        assert same_bytes(shaped.reshape(-1), page)


@pytest.mark.parametrize("src_layout", LAYOUTS)
@pytest.mark.parametrize("dst_layout", LAYOUTS)
def test_flat_page_round_trips_across_layouts(
    make_pool: MakePool, src_layout: str, dst_layout: str
) -> None:
    src = make_host(make_pool, "mha", src_layout, torch.float16)
    dst = make_host(make_pool, "mha", dst_layout, torch.float16)
    neighbour = dst.get_data_page(4)
    page = src.get_data_page(12)
    dst.set_from_flat_data_page(8, page)
    assert same_bytes(dst.get_data_page(8), page)
    assert same_bytes(dst.get_data_page(4), neighbour)  # nothing else written
    src.set_from_flat_data_page(0, src.get_dummy_flat_data_page())
    assert not bool(src.get_data_page(0).view(torch.uint8).any())


def test_set_page_validates(make_pool: MakePool) -> None:
    host = make_host(make_pool, "mla", "page_first", FP8)
    page = host.get_dummy_flat_data_page()
    assert page.numel() == host.page_numel and page.dtype == torch.uint8
    host.set_from_flat_data_page(4, page.view(FP8))  # logical fp8 accepted
    with pytest.raises(ValueError, match="elements"):
        host.set_from_flat_data_page(4, page[1:])
    with pytest.raises(ValueError, match="dtype"):
        host.set_from_flat_data_page(4, page.float())
    with pytest.raises(ValueError, match="first slot of a page"):
        host.set_from_flat_data_page(3, page)
    with pytest.raises(ValueError, match="first slot of a page"):
        host.get_data_page(host.size)
    with pytest.raises(TypeError, match="index"):
        host.get_data_page(torch.tensor(4))  # type: ignore[arg-type]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_page_buffer_meta_points_at_layout_native_page_bytes(
    make_pool, kind: str, layout: str
) -> None:

    host = make_host(make_pool, kind, layout, torch.float16)
    ps, n_roles, n_layers = host.page_size, len(host.roles), host.layer_num
    indices = torch.cat([torch.arange(12, 16), torch.arange(4, 8)])
    ptrs, sizes = host.get_page_buffer_meta(indices)
    per_page = n_roles * (n_layers if layout == "layer_first" else 1)
    assert len(ptrs) == len(sizes) == 2 * per_page
    assert sum(sizes) == 2 * host.page_numel * host.buffers[0].element_size()
    k = 0
    for start in (12, 4):
        for r in range(n_roles):
            layers = range(n_layers) if layout == "layer_first" else [None]
            for layer in layers:
                got = ctypes.string_at(ptrs[k], sizes[k])
                if layout == "layer_first":
                    rows = [host_row(host, r, layer, start + t) for t in range(ps)]  # type: ignore[arg-type]
                elif layout == "page_first":
                    rows = [
                        host_row(host, r, l, start + t) for t in range(ps) for l in range(n_layers)
                    ]
                else:
                    rows = [
                        host_row(host, r, l, start + t) for l in range(n_layers) for t in range(ps)
                    ]
                want = torch.cat([x.reshape(-1) for x in rows]).view(torch.uint8).numpy().tobytes()
                assert got == want
                k += 1
    with pytest.raises(ValueError, match="whole pages"):
        host.get_page_buffer_meta([1, 2, 3, 4])


def test_stride_alignment(make_pool: MakePool) -> None:
    # MHA row = 2 heads x 8 dims x 2 bytes = 32 B; 2 layers; page of 64 tokens = 4 KiB per role
    aligned = MHATokenToKVPoolHost(
        make_pool("mha", torch.float16, page_size=64, size=128, seed=None)
    )
    assert aligned.is_stride_page_aligned(4096)
    small_pages = make_pool("mha", torch.float16, page_size=16, size=64, seed=None)
    small = MHATokenToKVPoolHost(small_pages)
    assert not small.is_stride_page_aligned(4096)
    assert small.is_stride_page_aligned(1024)
