"""The argument checks every mem-cache package uses (one validation layer, bottom package).

**The exception rule** (every mem-cache package follows it, and each package tests it):

* ``TypeError``: the argument is the wrong *kind* of thing: not an ``int`` (a ``bool`` is not an
  int here), not a tensor, not a ``torch.dtype``, or a tensor of the wrong **dtype**;
* ``ValueError``: the argument is the right kind of thing with a wrong *value*: out of range,
  wrong shape or length, wrong device, not a power of two, a slot outside the pool;
* every message names the argument, the expected and the actual value
  (``"page_size must be a power of two, got 3"``).

Checks never mutate anything, so a call that validates before working fails with no state
change. Checks that need tensor *values* run only where reading them is free (CPU tensors); on a
GPU they would force a device->host synchronisation, so they run there only in debug mode
(``MEM_CACHE_DEBUG=1`` or a component's ``debug=True``): see :func:`host_values` and the ``full``
flag of :func:`check_index_values`. :func:`debug_enabled` is the one reader of that switch.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from typing import Any

import torch

# numpy reductions on a CPU tensor's buffer cost ~1 us; torch ops cost a few us each
_np: Any = importlib.import_module("numpy") if importlib.util.find_spec("numpy") else None

__all__ = [
    "DEBUG_ENV_VAR",
    "INDEX_DTYPES",
    "SMALL_BATCH",
    "IndexBound",
    "check_bool",
    "check_choice",
    "check_device_arg",
    "check_distinct",
    "check_dtype",
    "check_dtype_arg",
    "check_fits_dtype",
    "check_index",
    "check_index_range",
    "check_index_values",
    "check_int",
    "check_nonnegative",
    "check_number",
    "check_on_device",
    "check_optional_int",
    "check_page_size",
    "check_same_device",
    "check_same_length",
    "check_tensor",
    "check_tensor_list",
    "check_tensor_of",
    "debug_enabled",
    "describe",
    "host_bounds",
    "host_values",
    "is_power_of_two",
    "same_device",
]

INDEX_DTYPES = (torch.int32, torch.int64)
"""The dtypes an index tensor (slots, pages, lengths) may have."""

DEBUG_ENV_VAR = "MEM_CACHE_DEBUG"
"""The environment switch of debug mode for every mem-cache component."""

SMALL_BATCH = 64
"""Up to this many requests, host-side value checks run on Python ints (``tolist``): a few ints
beat a chain of small tensor ops. Larger batches run vectorised. One threshold for every package."""

_SHOW = 16


# ----------------------------------------------------------------------------- debug mode
def debug_enabled(flag: bool = False) -> bool:
    """``flag``, or ``MEM_CACHE_DEBUG`` set to something other than ``""``/``"0"``.

    Read on every call (tests flip it with ``monkeypatch``); components pass their own ``debug``
    constructor flag as ``flag``.
    """
    return flag or os.environ.get(DEBUG_ENV_VAR, "0") not in ("", "0")


def host_values(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` when its values are free to read (a CPU tensor), a host copy of it in debug mode
    (one device synchronisation), else ``None`` (the value checks are skipped)."""
    if t.device.type == "cpu":
        return t
    if debug_enabled() and t.device.type != "meta":
        return t.cpu()
    return None


def describe(values: torch.Tensor) -> str:
    """``[a, b, c, ...] (n total)`` for an error message (at most 16 values shown)."""
    flat = values.reshape(-1).tolist()
    shown = ", ".join(str(v) for v in flat[:_SHOW])
    more = ", ..." if len(flat) > _SHOW else ""
    return f"[{shown}{more}] ({len(flat)} total)"


# ----------------------------------------------------------------------------- scalars
def check_int(
    name: str, value: object, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]`` (bounds optional).

    ``TypeError`` for a non-int (a ``bool`` included), ``ValueError`` outside the bounds.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_optional_int(
    name: str, value: object, *, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    """:func:`check_int` that also accepts ``None``."""
    if value is None:
        return None
    return check_int(name, value, minimum=minimum, maximum=maximum)


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is a ``bool`` (not ``0``/``1``), else ``TypeError``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_number(name: str, value: object) -> float:
    """``value`` (an ``int`` or a ``float``, never a ``bool``) as a float, else ``TypeError``."""
    if isinstance(value, float):
        return value
    try:
        return float(check_int(name, value))
    except TypeError:
        raise TypeError(f"{name} must be a number, got {type(value).__name__}") from None


def check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    """``value`` if it is one of the strings ``choices``: ``TypeError`` for a non-``str``,
    ``ValueError`` for another string."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {tuple(choices)}, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def is_power_of_two(n: int) -> bool:
    """True for 1, 2, 4, ..."""
    return n > 0 and n & (n - 1) == 0


def check_page_size(value: object, name: str = "page_size") -> int:
    """Check that the page size is a positive power of two (1 included)."""
    n = check_int(name, value, minimum=1)
    if not is_power_of_two(n):
        raise ValueError(f"{name} must be a power of two, got {n}")
    return n


def check_dtype_arg(name: str, value: object) -> torch.dtype | None:
    """Check an optional ``torch.dtype`` keyword."""
    if value is not None and not isinstance(value, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype or None, got {type(value).__name__}")
    return value


def check_dtype(name: str, value: object) -> torch.dtype:
    """``value`` if it is a ``torch.dtype`` (``TypeError`` otherwise, ``None`` included)."""
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype, got {type(value).__name__}")
    return value


def check_device_arg(name: str, device: object) -> torch.device:
    """``device`` (a ``torch.device`` or a device string) as a ``torch.device``."""
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"{name} must be a torch.device or a str, got {type(device).__name__}")
    try:
        return torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"{name} must name a torch device (e.g. 'cpu', 'cuda:0'), got {device!r}"
        ) from None


# ----------------------------------------------------------------------------- tensors
def check_tensor(name: str, value: object) -> torch.Tensor:
    """Return ``value`` if it is a tensor with data, else raise naming ``name``.

    ``TypeError`` for a non-tensor; ``ValueError`` for a tensor on the meta device (it has no data:
    torch would fail later with an error that names none of the caller's arguments).
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.is_meta:
        raise ValueError(
            f"{name} must be a tensor with data (cpu or a GPU), got a tensor on the meta device"
        )
    return value


def _dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    return " or ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor_of(
    name: str,
    value: object,
    *,
    dtypes: Sequence[torch.dtype] | None = None,
    dim: int | None = None,
    min_dim: int | None = None,
    shape: str = "",
) -> torch.Tensor:
    """:func:`check_tensor`, then the dtype (one of ``dtypes``: ``TypeError``) and the rank
    (exactly ``dim`` or at least ``min_dim``: ``ValueError``).

    ``shape`` (e.g. ``"[rows, max_len]"``) describes the expected layout in the rank message.
    """
    t = check_tensor(name, value)
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must be {_dtype_names(dtypes)}, got {t.dtype}")
    layout = f" {shape}" if shape else ""
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D{layout}, got shape {tuple(t.shape)}")
    if min_dim is not None and t.dim() < min_dim:
        raise ValueError(f"{name} must be >= {min_dim}-D{layout}, got shape {tuple(t.shape)}")
    return t


def check_index(
    name: str,
    value: object,
    *,
    dtypes: Sequence[torch.dtype] = INDEX_DTYPES,
    length: int | None = None,
    device: torch.device | None = None,
    allow_meta: bool = False,
) -> torch.Tensor:
    """A 1-D index tensor: dtype in ``dtypes`` (``TypeError``), 1-D, ``length`` elements and on
    ``device`` when given (``ValueError``). ``allow_meta``: accept meta tensors (shape-only
    dry runs of a component); the ops that move data never do."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not allow_meta:
        check_tensor(name, value)
    if value.dtype not in dtypes:
        raise TypeError(f"{name} must be {_dtype_names(dtypes)}, got {value.dtype}")
    if value.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(value.shape)}")
    if length is not None and value.shape[0] != length:
        raise ValueError(f"{name} must have {length} elements, got {value.shape[0]}")
    if device is not None:
        check_on_device(name, value, device)
    return value


_LIST_BOUNDS = 32


def host_bounds(t: torch.Tensor) -> tuple[int, int]:
    """``(min, max)`` of a non-empty integer tensor, as ints (a device tensor synchronises once).

    A 1-D CPU tensor of at most 32 entries is read with ``tolist`` and Python's ``min`` / ``max``:
    1.6 against 2.1 us for 32 entries in a tight loop, and about half of a reduction's cost inside
    a scheduler step, which finds the reduction's code cold (``tools.bench.sglang_step``); any
    other tensor takes one ``aminmax``.
    """
    if t.is_cpu and t.dim() == 1 and t.shape[0] <= _LIST_BOUNDS:
        values: list[int] = t.tolist()
        return min(values), max(values)
    lo, hi = torch.aminmax(t)
    return int(lo), int(hi)


def check_index_values(
    name: str, t: torch.Tensor, *, limit: int, minimum: int = 0, full: bool = False
) -> None:
    """``ValueError`` unless every entry lies in ``[minimum, limit)``.

    Reads values only where that is free (a CPU tensor) or when ``full`` (debug mode: one device
    synchronisation); otherwise the range is the caller's guarantee.
    """
    if (full or t.is_cpu) and t.numel() > 0 and not t.is_meta:
        lo, hi = host_bounds(t)
        if lo < minimum or hi >= limit:
            raise ValueError(
                f"{name} values must lie in [{minimum}, {limit}), got min {lo}, max {hi}"
            )


def check_distinct(name: str, t: torch.Tensor, *, full: bool = False) -> None:
    """``ValueError`` if an index tensor repeats a value (read as :func:`check_index_values`)."""
    n = t.numel()
    if (full or t.is_cpu) and n > 1 and not t.is_meta:
        if n <= SMALL_BATCH and t.is_cpu:  # a few ints: a Python set beats torch.unique
            distinct = len(set(t.tolist()))
        else:
            distinct = int(torch.unique(t).numel())
        if distinct != t.numel():
            raise ValueError(
                f"{name} must not repeat a slot, got {t.numel() - distinct} repeated entries"
            )


def check_nonnegative(name: str, values: torch.Tensor | None, what: str = "entries") -> None:
    """Raise ``ValueError`` if a host-readable index tensor holds a negative entry."""
    if values is not None and values.numel():
        lo = int(values.min())
        if lo < 0:
            at = int(torch.nonzero(values < 0)[0, 0])
            raise ValueError(f"{name} must hold {what} >= 0, got {lo} at position {at}")


def check_fits_dtype(name: str, values: torch.Tensor | None, dtype: torch.dtype, into: str) -> None:
    """Raise ``ValueError`` if a host-readable integer tensor holds a value outside ``dtype``'s
    range (it would be stored wrapped, e.g. slot 2**31 as -2**31 in an int32 table)."""
    if values is None or not values.numel() or values.dtype.itemsize <= dtype.itemsize:
        return
    info = torch.iinfo(dtype)
    lo, hi = host_bounds(values)
    if lo < info.min or hi > info.max:
        bad = hi if hi > info.max else lo
        raise ValueError(
            f"{name} must hold values that fit {into} ({dtype}, [{info.min}, {info.max}]), "
            f"got {bad}"
        )


def check_same_length(**tensors: torch.Tensor) -> int:
    """Check that all given 1-D tensors have the same length; return it."""
    lengths = {name: t.shape[0] for name, t in tensors.items()}
    if len(set(lengths.values())) > 1:
        desc = ", ".join(f"{name}={n}" for name, n in lengths.items())
        raise ValueError(f"index tensors must have equal lengths, got {desc}")
    return next(iter(lengths.values())) if lengths else 0


def same_device(a: torch.device, b: torch.device) -> bool:
    """``a`` and ``b`` name one device (``"cuda"`` matches ``"cuda:0"``: an index is compared only
    when both sides give one)."""
    if a.type != b.type:
        return False
    return a.index is None or b.index is None or a.index == b.index


def check_on_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    """``ValueError`` unless ``t`` lives on ``device`` (see :func:`same_device`)."""
    if not same_device(t.device, device):
        raise ValueError(f"{name} must be on device {device}, got {t.device}")


def check_same_device(device: torch.device, **tensors: torch.Tensor) -> None:
    """Check that every tensor lives on ``device``."""
    for name, t in tensors.items():
        check_on_device(name, t, device)


def check_tensor_list(name: str, value: object, *, length: int | None = None) -> list[torch.Tensor]:
    """Check a non-empty sequence of tensors (optionally of a given length); return it as a list."""
    if isinstance(value, torch.Tensor) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of tensors, got {type(value).__name__}")
    items = list(value)
    if not items:
        raise ValueError(f"{name} must not be empty")
    if length is not None and len(items) != length:
        raise ValueError(f"{name} must hold {length} tensors, got {len(items)}")
    for i, t in enumerate(items):
        check_tensor(f"{name}[{i}]", t)
    return items


class IndexBound:
    """The largest entry of an index tensor, read once and checked against many buffers.

    Only CPU tensors are read (free); for device tensors the check is skipped (it would cost a
    host synchronisation) and the range is the caller's guarantee. Negative entries mean "skip".
    """

    __slots__ = ("name", "top")

    def __init__(self, name: str, idx: torch.Tensor) -> None:
        self.name = name
        self.top = int(idx.max()) if idx.device.type == "cpu" and idx.numel() else None

    def check(self, rows: int, what: str) -> None:
        """Raise ``ValueError`` if an entry is ``>= rows`` (the row count of ``what``)."""
        if self.top is not None and self.top >= rows:
            raise ValueError(
                f"{self.name} must index rows of {what} (< {rows}), got index {self.top}"
            )


def check_index_range(name: str, idx: torch.Tensor, rows: int, what: str) -> None:
    """On CPU only (free to read): every index must be ``< rows`` (negatives mean "skip")."""
    IndexBound(name, idx).check(rows, what)
