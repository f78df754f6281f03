"""A hybrid model's linear-state cache parameters (SGLang's ``Mamba2StateShape``,
``Mamba2StateDType``, ``Mamba2CacheParams``: per-layer state shapes and dtypes, and the Mamba-2
tensor-parallel shape rule) and how :class:`~mem_cache_pool.mamba.MambaPool` reads any object
shaped like them. The public path is :mod:`mem_cache_pool.mamba`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from mem_cache_kernels import checks

__all__ = [
    "BaseLinearStateParams",
    "Mamba2CacheParams",
    "Mamba2StateDType",
    "Mamba2StateShape",
]


# --------------------------------------------------------------------------- cache parameters
@dataclass(kw_only=True, frozen=True)
class Mamba2StateDType:
    """Dtypes of the conv and temporal states (SGLang defaults: bfloat16 conv, float32 SSM)."""

    conv: torch.dtype = torch.bfloat16
    temporal: torch.dtype = torch.float32


@dataclass(kw_only=True, frozen=True)
class Mamba2StateShape:
    """Per-layer, per-request state shapes: ``conv`` one ``(dim, conv_kernel - 1)`` per conv
    tensor, ``temporal`` ``(heads, head_dim, state_size)``. The other fields are SGLang's model
    geometry (optional here; only ``conv_kernel`` is read, for speculative conv windows)."""

    conv: list[tuple[int, ...]]
    temporal: tuple[int, ...]
    disable_conv_window_dedup: bool = False
    intermediate_size: int = 0
    conv_dim: int = 0
    ssm_state_size: int = 0
    num_heads: int = 0
    head_dim: int = 0
    state_size: int = 0
    conv_kernel: int = 0
    num_k_heads_per_tp: int = 1
    conv_shard_groups: list[int] | None = None

    @staticmethod
    def create(
        *,
        tp_world_size: int,
        intermediate_size: int,
        n_groups: int,
        num_heads: int,
        head_dim: int,
        state_size: int,
        conv_kernel: int,
        conv_shard_groups: list[int] | None = None,
    ) -> Mamba2StateShape:
        """Mamba-2 shapes for one tensor-parallel rank (SGLang's rule: groups are extended so
        that every head's groups shard with it; conv over ``intermediate + 2 * groups * state``)."""
        for name, value in (
            ("tp_world_size", tp_world_size),
            ("intermediate_size", intermediate_size),
            ("n_groups", n_groups),
            ("num_heads", num_heads),
            ("head_dim", head_dim),
            ("state_size", state_size),
            ("conv_kernel", conv_kernel),
        ):
            checks.check_int(name, value, minimum=1)
        k_heads = -(-n_groups // tp_world_size)
        if n_groups % tp_world_size != 0:
            # SGLang's extra_groups_for_head_shards: replicate groups up to tp_world_size
            n_groups += tp_world_size - n_groups
        conv_dim = intermediate_size + 2 * n_groups * state_size
        for name, value in (("conv_dim", conv_dim), ("num_heads", num_heads)):
            if value % tp_world_size:
                raise ValueError(
                    f"{name} ({value}) must be divisible by tp_world_size ({tp_world_size})"
                )
        return Mamba2StateShape(
            conv=[(conv_dim // tp_world_size, conv_kernel - 1)],
            temporal=(num_heads // tp_world_size, head_dim, state_size),
            intermediate_size=intermediate_size,
            conv_dim=conv_dim,
            ssm_state_size=state_size,
            num_heads=num_heads,
            head_dim=head_dim,
            state_size=state_size,
            conv_kernel=conv_kernel,
            num_k_heads_per_tp=k_heads,
            conv_shard_groups=conv_shard_groups,
        )


@runtime_checkable
class BaseLinearStateParams(Protocol):
    """What :class:`MambaPool` reads of a model's cache parameters: SGLang's
    ``Mamba2CacheParams`` / ``KimiLinearCacheParams`` satisfy it, and so does ours."""

    @property
    def shape(self) -> Any: ...  # .conv (list of tuples), .temporal (tuple)

    @property
    def dtype(self) -> Any: ...  # .conv, .temporal (torch dtypes)

    @property
    def layers(self) -> list[int]: ...


@dataclass(kw_only=True, frozen=True)
class Mamba2CacheParams:
    """A model's linear-state cache parameters (SGLang's fields): ``shape``, ``dtype`` and the
    global ids of its Mamba layers, ``layers``."""

    shape: Mamba2StateShape
    layers: list[int]
    dtype: Mamba2StateDType = field(default_factory=Mamba2StateDType)

    @property
    def mamba_cache_per_req(self) -> int:
        """Bytes of one request's states over every layer."""
        conv = sum(math.prod(s) for s in self.shape.conv) * self.dtype.conv.itemsize
        ssm = math.prod(self.shape.temporal) * self.dtype.temporal.itemsize
        return (conv + ssm) * len(self.layers)

    @property
    def is_kda(self) -> bool:
        """KDA per-K gate (Kimi linear); ``False`` for Mamba-2 / GDN."""
        return False


def _shape_tuple(name: str, value: object) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a tuple of ints, got {type(value).__name__}")
    dims = tuple(checks.check_int(f"{name}[{i}]", d, minimum=0) for i, d in enumerate(value))
    if not dims:
        raise ValueError(f"{name} must have at least one dimension, got ()")
    return dims


def _read_params(cache_params: object) -> tuple[list[tuple[int, ...]], tuple[int, ...], Any, Any]:
    shape = getattr(cache_params, "shape", None)
    dtype = getattr(cache_params, "dtype", None)
    if shape is None or dtype is None or not hasattr(shape, "conv"):
        raise TypeError(
            "cache_params must have .shape (.conv, .temporal) and .dtype (.conv, .temporal) "
            f"like SGLang's Mamba2CacheParams, got {type(cache_params).__name__}"
        )
    conv = shape.conv
    if isinstance(conv, (str, bytes)) or not isinstance(conv, Sequence):
        raise TypeError(f"cache_params.shape.conv must be a list of shapes, got {type(conv)}")
    conv_shapes = [_shape_tuple(f"cache_params.shape.conv[{i}]", c) for i, c in enumerate(conv)]
    temporal = _shape_tuple("cache_params.shape.temporal", shape.temporal)
    conv_dtype = checks.check_dtype("cache_params.dtype.conv", dtype.conv)
    ssm_dtype = checks.check_dtype("cache_params.dtype.temporal", dtype.temporal)
    return conv_shapes, temporal, conv_dtype, ssm_dtype
