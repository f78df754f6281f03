"""Shared fixtures: small host pools on the CPU."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from mem_cache_pool import MHATokenToKVPool
from mem_cache_pool_host import MHATokenToKVPoolHost

PS = 4


def make_host(layout: str = "page_first", size: int = 64, ratio: float = 2.0) -> Any:
    dev = MHATokenToKVPool(size, PS, torch.bfloat16, 2, 8, 2, "cpu")
    host = MHATokenToKVPoolHost(dev, ratio, 0, PS, layout, pin_memory=False)
    gen = torch.Generator().manual_seed(7)
    for buf in host.buffers:
        raw = buf.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    return host


@pytest.fixture
def host() -> Iterator[Any]:
    pool = make_host()
    yield pool
    pool.close()


def pages_of(pool: Any, slots: torch.Tensor) -> list[torch.Tensor]:
    return [pool.get_data_page(int(s)).view(torch.int16) for s in slots[::PS]]
