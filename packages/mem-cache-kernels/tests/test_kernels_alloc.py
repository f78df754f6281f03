"""Allocation ops: torch reference against hand-worked examples (sglang_mem_cache.md §B.5)."""

from __future__ import annotations

import pytest
import torch

import mem_cache_kernels as mk
from mem_cache_kernels import reference as ref


def _i64(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def _extend(  # noqa: PLR0917
    pre: list[int],
    seq: list[int],
    last: list[int],
    free: list[int],
    ps: int,
    dtype: torch.dtype = torch.int64,
) -> list[int]:
    out = torch.full((sum(s - p for p, s in zip(pre, seq)),), -7, dtype=torch.int64)
    mk.alloc_extend(
        torch.tensor(pre, dtype=dtype),
        torch.tensor(seq, dtype=dtype),
        torch.tensor(last, dtype=dtype),
        torch.tensor(free, dtype=dtype),
        out,
        ps,
        backend="torch",
    )
    return out.tolist()


def test_reference_doc_examples() -> None:
    assert _extend([2], [11], [1], [3, 4], 4) == [2, 3, 12, 13, 14, 15, 16, 17, 18]
    assert _extend([0], [8], [-1], [5, 6], 4) == list(range(20, 28))


def test_batch_consumes_pages_in_request_order() -> None:
    # req 0: prefix 2 -> 11 (pages 3, 4); req 1: prefix 0 -> 8 (pages 5, 6); int32 inputs
    got = _extend([2, 0], [11, 8], [1, -1], [3, 4, 5, 6, 99], 4, dtype=torch.int32)
    assert got == [2, 3, 12, 13, 14, 15, 16, 17, 18, *range(20, 28)]


def test_partial_page_only_and_page_aligned_prefix() -> None:
    assert _extend([5], [7], [41], [], 4) == [42, 43]  # stays inside the current page
    assert _extend([4], [6], [19], [9], 4) == [36, 37]  # prefix ends a page: new page 9


def test_page_size_one_is_a_token_allocator() -> None:
    assert _extend([3, 0], [5, 2], [10, -1], [7, 8, 9, 11], 1) == [7, 8, 9, 11]


def test_empty_extend_is_a_noop() -> None:
    assert _extend([3], [3], [10], [], 16) == []


def test_decode() -> None:
    out = torch.empty(4, dtype=torch.int64)
    # seq 5 with ps 4: the 5th token starts a page; seq 3 does not; seq 1 starts one
    mk.alloc_decode(_i64(5, 3, 1, 6), _i64(23, 41, -1, 52), _i64(7, 8), out, 4, backend="torch")
    assert out.tolist() == [28, 42, 32, 53]


def test_reference_module_is_the_same_math() -> None:
    out = torch.empty(9, dtype=torch.int64)
    ref.alloc_extend(_i64(2), _i64(11), _i64(1), _i64(3, 4), out, 4)
    assert out.tolist() == [2, 3, 12, 13, 14, 15, 16, 17, 18]


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"page_size": 3}, ValueError, "page_size must be a power of two, got 3"),
        ({"page_size": 0}, ValueError, "page_size must be >= 1"),
        ({"seq_lens": _i64(11, 12)}, ValueError, "equal lengths"),
        ({"prefix_lens": torch.tensor([2.0])}, TypeError, "prefix_lens must be int32 or int64"),
        ({"out": torch.empty(9, dtype=torch.int32)}, TypeError, "out must be int64, got"),
        ({"out": torch.full((8,), -7, dtype=torch.int64)}, ValueError, "out must have"),
        ({"free_pages": _i64(3)}, ValueError, "free_pages must hold the 2 pages"),
        ({"last_loc": _i64(1).view(1, 1)}, ValueError, "last_loc must be 1-D"),
        ({"backend": "cuda"}, ValueError, "backend must be one of"),
    ],
)
def test_extend_bad_input(kwargs: dict[str, object], exc: type[Exception], match: str) -> None:
    args: dict[str, object] = {
        "prefix_lens": _i64(2),
        "seq_lens": _i64(11),
        "last_loc": _i64(1),
        "free_pages": _i64(3, 4),
        "out": torch.full((9,), -7, dtype=torch.int64),
        "page_size": 4,
    }
    args.update(kwargs)
    out = args["out"]
    with pytest.raises(exc, match=match):
        mk.alloc_extend(**args)  # type: ignore[arg-type]
    assert isinstance(out, torch.Tensor)
    assert out.dtype != torch.int64 or bool((out == -7).all())  # a failed call writes nothing


def test_decode_bad_input() -> None:
    out = torch.empty(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="free_pages must hold the 2 pages"):
        mk.alloc_decode(_i64(1, 5), _i64(-1, 3), _i64(7), out, 4)
    with pytest.raises(ValueError, match="equal lengths"):
        mk.alloc_decode(_i64(1, 5), _i64(-1), _i64(7, 8), out, 4)
    with pytest.raises(ValueError, match="page_size must be a power of two"):
        mk.alloc_decode(_i64(1, 5), _i64(-1, 3), _i64(7, 8), out, 6)
