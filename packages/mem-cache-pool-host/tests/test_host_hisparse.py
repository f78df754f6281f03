"""HiSparse host rows: grown in whole pages, token-granular slots, position congruence."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from mem_cache_pool_host import MLATokenToKVPoolHost

MakePool = Callable[..., Any]


@pytest.fixture
def host(make_pool: MakePool) -> MLATokenToKVPoolHost:
    device = make_pool("mla", torch.bfloat16, page_size=4, size=16, seed=None)
    return MLATokenToKVPoolHost(device, host_to_device_ratio=2.0)  # 32 slots, 8 pages


def tables(rows: int = 3, max_len: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.full((rows, max_len), -1, dtype=torch.int64),
        torch.zeros(rows, dtype=torch.int64),
    )


def test_rows_grow_in_whole_pages(host: MLATokenToKVPoolHost) -> None:
    table, length = tables()
    s = host.alloc_paged_token_slots(table, length, 1, 0, 5)
    assert s is not None and s.numel() == 5
    assert int(length[1]) == 8 and host.available_size() == 24
    assert (s % 4).tolist() == [0, 1, 2, 3, 0]  # slot % ps == position % ps
    s2 = host.alloc_paged_token_slots(table, length, 1, 5, 2)  # fits in the allocated page
    assert s2 is not None and int(length[1]) == 8 and host.available_size() == 24
    assert torch.equal(s2, table[1, 5:7])
    s3 = host.alloc_paged_token_slots(table, length, 1, 7, 3)
    assert s3 is not None and int(length[1]) == 12
    backing = host.allocated_host_indices(table, 1, length[1])
    assert backing.numel() == 12 and host.is_allocated(backing)
    assert torch.equal(backing[:10], torch.cat([s, s2, s3]))
    assert (table[0] == -1).all() and (table[2] == -1).all()


def test_shortage_returns_none_and_leaves_tables_untouched(host: MLATokenToKVPoolHost) -> None:
    table, length = tables(max_len=64)
    assert host.alloc_paged_token_slots(table, length, 0, 0, 28) is not None
    before = table.clone()
    assert host.alloc_paged_token_slots(table, length, 1, 0, 8) is None
    assert torch.equal(table, before) and int(length[1]) == 0


def test_free_row_returns_pages(host: MLATokenToKVPoolHost) -> None:
    table, length = tables()
    assert host.alloc_paged_token_slots(table, length, 2, 0, 9) is not None
    assert host.free_paged_token_slots(table, length, 2) == 12
    assert host.available_size() == 32 and int(length[2]) == 0 and (table[2] == -1).all()
    assert host.free_paged_token_slots(table, length, 2) == 0
    pages = host.alloc_page(2)
    assert pages is not None and pages.numel() == 8


def test_bad_tables_and_positions_raise(host: MLATokenToKVPoolHost) -> None:
    table, length = tables()
    with pytest.raises(ValueError, match="exceed the row length"):
        host.alloc_paged_token_slots(table, length, 0, 20, 5)
    with pytest.raises(ValueError, match="req_pool_idx"):
        host.alloc_paged_token_slots(table, length, 3, 0, 1)
    with pytest.raises(ValueError, match=r"req_pool_idx must be <= 2, got 3"):
        host.allocated_host_indices(table, 3, 0)
    with pytest.raises(TypeError, match="req_pool_idx must be an int"):
        host.free_paged_token_slots(table, length, 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="req_to_host_pool must be int64"):
        host.alloc_paged_token_slots(table.int(), length, 0, 0, 1)
    with pytest.raises(ValueError, match="req_to_host_pool must be 2-D"):
        host.alloc_paged_token_slots(table[0], length, 0, 0, 1)
    with pytest.raises(TypeError, match="req_to_host_pool_allocated_len must be int64"):
        host.alloc_paged_token_slots(table, length.int(), 0, 0, 1)
    with pytest.raises(ValueError, match="req_to_host_pool_allocated_len must be 1-D"):
        host.alloc_paged_token_slots(table, length[None], 0, 0, 1)
    length[0] = 3
    with pytest.raises(ValueError, match="not a multiple of page_size"):
        host.alloc_paged_token_slots(table, length, 0, 0, 5)
