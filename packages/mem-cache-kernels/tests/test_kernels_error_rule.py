"""The exception rule (:mod:`mem_cache_kernels.checks`) for every public op of this package.

Table-driven from ``list_ops()``: each op has a valid call and three mistakes, each made in one
argument, and the error must name that argument:

* ``kind``: not a tensor / the wrong Python type -> ``TypeError``;
* ``dtype``: a tensor of the wrong dtype -> ``TypeError``;
* ``value``: wrong shape, length or value -> ``ValueError``.

Ops that take ``backend`` also get a non-str backend (``TypeError``) and an unknown name
(``ValueError``). An op added to the catalogue without a row here fails
``test_every_op_has_a_case``. The valid call must succeed and reach the torch implementation the
catalogue names (so the table cannot rot into calls that fail for another reason).
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import mem_cache_kernels as mk
from mem_cache_kernels import deepseek_v4 as d4
from mem_cache_kernels import dispatch

I32, I64 = torch.int32, torch.int64
U8 = torch.uint8


def _i(*xs: int, dtype: torch.dtype = I64) -> torch.Tensor:
    return torch.tensor(xs, dtype=dtype)


@dataclass(frozen=True)
class Case:
    """A valid call (``args``, built fresh per use) and one mistake per exception class:
    ``(argument, replacement)``."""

    args: Callable[[], dict[str, Any]]
    kind: tuple[str, object]
    dtype: tuple[str, object]
    value: tuple[str, object]


def _store() -> dict[str, Any]:
    return {
        "k_cache": torch.zeros(8, 2, 4),
        "v_cache": torch.zeros(8, 2, 4),
        "loc": _i(1, 2),
        "k": torch.ones(2, 2, 4),
        "v": torch.ones(2, 2, 4),
    }


def _layers(rows: int = 8, layers: int = 2) -> list[list[torch.Tensor]]:
    return [[torch.arange(rows * 4.0).view(rows, 4) for _ in range(layers)]]


def _mamba_states(slots: int = 6) -> list[torch.Tensor]:
    return [torch.arange(2 * slots * 6.0).view(2, slots, 2, 3), torch.zeros(2, slots, 4, dtype=U8)]


def _page_buffer() -> torch.Tensor:
    return torch.zeros(4, d4.page_row_bytes(2), dtype=U8)


CASES: dict[str, Case] = {
    "alloc_extend": Case(
        lambda: {
            "prefix_lens": _i(2),
            "seq_lens": _i(11),
            "last_loc": _i(1),
            "free_pages": _i(3, 4),
            "out": torch.empty(9, dtype=I64),
            "page_size": 4,
        },
        kind=("prefix_lens", [2]),
        dtype=("seq_lens", torch.tensor([11.0])),
        value=("out", torch.empty(8, dtype=I64)),
    ),
    "alloc_decode": Case(
        lambda: {
            "seq_lens": _i(5),
            "last_loc": _i(3),
            "free_pages": _i(4),
            "out": torch.empty(1, dtype=I64),
            "page_size": 4,
        },
        kind=("page_size", 4.0),
        dtype=("out", torch.empty(1, dtype=I32)),
        value=("last_loc", _i(3).view(1, 1)),
    ),
    "write_req_to_token": Case(
        lambda: {
            "req_to_token": torch.zeros(4, 8, dtype=I32),
            "req_pool_indices": _i(1),
            "prefix_lens": _i(0),
            "seq_lens": _i(3),
            "out_cache_loc": _i(5, 6, 7),
        },
        kind=("req_to_token", [[0] * 8] * 4),
        dtype=("req_to_token", torch.zeros(4, 8)),
        value=("out_cache_loc", _i(5, 6)),
    ),
    "get_last_loc": Case(
        lambda: {
            "req_to_token": torch.arange(32, dtype=I32).view(4, 8),
            "req_pool_indices": _i(1, 2),
            "prefix_lens": _i(3, 0),
        },
        kind=("prefix_lens", 3),
        dtype=("req_pool_indices", torch.tensor([1.0, 2.0])),
        value=("req_to_token", torch.zeros(32, dtype=I32)),
    ),
    "store_kv": Case(
        _store,
        kind=("k", [[0.0] * 4] * 2),
        dtype=("loc", torch.tensor([1.0, 2.0])),
        value=("v", torch.ones(2, 2, 5)),
    ),
    "set_mla_kv_buffer": Case(
        lambda: {
            "kv_buffer": torch.zeros(8, 1, 6),
            "loc": _i(1, 2),
            "k_nope": torch.ones(2, 1, 4),
            "k_rope": torch.ones(2, 1, 2),
        },
        kind=("k_rope", (1.0, 2.0)),
        dtype=("loc", _i(1, 2, dtype=torch.int16)),
        value=("kv_buffer", torch.zeros(8)),
    ),
    "get_mla_kv_buffer": Case(
        lambda: {"kv_buffer": torch.zeros(8, 1, 6), "loc": _i(1, 2), "nope_dim": 4},
        kind=("nope_dim", "4"),
        dtype=("loc", torch.tensor([True, False])),
        value=("nope_dim", 6),
    ),
    "copy_all_layer_kv_cache": Case(
        lambda: {
            "buffers": [torch.zeros(8, 4), torch.zeros(8, 2)],
            "tgt_loc": _i(1, 2),
            "src_loc": _i(3, 4),
        },
        kind=("buffers", torch.zeros(8, 4)),
        dtype=("src_loc", torch.tensor([3.0, 4.0])),
        value=("tgt_loc", _i(1, 2, 5)),
    ),
    "transfer_rows": Case(
        lambda: {
            "src": [torch.ones(8, 4)],
            "dst": [torch.zeros(8, 4)],
            "src_indices": _i(1, 2),
            "dst_indices": _i(3, 4),
        },
        kind=("dst", [1.0]),
        dtype=("dst_indices", _i(3, 4, dtype=torch.int16)),
        value=("src_indices", _i(1, 2).view(1, 2)),
    ),
    "transfer_rows_all_layers": Case(
        lambda: {
            "src": _layers(),
            "dst": _layers(),
            "src_indices": _i(1, 2),
            "dst_indices": _i(3, 4),
        },
        kind=("src", [torch.zeros(8, 4)]),
        dtype=("src_indices", torch.tensor([1.0, 2.0])),
        value=("dst", _layers(layers=3)),
    ),
    "load_layer_from_page_first": Case(
        lambda: {
            "host": [torch.ones(10, 2, 4)],
            "device": [torch.zeros(8, 4)],
            "host_indices": _i(1, 2),
            "device_indices": _i(3, 4),
            "layer_id": 1,
        },
        kind=("layer_id", 1.0),
        dtype=("host_indices", torch.tensor([1.0, 2.0])),
        value=("layer_id", 2),
    ),
    "backup_all_layers_to_page_first": Case(
        lambda: {
            "device": _layers(),
            "host": [torch.zeros(10, 2, 4)],
            "device_indices": _i(1, 2),
            "host_indices": _i(3, 4),
        },
        kind=("host", 3),
        dtype=("device_indices", torch.tensor([1.0, 2.0])),
        value=("host", [torch.zeros(10, 3, 4)]),
    ),
    "direct_transfer_rows": Case(
        lambda: {
            "src": _layers(),
            "dst": _layers(),
            "src_indices": _i(0, 1),
            "dst_indices": _i(4, 5),
            "page_size": 2,
        },
        kind=("page_size", 2.0),
        dtype=("dst_indices", torch.tensor([4.0, 5.0])),
        value=("src_indices", _i(0, 1, 2)),
    ),
    "direct_load_layer_from_page_first_direct": Case(
        lambda: {
            "host": [torch.ones(5, 2, 2, 4)],
            "device": [torch.zeros(8, 4)],
            "host_indices": _i(2, 3),
            "device_indices": _i(4, 5),
            "layer_id": 1,
            "page_size": 2,
        },
        kind=("device", torch.zeros(8, 4)),
        dtype=("device_indices", torch.tensor([4.0, 5.0])),
        value=("host", [torch.ones(5, 2, 8)]),
    ),
    "direct_backup_all_layers_to_page_first_direct": Case(
        lambda: {
            "device": _layers(),
            "host": [torch.zeros(5, 2, 2, 4)],
            "device_indices": _i(4, 5),
            "host_indices": _i(2, 3),
            "page_size": 2,
        },
        kind=("host_indices", [2, 3]),
        dtype=("host_indices", torch.tensor([2.0, 3.0])),
        value=("page_size", 3),
    ),
    "deepseek_v4.quantize_nope": Case(
        lambda: {"nope": torch.randn(2, 448)},
        kind=("nope", [[0.0] * 448]),
        dtype=("nope", torch.zeros(2, 448, dtype=I32)),
        value=("nope", torch.randn(2, 447)),
    ),
    "deepseek_v4.dequantize_nope": Case(
        lambda: {
            "nope_fp8": torch.zeros(2, 448, dtype=U8),
            "scales": torch.full((2, 7), 127, dtype=U8),
        },
        kind=("scales", None),
        dtype=("scales", torch.zeros(2, 7)),
        value=("nope_fp8", torch.zeros(2, 64, dtype=U8)),
    ),
    "deepseek_v4.pack_records": Case(
        lambda: {
            "nope_fp8": torch.zeros(2, 448, dtype=U8),
            "scales": torch.zeros(2, 7, dtype=U8),
            "rope": torch.zeros(2, 64, dtype=torch.bfloat16),
        },
        kind=("rope", [0.0] * 64),
        dtype=("rope", torch.zeros(2, 64)),
        value=("scales", torch.zeros(1, 7, dtype=U8)),
    ),
    "deepseek_v4.unpack_records": Case(
        lambda: {"records": torch.zeros(2, 584, dtype=U8)},
        kind=("records", b"\x00" * 584),
        dtype=("records", torch.zeros(2, 584, dtype=I32)),
        value=("records", torch.zeros(2, 583, dtype=U8)),
    ),
    "deepseek_v4.write_records": Case(
        lambda: {
            "buffer": _page_buffer(),
            "loc": _i(1, 6),
            "records": torch.ones(2, 584, dtype=U8),
            "page_size": 2,
        },
        kind=("page_size", "2"),
        dtype=("loc", torch.tensor([1.0, 6.0])),
        value=("records", torch.ones(1, 584, dtype=U8)),
    ),
    "mamba.copy_state_slots": Case(
        lambda: {"states": _mamba_states(), "src_slots": _i(1, 2), "dst_slots": _i(3, 4)},
        kind=("states", torch.zeros(2, 6, 3)),
        dtype=("src_slots", torch.tensor([1.0, 2.0])),
        value=("dst_slots", _i(3, 6)),
    ),
    "mamba.gather_state_slots": Case(
        lambda: {"states": _mamba_states(), "slots": _i(5, 0), "out": _mamba_states(2)},
        kind=("out", "host"),
        dtype=("slots", torch.tensor([5.0, 0.0])),
        value=("slots", _i(6, 0)),
    ),
    "mamba.scatter_state_slots": Case(
        lambda: {"states": _mamba_states(), "slots": _i(1, 2), "src": _mamba_states(2)},
        kind=("src", None),
        dtype=("src", [t.double() for t in _mamba_states(2)]),
        value=("src", _mamba_states(3)[:1]),
    ),
    "deepseek_v4.read_records": Case(
        lambda: {"buffer": _page_buffer(), "loc": _i(1, 6), "page_size": 2},
        kind=("buffer", [0] * 8),
        dtype=("buffer", torch.zeros(4, d4.page_row_bytes(2))),
        value=("page_size", 0),
    ),
}


def _op_function(qualname: str) -> Callable[..., Any]:
    info = next(op for op in mk.list_ops() if op.qualname == qualname)
    fn: Callable[..., Any] = getattr(importlib.import_module(info.module), info.name)
    return fn


def _names(message: str, argument: str) -> bool:
    """``message`` names ``argument`` as a whole word (``dst`` in ``dst[0]`` counts)."""
    return re.search(rf"(?<![\w.]){re.escape(argument)}(?!\w)", message) is not None


QUALNAMES = sorted(CASES)


def test_every_op_has_a_case() -> None:
    assert {op.qualname for op in mk.list_ops()} == set(CASES)


@pytest.mark.parametrize("qualname", QUALNAMES)
def test_valid_call_reaches_the_tabled_implementation(
    qualname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A valid call runs its op's torch row of ``dispatch.TABLE`` exactly once (and an op
    without a row, nothing of the table)."""
    calls: list[str] = []
    table = dict(dispatch.TABLE)
    for name, (torch_fn, load_triton_fn) in dispatch.TABLE.items():

        def counted(*args: Any, _name: str = name, _fn: Any = torch_fn, **kw: Any) -> Any:
            calls.append(_name)
            return _fn(*args, **kw)

        table[name] = (counted, load_triton_fn)
    monkeypatch.setattr(dispatch, "TABLE", table)
    fn = _op_function(qualname)
    kwargs = CASES[qualname].args()
    if "backend" in inspect.signature(fn).parameters:
        kwargs["backend"] = "torch"
    fn(**kwargs)
    info = next(op for op in mk.list_ops() if op.qualname == qualname)
    if not info.backends:  # the public function is the implementation: nothing dispatched
        assert calls == []
        return
    assert calls == [info.name]


@pytest.mark.parametrize("mistake", ["kind", "dtype", "value"])
@pytest.mark.parametrize("qualname", QUALNAMES)
def test_mistake_raises_by_the_rule(qualname: str, mistake: str) -> None:
    case = CASES[qualname]
    argument, bad = getattr(case, mistake)
    kwargs = case.args()
    assert argument in kwargs, f"{qualname}: no argument {argument!r}"
    kwargs[argument] = bad
    error = ValueError if mistake == "value" else TypeError
    with pytest.raises((TypeError, ValueError)) as info:
        _op_function(qualname)(**kwargs)
    assert type(info.value) is error, f"{qualname} {mistake}: {info.value!r}"
    assert _names(str(info.value), argument), f"{qualname}: {info.value} (names no {argument})"


@pytest.mark.parametrize("qualname", QUALNAMES)
def test_backend_argument_follows_the_rule(qualname: str) -> None:
    fn = _op_function(qualname)
    if "backend" not in inspect.signature(fn).parameters:
        pytest.skip("no backend choice")
    for bad, error in ((3, TypeError), ("gpu", ValueError)):
        with pytest.raises(error, match=r"^backend must be one of"):
            fn(**CASES[qualname].args(), backend=bad)
