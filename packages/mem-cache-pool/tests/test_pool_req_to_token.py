"""ReqToTokenPool: table shape, row order (tail first, SGLang 0.5.23), both request shapes
(``req.req_pool_idx`` and 0.5.23's ``req.kv.req_pool_idx``), free errors, write, clear."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from mem_cache_pool import ReqToTokenPool


@dataclass
class _Req:
    req_pool_idx: int | None = None


@dataclass
class _KvInfo:
    req_pool_idx: int | None = None


@dataclass
class _Req23:
    """SGLang 0.5.23's request shape: the row lives in ``req.kv.req_pool_idx``."""

    kv: _KvInfo


def _req23(idx: int | None = None) -> _Req23:
    return _Req23(_KvInfo(idx))


def _state(pool: ReqToTokenPool) -> tuple[list[int], torch.Tensor]:
    return list(pool.free_slots), pool.req_to_token.clone()


def test_table_shape_and_padding_row() -> None:
    pool = ReqToTokenPool(4, 16, "cpu")
    assert pool.req_to_token.shape == (5, 16)
    assert pool.req_to_token.dtype == torch.int32
    assert pool.available_size() == 4
    rows = pool.alloc(4)
    assert rows is not None and sorted(rows) == [1, 2, 3, 4]  # row 0 is never handed out


def test_rows_come_from_the_tail_like_sglang_0_5_23() -> None:
    pool = ReqToTokenPool(6, 8, "cpu")
    assert pool.alloc(2) == [5, 6]
    assert pool.alloc_rows(1) == [4]
    pool.free(5)
    pool.free_rows([6, 4])
    assert pool.free_slots == [1, 2, 3, 5, 6, 4]
    assert pool.alloc(1) == [4]  # the row freed last is handed out first
    assert pool.alloc(3) == [3, 5, 6]


def test_alloc_int_returns_none_without_state_change() -> None:
    pool = ReqToTokenPool(3, 8, "cpu")
    assert pool.alloc(2) == [2, 3]
    assert pool.alloc(2) is None
    assert pool.alloc_rows(2) is None
    assert pool.available_size() == 1
    assert pool.alloc(0) == []
    assert pool.alloc_rows(0) == []
    assert pool.available_size() == 1


@pytest.mark.parametrize("make", [_Req, _req23], ids=["req.req_pool_idx", "req.kv.req_pool_idx"])
def test_alloc_requests_assigns_and_keeps_existing_rows(make) -> None:  # type: ignore[no-untyped-def]
    def row(r):  # type: ignore[no-untyped-def]
        return r.kv.req_pool_idx if isinstance(r, _Req23) else r.req_pool_idx

    pool = ReqToTokenPool(3, 8, "cpu")
    chunked = make()
    assert pool.alloc([chunked]) == [3]
    fresh = [make(), make()]
    assert pool.alloc([chunked, *fresh]) == [3, 1, 2]
    assert [row(r) for r in fresh] == [1, 2]
    late = make()
    assert pool.alloc([late]) is None
    assert row(late) is None
    pool.free(chunked)
    assert row(chunked) is None
    assert pool.alloc([late]) == [3]
    assert row(late) == 3


def test_alloc_accepts_both_request_shapes_in_one_batch() -> None:
    pool = ReqToTokenPool(4, 8, "cpu")
    old, new = _Req(), _req23()
    assert pool.alloc([old, new]) == [3, 4]
    assert (old.req_pool_idx, new.kv.req_pool_idx) == (3, 4)
    pool.free(new)
    assert new.kv.req_pool_idx is None
    assert pool.available_size() == 3


@pytest.mark.parametrize("make", [_Req, _req23], ids=["req.req_pool_idx", "req.kv.req_pool_idx"])
def test_same_request_twice_raises_and_changes_nothing(make) -> None:  # type: ignore[no-untyped-def]
    # issue 13: alloc([r, r]) used to return [3, 3] and leak a row
    pool = ReqToTokenPool(4, 8, "cpu")
    req = make()
    before = _state(pool)
    with pytest.raises(ValueError, match=r"reqs\[0\] and reqs\[1\]"):
        pool.alloc([req, req])
    after = _state(pool)
    assert after[0] == before[0] and torch.equal(after[1], before[1])
    assert (req.kv.req_pool_idx if isinstance(req, _Req23) else req.req_pool_idx) is None
    assert pool.alloc([req]) == [4]
    with pytest.raises(ValueError, match="twice"):
        pool.alloc([req, make(), req])  # also once it owns a row
    assert pool.available_size() == 3


def test_two_requests_claiming_one_row_raise() -> None:
    pool = ReqToTokenPool(4, 8, "cpu")
    (row,) = pool.alloc(1) or []
    before = list(pool.free_slots)
    fresh = _Req()
    with pytest.raises(ValueError, match=r"reqs\[0\] and reqs\[2\] must not own the same row"):
        pool.alloc([_Req(row), fresh, _req23(row)])
    assert pool.free_slots == before and fresh.req_pool_idx is None


def test_alloc_rejects_foreign_rows_and_bad_types() -> None:
    pool = ReqToTokenPool(2, 8, "cpu")
    with pytest.raises(ValueError, match="req_pool_idx"):
        pool.alloc([_Req(1)])  # row 1 is free, so this request cannot own it
    with pytest.raises(TypeError, match="reqs"):
        pool.alloc("ab")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"reqs\[1\]"):
        pool.alloc([_Req(), object()])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"reqs\[0\].req_pool_idx"):
        pool.alloc([_Req(1.0)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reqs must be >= 0, got -1"):
        pool.alloc(-1)
    with pytest.raises(ValueError, match="need_size must be >= 0, got -1"):
        pool.alloc_rows(-1)
    assert pool.available_size() == 2


def test_free_errors_leave_state_unchanged() -> None:
    pool = ReqToTokenPool(3, 8, "cpu")
    assert pool.alloc(2) == [2, 3]
    before = list(pool.free_slots)
    with pytest.raises(ValueError, match="double free"):
        pool.free([3, 1])
    with pytest.raises(ValueError, match=r"\[1, 3\]"):
        pool.free(0)
    with pytest.raises(ValueError, match="repeat"):
        pool.free([2, 2])
    with pytest.raises(ValueError, match="None"):
        pool.free(_Req())
    with pytest.raises(ValueError, match="None"):
        pool.free(_req23())
    with pytest.raises(TypeError, match=r"\breq\b"):
        pool.free(1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"\breq\b"):
        pool.free("23")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="indices"):
        pool.free_rows(2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"indices row 1 is not allocated"):
        pool.free_rows([2, 1])
    assert pool.free_slots == before
    pool.free([2, 3])
    assert pool.available_size() == 3


def test_write_and_clear() -> None:
    pool = ReqToTokenPool(2, 6, "cpu")
    (row,) = pool.alloc(1) or []
    assert row == 2
    pool.write((row, slice(0, 3)), torch.tensor([7, 8, 9], dtype=torch.int64))
    assert pool.req_to_token[row, :4].tolist() == [7, 8, 9, 0]
    pool.clear()
    assert pool.available_size() == 2


def test_write_rejects_values_past_int32_and_rows_outside_the_table() -> None:
    pool = ReqToTokenPool(2, 6, "cpu")
    before = pool.req_to_token.clone()
    with pytest.raises(
        ValueError, match=r"values must hold values that fit int32 .* got 2147483648"
    ):
        pool.write((1, slice(0, 2)), torch.tensor([5, 2**31]))
    with pytest.raises(ValueError, match=r"values must fit int32 .* got -2147483649"):
        pool.write((1, 0), -(2**31) - 1)
    with pytest.raises(ValueError, match=r"indices must address req_to_token of shape \(3, 6\)"):
        pool.write((3, slice(0, 2)), torch.tensor([5, 6]))
    assert torch.equal(pool.req_to_token, before)
    pool.write((1, 0), 2**31 - 1)
    assert int(pool.req_to_token[1, 0]) == 2**31 - 1


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="device must name a torch device"):
        ReqToTokenPool(2, 4, "nodev")
    with pytest.raises(ValueError, match="size"):
        ReqToTokenPool(0, 4, "cpu")
    with pytest.raises(TypeError, match="max_context_len"):
        ReqToTokenPool(2, 4.0, "cpu")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "indices",
    [
        (torch.tensor([1, 2, 9]), torch.tensor([0, 1, 2])),  # decode form, a row past the table
        (torch.tensor([1, 2, 3]), torch.tensor([0, 1, 6])),  # decode form, a column past it
        (torch.tensor([1, 2, -5]), torch.tensor([0, 1, 2])),  # a negative row before row 0
        ([1, 2, 7], slice(0, 3)),  # general form: a list of rows
        (torch.tensor([1, 2, 5], dtype=torch.int32), slice(0, 3)),  # general form, int32 rows
    ],
)
def test_write_outside_the_table_writes_nothing(indices: object) -> None:
    """torch's assignment writes the entries before the first bad index and then raises; ours
    raises first (a failed call changes nothing)."""
    pool = ReqToTokenPool(3, 6, "cpu")
    before = pool.req_to_token.clone()
    with pytest.raises(ValueError, match=r"indices must address req_to_token of shape \(4, 6\)"):
        pool.write(indices, torch.tensor([7, 8, 9], dtype=torch.int32))  # type: ignore[arg-type]
    assert torch.equal(pool.req_to_token, before)


def test_write_forms_match_plain_assignment() -> None:
    """Every inline form ends in the state torch's plain assignment gives (negative rows and
    columns included), and a replaced ``req_to_token`` is the one written."""
    pool = ReqToTokenPool(3, 6, "cpu")
    model = pool.req_to_token.clone()
    cases: list[tuple[object, torch.Tensor]] = [
        ((2, slice(1, 4)), torch.tensor([5, 6, 7])),
        ((-1, slice(0, 2)), torch.tensor([8, 9], dtype=torch.int32)),
        ((torch.tensor([1, -2]), torch.tensor([0, -1])), torch.tensor([3, 4], dtype=torch.int32)),
        ((torch.tensor([3, 1], dtype=torch.int32), torch.tensor([5, 2])), torch.tensor([1, 2])),
        ((1, slice(4, None)), torch.tensor([11, 12])),
    ]
    for index, values in cases:
        pool.write(index, values)  # type: ignore[arg-type]
        model[index] = values.to(torch.int32)  # type: ignore[index]
        assert torch.equal(pool.req_to_token, model), index
    pool.req_to_token = torch.zeros(4, 6, dtype=torch.int32)
    pool.write((2, slice(0, 2)), torch.tensor([1, 2]))
    assert pool.req_to_token[2, :3].tolist() == [1, 2, 0]
    assert model[2, :3].tolist() != [1, 2, 0]


def test_alloc_bumps_the_generation_of_the_rows_it_hands_out() -> None:
    pool = ReqToTokenPool(4, 6, "cpu")
    rows = pool.alloc([_req23(), _req23()]) or []
    assert rows == [3, 4]
    assert pool.req_generation.tolist() == [0, 0, 0, 1, 1]
    pool.free(rows[0])
    pool.alloc_rows(1)
    assert pool.req_generation.tolist() == [0, 0, 0, 2, 1]
    pool.req_generation = torch.full((5,), 7, dtype=torch.int64)  # replaced: its own counts
    pool.alloc_rows(1)
    assert pool.req_generation.tolist() == [7, 7, 8, 7, 7]
    pool.clear()
    pool.req_generation = torch.zeros(5, dtype=torch.int32)  # not int64: the tensor path
    pool.alloc_rows(2)
    assert pool.req_generation.tolist() == [0, 0, 0, 1, 1]


def test_free_of_a_request_resets_its_row_and_refuses_a_second_free() -> None:
    pool = ReqToTokenPool(4, 6, "cpu")
    req = _req23()
    (row,) = pool.alloc([req]) or []
    pool.free(req)
    assert req.kv.req_pool_idx is None and pool.free_slots[-1] == row
    before = list(pool.free_slots)
    req.kv.req_pool_idx = row  # a stale row: freed already
    with pytest.raises(ValueError, match=rf"req row {row} is not allocated \(double free\)"):
        pool.free(req)
    assert pool.free_slots == before and req.kv.req_pool_idx == row


def test_cached_views_follow_storage_swapped_in_place() -> None:
    """The row views and the generation counts are rebuilt when a tensor keeps its identity but
    gets other memory (``set_``): the writes land in the tensor's current storage."""
    pool = ReqToTokenPool(3, 6, "cpu")
    pool.write((1, slice(0, 2)), torch.tensor([4, 5]))  # row views in use
    pool.req_to_token.set_(torch.zeros(4, 6, dtype=torch.int32))
    pool.write((1, slice(0, 2)), torch.tensor([7, 8]))
    assert pool.req_to_token[1, :3].tolist() == [7, 8, 0]
    pool.alloc_rows(1)
    pool.req_generation.set_(torch.full((4,), 5, dtype=torch.int64))
    pool.alloc_rows(1)
    assert pool.req_generation.tolist() == [5, 5, 6, 5]
    pool.req_generation.resize_(2)  # shorter: the view follows its length
    pool.req_generation.resize_(4)
    pool.alloc_rows(1)
    assert int(pool.req_generation[1]) == 6
