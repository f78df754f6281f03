"""The HiSparse conformance kit (``mem_cache_allocator._testing_hisparse``) over both HiSparse
allocators, page sizes 1/4/16 (HiSparse) and 16 (DeepSeek-V4, paged and SWA logical
allocators), need_sort on and off; and a mutant with SGLang 0.5.23's device-buffer padding that
the kit must catch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from mem_cache_allocator.deepseek_v4_hisparse import DeepSeekV4HiSparseTokenToKVPoolAllocator
from mem_cache_allocator.hisparse import HiSparseTokenToKVPoolAllocator
from mem_cache_allocator.paged import PagedTokenToKVPoolAllocator
from mem_cache_allocator.swa import SWATokenToKVPoolAllocator
from mem_cache_allocator.testing import hisparse_state_machine
from mem_cache_pool.deepseek_v4 import DeepSeekV4TokenToKVPool
from mem_cache_pool.hisparse import HiSparseDSATokenToKVPool

FP8 = torch.float8_e4m3fn
SETTINGS = settings(
    max_examples=6,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _hisparse(ps: int, need_sort: bool) -> HiSparseTokenToKVPoolAllocator:
    size = 16 * ps if ps > 1 else 32
    pool = HiSparseDSATokenToKVPool(
        size, ps, torch.bfloat16, 16, 8, 1, "cpu", index_buf_size=2 * size
    )
    return HiSparseTokenToKVPoolAllocator(
        size, ps, torch.bfloat16, "cpu", pool, need_sort, 2, debug=True
    )


def _deepseek_v4_pool() -> DeepSeekV4TokenToKVPool:
    return DeepSeekV4TokenToKVPool(
        2, 128, 32, 0, 2, 2, 16, 16, FP8, torch.float32, torch.float32,
        448, 64, 16, 2, "cpu", False, [0, 4], enable_hisparse=True, state_dim=8,
    )  # fmt: skip


def _deepseek_v4(swa: bool, need_sort: bool) -> DeepSeekV4HiSparseTokenToKVPoolAllocator:
    pool = _deepseek_v4_pool()
    logical: Any
    if swa:
        logical = SWATokenToKVPoolAllocator(pool.size, 128, 16, FP8, "cpu", pool, need_sort)
    else:
        logical = PagedTokenToKVPoolAllocator(pool.size, 16, FP8, "cpu", pool, need_sort)
    return DeepSeekV4HiSparseTokenToKVPoolAllocator(logical, debug=True)


@pytest.mark.parametrize("need_sort", [False, True])
@pytest.mark.parametrize("ps", [1, 4, 16])
def test_kit_hisparse(ps: int, need_sort: bool) -> None:
    run_state_machine_as_test(
        hisparse_state_machine(lambda: _hisparse(ps, need_sort)), settings=SETTINGS
    )


@pytest.mark.parametrize("need_sort", [False, True])
@pytest.mark.parametrize("swa", [False, True])
def test_kit_deepseek_v4_hisparse(swa: bool, need_sort: bool) -> None:
    run_state_machine_as_test(
        hisparse_state_machine(lambda: _deepseek_v4(swa, need_sort)), settings=SETTINGS
    )


class _SGLangPadding(DeepSeekV4HiSparseTokenToKVPoolAllocator):
    """SGLang 0.5.23's buffer padding: continue from the last *listed* slot after the swap."""

    def alloc_device_buffer(
        self, allocated_indices: torch.Tensor, need_size: int
    ) -> torch.Tensor | None:
        cps = self.hisparse_page_size
        mapping = self.full_to_hisparse_device_index_mapping
        dev = mapping[allocated_indices]
        mapping[allocated_indices] = 0
        dev = dev[dev > 0].clone()
        n, reserved = int(dev.shape[0]), need_size - cps
        if n > reserved + 1:
            old = dev[reserved].clone()
            dev[reserved] = dev[n - 1]
            dev[n - 1] = old
        if n >= need_size:
            return dev[:need_size]  # (surplus handling irrelevant for this mutant)
        if n % cps:
            last = int(dev[-1])
            dev = torch.cat([dev, torch.arange(last + 1, last + 1 + cps - n % cps)])
        extra = self.hisparse_attn_allocator.alloc(need_size - int(dev.shape[0]))
        return None if extra is None else torch.cat([dev, extra])


def test_kit_catches_sglang_buffer_padding() -> None:
    def factory() -> DeepSeekV4HiSparseTokenToKVPoolAllocator:
        pool = _deepseek_v4_pool()
        logical = PagedTokenToKVPoolAllocator(pool.size, 16, FP8, "cpu", pool)
        return _SGLangPadding(logical)

    with pytest.raises(AssertionError, match=r"slot twice in a buffer|device available"):
        run_state_machine_as_test(
            hisparse_state_machine(factory),
            settings=settings(
                SETTINGS, max_examples=100, stateful_step_count=20, report_multiple_bugs=False
            ),
        )
