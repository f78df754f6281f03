"""Generic argument checks the kernels need that :mod:`mem_cache_kernels.checks` lacks.

Candidates for ``checks.py`` (the one validation layer): they follow its exception rule
(``TypeError`` for the wrong kind of thing or a wrong tensor dtype, ``ValueError`` for a wrong
value or shape; every message names the argument, the expected and the actual value) and are
written once here so that no kernels module repeats them. Nothing else in the package raises
for a generic reason.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels import checks as v

__all__ = ["check_choice", "check_tensor_of"]


def check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    """``value`` if it is one of the strings ``choices``: ``TypeError`` for a non-str,
    ``ValueError`` for another string."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {tuple(choices)}, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
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
    """:func:`~mem_cache_kernels.checks.check_tensor`, then the dtype (one of ``dtypes``:
    ``TypeError``) and the rank (exactly ``dim`` or at least ``min_dim``: ``ValueError``).

    ``shape`` (e.g. ``"[rows, max_len]"``) describes the expected layout in the rank message.
    """
    t = v.check_tensor(name, value)
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must be {_dtype_names(dtypes)}, got {t.dtype}")
    layout = f" {shape}" if shape else ""
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D{layout}, got shape {tuple(t.shape)}")
    if min_dim is not None and t.dim() < min_dim:
        raise ValueError(f"{name} must be >= {min_dim}-D{layout}, got shape {tuple(t.shape)}")
    return t
