"""The device KV pool contract: ``KVCache``, ``KVWriteLoc`` and the buffer descriptor.

Index conventions (shared by every pool, allocator and host pool of mem-cache):

* A *slot* (token location, ``loc``) is a row index into every per-layer buffer of a pool. Slots
  are int64 (int32 accepted on input) tensors on the pool's device.
* With page size ``ps``, page ``p`` owns slots ``[p * ps, (p + 1) * ps)``. Every per-layer buffer
  has ``size + ps`` rows: page 0 (slots ``[0, ps)``) is the padding page, a write sink for padded
  tokens that allocators never hand out.
* Layer ids are global: a pool holds layers ``[start_layer, end_layer)`` (a pipeline stage; note
  the half-open range, ``end_layer = start_layer + layer_num`` by default) and
  indexes its buffers by ``layer_id - start_layer``.
* fp8 pools (``float8_e4m3fn``, ``float8_e5m2``, ...) store their rows as ``uint8``
  (``store_dtype``) and view them back as ``dtype`` on read.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

__all__ = [
    "FP8_DTYPES",
    "KVBufferDesc",
    "KVCache",
    "KVWriteLoc",
    "LayerReadyWaiter",
    "storage_dtype",
]

FP8_DTYPES: frozenset[torch.dtype] = frozenset(
    d
    for d in (
        getattr(torch, "float8_e4m3fn", None),
        getattr(torch, "float8_e5m2", None),
        getattr(torch, "float8_e4m3fnuz", None),
        getattr(torch, "float8_e5m2fnuz", None),
    )
    if d is not None
)


def storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a pool stores ``dtype`` rows in: ``uint8`` for fp8, ``dtype`` otherwise."""
    return torch.uint8 if dtype in FP8_DTYPES else dtype


@runtime_checkable
class LayerReadyWaiter(Protocol):
    """Blocks a reader until layer ``layer_index`` (``layer_id - start_layer``) is loaded.

    A host pool's layer-wise loader implements this; the device pool calls ``wait_until`` from
    ``get_key_buffer`` / ``get_value_buffer`` so attention on layer i overlaps loading of i + 1.
    """

    def wait_until(self, layer_index: int) -> None: ...


@dataclass(frozen=True, slots=True)
class KVWriteLoc:
    """Where one forward writes its new K/V rows.

    ``loc`` are slots of the (full-attention) pool; ``swa_loc`` the same tokens' slots in a
    sliding-window sub-pool, when the pool has one. A caller builds one ``KVWriteLoc`` per forward
    and makes one ``set_kv_buffer`` call per layer for any pool type.
    """

    loc: torch.Tensor
    swa_loc: torch.Tensor | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class KVBufferDesc:
    """Everything a host pool or a transfer engine needs to know about a device pool.

    ``buffers[r][l]`` is the tensor of role ``roles[r]`` (``"k"``/``"v"`` for MHA, ``"kv"`` for
    MLA) for local layer ``l``: shape ``[size + page_size, *row_shape[r]]``, dtype ``store_dtype``,
    rows contiguous (row stride ``row_bytes[r]`` bytes). ``data_ptrs`` is a uint64 tensor on the
    pool's device holding ``buffers[r][l].data_ptr()`` at index ``r * layer_num + l``.
    """

    roles: tuple[str, ...]
    buffers: tuple[tuple[torch.Tensor, ...], ...]
    row_shape: tuple[tuple[int, ...], ...]
    row_bytes: tuple[int, ...]
    data_ptrs: torch.Tensor
    size: int
    page_size: int
    layer_num: int
    start_layer: int
    dtype: torch.dtype
    store_dtype: torch.dtype
    device: torch.device

    @property
    def item_bytes(self) -> tuple[int, ...]:
        """Bytes of one page of one layer, per role (``row_bytes * page_size``)."""
        return tuple(b * self.page_size for b in self.row_bytes)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token occupies across all roles and layers."""
        return sum(self.row_bytes) * self.layer_num

    def role_buffers(self, role: str) -> tuple[torch.Tensor, ...]:
        """Per-layer buffers of ``role``; ``ValueError`` naming the known roles otherwise."""
        if role not in self.roles:
            raise ValueError(f"role must be one of {self.roles}, got {role!r}")
        return self.buffers[self.roles.index(role)]


def _pointer_table(buffers: Sequence[Sequence[torch.Tensor]], device: torch.device) -> torch.Tensor:
    ptrs = [t.data_ptr() for role in buffers for t in role]
    # data pointers fit in int64 on every supported platform; reinterpret as uint64
    return torch.tensor(ptrs, dtype=torch.int64, device=device).view(torch.uint64)


class KVCache(abc.ABC):
    """Base class of device KV pools (mirrors SGLang's ``KVCache``)."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        layer_num: int,
        device: str | torch.device,
        enable_memory_saver: bool = False,
        start_layer: int | None = None,
        end_layer: int | None = None,
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.store_dtype = storage_dtype(dtype)
        self.layer_num = layer_num
        self.device = torch.device(device)
        self.enable_memory_saver = enable_memory_saver
        self.start_layer = start_layer or 0
        # half-open: the pool holds global layers [start_layer, end_layer)
        self.end_layer = end_layer if end_layer is not None else self.start_layer + layer_num
        self.layer_transfer_counter: LayerReadyWaiter | None = None

    @abc.abstractmethod
    def get_key_buffer(self, layer_id: int) -> torch.Tensor: ...

    @abc.abstractmethod
    def get_value_buffer(self, layer_id: int) -> torch.Tensor: ...

    @abc.abstractmethod
    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    @abc.abstractmethod
    def set_kv_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor | KVWriteLoc,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
    ) -> None: ...

    def register_layer_transfer_counter(self, counter: LayerReadyWaiter | None) -> None:
        """Install (or remove with ``None``) the per-layer readiness waiter."""
        self.layer_transfer_counter = counter
