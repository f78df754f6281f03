"""Closed objects, calls out of order and empty inputs: a clear error (or a documented no-op),
never a silent state change."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import mem_cache_kernels as mk
from tests.bad_input._subjects import OWNERS, same_state, snapshot

I64 = torch.int64


def _host() -> tuple[Any, Any]:
    from mem_cache_pool import MHATokenToKVPool
    from mem_cache_pool_host import MHATokenToKVPoolHost

    dev = MHATokenToKVPool(32, 4, torch.float16, 2, 8, 2, "cpu")
    return dev, MHATokenToKVPoolHost(dev, host_size_bytes=1 << 16, pin_memory=False)


CLOSED: dict[str, Callable[[Any, Any, torch.Tensor], object]] = {
    "alloc": lambda dev, host, h: host.alloc(4),
    "free": lambda dev, host, h: host.free(h),
    "load_to_device_per_layer": lambda dev, host, h: host.load_to_device_per_layer(
        dev, h, torch.arange(4, 8), 0
    ),
    "backup_from_device_all_layer": lambda dev, host, h: host.backup_from_device_all_layer(
        dev, h, torch.arange(4, 8)
    ),
    "get_data_page": lambda dev, host, h: host.get_data_page(int(h[0])),
}


@pytest.mark.parametrize("method", list(CLOSED))
def test_closed_host_pool_raises(method: str) -> None:
    dev, host = _host()
    h = host.alloc(4)
    assert h is not None
    host.close()
    before = snapshot(dev)
    with pytest.raises(RuntimeError, match=r"MHATokenToKVPoolHost is closed"):
        CLOSED[method](dev, host, h)
    assert same_state(before, snapshot(dev))


ALLOCATORS = [
    "mem_cache_allocator.token:TokenToKVPoolAllocator",
    "mem_cache_allocator.paged:PagedTokenToKVPoolAllocator",
    "mem_cache_allocator.swa:SWATokenToKVPoolAllocator",
    "mem_cache_allocator.hisparse:HiSparseTokenToKVPoolAllocator",
]


@pytest.mark.parametrize("key", ALLOCATORS)
def test_free_group_out_of_order(key: str) -> None:
    a = OWNERS[key]()
    a.free_group_begin()
    before = snapshot(a)
    with pytest.raises(RuntimeError, match="free_group"):
        a.free_group_begin()  # nesting
    assert same_state(before, snapshot(a))


@pytest.mark.parametrize("key", ALLOCATORS)
def test_restore_state_of_another_allocator_raises(key: str) -> None:
    a, b = OWNERS[key](), OWNERS[key]()
    state = b.backup_state()
    before = snapshot(a)
    with pytest.raises(ValueError, match="state"):
        a.restore_state(state)
    assert same_state(before, snapshot(a))


def test_mamba_group_out_of_order() -> None:
    a = OWNERS["mem_cache_allocator.mamba:MambaSlotAllocator"]()
    a.alloc_group_begin(2)
    before = snapshot(a)
    with pytest.raises(RuntimeError, match="alloc_group_begin"):
        a.alloc_group_begin(1)
    assert same_state(before, snapshot(a))


def test_req_pool_double_free_raises() -> None:
    pool = OWNERS["mem_cache_pool.req_to_token:ReqToTokenPool"]()
    rows = pool.alloc(1)
    assert rows is not None
    pool.free(rows[0])
    before = snapshot(pool)
    with pytest.raises(ValueError, match=r"\breq\b"):
        pool.free(rows[0])
    assert same_state(before, snapshot(pool))


def test_layer_counter_complete_out_of_range_raises() -> None:
    counter = OWNERS["mem_cache_pool_host.layer_counter:LayerDoneCounter"]()
    counter.begin()
    with pytest.raises(ValueError, match="layer_index"):
        counter.complete(5)


EMPTY = torch.empty(0, dtype=I64)


def _empty_calls() -> dict[str, tuple[Callable[..., object], list[torch.Tensor]]]:
    """Each kernel op with an empty batch: (op, its positional arguments, built fresh)."""
    i32 = torch.int32
    return {
        "store_kv": (mk.store_kv, [torch.zeros(4, 2), torch.zeros(4, 2), EMPTY.clone(),
                                   torch.ones(0, 2), torch.ones(0, 2)]),
        "transfer_rows": (lambda src, dst, a, b: mk.transfer_rows([src], [dst], a, b),
                          [torch.zeros(4, 2), torch.arange(8.0).view(4, 2), EMPTY.clone(),
                           EMPTY.clone()]),
        "alloc_decode": (lambda *a: mk.alloc_decode(*a, 4),
                         [EMPTY.clone(), EMPTY.clone(), EMPTY.clone(), torch.empty(0, dtype=I64)]),
        "alloc_extend": (lambda *a: mk.alloc_extend(*a, 4),
                         [EMPTY.clone(), EMPTY.clone(), EMPTY.clone(), EMPTY.clone(),
                          torch.empty(0, dtype=I64)]),
        "write_req_to_token": (mk.write_req_to_token,
                               [torch.arange(8, dtype=i32).view(2, 4), EMPTY.clone(),
                                EMPTY.clone(), EMPTY.clone(), EMPTY.clone()]),
        "get_last_loc": (mk.get_last_loc, [torch.arange(8, dtype=i32).view(2, 4), EMPTY.clone(),
                                           EMPTY.clone()]),
    }  # fmt: skip


@pytest.mark.parametrize("name", list(_empty_calls()))
def test_empty_inputs_are_no_ops(name: str) -> None:
    op, args = _empty_calls()[name]
    before = snapshot(args)
    result = op(*args)
    # nothing changed: every argument (buffers, tables, free lists) is bit-exact as before
    assert same_state(before, snapshot(args)), f"{name} on an empty batch changed an argument"
    # and nothing came back but an empty answer
    assert result is None or (isinstance(result, torch.Tensor) and result.numel() == 0), result


@pytest.mark.parametrize("key", ALLOCATORS)
def test_empty_free_is_a_no_op(key: str) -> None:
    a = OWNERS[key]()
    before = snapshot(a)
    a.free(EMPTY)
    assert same_state(before, snapshot(a))
