"""ReqToTokenPool: table shape, both alloc conventions, free errors, write, clear."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from mem_cache_pool import ReqToTokenPool


@dataclass
class _Req:
    req_pool_idx: int | None = None


def test_table_shape_and_padding_row() -> None:
    pool = ReqToTokenPool(4, 16, "cpu")
    assert pool.req_to_token.shape == (5, 16)
    assert pool.req_to_token.dtype == torch.int32
    assert pool.available_size() == 4
    rows = pool.alloc(4)
    assert rows is not None and sorted(rows) == [1, 2, 3, 4]  # row 0 is never handed out


def test_alloc_int_returns_none_without_state_change() -> None:
    pool = ReqToTokenPool(3, 8, "cpu")
    assert pool.alloc(2) == [1, 2]
    assert pool.alloc(2) is None
    assert pool.available_size() == 1
    assert pool.alloc(0) == []


def test_alloc_requests_assigns_and_keeps_existing_rows() -> None:
    pool = ReqToTokenPool(3, 8, "cpu")
    chunked = _Req()
    assert pool.alloc([chunked]) == [1]
    fresh = [_Req(), _Req()]
    assert pool.alloc([chunked, *fresh]) == [1, 2, 3]
    assert [r.req_pool_idx for r in fresh] == [2, 3]
    late = _Req()
    assert pool.alloc([late]) is None
    assert late.req_pool_idx is None
    pool.free(chunked)
    assert chunked.req_pool_idx is None
    assert pool.alloc([late]) == [1]


def test_alloc_rejects_foreign_rows_and_bad_types() -> None:
    pool = ReqToTokenPool(2, 8, "cpu")
    with pytest.raises(ValueError, match="req_pool_idx"):
        pool.alloc([_Req(1)])  # row 1 is free, so this request cannot own it
    with pytest.raises(TypeError, match="reqs"):
        pool.alloc("ab")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"reqs\[0\]"):
        pool.alloc([object()])  # type: ignore[list-item]
    assert pool.available_size() == 2


def test_free_errors_leave_state_unchanged() -> None:
    pool = ReqToTokenPool(3, 8, "cpu")
    pool.alloc(2)
    with pytest.raises(ValueError, match="double free"):
        pool.free([1, 3])
    with pytest.raises(ValueError, match=r"\[1, 3\]"):
        pool.free(0)
    with pytest.raises(ValueError, match="repeat"):
        pool.free([2, 2])
    with pytest.raises(ValueError, match="None"):
        pool.free(_Req())
    with pytest.raises(TypeError, match="free_index"):
        pool.free(1.0)  # type: ignore[arg-type]
    assert pool.available_size() == 1
    pool.free([1, 2])
    assert pool.available_size() == 3


def test_write_and_clear() -> None:
    pool = ReqToTokenPool(2, 6, "cpu")
    (row,) = pool.alloc(1) or []
    pool.write((row, slice(0, 3)), torch.tensor([7, 8, 9], dtype=torch.int64))
    assert pool.req_to_token[row, :4].tolist() == [7, 8, 9, 0]
    pool.clear()
    assert pool.available_size() == 2


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="size"):
        ReqToTokenPool(0, 4, "cpu")
    with pytest.raises(TypeError, match="max_context_len"):
        ReqToTokenPool(2, 4.0, "cpu")  # type: ignore[arg-type]
