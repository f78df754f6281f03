"""The exception-type rule of :mod:`mem_cache_kernels.checks`, for every allocator class.

Table-driven over the allocator classes the package exports (``mem_cache_allocator.__all__`` and
its lazily imported names): a new allocator without a row in ``ROWS`` fails
``test_every_allocator_has_a_row``. For the constructor and ``alloc``, ``alloc_extend``,
``alloc_decode``, ``free``, ``free_segment``, ``free_segments`` each row's valid call is broken in
one argument at a time:

* (a) the wrong Python type (a ``bool`` or ``float`` for an int, a list for a tensor) and
  (b) an index tensor of the wrong dtype raise ``TypeError`` (and not ``ValueError``);
* (c) a wrong value, shape or range raises ``ValueError`` (``AllocatorDebugError`` is one on
  purpose) and not ``TypeError``;

and every message names the argument.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import mem_cache_allocator
from mem_cache_allocator import (
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from mem_cache_allocator.base import BaseTokenToKVPoolAllocator
from mem_cache_allocator.deepseek_v4_hisparse import DeepSeekV4HiSparseTokenToKVPoolAllocator
from mem_cache_allocator.hisparse import HiSparseTokenToKVPoolAllocator
from mem_cache_allocator.mamba import MambaSlotAllocator
from mem_cache_allocator.swa import SWATokenToKVPoolAllocator
from mem_cache_pool.deepseek_v4 import DeepSeekV4TokenToKVPool

F16 = torch.float16
FP8 = torch.float8_e4m3fn
I64 = torch.int64
T, V = TypeError, ValueError


def _i(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=I64)


def _v4(**kw: Any) -> DeepSeekV4HiSparseTokenToKVPoolAllocator:
    pool = DeepSeekV4TokenToKVPool(
        2, 16, 16, 0, 2, 2, 16, 4, FP8, torch.float32, torch.float32,
        448, 64, 16, 2, "cpu", False, [0, 4], enable_hisparse=True, state_dim=8,
    )  # fmt: skip
    logical = kw.pop("logical_attn_allocator", None)
    if logical is None:
        logical = PagedTokenToKVPoolAllocator(pool.size, 16, FP8, "cpu", pool)
    return DeepSeekV4HiSparseTokenToKVPoolAllocator(logical, **kw)


@dataclass(frozen=True)
class Row:
    """How to build one allocator class, its page size and the constructor arguments to break
    (``(argument, bad value, expected exception)``); ``slots``: allocators of token slots (the
    extend / decode / segment methods apply)."""

    make: Callable[..., Any]
    page_size: int
    ctor: list[tuple[str, object, type[Exception]]] = field(default_factory=list)
    slots: bool = True


_SIZE = [("size", True, T), ("size", 64.0, T), ("size", "64", T), ("size", -1, V)]
_PS = [("page_size", True, T), ("page_size", 4.0, T), ("page_size", 3, V), ("page_size", 0, V)]
_DEV = [("device", 1.5, T), ("device", "no-such-device", V)]

ROWS: dict[str, Row] = {
    "TokenToKVPoolAllocator": Row(
        lambda **kw: TokenToKVPoolAllocator(
            **{"size": 64, "dtype": F16, "device": "cpu", "kvcache": None, **kw}
        ),
        1,
        [*_SIZE, *_DEV],
    ),
    "PagedTokenToKVPoolAllocator": Row(
        lambda **kw: PagedTokenToKVPoolAllocator(
            **{"size": 64, "page_size": 4, "dtype": F16, "device": "cpu", "kvcache": None, **kw}
        ),
        4,
        [*_SIZE, *_PS, *_DEV],
    ),
    "SWATokenToKVPoolAllocator": Row(
        lambda **kw: SWATokenToKVPoolAllocator(
            **{
                "size": 64,
                "size_swa": 32,
                "page_size": 4,
                "dtype": F16,
                "device": "cpu",
                "kvcache": None,
                **kw,
            }
        ),
        4,
        [*_SIZE, *_PS, *_DEV, ("size_swa", False, T), ("size_swa", 8.0, T), ("size_swa", -4, V)],
    ),
    "HiSparseTokenToKVPoolAllocator": Row(
        lambda **kw: HiSparseTokenToKVPoolAllocator(
            **{"size": 64, "page_size": 4, "dtype": F16, "device": "cpu", "kvcache": None, **kw}
        ),
        4,
        [
            *_SIZE,
            *_PS,
            *_DEV,
            ("host_to_device_ratio", True, T),
            ("host_to_device_ratio", 2.0, T),
            ("host_to_device_ratio", 0, V),
        ],
    ),
    "DeepSeekV4HiSparseTokenToKVPoolAllocator": Row(
        _v4, 16, [("logical_attn_allocator", object(), T)]
    ),
    "MambaSlotAllocator": Row(
        lambda **kw: MambaSlotAllocator(**{"size": 8, "device": "cpu", **kw}),
        1,
        [*_SIZE, *_DEV],
        slots=False,
    ),
}


def _allocator_classes() -> dict[str, type]:
    out = {}
    for name in dir(mem_cache_allocator):  # __all__ and the lazily imported composites
        obj = getattr(mem_cache_allocator, name)
        if not isinstance(obj, type) or issubclass(obj, Exception):
            continue
        if inspect.isabstract(obj) or obj is BaseTokenToKVPoolAllocator:
            continue  # the abstract base: every concrete allocator is a row
        if issubclass(obj, BaseTokenToKVPoolAllocator) or name.endswith("Allocator"):
            out[name] = obj
    return out


def test_every_allocator_has_a_row() -> None:
    classes = _allocator_classes()
    assert set(classes) == set(ROWS), "add a ROWS entry for each new allocator class"
    for name, row in ROWS.items():
        assert type(row.make()) is classes[name]


def _raises(exc: type[Exception], name: str, call: Callable[[], object]) -> None:
    with pytest.raises(exc) as info:
        call()
    other = ValueError if exc is TypeError else TypeError
    assert not isinstance(info.value, other), f"{type(info.value).__name__}: {info.value}"
    assert name in str(info.value), f"message does not name {name!r}: {info.value}"


# ----------------------------------------------------------------------------- constructors
_CTOR = [(cls, arg, bad, exc) for cls, row in ROWS.items() for arg, bad, exc in row.ctor]


@pytest.mark.parametrize(("cls", "arg", "bad", "exc"), _CTOR, ids=repr)
def test_constructor(cls: str, arg: str, bad: object, exc: type[Exception]) -> None:
    _raises(exc, arg, lambda: ROWS[cls].make(**{arg: bad}))


# ----------------------------------------------------------------------------- alloc
_ALLOC = [("need_size", True, T), ("need_size", 4.0, T), ("need_size", "4", T),
          ("need_size", -1, V)]  # fmt: skip


@pytest.mark.parametrize("cls", list(ROWS))
@pytest.mark.parametrize(("arg", "bad", "exc"), _ALLOC, ids=repr)
def test_alloc(cls: str, arg: str, bad: object, exc: type[Exception]) -> None:
    a = ROWS[cls].make()
    assert a.alloc(ROWS[cls].page_size) is not None  # the valid call
    _raises(exc, arg, lambda: a.alloc(bad))


# ----------------------------------------------------------------------------- alloc_extend
def _extend_args() -> dict[str, Any]:
    p, s = _i(0, 0), _i(5, 3)
    return {"prefix_lens": p, "prefix_lens_cpu": p.clone(), "seq_lens": s,
            "seq_lens_cpu": s.clone(), "last_loc": _i(-1, -1), "extend_num_tokens": 8}  # fmt: skip


_TENSOR_ARGS = ("prefix_lens", "prefix_lens_cpu", "seq_lens", "seq_lens_cpu", "last_loc")
_EXTEND: list[tuple[str, object, type[Exception]]] = [
    *[(arg, [0, 0], T) for arg in _TENSOR_ARGS],  # (a) a list for a tensor
    *[(arg, torch.tensor([0.0, 5.0]), T) for arg in _TENSOR_ARGS],  # (b) wrong dtype
    # (c) wrong length (seq_lens_cpu sets the batch size: the others are measured against it)
    *[(arg, _i(0, 0, 0), V) for arg in _TENSOR_ARGS if arg != "seq_lens_cpu"],
    *[(arg, _i(0, 0).reshape(1, 2), V) for arg in _TENSOR_ARGS],  # (c) wrong shape
    ("seq_lens_cpu", torch.tensor([5, 3], device="meta"), V),  # (c) not on the host
    ("prefix_lens_cpu", _i(6, 0), V),  # (c) prefix > seq
    ("seq_lens", _i(5, 4), V),  # (c) differs from seq_lens_cpu
    ("last_loc", _i(7, -1), V),  # (c) not -1 for an empty prefix
    ("extend_num_tokens", True, T),
    ("extend_num_tokens", 8.0, T),
    ("extend_num_tokens", 7, V),
]


@pytest.mark.parametrize("cls", [c for c, r in ROWS.items() if r.slots])
@pytest.mark.parametrize(("arg", "bad", "exc"), _EXTEND, ids=repr)
def test_alloc_extend(cls: str, arg: str, bad: object, exc: type[Exception]) -> None:
    a = ROWS[cls].make()
    assert a.alloc_extend(**_extend_args()) is not None  # the valid call
    _raises(exc, arg, lambda: a.alloc_extend(**{**_extend_args(), arg: bad}))


# ----------------------------------------------------------------------------- alloc_decode
_DECODE: list[tuple[str, object, type[Exception]]] = [
    *[(arg, [6, 4], T) for arg in ("seq_lens", "seq_lens_cpu", "last_loc")],
    *[(arg, torch.tensor([6.0, 4.0]), T) for arg in ("seq_lens", "seq_lens_cpu", "last_loc")],
    *[(arg, _i(6, 4, 1), V) for arg in ("seq_lens", "last_loc")],  # seq_lens_cpu sets bs
    ("seq_lens_cpu", _i(6, 0), V),  # (c) a decode includes its new token
    ("seq_lens", _i(6, 5), V),  # (c) differs from seq_lens_cpu
]


def _decode_args(a: Any) -> dict[str, Any]:
    out = a.alloc_extend(**_extend_args())
    assert out is not None
    s = _i(6, 4)
    return {"seq_lens": s, "seq_lens_cpu": s.clone(), "last_loc": out[[4, 7]].clone()}


@pytest.mark.parametrize("cls", [c for c, r in ROWS.items() if r.slots])
@pytest.mark.parametrize(("arg", "bad", "exc"), _DECODE, ids=repr)
def test_alloc_decode(cls: str, arg: str, bad: object, exc: type[Exception]) -> None:
    a = ROWS[cls].make()
    args = _decode_args(a)
    _raises(exc, arg, lambda: a.alloc_decode(**{**args, arg: bad}))
    assert a.alloc_decode(**args) is not None  # the valid call (after the failed one)


# ----------------------------------------------------------------------------- free
_FREE: list[tuple[object, type[Exception]]] = [
    ([1, 2], T),
    ((1, 2), T),
    (torch.tensor([1.0, 2.0]), T),
    (torch.tensor([True, False]), T),
    (_i(1, 2, 3, 4).reshape(2, 2), V),
    (_i(10**6), V),  # (c) out of range (a CPU tensor: checked for free)
]


@pytest.mark.parametrize("cls", list(ROWS))
@pytest.mark.parametrize(("bad", "exc"), _FREE, ids=repr)
def test_free(cls: str, bad: object, exc: type[Exception]) -> None:
    a = ROWS[cls].make()
    slots = a.alloc(ROWS[cls].page_size)
    assert slots is not None
    _raises(exc, "free_index", lambda: a.free(bad))
    a.free(slots)  # the valid call


# ----------------------------------------------------------------------------- free_segment(s)
_SEGMENT: list[tuple[str, object, type[Exception]]] = [
    ("start_pos", True, T),
    ("start_pos", 0.0, T),
    ("start_pos", -1, V),
    ("free_index", [1, 2], T),
    ("free_index", torch.tensor([1.0, 2.0]), T),
    ("free_index", _i(1, 2, 3, 4).reshape(2, 2), V),
]


@pytest.mark.parametrize("cls", [c for c, r in ROWS.items() if r.slots])
@pytest.mark.parametrize(("arg", "bad", "exc"), _SEGMENT, ids=repr)
def test_free_segment(cls: str, arg: str, bad: object, exc: type[Exception]) -> None:
    a = ROWS[cls].make()
    slots = a.alloc(ROWS[cls].page_size)
    assert slots is not None
    args: dict[str, Any] = {"free_index": slots, "start_pos": 0}
    _raises(exc, arg, lambda: a.free_segment(**{**args, arg: bad}))
    a.free_segment(**args)  # the valid call


_SEGMENTS: list[tuple[Callable[[torch.Tensor], object], str, type[Exception]]] = [
    (lambda s: s, "segments", T),  # a tensor, not pairs
    (lambda s: 3, "segments", T),
    (lambda s: [s], "segments[0]", T),  # not a pair
    (lambda s: [(s, True)], "segments[0] start_pos", T),
    (lambda s: [(s, 0.0)], "segments[0] start_pos", T),
    (lambda s: [(s, -1)], "segments[0] start_pos", V),
    (lambda s: [(s.tolist(), 0)], "segments[0] free_index", T),
    (lambda s: [(s.to(torch.float32), 0)], "segments[0] free_index", T),
    (lambda s: [(s.reshape(1, -1), 0)], "segments[0] free_index", V),
    (lambda s: [(s, 4), (s[:1], 0)], "segments", V),  # descending
]


@pytest.mark.parametrize("cls", [c for c, r in ROWS.items() if r.slots])
@pytest.mark.parametrize(("make_bad", "name", "exc"), _SEGMENTS, ids=[s[1] for s in _SEGMENTS])
def test_free_segments(
    cls: str, make_bad: Callable[[torch.Tensor], object], name: str, exc: type[Exception]
) -> None:
    a = ROWS[cls].make()
    slots = a.alloc(ROWS[cls].page_size)
    assert slots is not None
    _raises(exc, name, lambda: a.free_segments(make_bad(slots)))
    a.free_segments([(slots, 0)])  # the valid call
