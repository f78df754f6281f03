"""The hostile-input catalogue: for an argument of a given kind, the wrong values to try.

Each builder in ``test_catalogue.py`` returns a *valid* call (every argument right); the suite
then replaces one argument at a time with each hostile value of its kind, so the error must
name that argument. Kinds:

* ``idx``: a 1-D int index tensor whose negative entries are a documented "skip";
  ``pair_idx``: the same, paired with another argument of equal length;
* ``slots``: a 1-D int index tensor where a negative entry is an error;
* ``lens``: 1-D int lengths (>= 0); ``page_ids``: free page ids (>= 1, no known upper bound);
* ``table_rows``: row indices of a table (negative is an error, duplicates in a batch are an
  error); ``table_slots``: slots stored into an int32 table (must fit it; no known bound);
* ``data``: a float tensor of rows (dtype casts are allowed, so no dtype variants);
* ``count``: a Python int >= 0; ``layer``: a layer id; ``page_size``: a power of two;
* ``buffers``: a list of tensors (``[role]``), ``layers``: a list of lists (``[role][layer]``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["VARIANTS", "hostile_values"]

Variant = Callable[[object], object]


def _t(value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"catalogue variant needs a tensor, got {type(value).__name__}")
    return value


def _set_first(value: object, x: int) -> torch.Tensor:
    t = _t(value).clone()
    if t.numel():
        t.view(-1)[0] = x
    return t


def _index_common() -> dict[str, Variant]:
    return {
        "float": lambda v: _t(v).to(torch.float32),
        "bool": lambda v: _t(v).to(torch.bool),
        "int16": lambda v: _t(v).to(torch.int16),
        "meta": lambda v: _t(v).to("meta"),
        "2-D": lambda v: _t(v).reshape(1, -1),
        "list": lambda v: _t(v).tolist(),
        "out of range": lambda v: _set_first(v, 10**6),
    }


def _negative(value: object) -> torch.Tensor:
    return _set_first(value, -1)


def _duplicate(value: object) -> torch.Tensor:
    t = _t(value).clone()
    if t.numel() >= 2:
        t[1] = t[0]
    return t


def _shorter(value: object) -> torch.Tensor:
    return _t(value)[:-1]


VARIANTS: dict[str, dict[str, Variant]] = {
    "idx": _index_common(),
    "pair_idx": {**_index_common(), "mismatched length": _shorter},
    "slots": {**_index_common(), "negative": _negative},
    "page_ids": {
        **{k: f for k, f in _index_common().items() if k != "out of range"},
        "negative": _negative,
        "padding page 0": lambda v: _set_first(v, 0),
    },
    "table_rows": {**_index_common(), "negative": _negative, "duplicate": _duplicate},
    "table_slots": {
        **{k: f for k, f in _index_common().items() if k != "out of range"},
        "mismatched length": _shorter,
        "past int32": lambda v: _set_first(v, 2**31),
    },
    "lens": {
        "float": lambda v: _t(v).to(torch.float32),
        "meta": lambda v: _t(v).to("meta"),
        "2-D": lambda v: _t(v).reshape(1, -1),
        "list": lambda v: _t(v).tolist(),
        "negative": _negative,
    },
    "data": {
        "meta": lambda v: _t(v).to("meta"),
        "list": lambda v: _t(v).tolist(),
        "wrong row shape": lambda v: torch.cat([_t(v), _t(v)[..., :1]], dim=-1),
        "1-D": lambda v: _t(v).reshape(-1),
    },
    "count": {"float": lambda v: 1.5, "str": lambda v: "1", "negative": lambda v: -1},
    "layer": {"float": lambda v: 0.5, "negative": lambda v: -1, "past the last": lambda v: 99},
    # SGLang's host-pool loads: a layer outside the pool is a documented no-op, not an error
    "host layer": {"float": lambda v: 0.5, "str": lambda v: "0", "bool": lambda v: True},
    "page_size": {"zero": lambda v: 0, "not a power of two": lambda v: 3, "float": lambda v: 4.0},
    "buffers": {"a tensor": lambda v: v[0], "empty": lambda v: []},  # type: ignore[index]
    "layers": {"a tensor": lambda v: v[0][0], "empty": lambda v: []},  # type: ignore[index]
}


def hostile_values(kind: str, value: object) -> dict[str, object]:
    """``{variant: hostile value}`` for one valid ``value`` of ``kind``."""
    return {name: make(value) for name, make in VARIANTS[kind].items()}
