"""Issue 13 items 2-4 and 8: hostile values in the request-table and allocation ops.

* a negative (or too large) ``req_pool_indices`` row raises on both backends, identically, and
  changes nothing; the kernels themselves (what runs unchecked on a GPU) never write outside the
  table: the table is a slice of a larger tensor whose rows before and after it are canaries;
* a slot that does not fit the table's dtype raises;
* allocation ops reject poisoned ``free_pages`` (0, -1) and ``seq_lens == 0`` on CPU, hint or not;
* ``direct_transfer_rows`` checks that each page's indices are consecutive.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest
import torch

import mem_cache_kernels as mk
from mem_cache_kernels import Backend, reference

I64 = torch.int64
BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.triton)]


def _t(*xs: int, dtype: torch.dtype = I64) -> torch.Tensor:
    return torch.tensor(xs, dtype=dtype)


def _guarded_table(rows: int = 4, cols: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """(whole, table): ``table`` is ``whole[1:-1]``; rows 0 and -1 of ``whole`` are canaries."""
    whole = torch.full((rows + 2, cols), 7777, dtype=torch.int32)
    table = whole[1:-1]
    table.copy_(torch.arange(rows * cols, dtype=torch.int32).view(rows, cols))
    return whole, table


def _backend(name: str, request: pytest.FixtureRequest) -> Backend:
    if name == "triton":
        request.getfixturevalue("triton_interpret")
    return cast("Backend", name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("row", [-1, -4, 4])
def test_write_req_to_token_bad_row_raises_and_changes_nothing(
    backend: str, row: int, request: pytest.FixtureRequest
) -> None:
    b = _backend(backend, request)
    whole, table = _guarded_table()
    before = whole.clone()
    with pytest.raises(ValueError, match="req_pool_indices") as info:
        mk.write_req_to_token(
            table,
            _t(0, row),
            _t(0, 0),
            _t(2, 2),
            _t(5, 6, 7, 8),
            backend=b,
        )
    assert str(row) in str(info.value)
    assert torch.equal(whole, before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_get_last_loc_negative_row_raises(backend: str, request: pytest.FixtureRequest) -> None:
    b = _backend(backend, request)
    _, table = _guarded_table()
    with pytest.raises(ValueError, match=r"req_pool_indices must hold row indices .* got -1"):
        mk.get_last_loc(table, _t(1, -1), _t(3, 3), backend=b)


def test_both_backends_give_the_same_error(request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("triton_interpret")
    messages = []
    for b in cast("tuple[Backend, ...]", ("torch", "triton")):
        _, table = _guarded_table()
        with pytest.raises(ValueError) as info:
            mk.write_req_to_token(table, _t(-1), _t(0), _t(1), _t(3), backend=b)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def _kernels(
    request: pytest.FixtureRequest,
) -> dict[str, tuple[Callable[..., None], Callable[..., torch.Tensor]]]:
    request.getfixturevalue("triton_interpret")
    from mem_cache_kernels._triton import req_table as tri

    return {
        "torch": (reference.write_req_to_token, reference.get_last_loc),
        "triton": (tri.write_req_to_token, tri.get_last_loc),
    }


@pytest.mark.triton
def test_unchecked_kernels_never_write_outside_the_table(request: pytest.FixtureRequest) -> None:
    """What runs on a GPU without the CPU checks: rows outside the table write nothing, columns
    past max_len are dropped, and both backends leave the same table."""
    results = {}
    for name, (write, last) in _kernels(request).items():
        whole, table = _guarded_table()
        rows, pre, seq = _t(-1, 2, 4, 1), _t(0, 1, 0, 6), _t(3, 3, 2, 10)
        new = torch.arange(100, 100 + 3 + 2 + 2 + 4, dtype=I64)
        write(table, rows, pre, seq, new, None)
        assert bool((whole[0] == 7777).all()) and bool((whole[-1] == 7777).all()), name
        got = last(table, _t(-1, 4, 2, 0, 1), _t(1, 1, 3, 0, 9))
        results[name] = (table.clone(), got)
    assert torch.equal(results["torch"][0], results["triton"][0])
    assert torch.equal(results["torch"][1], results["triton"][1])
    table, got = results["torch"]
    assert table[2, 1:3].tolist() == [103, 104]  # the valid request was written
    assert table[1, 6:8].tolist() == [107, 108]  # positions 8, 9 (past max_len 8) dropped
    assert got.tolist() == [-1, -1, 104, -1, -1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value", [2**31, -(2**31) - 1])
def test_slot_that_does_not_fit_int32_raises(
    backend: str, value: int, request: pytest.FixtureRequest
) -> None:
    b = _backend(backend, request)
    whole, table = _guarded_table()
    before = whole.clone()
    with pytest.raises(
        ValueError, match=rf"out_cache_loc must hold values that fit .* got {value}"
    ):
        mk.write_req_to_token(table, _t(1), _t(0), _t(2), _t(5, value), backend=b)
    with pytest.raises(ValueError, match="prefix_slots must hold values that fit"):
        mk.write_req_to_token(
            table,
            _t(1),
            _t(1),
            _t(2),
            _t(5),
            _t(value),
            backend=b,
        )
    assert torch.equal(whole, before)
    # int64 tables take them
    t64 = torch.zeros(2, 4, dtype=I64)
    mk.write_req_to_token(t64, _t(1), _t(0), _t(1), _t(value), backend=b)
    assert int(t64[1, 0]) == value


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [0, -1])
@pytest.mark.parametrize("hint", [False, True])
def test_poisoned_free_pages_rejected(
    backend: str, bad: int, hint: bool, request: pytest.FixtureRequest
) -> None:
    b = _backend(backend, request)
    out = torch.full((5,), -3, dtype=I64)
    kw = {"num_new_pages": 2, "num_tokens": 5} if hint else {}
    with pytest.raises(ValueError, match=rf"free_pages must hold page ids >= 1 .* got {bad}"):
        mk.alloc_extend(
            _t(0),
            _t(5),
            _t(-1),
            _t(3, bad, 9),
            out,
            4,
            backend=b,
            **kw,
        )
    out_d = torch.full((2,), -3, dtype=I64)
    kw_d = {"num_new_pages": 1} if hint else {}
    with pytest.raises(ValueError, match=rf"free_pages must hold page ids >= 1 .* got {bad}"):
        mk.alloc_decode(
            _t(9, 6),
            _t(35, 20),
            _t(bad),
            out_d,
            4,
            backend=b,
            **kw_d,
        )
    assert bool((out == -3).all()) and bool((out_d == -3).all())
    # pages past the ones the batch takes are not read
    mk.alloc_decode(_t(9, 6), _t(35, 20), _t(4, bad), out_d, 4, backend=b)
    assert out_d.tolist() == [16, 21]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hint", [None, 0, 1])
def test_decode_seq_len_zero_rejected(
    backend: str, hint: int | None, request: pytest.FixtureRequest
) -> None:
    b = _backend(backend, request)
    out = torch.full((2,), -3, dtype=I64)
    zero_at_1 = r"seq_lens must be >= 1 .* requests \[1\] .* seq_lens=\[0\]"
    with pytest.raises(ValueError, match=zero_at_1):
        mk.alloc_decode(
            _t(6, 0),
            _t(20, -1),
            _t(3),
            out,
            4,
            num_new_pages=hint,
            backend=b,
        )
    assert bool((out == -3).all())


def test_debug_mode_runs_value_checks_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a device whose values are not free to read, the checks run in debug mode only: proven
    here through ``host_values`` (a CPU stand-in is not possible, so its contract is tested)."""
    from mem_cache_kernels import checks as v

    t = _t(1, 2)
    assert v.host_values(t) is t
    monkeypatch.setenv("MEM_CACHE_DEBUG", "1")
    assert v.debug_enabled()
    monkeypatch.setenv("MEM_CACHE_DEBUG", "0")
    assert not v.debug_enabled()
    monkeypatch.delenv("MEM_CACHE_DEBUG")
    assert not v.debug_enabled()


def test_direct_transfer_rows_checks_consecutive_pages() -> None:
    src = [[torch.arange(16.0).view(8, 2)]]
    dst = [[torch.zeros(8, 2)]]
    before = dst[0][0].clone()
    with pytest.raises(
        ValueError, match=r"src_indices must hold whole pages of 2 consecutive .* \[2, 5\]"
    ):
        mk.direct_transfer_rows(src, dst, _t(0, 1, 2, 5), _t(4, 5, 6, 7), 2)
    with pytest.raises(ValueError, match=r"dst_indices must hold whole pages of 2 consecutive"):
        mk.direct_transfer_rows(src, dst, _t(0, 1, 2, 3), _t(4, 5, 7, 6), 2)
    assert torch.equal(dst[0][0], before)
    mk.direct_transfer_rows(src, dst, _t(0, 1, 2, 3), _t(4, 5, 6, 7), 2)
    assert torch.equal(dst[0][0][4:], src[0][0][:4])


@pytest.mark.parametrize(
    "call",
    [
        lambda m: mk.write_req_to_token(
            m(torch.zeros(2, 4, dtype=torch.int32)), _t(0), _t(0), _t(1), _t(3)
        ),
        lambda m: mk.get_last_loc(torch.zeros(2, 4, dtype=torch.int32), m(_t(0)), _t(1)),
        lambda m: mk.alloc_decode(_t(1), _t(-1), _t(3), m(torch.empty(1, dtype=I64)), 4),
        lambda m: mk.alloc_extend(
            m(_t(0)), m(_t(1)), m(_t(-1)), m(_t(3)), m(torch.empty(1, dtype=I64)), 4
        ),
        lambda m: mk.store_kv(
            torch.zeros(4, 2), torch.zeros(4, 2), m(_t(1)), torch.ones(1, 2), torch.ones(1, 2)
        ),
    ],
)
def test_meta_tensors_rejected_naming_the_argument(call: Callable[..., object]) -> None:
    with pytest.raises(ValueError, match=r"\w+ must be a tensor with data .* meta device"):
        call(lambda t: t.to("meta"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_req_to_token_duplicate_rows_raise(
    backend: str, request: pytest.FixtureRequest
) -> None:
    b = _backend(backend, request)
    whole, table = _guarded_table()
    before = whole.clone()
    with pytest.raises(ValueError, match=r"must hold distinct rows .* row 2 twice"):
        mk.write_req_to_token(table, _t(2, 2), _t(0, 0), _t(1, 1), _t(5, 6), backend=b)
    assert torch.equal(whole, before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_deepseek_v4_records_loc_out_of_range_raises(
    backend: str, request: pytest.FixtureRequest
) -> None:
    from mem_cache_kernels import deepseek_v4

    b = _backend(backend, request)
    ps = 4
    buffer = torch.zeros(2, deepseek_v4.page_row_bytes(ps), dtype=torch.uint8)
    records = torch.ones(1, 584, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"loc must index rows of buffer .* got index 8"):
        deepseek_v4.write_records(buffer, _t(8), records, ps, backend=b)
    with pytest.raises(ValueError, match=r"loc must index rows of buffer .* got index 8"):
        deepseek_v4.read_records(buffer, _t(8), ps, backend=b)
    assert not bool(buffer.any())


@pytest.mark.parametrize("numpy", [True, False])
def test_large_batch_checks_with_and_without_numpy(
    numpy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches above the Python-int threshold take the vectorised checks (numpy or torch)."""
    from mem_cache_kernels import _alloc, checks

    monkeypatch.setattr(_alloc, "_HAS_NUMPY", numpy)
    if not numpy:
        monkeypatch.setattr(checks, "_np", None)
    bs = checks.SMALL_BATCH + 8
    seq = torch.full((bs,), 5, dtype=I64)  # every request starts a page (page size 4)
    last = torch.full((bs,), -1, dtype=I64)
    free = torch.arange(1, bs + 1, dtype=I64)
    out = torch.full((bs,), -3, dtype=I64)
    seq[bs - 1] = 0
    with pytest.raises(ValueError, match=rf"seq_lens must be >= 1 .* requests \[{bs - 1}\]"):
        mk.alloc_decode(seq, last, free, out, 4, num_new_pages=bs)
    seq[bs - 1] = 5
    free[bs - 2] = 0
    with pytest.raises(ValueError, match=rf"free_pages must hold page ids >= 1 .* {bs - 2} of"):
        mk.alloc_decode(seq, last, free, out, 4, num_new_pages=bs)
    assert bool((out == -3).all())
    free[bs - 2] = bs + 5
    mk.alloc_decode(seq, last, free, out, 4, num_new_pages=bs)
    assert torch.equal(out, free * 4)
