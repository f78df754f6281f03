"""Configurations a call does not support answer *after* the caller's arguments are checked.

The sweep (``test_type_sweep``) passes hostile values only, so it sees the argument checks; these
cases pass valid arguments and pin what comes next: the missing kvcache (``RuntimeError``), the
pool without CPU copies (``NotImplementedError`` naming the allocator and the pool), the pool
without a registered full -> swa mapping (``RuntimeError``), and the allocator whose logical side
has no window (``AttributeError``, which ``hasattr`` callers rely on).
"""

from __future__ import annotations

import pytest
import torch

from tests.bad_input._subjects import OWNERS, _v4_pool, same_state, snapshot

_HISPARSE = "mem_cache_allocator.hisparse:HiSparseTokenToKVPoolAllocator"
_DEEPSEEK_V4 = "mem_cache_allocator.deepseek_v4_hisparse:DeepSeekV4HiSparseTokenToKVPoolAllocator"


def _idx(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_hisparse_without_kvcache_checks_indices_then_raises_runtime_error() -> None:
    a = OWNERS[_HISPARSE]()
    assert a.get_kvcache() is None
    before = snapshot(a)
    with pytest.raises(RuntimeError, match="has no kvcache"):
        a.get_cpu_copy(_idx(4, 5))
    with pytest.raises(RuntimeError, match="has no kvcache"):
        a.load_cpu_copy({}, _idx(4, 5))
    with pytest.raises(TypeError, match=r"\bmamba_indices\b"):  # a wrong dtype: TypeError
        a.get_cpu_copy(_idx(4), torch.tensor([0.5]))
    with pytest.raises(TypeError, match=r"\bindices\b"):
        a.load_cpu_copy({}, [4, 5])
    assert same_state(before, snapshot(a))


@pytest.mark.parametrize("name", ["get_cpu_copy", "load_cpu_copy"])
def test_deepseek_v4_cpu_copy_names_the_allocator_and_the_pool(name: str) -> None:
    a = OWNERS[_DEEPSEEK_V4]()
    before = snapshot(a)
    args: tuple[object, ...] = (_idx(4),) if name == "get_cpu_copy" else ({}, _idx(4))
    with pytest.raises(NotImplementedError) as info:
        getattr(a, name)(*args)
    message = str(info.value)
    assert "DeepSeekV4HiSparseTokenToKVPoolAllocator" in message, message
    assert "DeepSeekV4TokenToKVPool" in message.split(":", 1)[1], message
    assert isinstance(info.value.__cause__, NotImplementedError)
    assert same_state(before, snapshot(a))


def test_deepseek_v4_suite_stack_has_a_window_side() -> None:
    # the suite builds SGLang's stack, so the SWA pass-throughs answer (and are swept)
    a = OWNERS[_DEEPSEEK_V4]()
    full = _idx(128, 129)
    assert a.translate_loc_from_full_to_swa(full).tolist() == [0, 0]  # nothing mapped yet
    (fc, fa), (sc, sa) = a.swa_capacity_and_available()
    assert (fc, sc) == (a.size_full, a.size_swa) == (512, 256)
    assert (fa, sa) == (a.full_available_size(), a.swa_available_size())


def test_deepseek_v4_over_a_paged_allocator_has_no_window_side() -> None:
    from mem_cache_allocator import PagedTokenToKVPoolAllocator
    from mem_cache_allocator.deepseek_v4_hisparse import DeepSeekV4HiSparseTokenToKVPoolAllocator

    pool = _v4_pool(hisparse=True)
    logical = PagedTokenToKVPoolAllocator(pool.size, 128, torch.float8_e4m3fn, "cpu", pool)
    a = DeepSeekV4HiSparseTokenToKVPoolAllocator(logical)
    assert not hasattr(a, "size_swa")
    with pytest.raises(AttributeError, match="PagedTokenToKVPoolAllocator has no free_swa"):
        a.free_swa(_idx(128))


def test_deepseek_v4_pool_without_mapping_checks_kv_indices_first() -> None:
    pool = _v4_pool(hisparse=True)
    assert pool.full_to_swa_index_mapping is None
    with pytest.raises(TypeError, match=r"\bkv_indices\b"):
        pool.translate_loc_from_full_to_swa([1, 2])
    with pytest.raises((TypeError, ValueError), match=r"\bkv_indices\b"):
        pool.translate_loc_from_full_to_swa(torch.tensor([1.5]))
    with pytest.raises(ValueError, match=r"\bkv_indices\b"):
        pool.translate_loc_from_full_to_swa(_idx(10**6))  # out of range (CPU: always checked)
    with pytest.raises(RuntimeError, match="no full -> swa mapping registered"):
        pool.translate_loc_from_full_to_swa(_idx(1, 2))
