"""Shared argument checks for the public ops.

Every public op validates its arguments with these helpers *before* any work, so a failed call
mutates nothing. Caller mistakes raise ``TypeError`` (wrong Python type or tensor dtype) or
``ValueError`` (wrong shape, length, device, size or value); every message names the argument, the
expected and the actual value.

Checks that need tensor *values* (for example "``out`` holds exactly sum(seq - prefix) slots") are
done only when the tensor lives on the CPU, where reading it is free; on a GPU they would force a
host synchronisation, so device tensors are trusted there (documented per op). Debug mode
(``MEM_CACHE_DEBUG=1``, the switch the other mem-cache packages read) runs those value checks on
every device, copying the tensors to the host first (:func:`value_checks_for`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

__all__ = [
    "DEBUG_ENV_VAR",
    "INDEX_DTYPES",
    "IndexBound",
    "as_byte_rows",
    "check_dtype_arg",
    "check_index",
    "check_index_range",
    "check_int",
    "row_bytes",
    "check_page_size",
    "check_same_device",
    "check_same_length",
    "check_fits_dtype",
    "check_nonnegative",
    "debug_enabled",
    "host_values",
    "check_tensor",
    "check_tensor_list",
    "is_power_of_two",
]

INDEX_DTYPES = (torch.int32, torch.int64)
DEBUG_ENV_VAR = "MEM_CACHE_DEBUG"


def debug_enabled() -> bool:
    """True when ``MEM_CACHE_DEBUG`` is set to something other than ``""``/``"0"``.

    Read on every call (tests flip it with ``monkeypatch``).
    """
    return os.environ.get(DEBUG_ENV_VAR, "0") not in ("", "0")


def host_values(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` when its values are free to read (a CPU tensor), a host copy of it in debug mode
    (one device synchronisation), else ``None`` (the value checks are skipped)."""
    if t.device.type == "cpu":
        return t
    if debug_enabled() and t.device.type != "meta":
        return t.cpu()
    return None


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
    lo, hi = int(values.min()), int(values.max())
    if lo < info.min or hi > info.max:
        bad = hi if hi > info.max else lo
        raise ValueError(
            f"{name} must hold values that fit {into} ({dtype}, [{info.min}, {info.max}]), "
            f"got {bad}"
        )


def check_index(name: str, value: object, *, allow_int64_only: bool = False) -> torch.Tensor:
    """Check that ``value`` is a 1-D int32/int64 tensor (int64 only when ``allow_int64_only``)."""
    t = check_tensor(name, value)
    allowed = (torch.int64,) if allow_int64_only else INDEX_DTYPES
    if t.dtype not in allowed:
        expected = " or ".join(str(d).removeprefix("torch.") for d in allowed)
        raise TypeError(f"{name} must be {expected}, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    return t


def check_same_length(**tensors: torch.Tensor) -> int:
    """Check that all given 1-D tensors have the same length; return it."""
    lengths = {name: t.shape[0] for name, t in tensors.items()}
    if len(set(lengths.values())) > 1:
        desc = ", ".join(f"{name}={n}" for name, n in lengths.items())
        raise ValueError(f"index tensors must have equal lengths, got {desc}")
    return next(iter(lengths.values())) if lengths else 0


def check_same_device(device: torch.device, **tensors: torch.Tensor) -> None:
    """Check that every tensor lives on ``device``."""
    for name, t in tensors.items():
        if t.device != device:
            raise ValueError(f"{name} must be on {device}, got a tensor on {t.device}")


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """Check that ``value`` is a Python int (not bool), optionally ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
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


def check_dtype_arg(name: str, value: object) -> torch.dtype | None:
    """Check an optional ``torch.dtype`` keyword."""
    if value is not None and not isinstance(value, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype or None, got {type(value).__name__}")
    return value


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


def row_bytes(t: torch.Tensor) -> int:
    """Bytes of one row (everything after the leading dimension)."""
    n = t.element_size()
    for size in t.shape[1:]:
        n *= size
    return n


def as_byte_rows(name: str, t: torch.Tensor) -> torch.Tensor:
    """View ``t`` (``[rows, *row]``, any row stride, C-contiguous rows) as uint8 ``[rows, bytes]``.

    No data is copied. Raises ``ValueError`` when a row is not contiguous in memory (the row
    stride itself may be anything, e.g. a page-first host buffer sliced at one layer).
    """
    if t.dim() < 1:
        raise ValueError(f"{name} must have a leading row dimension, got a 0-d tensor")
    if t.dim() == 1:
        t = t.unsqueeze(1)
    expected = 1
    for size, stride in zip(reversed(t.shape[1:]), reversed(t.stride()[1:])):
        if size != 1 and stride != expected:
            raise ValueError(
                f"{name} must have C-contiguous rows (inner strides {_contig_strides(t)}), "
                f"got strides {tuple(t.stride())} for shape {tuple(t.shape)}"
            )
        expected *= size
    rows = t.shape[0]
    row_elems = expected
    if row_elems == 0:
        raise ValueError(
            f"{name} must have rows of at least one element, got shape {tuple(t.shape)}"
        )
    row_stride = t.stride(0) if rows > 1 else row_elems
    flat = t.as_strided((rows, row_elems), (row_stride, 1))
    return flat.view(torch.uint8)


def _contig_strides(t: torch.Tensor) -> tuple[int, ...]:
    out: list[int] = []
    acc = 1
    for size in reversed(t.shape[1:]):
        out.append(acc)
        acc *= size
    return tuple(reversed(out))
