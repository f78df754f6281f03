"""Host pool sizing: ratio, explicit bytes, whole pages (no extra page), preflight errors."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch

from mem_cache_pool_host import (
    MHATokenToKVPoolHost,
    MLATokenToKVPoolHost,
    plan_host_capacity,
    preflight_host_memory,
)
from mem_cache_pool_host.capacity import available_host_memory, default_reserve_bytes

MakePool = Callable[..., Any]


@pytest.mark.parametrize(
    ("device_size", "ratio", "page_size", "expected_pages"),
    [(64, 2.0, 1, 128), (64, 2.0, 16, 8), (100, 1.5, 16, 9), (64, 0.5, 16, 2), (10, 1.0, 4, 2)],
)
def test_ratio_sizing_rounds_down_to_whole_pages(
    device_size: int, ratio: float, page_size: int, expected_pages: int
) -> None:
    cap = plan_host_capacity(
        device_size=device_size, bytes_per_token=64, page_size=page_size, host_to_device_ratio=ratio
    )
    assert cap.num_pages == expected_pages
    assert cap.size == expected_pages * page_size
    assert cap.nbytes == cap.size * 64


def test_explicit_bytes_win_over_ratio_and_round_down() -> None:
    cap = plan_host_capacity(
        device_size=64,
        bytes_per_token=100,
        page_size=4,
        host_to_device_ratio=2.0,
        host_size_bytes=4 * 100 * 7 + 399,
    )
    assert cap.num_pages == 7


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"host_size_bytes": 10}, "host_size_bytes=10 holds no page"),
        ({"host_to_device_ratio": 0.01}, "host_to_device_ratio=0.01"),
        ({"host_to_device_ratio": -1.0}, "host_to_device_ratio must be > 0"),
        ({"host_size_bytes": -1}, "host_size_bytes must be >= 0"),
        ({"page_size": 0}, "page_size"),
    ],
)
def test_sizing_errors_name_the_argument(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"device_size": 64, "bytes_per_token": 64, "page_size": 16}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        plan_host_capacity(**args)  # type: ignore[arg-type]


def test_sizing_rejects_a_ratio_that_is_not_a_number() -> None:
    with pytest.raises(TypeError, match="host_to_device_ratio must be a number, got str"):
        plan_host_capacity(
            device_size=64, bytes_per_token=64, page_size=16, host_to_device_ratio="2"
        )  # type: ignore[arg-type]


def test_preflight_fails_before_allocating_with_the_numbers() -> None:
    with pytest.raises(ValueError, match=r"needs 2000 bytes .* only 500 bytes"):
        preflight_host_memory(2000, reserve_bytes=500, available=1000)
    preflight_host_memory(500, reserve_bytes=500, available=1000)  # fits exactly
    with pytest.raises(ValueError, match="reserve_bytes"):
        preflight_host_memory(1, reserve_bytes=-1, available=10)


def test_available_memory_and_reserve_are_sane() -> None:
    avail = available_host_memory()
    assert avail is None or avail > 0
    assert 0 < default_reserve_bytes() <= 10 * 1024**3


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_pool_sizes_in_whole_pages_without_an_extra_page(kind: str, make_pool: MakePool) -> None:
    device = make_pool(kind, torch.bfloat16, page_size=16, size=64, seed=None)
    cls = MHATokenToKVPoolHost if kind == "mha" else MLATokenToKVPoolHost
    host = cls(device)
    desc = device.get_buffer_desc()
    assert host.size == 128 and host.page_num == 8  # 2.0 x 64, no extra page
    assert host.available_size() == 128
    assert host.size_per_token == desc.bytes_per_token == host.get_size_per_token()
    one_page = desc.bytes_per_token * 16
    host2 = cls(device, host_size_bytes=3 * one_page + 1)
    assert host2.size == 48
    host.close()
    host2.close()


def test_pool_preflight_rejects_an_impossible_size(make_pool: MakePool) -> None:
    device = make_pool("mha", torch.float16, page_size=1, size=16, seed=None)
    with pytest.raises(ValueError, match="host KV pool needs"):
        MHATokenToKVPoolHost(device, host_size_bytes=1 << 60)


def test_pool_smaller_than_device_warns(
    make_pool: MakePool, caplog: pytest.LogCaptureFixture
) -> None:
    device = make_pool("mha", torch.float16, page_size=1, size=16, seed=None)
    with caplog.at_level(logging.WARNING):
        host = MHATokenToKVPoolHost(device, host_to_device_ratio=0.5)
    assert host.size == 8
    assert "smaller than the device pool" in caplog.text


def test_pool_rejects_mismatched_arguments(make_pool: MakePool) -> None:
    mha = make_pool("mha", torch.float16, page_size=4, size=16, seed=None)
    mla = make_pool("mla", torch.float16, page_size=4, size=16, seed=None)
    with pytest.raises(ValueError, match=r"got \('kv',\)"):
        MHATokenToKVPoolHost(mla)
    with pytest.raises(ValueError, match=r"got \('k', 'v'\)"):
        MLATokenToKVPoolHost(mha)
    with pytest.raises(ValueError, match="page_size must equal"):
        MHATokenToKVPoolHost(mha, page_size=8)
    with pytest.raises(ValueError, match="layout must be one of"):
        MHATokenToKVPoolHost(mha, layout="page_head")
    with pytest.raises(ValueError, match="device must be 'cpu'"):
        MHATokenToKVPoolHost(mha, device="meta")
    with pytest.raises(TypeError, match="get_buffer_desc"):
        MHATokenToKVPoolHost(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"allocator must have allocate_bytes\(nbytes\)"):
        MHATokenToKVPoolHost(mha, allocator=object())  # type: ignore[arg-type]
    host = MHATokenToKVPoolHost(mha)
    with pytest.raises(ValueError, match="page_size_bytes must be >= 1, got 0"):
        host.is_stride_page_aligned(0)
    with pytest.raises(TypeError, match="layer_index must be an int"):
        host.layer_done_counter.complete("0")  # type: ignore[arg-type]


def test_pool_accepts_a_buffer_descriptor(make_pool: MakePool) -> None:
    device = make_pool("mla", torch.float32, page_size=4, size=16, seed=None)
    host = MLATokenToKVPoolHost(device.get_buffer_desc(), layout="layer_first")
    assert host.kv_buffer.shape == (2, 32, 1, 24)
    assert host.kv_cache_dim == 24


def test_sglang_positional_signature(make_pool: MakePool) -> None:
    device = make_pool("mha", torch.float16, page_size=4, size=32, seed=None)
    # (device_pool, host_to_device_ratio, host_size (bytes here; 0 = use the ratio), page_size,
    #  layout, pin_memory, device)
    host = MHATokenToKVPoolHost(device, 1.5, 0, 4, "layer_first", True, "cpu")
    assert host.size == 48 and host.layout == "layer_first"
