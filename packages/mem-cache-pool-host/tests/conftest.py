"""Fixtures for the mem-cache-pool-host tests: tiny CPU device pools filled with random bytes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from mem_cache_pool import KVCache, MHATokenToKVPool, MLATokenToKVPool

FP8 = getattr(torch, "float8_e4m3fn", torch.uint8)
DTYPES = [torch.bfloat16, torch.float16, torch.float32, FP8]

MakePool = Callable[..., KVCache]


def _fill_random(pool: KVCache, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for role in pool.get_buffer_desc().buffers:
        for buf in role:
            raw = buf.view(torch.uint8)
            raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))


@pytest.fixture
def make_pool() -> MakePool:
    """``make_pool(kind, dtype, *, page_size, size, layer_num, seed, start_layer)``.

    ``seed`` fills every device buffer with random bytes (rows of all 256 byte values, NaN
    patterns included, so comparisons must be byte-wise).
    """

    def make(
        kind: str = "mha",
        dtype: torch.dtype = torch.float16,
        *,
        page_size: int = 1,
        size: int = 64,
        layer_num: int = 2,
        seed: int | None = 0,
        start_layer: int | None = None,
    ) -> KVCache:
        pool: KVCache
        if kind == "mha":
            pool = MHATokenToKVPool(
                size, page_size, dtype, 2, 8, layer_num, "cpu", start_layer=start_layer
            )
        elif kind == "mla":
            pool = MLATokenToKVPool(
                size, page_size, dtype, 16, 8, layer_num, "cpu", start_layer=start_layer
            )
        else:
            raise ValueError(kind)
        if seed is not None:
            _fill_random(pool, seed)
        return pool

    return make
