"""The device KV pool contract: ``KVCache``, ``KVWriteLoc`` and the buffer descriptor.

Index conventions (shared by every pool, allocator and host pool of mem-cache):

* A *slot* (token location, ``loc``) is a row index into every per-layer buffer of a pool. Slots
  are int64 (int32 accepted on input) 1-D tensors on the pool's device.
* With page size ``ps``, page ``p`` owns slots ``[p * ps, (p + 1) * ps)``. Every per-layer buffer
  has ``size + ps`` rows: page 0 (slots ``[0, ps)``) is the padding page, a write sink for padded
  tokens that allocators never hand out.
* Slot 0 is the CUDA-graph padding slot. The stores SGLang 0.5.23 guards skip it (nothing is
  written there, so it keeps its zeros): ``MHATokenToKVPool.set_kv_buffer`` (and SWA through it)
  and ``set_mla_kv_buffer`` of the MLA family. The other stores write it as SGLang does (see the
  package README's table).
* Layer ids are global: a pool holds layers ``[start_layer, end_layer)`` (a pipeline stage; note
  the half-open range, ``end_layer = start_layer + layer_num`` by default) and
  indexes its buffers by ``layer_id - start_layer``.
* fp8 pools (``float8_e4m3fn``, ``float8_e5m2``, ...) store their rows as ``uint8``
  (``store_dtype``) and view them back as ``dtype`` on read.

Checking policy: every call validates types, dtypes, shapes, devices and layer ids before it
touches a buffer, so a failed call mutates nothing. Slot *values* are range-checked when the slot
tensor is on the CPU (free) or when the pool is in debug mode (``debug=True`` or the environment
variable ``MEM_CACHE_DEBUG=1``), because on a GPU that check synchronises with the device.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from mem_cache_kernels import checks
from mem_cache_kernels.checks import check_dtype
from mem_cache_kernels.dispatch import pick
from mem_cache_pool._checks import check_copy_layers, check_copy_roles, check_layer

__all__ = [
    "FP8_DTYPES",
    "PADDING_SLOT",
    "CpuKVCopy",
    "KVBufferDesc",
    "KVCache",
    "KVWriteLoc",
    "LayerReadyWaiter",
    "storage_dtype",
    "unwrap_write_loc",
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

CpuKVCopy = dict[str, list[torch.Tensor]]
"""A retraction copy: role name -> per-layer CPU tensors ``[n, *row]`` in the store dtype."""


def storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a pool stores ``dtype`` rows in: ``uint8`` for fp8, ``dtype`` otherwise."""
    return torch.uint8 if check_dtype("dtype", dtype) in FP8_DTYPES else dtype


@runtime_checkable
class LayerReadyWaiter(Protocol):
    """Blocks a reader until layer ``layer_index`` (``layer_id - start_layer``) is loaded.

    A host pool's layer-wise loader implements this; the device pool calls ``wait_until`` from
    ``get_key_buffer`` / ``get_value_buffer`` so attention on layer i overlaps loading of i + 1.
    """

    def wait_until(self, layer_index: int) -> None: ...


def check_layer_waiter(value: object) -> LayerReadyWaiter | None:
    """``value`` when it is ``None`` or implements :class:`LayerReadyWaiter`, else
    ``TypeError`` naming ``layer_transfer_counter`` (the argument of every pool's
    ``register_layer_transfer_counter``)."""
    if value is not None and not isinstance(value, LayerReadyWaiter):
        raise TypeError(
            "layer_transfer_counter must implement wait_until(layer_index), "
            f"got {type(value).__name__}"
        )
    return value


@dataclass(frozen=True, slots=True)
class KVWriteLoc:
    """Where one forward writes its new K/V rows (SGLang 0.5.23's ``KVWriteLoc``).

    ``loc`` are slots of the (full-attention) pool; ``swa_loc`` the same tokens' slots in a
    sliding-window sub-pool, when the pool has one; ``full_loc`` (optional) the same tokens'
    slots in a full-attention sub-pool, in ``loc``'s id space (pools use ``loc`` when it is
    ``None``). ``physical`` marks the slots as physical token ids; only SGLang's unified pool
    checks the mark (``requires_physical_write_loc``), which none of ours sets. A caller builds
    one ``KVWriteLoc`` per forward and makes one ``set_kv_buffer`` call per layer for any pool
    type.

    As in SGLang, a ``swa_loc`` / ``full_loc`` longer than ``loc`` is cut to ``loc``'s length
    on construction (padded paths narrow ``loc`` per layer; the other locs follow, same token
    order). Frozen: build a new one to change a field.
    """

    loc: torch.Tensor
    swa_loc: torch.Tensor | None = None
    full_loc: torch.Tensor | None = None
    physical: bool = False

    def __post_init__(self) -> None:
        n = self.loc.shape[0] if isinstance(self.loc, torch.Tensor) and self.loc.dim() else None
        if n is None:
            return
        for name in ("swa_loc", "full_loc"):
            other = getattr(self, name)
            if isinstance(other, torch.Tensor) and other.dim() and other.shape[0] != n:
                object.__setattr__(self, name, other[:n])

    @classmethod
    def for_batch(
        cls,
        forward_batch: object,
        *,
        swa_loc: torch.Tensor | None = None,
        full_loc: torch.Tensor | None = None,
    ) -> KVWriteLoc:
        """The batch's ``out_cache_loc`` as a write loc, marked physical when the batch's
        ``out_cache_loc_is_physical`` is true (SGLang's ``ForwardBatch`` fields; a batch without
        that attribute is not marked). ``TypeError`` when ``forward_batch`` has no
        ``out_cache_loc`` tensor."""
        loc = getattr(forward_batch, "out_cache_loc", None)
        if not isinstance(loc, torch.Tensor):
            raise TypeError(
                "forward_batch must have an out_cache_loc tensor, "
                f"got {type(forward_batch).__name__}"
            )
        return cls(
            loc,
            swa_loc,
            full_loc,
            physical=bool(getattr(forward_batch, "out_cache_loc_is_physical", False)),
        )

    @classmethod
    def for_layer(
        cls,
        forward_batch: object,
        layer: object,
        *,
        swa_loc: torch.Tensor | None = None,
        full_loc: torch.Tensor | None = None,
    ) -> KVWriteLoc:
        """``layer``'s write loc: :meth:`for_batch`, or for a cross-attention layer
        (``layer.is_cross_attention``) the batch's ``encoder_out_cache_loc``, never marked
        physical. ``TypeError`` when ``layer`` has no ``is_cross_attention`` flag or the batch
        lacks the tensor to use."""
        if not hasattr(layer, "is_cross_attention"):
            raise TypeError(
                f"layer must have an is_cross_attention attribute, got {type(layer).__name__}"
            )
        cross = bool(layer.is_cross_attention)
        if cross:
            loc = getattr(forward_batch, "encoder_out_cache_loc", None)
            if not isinstance(loc, torch.Tensor):
                raise TypeError(
                    "forward_batch must have an encoder_out_cache_loc tensor for a "
                    f"cross-attention layer, got {type(forward_batch).__name__}"
                )
            return cls(loc, swa_loc, full_loc)
        return cls.for_batch(forward_batch, swa_loc=swa_loc, full_loc=full_loc)


def unwrap_write_loc(loc: torch.Tensor | KVWriteLoc) -> torch.Tensor:
    """The full-pool slots of ``loc`` (a bare tensor or a ``KVWriteLoc``).

    ``TypeError`` unless the slots are an int32/int64 tensor; ``ValueError`` for a meta tensor or
    one that is not 1-D (:func:`mem_cache_kernels.checks.check_index`).
    """
    return _write_slots("loc", loc)


def _write_slots(name: str, loc: object) -> torch.Tensor:
    """:func:`unwrap_write_loc` for an argument called ``name``."""
    slots = loc.loc if isinstance(loc, KVWriteLoc) else loc
    if not isinstance(slots, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor or a KVWriteLoc, got {type(slots).__name__}"
        )
    return checks.check_index(name, slots)


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


class _NoMemorySaver:
    """A disabled memory-saver adapter (SGLang's ``TorchMemorySaverAdapter`` with
    ``enable=False``): ``enabled`` is False and ``region(...)`` does nothing."""

    enabled = False

    @contextmanager
    def region(self, *args: object, **kwargs: object) -> Iterator[None]:
        yield


_NO_MEMORY_SAVER = _NoMemorySaver()


PADDING_SLOT = 0
"""The CUDA-graph padding slot: padded tokens write here; guarded stores skip it."""


def _pointer_table(buffers: Sequence[Sequence[torch.Tensor]], device: torch.device) -> torch.Tensor:
    ptrs = [t.data_ptr() for role in buffers for t in role]
    # data pointers fit in int64 on every supported platform; reinterpret as uint64
    return torch.tensor(ptrs, dtype=torch.int64, device=device).view(torch.uint64)


class KVCache(abc.ABC):
    """Base class of device KV pools (mirrors SGLang's ``KVCache``).

    Args:
        size: token capacity, excluding the padding page (``>= 0``).
        page_size: tokens per page (``>= 1``); buffers have ``size + page_size`` rows.
        dtype: the logical element dtype (fp8 dtypes are stored as ``uint8``, ``store_dtype``).
        layer_num: number of layers held (``>= 1``).
        device: where every buffer lives.
        enable_memory_saver: accepted for SGLang compatibility; no memory-saver integration.
        start_layer, end_layer: the global layer range ``[start_layer, end_layer)``;
            ``end_layer - start_layer`` must equal ``layer_num``.
        debug: range-check slot values on every device (syncs); also on with ``MEM_CACHE_DEBUG=1``.

    Subclasses allocate their buffers and implement ``_role_buffers`` (the per-role, per-layer
    tensors that ``get_buffer_desc``, ``move_kv_cache``, ``get_cpu_copy``, ``load_cpu_copy`` and
    ``get_kv_size_bytes`` act on), the non-waiting accessors ``_get_key_buffer`` /
    ``_get_value_buffer`` (which receive an already validated layer id) and ``set_kv_buffer``.

    Reads: ``get_key_buffer``, ``get_value_buffer`` and ``get_kv_buffer`` validate the layer id
    (``ValueError`` outside ``[start_layer, end_layer)``, ``TypeError`` for a non-int), call the
    registered ``LayerReadyWaiter.wait_until(layer_id - start_layer)`` exactly once, and return
    views of the layer's buffer (viewed as ``dtype``; they alias the pool's storage).
    """

    def __init__(  # noqa: PLR0917 (SGLang-compatible positional signature)
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        layer_num: int,
        device: str | torch.device,
        enable_memory_saver: bool = False,
        start_layer: int | None = None,
        end_layer: int | None = None,
        allocation_label: str | None = None,
        *,
        debug: bool = False,
    ) -> None:
        if allocation_label is not None and not isinstance(allocation_label, str):
            raise TypeError(
                f"allocation_label must be a str or None, got {type(allocation_label).__name__}"
            )
        self.allocation_label = allocation_label
        self.size = checks.check_int("size", size, minimum=0)
        self.page_size = checks.check_int("page_size", page_size, minimum=1)
        self.dtype = check_dtype("dtype", dtype)
        self.store_dtype = storage_dtype(dtype)
        self.layer_num = checks.check_int("layer_num", layer_num, minimum=1)
        self.device = checks.check_device_arg("device", device)
        self.enable_memory_saver = enable_memory_saver
        self.start_layer = checks.check_int(
            "start_layer", 0 if start_layer is None else start_layer, minimum=0
        )
        # half-open: the pool holds global layers [start_layer, end_layer)
        end = checks.check_optional_int("end_layer", end_layer)
        self.end_layer = self.start_layer + self.layer_num if end is None else end
        if self.end_layer - self.start_layer != layer_num:
            raise ValueError(
                f"end_layer must be start_layer + layer_num = {self.start_layer + layer_num}, "
                f"got {self.end_layer}"
            )
        self.debug = checks.debug_enabled(debug)
        self.layer_transfer_counter: LayerReadyWaiter | None = None
        self.mem_usage = 0.0  # GB, set by _finalize_allocation
        self.cpu_offloading_chunk_size = 8192
        self._desc: KVBufferDesc | None = None

    # ---------------------------------------------------------------- SGLang switches (off)
    # Features of SGLang's KVCache that these pools do not have; each answers what SGLang's
    # base class answers when the feature is off.
    layer_shard_enabled: bool = False
    """SGLang: layer-sharded KV pools. Not supported: always False."""
    post_capture_active: bool = False
    """SGLang: CUDA-graph post-capture (VMM) backing. Not supported: always False."""
    cpu_copy_carries_mamba: bool = False
    """Whether ``get_cpu_copy``/``load_cpu_copy`` carry recurrent (Mamba) state: no KV pool
    here holds any, so False (SGLang's default)."""
    requires_physical_write_loc: bool = False
    """SGLang's unified pool refuses writes not marked ``KVWriteLoc.physical``; ours never do."""
    host_transfer_translate: Callable[[torch.Tensor], torch.Tensor] | None = None
    """Optional translation of controller ids to buffer rows for host transfers: None (rows
    are slots), as in SGLang's base."""
    host_capacity_tokens: int | None = None
    """Token capacity for host sizing when it differs from ``size``: None (use ``size``)."""
    host_capacity_bytes: int | None = None
    """Host-budget weight when it differs from the KV bytes: None."""
    enable_custom_mem_pool: bool = False
    """SGLang: a custom CUDA memory pool for NVLink disaggregation. Not supported: False."""
    custom_mem_pool: None = None
    """The custom memory pool (SGLang): none, see ``enable_custom_mem_pool``."""

    @property
    def memory_saver_adapter(self) -> _NoMemorySaver:
        """SGLang's memory-saver adapter; these pools have no memory-saver integration, so a
        disabled adapter whose ``region(...)`` is a no-op context."""
        return _NO_MEMORY_SAVER

    def maybe_get_custom_mem_pool(self) -> None:
        """The custom memory pool (SGLang): always None (no custom pools here)."""
        return self.custom_mem_pool

    def get_kv_cache_quant_method(self) -> Any:
        """The KV quant method of this pool or of its ``full_kv_pool``/``swa_kv_pool``
        (SGLang's lookup): the first non-unquantized ``quant_method`` found, else the last
        unquantized one, else None. Our pools are unquantized (``quant_method`` None), so
        None unless a caller attached a quant method object."""
        fallback = None
        for pool in (self, *self._quant_sub_pools()):
            method = getattr(pool, "quant_method", None)
            if method is None:
                continue
            if getattr(method, "name", None) != "unquantized":
                return method
            fallback = method
        return fallback

    def _quant_sub_pools(self) -> list[object]:
        return []

    def get_device_pool_infos(self) -> tuple[Any, ...]:
        """SGLang's ``DevicePoolInfo`` descriptions for migrated host consumers. Not
        provided: ``NotImplementedError``, as SGLang's base raises for a pool without a
        provider. Our host pools read :meth:`get_buffer_desc` instead."""
        raise NotImplementedError(f"{type(self).__name__} has no device pool provider")

    def get_kv_buffer_shape(self) -> tuple[torch.Size, torch.Size]:
        """``(key shape, value shape)`` of layer ``start_layer`` (SGLang's helper)."""
        k, v = self.get_kv_buffer(self.start_layer)
        return k.shape, v.shape

    # ---------------------------------------------------------------- subclass hooks
    @abc.abstractmethod
    def _role_buffers(self) -> tuple[tuple[str, Sequence[torch.Tensor]], ...]:
        """``((role, per-layer buffers), ...)``: every row-per-slot buffer of the pool."""

    @abc.abstractmethod
    def _get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Key view of validated global layer ``layer_id`` without waiting."""

    @abc.abstractmethod
    def _get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Value view of validated global layer ``layer_id`` without waiting."""

    @abc.abstractmethod
    def set_kv_buffer(
        self,
        layer: object,
        loc: torch.Tensor | KVWriteLoc,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
    ) -> None:
        """Write the rows of ``cache_k``/``cache_v`` (``[n, *row]``) at slots ``loc`` (``[n]``).

        ``layer``: SGLang's ``RadixAttention`` (anything with an int ``layer_id``) or an int
        layer id. Mutates that layer only. Inputs in another floating dtype are cast to ``dtype``.
        Raises ``TypeError``/``ValueError`` on a bad layer id, slot tensor, shape, dtype or device
        before writing anything.
        """

    # ---------------------------------------------------------------- geometry / checks
    @property
    def num_rows(self) -> int:
        """Rows of every per-layer buffer: ``size + page_size`` (the slot limit)."""
        return self.size + self.page_size

    def layer_index(self, layer_id: object, name: str = "layer_id") -> int:
        """``layer_id - start_layer`` after checking ``start_layer <= layer_id < end_layer``.

        ``layer_id`` is an int or a layer object with an int ``layer_id`` (SGLang's
        ``RadixAttention``); a bool is a ``TypeError``. ``name`` names it in errors."""
        return self._layer(layer_id, name) - self.start_layer

    # The layer and slot checks below accept the common forms inline (an int or a layer
    # object's int id in range; a slot tensor through mem_cache_kernels.checks) and hand
    # anything else to the full check of mem_cache_pool._checks, which raises naming the
    # argument (or accepts an unusual valid form): one check per argument either way.

    def _write_layer(self, layer: object, layer_id_override: object = None) -> int:
        """Local index of a write's layer: ``layer_id_override`` when given, else ``layer``."""
        if layer_id_override is not None:
            return self.layer_index(layer_id_override, "layer_id_override")
        return self.layer_index(layer, "layer")

    def _layer(self, layer: object, name: str = "layer_id") -> int:
        """The validated global layer id of ``layer`` (an int or a layer object)."""
        lid = getattr(layer, "layer_id", layer)
        if type(lid) is int and self.start_layer <= lid < self.end_layer:
            return lid
        return check_layer(name, layer, self.start_layer, self.end_layer)

    def _check_loc(
        self, name: str, loc: object, *, limit: int | None = None, length: int | None = None
    ) -> torch.Tensor:
        t = checks.check_index(name, loc, length=length, device=self.device)
        rows = self.size + self.page_size if limit is None else limit
        checks.check_index_values(name, t, limit=rows, full=self.debug)
        return t

    def _wait_layer(self, layer_id: object, name: str = "layer_id") -> int:
        """Validate ``layer_id``, wait for it once, return its local index."""
        index = self.layer_index(layer_id, name)
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(index)
        return index

    # ---------------------------------------------------------------- reads
    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Keys of layer ``layer_id`` (an int or a layer object; waits for the layer first)."""
        index = self._wait_layer(layer_id)
        return self._get_key_buffer(self.start_layer + index)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Values of layer ``layer_id`` (an int or a layer object; waits for the layer first)."""
        index = self._wait_layer(layer_id)
        return self._get_value_buffer(self.start_layer + index)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys, values)`` of layer ``layer_id``; waits once for the layer."""
        lid = self.start_layer + self._wait_layer(layer_id)
        return self._get_key_buffer(lid), self._get_value_buffer(lid)

    def register_layer_transfer_counter(
        self, layer_transfer_counter: LayerReadyWaiter | None
    ) -> None:
        """Install (or remove with ``None``) the per-layer readiness waiter."""
        self.layer_transfer_counter = check_layer_waiter(layer_transfer_counter)

    # ---------------------------------------------------------------- bulk operations
    def _all_buffers(self) -> list[torch.Tensor]:
        return [t for _, bufs in self._role_buffers() for t in bufs]

    def _finalize_allocation(self) -> None:
        """Record ``mem_usage`` (GB); subclasses call this after allocating their buffers."""
        self.mem_usage = self.get_total_bytes() / (1 << 30)

    def get_total_bytes(self) -> int:
        """Bytes of every device buffer of the pool (including side buffers)."""
        return sum(t.numel() * t.element_size() for t in self._all_buffers())

    def get_kv_size_bytes(self) -> int | tuple[int, int]:
        """Bytes of the KV buffers (MHA: ``(k_bytes, v_bytes)``; others: one int)."""
        return self.get_total_bytes()

    def get_buffer_desc(self) -> KVBufferDesc:
        """Describe the row-per-slot buffers (see :class:`KVBufferDesc`); built once, cached."""
        if self._desc is None:
            roles = self._role_buffers()
            buffers = tuple(tuple(bufs) for _, bufs in roles)
            row_shape = tuple(tuple(bufs[0].shape[1:]) for bufs in buffers)
            row_bytes = tuple(bufs[0][0].numel() * bufs[0].element_size() for bufs in buffers)
            self._desc = KVBufferDesc(
                roles=tuple(r for r, _ in roles),
                buffers=buffers,
                row_shape=row_shape,
                row_bytes=row_bytes,
                data_ptrs=_pointer_table(buffers, self.device),
                size=self.size,
                page_size=self.page_size,
                layer_num=self.layer_num,
                start_layer=self.start_layer,
                dtype=self.dtype,
                store_dtype=self.store_dtype,
                device=self.device,
            )
        return self._desc

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """For every layer and role, rows ``tgt_loc`` get the old contents of rows ``src_loc``.

        ``tgt_loc``/``src_loc``: equal-length 1-D int32/int64 slot tensors on the pool's device;
        ``tgt_loc`` entries must be distinct; the two may overlap (all reads happen before the
        writes). Used by speculative decoding to
        relocate accepted tokens. Mutates rows ``tgt_loc`` of every buffer.
        """
        tgt = self._check_loc("tgt_loc", tgt_loc)
        checks.check_distinct("tgt_loc", tgt, full=self.debug)
        src = self._check_loc("src_loc", src_loc, length=tgt.numel())
        self._move_rows(tgt, src)

    def _move_rows(self, tgt: torch.Tensor, src: torch.Tensor) -> None:
        """The trusted body of :meth:`move_kv_cache` (arguments checked by the caller: a
        composite pool that checked them at its own public method calls this)."""
        if tgt.numel():
            bufs = self._all_buffers()
            pick("copy_all_layer_kv_cache", "auto", bufs[0], tgt, src)(bufs, tgt, src)

    def get_cpu_copy(
        self,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> CpuKVCopy:
        """Copy rows ``indices`` of every buffer to the CPU (request retraction).

        ``mamba_indices`` and ``req_pool_index`` complete SGLang 0.5.23's signature; these pools
        hold no Mamba state or per-request compress tails, so they are ignored (as SGLang's KV
        pools ignore them). The same holds for :meth:`load_cpu_copy`.

        Returns ``{role: [layer tensors [n, *row]]}`` in the store dtype; the pool is not mutated.
        """
        idx = self._check_loc("indices", indices)
        roles = self._role_buffers()
        dst = [
            [torch.empty((idx.numel(), *b.shape[1:]), dtype=b.dtype) for b in bufs]
            for _, bufs in roles
        ]
        if idx.numel():
            src = [bufs for _, bufs in roles]
            rows = torch.arange(idx.numel(), device=idx.device)
            pick("transfer_rows_all_layers", "auto", src[0][0], dst[0][0], idx)(src, dst, idx, rows)
        return {name: d for (name, _), d in zip(roles, dst)}

    def _check_cpu_copy(
        self, kv_cache_cpu: CpuKVCopy, idx: torch.Tensor, arg: str = "kv_cache_cpu"
    ) -> None:
        """Check that ``kv_cache_cpu`` (the argument ``arg``) fits the pool (roles, layers, rows
        of ``idx``): ``TypeError`` for a non-dict, a non-tensor or a wrong dtype, ``ValueError``
        otherwise."""
        roles = self._role_buffers()
        copy = check_copy_roles(kv_cache_cpu, [name for name, _ in roles], arg)
        for name, bufs in roles:
            want = (idx.numel(), *bufs[0].shape[1:])
            check_copy_layers(f"{arg}[{name!r}]", copy[name], len(bufs), bufs[0].dtype, want)

    def load_cpu_copy(
        self,
        kv_cache_cpu: CpuKVCopy,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> None:
        """Write a ``get_cpu_copy`` result back at (new) slots ``indices``.

        Raises ``ValueError`` when the copy's roles, layer counts or shapes do not match the pool
        or ``indices`` (checked before any write). Mutates rows ``indices`` of every buffer.
        """
        idx = self._check_loc("indices", indices)
        checks.check_distinct("indices", idx, full=self.debug)
        self._check_cpu_copy(kv_cache_cpu, idx)
        roles = self._role_buffers()
        names = [name for name, _ in roles]
        if idx.numel():
            src = [kv_cache_cpu[name] for name in names]
            dst = [bufs for _, bufs in roles]
            rows = torch.arange(idx.numel())
            pick("transfer_rows_all_layers", "auto", src[0][0], dst[0][0], idx)(src, dst, rows, idx)
