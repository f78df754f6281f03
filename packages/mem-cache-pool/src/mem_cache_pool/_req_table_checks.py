"""The full argument checks of :class:`mem_cache_pool.req_to_token.ReqToTokenPool`, run when a
call is not one of its inline forms (or to name what is wrong): the kind of every ``write`` index
part and value, the int32 range of the values, a request listed twice, and debug mode's bounds
of device index tensors. Each raises ``TypeError`` / ``ValueError`` naming the argument.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels import checks

_Index = int | slice | torch.Tensor | tuple[int | slice | torch.Tensor, ...]


def _raise_listed_twice(reqs: Sequence[object]) -> None:
    """``ValueError`` naming the first request listed twice in ``reqs``."""
    seen: dict[int, int] = {}
    for i, req in enumerate(reqs):
        first = seen.setdefault(id(req), i)
        if first != i:
            raise ValueError(
                f"reqs must not list a request twice, got the same request at reqs[{first}] "
                f"and reqs[{i}]"
            )
    raise RuntimeError("reqs lists a request twice, but no repeat was found")


def _check_index_part(part: object) -> None:
    """One part of a ``write`` index: ``TypeError`` for what torch would misread or reject with
    a message that names no argument (a bool, a float, a string, a float tensor)."""
    if isinstance(part, torch.Tensor):
        if part.dtype.is_floating_point or part.dtype.is_complex:
            raise TypeError(f"indices tensors must be integer or bool, got {part.dtype}")
    elif isinstance(part, int):
        checks.check_int("indices", part)  # a bool would index as a new axis
    elif not (part is None or part is Ellipsis or isinstance(part, (slice, list))):
        raise TypeError(
            "indices must be ints, slices, lists or int tensors (or a tuple of them), "
            f"got {type(part).__name__}"
        )


def _check_write(parts: tuple[object, ...], values: object) -> torch.Tensor | int:
    """The full check of ``write(indices, values)`` (``parts``: the index parts; ``()`` when
    they were accepted already); returns ``values`` ready to store.

    In order: a tensor without data among the parts or ``values`` (``ValueError``), the kind of
    each part (:func:`_check_index_part`), then ``values``: an integer tensor whose values fit
    int32 (read on the CPU or in debug mode), returned as int32, or an int that fits int32.
    ``TypeError`` for a float, a bool, a float or bool tensor; ``ValueError`` past int32."""
    for name, arg in (("indices", parts), ("values", values)):
        for part in arg if isinstance(arg, tuple) else (arg,):
            if isinstance(part, torch.Tensor):
                checks.check_tensor(name, part)  # meta: no data to write or address
    for part in parts:
        _check_index_part(part)
    if isinstance(values, torch.Tensor):
        if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
            raise TypeError(f"values must be an integer tensor (slots), got {values.dtype}")
        checks.check_fits_dtype("values", checks.host_values(values), torch.int32, "int32")
        return values.to(torch.int32)
    try:
        value = checks.check_int("values", values)
    except TypeError:
        raise TypeError(f"values must be an int or a tensor, got {type(values).__name__}") from None
    lo32, hi32 = -(2**31), 2**31 - 1
    if not lo32 <= value <= hi32:
        raise ValueError(f"values must fit int32 [{lo32}, {hi32}], got {value}")
    return value


def _check_device_index_bounds(table: torch.Tensor, indices: _Index) -> None:
    """Debug mode on a device: every integer tensor part of ``indices`` addresses its
    dimension of ``table``; tuples with ``None`` or ``...`` are left to torch."""
    parts: tuple[object, ...] = indices if isinstance(indices, tuple) else (indices,)
    if any(p is None or p is Ellipsis for p in parts):
        return
    for dim, part in enumerate(parts):
        if isinstance(part, torch.Tensor) and part.dtype != torch.bool and part.numel():
            size = table.shape[dim]
            lo, hi = checks.host_bounds(part)
            if lo < -size or hi >= size:
                raise IndexError(
                    f"index {hi if hi >= size else lo} is out of bounds for dimension {dim} "
                    f"with size {size}"
                )
