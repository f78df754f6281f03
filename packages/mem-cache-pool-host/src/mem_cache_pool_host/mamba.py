"""``MambaPoolHost``: the host tier (HiCache L2) of Mamba / linear-attention request states.

Mirrors SGLang 0.5.23's ``pool_host/mamba.py`` ``MambaPoolHost``. A host *slot* holds one
request's states over every Mamba layer (``page_size`` is 1: a state is not token-granular):

* ``temporal_buffer``: ``[size, num_mamba_layers, 1, *temporal]`` (page-first: one slot's bytes
  are contiguous per tensor), ``conv_buffer[i]``: ``[size, num_mamba_layers, 1, *conv[i]]``;
* ``backup_from_device_all_layer(device_pool, host_indices, device_indices)`` copies device
  slots into host slots (every layer), ``load_to_device_per_layer(..., layer_id)`` one layer
  back, then marks the layer done on ``layer_done_counter``; both bit-exact, validated at the
  method (errors name ``host_indices`` / ``device_indices``), then the trusted body of
  :mod:`mem_cache_kernels.mamba`'s gather / scatter (``mem_cache_kernels.dispatch.pick``, source
  before destination; ``io_backend="kernel"``: Triton on a GPU, torch on the CPU; ``"direct"``:
  the torch path);
* storage (L3) pages: ``get_data_page`` / ``set_from_flat_data_page`` move one slot as a flat
  ``uint8`` page (``temporal`` bytes, then each conv tensor's: SGLang's order), and
  ``get_page_buffer_meta`` gives the zero-copy ``(ptrs, sizes)`` of slots, SGLang's order
  (temporal, then conv ``0..n`` per slot), so any page-granular storage backend carries states.

Sizing as SGLang: ``host_size`` (GB) wins when ``> 0`` (``host_size * 1e9 // size_per_token``
slots), else ``device_capacity * host_to_device_ratio``; one slot more is allocated (SGLang's
``page_num = size // page_size + 1``). Host slots come from
:class:`~mem_cache_pool_host.slots.HostSlotAllocator` (double frees raise, nothing changes).
Out of scope: speculative MTP draft layers (``mtp_draft_buffer_infos``), registered side states
(``extra_checkpoint_buffers``) and the ``layer_first`` layout, each ``NotImplementedError`` /
``ValueError`` as SGLang's refusals.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mem_cache_kernels.checks import (
    check_bool,
    check_choice,
    check_device_arg,
    check_distinct,
    check_index,
    check_index_values,
    check_int,
    check_number,
    check_on_device,
    check_tensor,
)
from mem_cache_kernels.dispatch import pick
from mem_cache_pool_host._mamba_pages import MambaStoragePages
from mem_cache_pool_host.base import _prepare_transfer_indices
from mem_cache_pool_host.capacity import preflight_host_memory
from mem_cache_pool_host.layer_counter import LayerDoneCounter
from mem_cache_pool_host.memory import HostAllocation, default_host_tensor_allocator
from mem_cache_pool_host.slots import HostSlotAllocator

__all__ = ["MambaPoolHost", "MambaStateBufferInfo"]

_LAYOUTS = ("page_first", "page_first_direct")


@dataclass(frozen=True, kw_only=True)
class MambaStateBufferInfo:
    """The device checkpoint buffers a host pool mirrors (SGLang's fields): ``temporal``
    ``[L, slots, *t]`` and ``conv`` (each ``[L, slots, *c]``); ``extra_checkpoint_buffers``
    (side states) are not supported here."""

    temporal: torch.Tensor
    conv: tuple[torch.Tensor, ...]
    extra_checkpoint_buffers: tuple[torch.Tensor, ...] = ()

    @classmethod
    def from_pool(cls, mamba_pool: Any) -> MambaStateBufferInfo:
        """The checkpoint buffers of a ``MambaPool`` (ours or SGLang's: ``mamba_cache``)."""
        cache = getattr(mamba_pool, "mamba_cache", None)
        if cache is None:
            raise TypeError(
                f"mamba_pool must have a mamba_cache (a MambaPool), got {type(mamba_pool).__name__}"
            )
        return cls(temporal=cache.temporal, conv=tuple(cache.conv))


def _entries_contiguous(t: torch.Tensor) -> bool:
    """Whether the ``[*state]`` entries of a ``[layers, slots, *state]`` tensor are C-contiguous
    (what the state kernels need; size-1 axes may have any stride)."""
    expected = 1
    for size, stride in zip(reversed(t.shape[2:]), reversed(t.stride()[2:])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _buffer_info(value: object, arg: str = "buffer_info") -> Any:
    if hasattr(value, "mamba_cache"):
        return MambaStateBufferInfo.from_pool(value)
    for name in ("temporal", "conv"):
        if not hasattr(value, name):
            raise TypeError(
                f"{arg} must be a MambaStateBufferInfo (temporal, conv) or a MambaPool, "
                f"got {type(value).__name__}"
            )
    return value


class MambaPoolHost(MambaStoragePages):
    """Host slots of request states (see the module doc). SGLang's arguments:
    ``buffer_info`` (the device checkpoint buffers, or the device ``MambaPool`` itself),
    ``host_to_device_ratio``, ``host_size`` (GB; ``> 0`` wins), ``device_capacity`` (device
    state slots), ``pin_memory``, ``device`` (``"cpu"``), ``allocator_type`` (``"default"``),
    ``layout`` (``"page_first"`` or ``"page_first_direct"``)."""

    mtp_draft_buffer_infos: tuple[Any, ...] = ()
    slot_state_device_tensors: tuple[torch.Tensor, ...] = ()
    slot_state_buffers: tuple[torch.Tensor, ...] = ()

    # SGLang 0.5.23's ``HostKVCache`` class-level answers, which its ``MambaPoolHost`` inherits,
    # for features this package does not have: decode context parallelism (one rank holds every
    # slot), shared compacting host layouts, page envelopes and a page format of its own (our
    # flat pages are SGLang's default Mamba format, so no tag).
    dcp_size: int = 1
    """Decode-context-parallel ranks sharing a host row: always 1 (not supported)."""
    dcp_rank: int = 0
    """This rank's decode-context-parallel index: always 0 (not supported)."""
    shared_allocation_domain: None = None
    """SGLang's shared compacting host-layout domain: ``None`` (slots are physical, owned by
    this pool alone), so controllers allocate this pool's slots on their own."""
    stores_page_envelope: bool = False
    """Whether storage pages carry an envelope around the flat bytes: ``False`` (plain pages)."""
    storage_format_tag: str | None = None
    """Tag naming a page byte format of its own in storage keys: ``None`` (SGLang's default
    format: temporal bytes, then each conv tensor's)."""
    device_rows_packed: bool = True
    """SGLang's answer for device pools without strided rows (its ``MambaPoolHost`` never
    records a row stride): ``True``. The state kernels follow each device tensor's strides."""
    pool_label: str = "mamba"
    """The pool's name in logs and transfer plans: ``"mamba"``, SGLang's ``PoolName.MAMBA``
    (SGLang's ``MambaPoolHost`` skips the base constructor that sets it)."""

    def __init__(
        self,
        buffer_info: Any,
        host_to_device_ratio: float,
        host_size: float,
        *,
        device_capacity: int,
        pin_memory: bool = True,
        device: str = "cpu",
        allocator_type: str = "default",
        layout: str = "page_first",
        mtp_draft_buffer_infos: Sequence[Any] = (),
        reserve_bytes: int | None = None,
    ) -> None:
        info = _buffer_info(buffer_info)
        if mtp_draft_buffer_infos:
            raise NotImplementedError("MambaPoolHost: MTP draft layers are not supported")
        if tuple(getattr(info, "extra_checkpoint_buffers", ())):
            raise NotImplementedError("MambaPoolHost: registered side states are not supported")
        temporal = check_tensor("buffer_info.temporal", info.temporal)
        conv = [check_tensor(f"buffer_info.conv[{i}]", c) for i, c in enumerate(info.conv)]
        if temporal.dim() < 2 or not conv:
            raise ValueError(
                "buffer_info must hold temporal [layers, slots, ...] and at least one conv "
                f"buffer, got temporal shape {tuple(temporal.shape)} and {len(conv)} conv"
            )
        for i, c in enumerate(conv):
            if c.shape[:2] != temporal.shape[:2] or c.device != temporal.device:
                raise ValueError(
                    f"buffer_info.conv[{i}] must start with the layer/slot axes "
                    f"{tuple(temporal.shape[:2])} on {temporal.device}, got {tuple(c.shape)} "
                    f"on {c.device}"
                )
        self.layout = check_choice("layout", layout, _LAYOUTS)
        check_choice("allocator_type", allocator_type, ("default",))
        if check_device_arg("device", device).type != "cpu":
            raise ValueError(f"device must be 'cpu' (host memory), got {device!r}")
        self.pin_memory = check_bool("pin_memory", pin_memory)
        ratio = check_number("host_to_device_ratio", host_to_device_ratio)
        gb = check_number("host_size", host_size)
        capacity = check_int("device_capacity", device_capacity, minimum=0)
        self.device_capacity_tokens = capacity
        self.buffer_info = info
        self._device_source: object = buffer_info
        self._own_states: list[torch.Tensor] = [*conv, temporal]
        for i, t in enumerate(self._own_states):
            if not _entries_contiguous(t):
                what = "temporal" if t is temporal else f"conv[{i}]"
                raise ValueError(
                    f"buffer_info.{what} must have C-contiguous state entries, got strides "
                    f"{tuple(t.stride())} for shape {tuple(t.shape)}"
                )
        self.device_pool = None
        self.device = "cpu"
        self.page_size = 1
        self.num_mamba_layers = int(temporal.shape[0])
        self._buffer_device = temporal.device
        self.conv_state_shapes = [tuple(c.shape[2:]) for c in conv]
        self.temporal_state_shape = tuple(temporal.shape[2:])
        self.temporal_state_elem_size = math.prod(self.temporal_state_shape)
        self.conv_state_elem_sizes = [math.prod(s) for s in self.conv_state_shapes]
        self.conv_dtype = conv[0].dtype
        self.temporal_dtype = temporal.dtype
        self.dtype = self.conv_dtype
        self._conv_dtypes = [c.dtype for c in conv]
        self.size_per_token = self.get_size_per_token()
        if gb > 0:  # SGLang's rule: a host_size > 0 wins (NaN and -inf are not > 0)
            if math.isinf(gb):
                raise ValueError(f"host_size must be a finite number of GB, got {gb}")
            size = int(gb * 1e9 // self.size_per_token)
        else:
            slots = capacity * ratio
            if not math.isfinite(slots) or int(slots) < 0:
                raise ValueError(
                    "host_to_device_ratio must be a finite number >= 0 (host slots = "
                    f"device_capacity {capacity} x ratio), got {ratio}"
                )
            size = int(slots)
        self.page_num = size // self.page_size + 1
        self.size = self.page_num * self.page_size
        preflight_host_memory(self.size * self.size_per_token, reserve_bytes=reserve_bytes)
        self._allocations: list[HostAllocation] = []
        self.allocator = default_host_tensor_allocator(self.pin_memory)
        self.start_layer = 0
        self.end_layer = self.num_mamba_layers
        # SGLang's per-layer device views and pointer tables (uint64, on the device)
        self.temporal_device_layers = list(temporal.unbind(0))
        self.conv_device_layers = [list(c.unbind(0)) for c in conv]
        self.temporal_device_ptrs = torch.tensor(
            [t.data_ptr() for t in self.temporal_device_layers], dtype=torch.uint64
        ).to(temporal.device)
        self.conv_device_ptrs = [
            torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64).to(temporal.device)
            for layers in self.conv_device_layers
        ]
        self.kv_buffer = self.init_kv_buffer()
        self.temporal_staging_buffer = None
        self.conv_staging_buffers: list[torch.Tensor | None] = [None] * len(self.conv_buffer)
        self.can_use_write_back_jit = True
        self.layer_done_counter = LayerDoneCounter(max(1, self.num_mamba_layers))
        self._slots = HostSlotAllocator(self.page_num, self.page_size)
        self.lock: threading.RLock = self._slots.lock

    def init_kv_buffer(self) -> list[torch.Tensor]:
        """Allocate the host buffers (page-first ``[size, L, 1, *state]``); returns the
        non-empty ones (what ``close`` releases). Called once by the constructor."""
        self.temporal_buffer = self._alloc(self.temporal_state_shape, self.temporal_dtype)
        self.conv_buffer = [
            self._alloc(s, d) for s, d in zip(self.conv_state_shapes, self._conv_dtypes)
        ]
        return [b for b in (self.temporal_buffer, *self.conv_buffer) if b.numel()]

    def _alloc(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        dims = (self.size, self.num_mamba_layers, 1, *shape)
        nbytes = math.prod(dims) * dtype.itemsize
        if nbytes == 0:
            return torch.empty(dims, dtype=dtype)
        alloc = self.allocator.allocate_bytes(nbytes)
        self._allocations.append(alloc)
        return alloc.tensor.view(dtype).view(dims)

    # ------------------------------------------------------------------ transfers
    def _host_views(self) -> list[torch.Tensor]:
        """Host buffers viewed as ``[L, size, *state]`` (state entries contiguous)."""
        return [b.squeeze(2).transpose(0, 1) for b in (*self.conv_buffer, self.temporal_buffer)]

    def _device_states(self, device_pool: Any) -> list[torch.Tensor]:
        """The device state tensors of ``device_pool`` (``None``: the construction-time one),
        conv then temporal, checked against the host views (``ValueError`` on a mismatch)."""
        if device_pool is None or device_pool is self._device_source or device_pool is (
            self.buffer_info
        ):
            return self._own_states
        info = _buffer_info(device_pool, "device_pool")
        states = [*info.conv, info.temporal]
        for i, s in enumerate(states):
            check_tensor(f"device_pool state {i}", s)
        for s, h in zip(states, self._host_views()):
            if s.shape[0] != h.shape[0] or s.shape[2:] != h.shape[2:] or s.dtype != h.dtype:
                raise ValueError(
                    f"device_pool states {tuple(s.shape)} {s.dtype} do not match this host "
                    f"pool's [{h.shape[0]}, slots, {tuple(h.shape[2:])}] {h.dtype}"
                )
            check_on_device(f"device_pool state {tuple(s.shape)}", s, states[0].device)
            if not _entries_contiguous(s):
                raise ValueError(
                    f"device_pool states must have C-contiguous state entries, got strides "
                    f"{tuple(s.stride())} for shape {tuple(s.shape)}"
                )
        return states

    def _transfer_args(
        self, device_pool: Any, host_indices: object, device_indices: object, io_backend: str
    ) -> tuple[str, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
        """Everything a transfer checks, once, before any byte moves: the kernel backend, the
        (device state, host view) pairs with data, and both index tensors on the device of the
        states. Errors name the caller's arguments: ``host_indices`` are allocated host slots
        without repeats, ``device_indices`` (``-1`` skips a pair) lie below the device slot
        count (values checked where free to read: CPU tensors)."""
        check_choice("io_backend", io_backend, ("kernel", "direct"))
        backend = "torch" if io_backend == "direct" else "auto"
        h = check_index("host_indices", host_indices)
        d = check_index("device_indices", device_indices, length=h.shape[0])
        states = self._device_states(device_pool)
        device_slots = min(int(s.shape[1]) for s in states)
        check_index_values("device_indices", d, limit=device_slots, minimum=-1)
        if h.numel():
            hc = h.cpu()
            check_index_values("host_indices", hc, limit=self.size)
            check_distinct("host_indices", hc)
            with self.lock:  # the allocator's page_used, read inline (no call on this path)
                allocated = bool(self._slots.page_used[hc].all())
            if not allocated:
                raise ValueError("host_indices must be allocated host slots")
        pairs = [(s, v) for s, v in zip(states, self._host_views()) if s.numel()]
        dev = states[0].device
        return backend, pairs, h.to(dev), d.to(dev)

    def backup_from_device_all_layer(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str = "kernel",
    ) -> None:
        """Copy device slots ``device_indices`` (every layer, conv and temporal) into host
        slots ``host_indices`` (allocated). ``device_pool``: the device ``MambaPool`` or its
        buffer info (``None``: the one given at construction)."""
        backend, pairs, h, d = self._transfer_args(
            device_pool, host_indices, device_indices, io_backend
        )
        if not h.numel() or not pairs:
            return
        src = [s for s, _ in pairs]
        dst = [v for _, v in pairs]
        pick("gather_state_slots", backend, *src, *dst)(src, dst, d, h)

    def load_to_device_per_layer(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: str = "kernel",
        *,
        is_draft: bool = False,
    ) -> None:
        """Copy host slots ``host_indices`` of pool layer ``layer_id`` into device slots
        ``device_indices``, then mark the layer done on ``layer_done_counter`` (an error aborts
        the batch in flight, so readers raise instead of waiting forever)."""
        try:
            if is_draft:
                raise NotImplementedError("MambaPoolHost: MTP draft layers are not supported")
            check_int("layer_id", layer_id, minimum=0, maximum=self.num_mamba_layers - 1)
            backend, pairs, h, d = self._transfer_args(
                device_pool, host_indices, device_indices, io_backend
            )
            event: Any = None
            if h.numel() and pairs:
                src = [v[layer_id : layer_id + 1] for _, v in pairs]
                dst = [s[layer_id : layer_id + 1] for s, _ in pairs]
                pick("scatter_state_slots", backend, *dst, *src)(src, dst, h, d)
                dev = dst[0].device
                if dev.type == "cuda":
                    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                    event.record(torch.cuda.current_stream(dev))
        except BaseException as exc:
            self.layer_done_counter.abort(exc)
            raise
        self.layer_done_counter.complete(layer_id, event)

    def prepare_transfer_indices(
        self, host_indices: torch.Tensor, device_indices: torch.Tensor, io_backend: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """SGLang's hook resolving indices that must stay stable through one L2 submission.

        Host slots here are physical (no shared compacting layout), so both come back as given
        (the same tensors); SGLang's controller has already moved them where ``io_backend``
        needs them. ``TypeError``/``ValueError`` unless both are 1-D index tensors and
        ``io_backend`` a str (the transfer that follows checks the rest): the host pools' one
        check (``base._prepare_transfer_indices``)."""
        return _prepare_transfer_indices(host_indices, device_indices, io_backend)

    def backup_from_device_all_layer_physical(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
    ) -> None:
        """:meth:`backup_from_device_all_layer` on physical indices (SGLang's transfer engine
        calls this after :meth:`prepare_transfer_indices`); same checks and effect."""
        self.backup_from_device_all_layer(device_pool, host_indices, device_indices, io_backend)

    def load_to_device_per_layer_physical(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: str,
        *,
        is_draft: bool = False,
    ) -> None:
        """:meth:`load_to_device_per_layer` on physical indices (SGLang's transfer engine);
        same checks and effect, ``layer_done_counter`` included."""
        self.load_to_device_per_layer(
            device_pool, host_indices, device_indices, layer_id, io_backend, is_draft=is_draft
        )

    def close(self) -> None:
        """Release the host memory (idempotent)."""
        for a in self._allocations:
            a.close()
        self._allocations.clear()

    destroy = close
