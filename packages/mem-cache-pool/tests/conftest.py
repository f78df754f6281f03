"""Fixtures for the mem-cache-pool tests: the one DeepSeek-V4 pool builder.

``deepseek_v4_args`` is also the argument set of ``tests/sglang/test_deepseek_v4_pool.py``, which
builds SGLang 0.5.23's pool and ours from it (loaded from this file by path: the tests here are not
a package).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from mem_cache_pool.deepseek_v4 import DeepSeekV4TokenToKVPool

MakeDeepSeekV4Pool = Callable[..., DeepSeekV4TokenToKVPool]


def deepseek_v4_args(**overrides: Any) -> dict[str, Any]:
    """Every argument SGLang 0.5.23's ``DeepSeekV4TokenToKVPool`` requires, for a small CPU pool:
    four layers with compression ratios 0, 4, 128, 4, page size 128, ``c128_size`` 2 (full size
    256), SWA 16 tokens in pages of 4, fp8 records, indexer head dim 16; then ``overrides``."""
    args: dict[str, Any] = dict(
        max_num_reqs=4,
        swa_size=16,
        c4_size=64,
        c128_size=2,
        c4_state_pool_size=4,
        c128_state_pool_size=4,
        page_size=128,
        swa_page_size=4,
        dtype=torch.float8_e4m3fn,
        c4_state_dtype=torch.float32,
        c128_state_dtype=torch.float32,
        qk_nope_head_dim=448,
        qk_rope_head_dim=64,
        indexer_head_dim=16,
        layer_num=4,
        device="cpu",
        enable_memory_saver=False,
        compression_ratios=[0, 4, 128, 4],
    )
    args.update(overrides)
    return args


@pytest.fixture
def make_deepseek_v4_pool() -> MakeDeepSeekV4Pool:
    """``make_deepseek_v4_pool(**overrides)``: our pool from :func:`deepseek_v4_args` with
    ``state_dim=8`` and ``start_layer=1`` (layers 1..4), any of them overridden."""

    def make(**overrides: Any) -> DeepSeekV4TokenToKVPool:
        return DeepSeekV4TokenToKVPool(
            **deepseek_v4_args(**{"state_dim": 8, "start_layer": 1, **overrides})
        )

    return make
