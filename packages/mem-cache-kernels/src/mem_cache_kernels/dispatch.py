"""The trusted entry to every kernel op, for the packages above (pools, allocators, host pools).

A public op of :mod:`mem_cache_kernels` (``store_kv``, ``alloc_extend``, ...) checks its arguments,
then runs the implementation :func:`pick` returns. A pool, allocator or host pool that has
already checked its own arguments at its public method calls :func:`pick` itself and runs the
same implementation directly: no second validation on the way down.

``pick(op, backend, *tensors)(*args)``: ``op`` is the op's name (``list_ops()``), ``backend`` is
``"auto" | "torch" | "triton"`` resolved as the public ops resolve it (``MEM_CACHE_KERNELS_BACKEND``
replaces ``"auto"``), ``tensors`` are the operands that decide the device. The implementation
takes the public op's arguments in order, without ``backend`` and with keyword-only arguments
passed positionally, and trusts them: valid shapes, dtypes, devices and in-range indices
(negative index entries are skipped, as in the public ops).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mem_cache_kernels._dispatch import implementation
from mem_cache_kernels._registry import op as _op

__all__ = ["pick"]


def pick(op: str, backend: str, *tensors: torch.Tensor) -> Callable[..., Any]:
    """The implementation of kernel op ``op`` for ``backend`` on ``tensors`` (trusted arguments).

    ``KeyError`` for an unknown op name; the backend errors of ``resolve_backend``."""
    return implementation(_op(op), backend, *tensors)
