"""``HostKVCache``: the host (L2) mirror of a device KV pool.

Built from the device pool's :class:`~mem_cache_pool.base.KVBufferDesc` only (never its
internals). Holds one host tensor per role (``"k"``, ``"v"`` / ``"kv"``) in one of the layouts of
``layout.py``, a page-granular slot allocator, and a :class:`LayerDoneCounter` for layer-wise
loads.

Contract:

* Capacity: whole pages, ``host_size_bytes`` (if > 0) or ``device.size * host_to_device_ratio``
  tokens, rounded down; the host page size equals the device pool's. Before allocating, the
  requested bytes are checked against available host memory (``ValueError`` with the numbers).
* Host slots ``[0, size)`` (no padding page); ``alloc(n)`` returns CPU int64 whole-page slots or
  ``None``; ``free`` raises ``ValueError`` on double free / never-allocated / misaligned pages.
* Transfers: ``load_to_device_per_layer`` copies one layer host -> device and advances
  ``layer_done_counter``; ``backup_from_device_all_layer`` copies every layer device -> host. Rows
  are bit-exact byte copies in the store dtype. ``layer_id`` is the *local* layer index
  (``0..layer_num-1``, as the cache controller loops). Indices (int32/int64, equal lengths, in
  range; whole pages for direct IO; ``-1`` entries skipped) are validated by the transfer method
  itself before any copy (errors name its arguments), so a rejected call copies nothing; the copy
  is the kernels' trusted body (``mem_cache_kernels.dispatch.pick``), whose arguments come source
  first (device then host for a backup, host then device for a load). ``"kernel"`` IO gets its
  indices on the device pool's device, ``"direct"`` on the CPU (the host-driven
  ``mem_cache_kernels.direct_*`` copies). A failing load aborts the counter's batch in flight so
  readers never deadlock.
* Thread safety: alloc/free/clear/available_size/close hold ``self.lock`` (an RLock); transfers do
  not (IO threads move disjoint slots concurrently).
* ``close()`` unregisters host memory (idempotent); the pool is unusable afterwards.
* Storage (L3) page API: whole pages as flat tensors or zero-copy byte ranges. A page is addressed
  by its first host slot ``index`` (a multiple of ``page_size``). The flat page bytes follow
  SGLang 0.5.23's host-layout-dependent order; the format is named and versioned by
  ``page_format`` (:mod:`mem_cache_pool_host.page_format`), whose ``tag`` a storage tier records
  with each page. Pages restore unchanged into pools with an equal tag (``layer_first`` and
  ``page_first_direct`` pools share one); :func:`~mem_cache_pool_host.page_format.convert_flat_page`
  reorders a ``page_first`` page for the others and back. ``get_page_buffer_meta`` is layout
  native (zero copy).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from mem_cache_kernels import (
    direct_backup_all_layers_to_page_first_direct,
    direct_load_layer_from_page_first_direct,
    direct_transfer_rows,
)
from mem_cache_kernels.checks import (
    check_bool,
    check_choice,
    check_device_arg,
    check_index,
    check_index_values,
    check_int,
    check_optional_int,
    check_same_length,
    check_tensor,
)
from mem_cache_kernels.dispatch import pick
from mem_cache_pool.base import KVBufferDesc
from mem_cache_pool_host import _flat_pages, _sglang_args
from mem_cache_pool_host.capacity import (
    DEFAULT_HOST_TO_DEVICE_RATIO,
    HostCapacity,
    plan_host_capacity,
    preflight_host_memory,
)
from mem_cache_pool_host.layer_counter import LayerDoneCounter
from mem_cache_pool_host.layout import (
    IO_BACKENDS,
    IOBackend,
    Layout,
    effective_io_backend,
    host_buffer_shape,
    resolve_layout,
)
from mem_cache_pool_host.memory import (
    HostAllocation,
    HostBytesAllocator,
    HostTensorAllocator,
    allocate_for_pool,
    default_host_tensor_allocator,
    uses_bytes_interface,
)
from mem_cache_pool_host.page_format import PageFormat, page_order
from mem_cache_pool_host.slots import HostSlotAllocator

__all__ = ["DevicePoolLike", "HostKVCache", "resolve_buffer_desc"]

_log = logging.getLogger(__name__)
_CPU = torch.device("cpu")


def _prepare_transfer_indices(
    host_indices: torch.Tensor, device_indices: torch.Tensor, io_backend: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``prepare_transfer_indices`` of every host pool whose slots are physical (this module's
    and ``MambaPoolHost``): both index tensors come back as given after the entry check (1-D
    index tensors, ``io_backend`` a str; the transfer that follows checks the rest)."""
    check_index("host_indices", host_indices, allow_meta=False)
    check_index("device_indices", device_indices)
    if not isinstance(io_backend, str):
        raise TypeError(f"io_backend must be a str, got {type(io_backend).__name__}")
    return host_indices, device_indices


@runtime_checkable
class DevicePoolLike(Protocol):
    """Anything that describes its buffers (every mem_cache_pool device pool)."""

    def get_buffer_desc(self) -> KVBufferDesc: ...


def resolve_buffer_desc(
    device_pool: DevicePoolLike | KVBufferDesc, *, name: str = "device_pool"
) -> KVBufferDesc:
    """``device_pool`` if it is a ``KVBufferDesc``, else ``device_pool.get_buffer_desc()``
    (``TypeError`` naming ``name`` otherwise)."""
    if isinstance(device_pool, KVBufferDesc):
        return device_pool
    getter = getattr(device_pool, "get_buffer_desc", None)
    if getter is None:
        raise TypeError(
            f"{name} must be a KVBufferDesc or have get_buffer_desc(), got "
            f"{type(device_pool).__name__}"
        )
    desc = getter()
    if not isinstance(desc, KVBufferDesc):
        raise TypeError(f"get_buffer_desc() must return a KVBufferDesc, got {type(desc).__name__}")
    return desc


class HostKVCache:
    """Base of the host pools (see the module docstring). Subclasses pin the expected roles."""

    expected_roles: ClassVar[tuple[str, ...] | None] = None

    # transfer plan (``_plan_transfers``): [role][layer] host views (layer_first), and per local
    # layer the host (layer_first) and device tensors of every role
    _layer_views: tuple[tuple[torch.Tensor, ...], ...]
    _host_layers: tuple[tuple[torch.Tensor, ...], ...]
    _device_layers: tuple[tuple[torch.Tensor, ...], ...]

    # SGLang 0.5.23's class-level answers for features this package does not have: decode context
    # parallelism (one rank holds every token), shared compacting host layouts, page envelopes
    # and a page format of its own (our flat pages are SGLang's default format, so no tag).
    dcp_size: int = 1
    dcp_rank: int = 0
    shared_allocation_domain: None = None
    stores_page_envelope: bool = False
    storage_format_tag: str | None = None

    def __init__(  # noqa: PLR0917 (SGLang-compatible signature)
        self,
        buffer_info: DevicePoolLike | KVBufferDesc,
        host_to_device_ratio: float = DEFAULT_HOST_TO_DEVICE_RATIO,
        host_size: float = 0,
        page_size: int | None = None,
        layout: str = "page_first",
        pin_memory: bool = True,
        device: str | torch.device = "cpu",
        allocator_type: str = "default",
        *,
        dtype: torch.dtype | None = None,
        device_capacity_tokens: int | None = None,
        size_per_token: int | None = None,
        start_layer: int | None = None,
        end_layer: int | None = None,
        dcp_size: int = 1,
        dcp_rank: int = 0,
        pool_label: str = "kv",
        is_dummy: bool = False,
        host_token_capacity: int | None = None,
        host_size_bytes: int | None = None,
        io_backend: str | None = None,
        allocator: HostTensorAllocator | HostBytesAllocator | None = None,
        reserve_bytes: int | None = None,
        draft_buffer_infos: Sequence[Any] = (),
    ) -> None:
        """Build the host mirror of ``buffer_info``: a device pool with ``get_buffer_desc()`` (every
        ``mem_cache_pool`` pool) or its ``KVBufferDesc``. SGLang passes its own buffer-info
        record here; ours is the descriptor (built from the pool, never its internals).

        Capacity, in whole pages: ``host_token_capacity`` tokens (positive, page aligned,
        exactly), else ``host_size`` GB (SGLang's unit) or ``host_size_bytes`` bytes when > 0,
        else ``device_capacity_tokens`` (default: the device pool's size) times
        ``host_to_device_ratio``, rounded down (no padding page: every host page is usable).
        ``page_size``: must equal the device pool's (default). ``layout``: see ``layout.py``;
        ``io_backend``: the backend the pool will mostly use (``"direct"`` turns ``page_first``
        into ``page_first_direct``). ``pin_memory``: register the memory with CUDA when
        available (default allocator only). ``allocator``: supplies the memory (one allocation per
        row shape): ``allocate_bytes(nbytes)`` (:class:`HostBytesAllocator`, ours) or, failing
        that, SGLang's ``allocate(dims, dtype, device)`` (:class:`HostTensorAllocator`, e.g. a
        storage backend's); ``allocator_type`` is SGLang's name for a storage backend's
        allocator, which lives in ``mem_cache_storage`` (pass it as ``allocator``): any name
        other than ``"default"`` without ``allocator`` logs a warning and uses the default
        allocator, as SGLang does when the backend's allocator is unavailable.
        ``reserve_bytes``: host memory the preflight check leaves free. ``device`` must be
        ``"cpu"``.

        SGLang's geometry keywords (``dtype``, ``size_per_token``, ``start_layer``,
        ``end_layer``) are checked against the device pool's (``ValueError`` on a mismatch);
        ``pool_label`` names the pool in logs. Decode context parallelism (``dcp_size > 1``) and
        SGLang's allocator-only dummy pools (``is_dummy=True``) are not supported:
        ``NotImplementedError``, nor are SGLang's packed MTP draft layers (``draft_buffer_infos``,
        its MHA and MLA pools' argument: must be an empty sequence). Raises
        ``ValueError``/``TypeError`` (naming the argument) before allocating anything.
        """
        _sglang_args.check_no_draft_layers(draft_buffer_infos)
        desc = resolve_buffer_desc(buffer_info, name="buffer_info")
        if self.expected_roles is not None and desc.roles != self.expected_roles:
            raise ValueError(
                f"{type(self).__name__} needs a device pool with roles {self.expected_roles}, "
                f"got {desc.roles}"
            )
        if check_optional_int("page_size", page_size) is None:
            page_size = desc.page_size
        if page_size != desc.page_size:
            raise ValueError(
                f"page_size must equal the device pool's page size {desc.page_size}, "
                f"got {page_size}"
            )
        if check_device_arg("device", device).type != "cpu":
            raise ValueError(f"device must be 'cpu' (host memory), got {device!r}")
        check_bool("pin_memory", pin_memory)
        host_size_bytes = _sglang_args.resolve_capacity_bytes(
            desc,
            page_size,
            host_size=host_size,
            host_size_bytes=host_size_bytes,
            host_token_capacity=host_token_capacity,
        )
        device_tokens = check_optional_int("device_capacity_tokens", device_capacity_tokens)
        if device_tokens is None:
            device_tokens = desc.size
        elif device_tokens < 0:
            raise ValueError(f"device_capacity_tokens must be >= 0, got {device_tokens}")
        _sglang_args.check_geometry(
            desc,
            dtype=dtype,
            size_per_token=size_per_token,
            start_layer=start_layer,
            end_layer=end_layer,
        )
        _sglang_args.check_unsupported(dcp_size=dcp_size, dcp_rank=dcp_rank, is_dummy=is_dummy)
        if not isinstance(pool_label, str):
            raise TypeError(f"pool_label must be a str, got {type(pool_label).__name__}")
        if not isinstance(allocator_type, str):
            raise TypeError(f"allocator_type must be a str, got {type(allocator_type).__name__}")
        self.pool_label = pool_label
        self.allocator_type = allocator_type
        self.device_desc = desc
        self._device_source: object = buffer_info
        self.layout: Layout = resolve_layout(layout, io_backend)
        self.capacity: HostCapacity = plan_host_capacity(
            device_size=device_tokens,
            bytes_per_token=desc.bytes_per_token,
            page_size=page_size,
            host_to_device_ratio=host_to_device_ratio,
            host_size_bytes=host_size_bytes,
        )
        if self.capacity.size < desc.size:
            _log.warning(
                "host pool %s (%d tokens) is smaller than the device pool (%d tokens)",
                pool_label,
                self.capacity.size,
                desc.size,
            )
        preflight_host_memory(self.capacity.nbytes, reserve_bytes=reserve_bytes)
        self.page_size = page_size
        self.page_num = self.capacity.num_pages
        self.size = self.capacity.size
        self.size_per_token = desc.bytes_per_token
        self.device_capacity_tokens = device_tokens
        self.layer_num = desc.layer_num
        self.target_layer_num = desc.layer_num
        self.start_layer = desc.start_layer
        self.end_layer = desc.start_layer + desc.layer_num
        self.dtype = desc.dtype
        self.store_dtype = desc.store_dtype
        self.roles = desc.roles
        self.row_shapes = desc.row_shape
        self.row_bytes = desc.row_bytes
        self.pin_memory = pin_memory
        self.device = torch.device("cpu")
        if allocator is not None and not (
            uses_bytes_interface(allocator) or callable(getattr(allocator, "allocate", None))
        ):
            raise TypeError(
                "allocator must have allocate_bytes(nbytes) -> HostAllocation or SGLang's "
                f"allocate(dims, dtype, device) -> Tensor, got {type(allocator).__name__}"
            )
        if allocator is None and allocator_type != "default":
            _log.warning(
                "allocator_type %r: that storage backend's host allocator is built by "
                "mem_cache_storage (pass it as allocator=); using the default allocator",
                allocator_type,
            )
        self.allocator: HostTensorAllocator | HostBytesAllocator = (
            allocator or default_host_tensor_allocator(pin_memory)
        )
        self._allocations: list[HostAllocation] = []
        self._kv_buffer: torch.Tensor | tuple[torch.Tensor, ...] | None = None
        self.buffers: tuple[torch.Tensor, ...] = self._allocate_buffers(self.allocator)
        self._plan_transfers()
        self._slots = HostSlotAllocator(self.page_num, page_size)
        self.lock: threading.RLock = self._slots.lock
        self.layer_done_counter = LayerDoneCounter(self.layer_num)
        self._warned_kernel_fixup = False
        self._closed = False
        # raw-pointer users (storage IO on other threads): close() defers the release to the last
        self._io_cond = threading.Condition(threading.Lock())
        self._io_users = 0
        self._release_pending = False

    # ---------------------------------------------------------------- memory
    def _allocate_buffers(
        self, tensor_allocator: HostTensorAllocator | HostBytesAllocator
    ) -> tuple[torch.Tensor, ...]:
        """One host tensor per role, in the layout. Roles of one row shape share one allocation
        (SGLang's ``kv_buffer``: ``[roles, *layout shape]``, e.g. MHA's ``[2, L, size, H, D]``);
        roles of different row shapes get one allocation each."""
        item = torch.empty((), dtype=self.store_dtype).element_size()
        shapes = [
            host_buffer_shape(
                self.layout,
                num_pages=self.page_num,
                page_size=self.page_size,
                layer_num=self.layer_num,
                row_shape=shape_r,
            )
            for shape_r in self.row_shapes
        ]
        stacked = len(shapes) > 1 and len(set(shapes)) == 1
        groups = [(len(shapes), shapes[0])] if stacked else [(1, shape) for shape in shapes]
        out: list[torch.Tensor] = []
        try:
            for count, shape in groups:
                numel = count * math.prod(shape)
                alloc = allocate_for_pool(tensor_allocator, numel * item)
                self._allocations.append(alloc)
                whole = alloc.tensor.view(self.store_dtype).view(count, *shape)
                out.extend(whole[i] for i in range(count))
                if stacked:
                    self._kv_buffer = whole
        except BaseException:
            for a in self._allocations:
                a.close()
            self._allocations.clear()
            raise
        if not stacked:
            self._kv_buffer = out[0] if len(out) == 1 else tuple(out)
        return tuple(out)

    def init_kv_buffer(self) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """SGLang's hook that allocates the host buffer; here ``__init__`` allocates it once
        (through ``allocator``), and this returns that buffer: :attr:`kv_buffer`. Raises
        ``RuntimeError`` when the pool is closed."""
        self._check_open()
        assert self._kv_buffer is not None
        return self._kv_buffer

    @property
    def kv_buffer(self) -> torch.Tensor | tuple[torch.Tensor, ...] | None:
        """SGLang's ``kv_buffer``: the host memory of every role. One tensor when the roles share
        a row shape (MHA: ``[2, *layout shape]`` with ``k_buffer``/``v_buffer`` its halves; MLA:
        the latent tensor itself), else a tuple per role (asymmetric K/V, as SGLang's
        asymmetric pool). ``None`` once the pool is closed (SGLang's ``destroy()``), so storage
        backends can tell a released pool."""
        return None if self._closed else self._kv_buffer

    @property
    def fd(self) -> int | None:
        """SGLang's shared-memory file descriptor of the host buffer (its ``shm`` allocator);
        ``getattr(allocator, "fd", None)`` as SGLang reads it: ``None`` for the default mmap
        allocator."""
        fd = getattr(self.allocator, "fd", None)
        return fd if isinstance(fd, int) else None

    @property
    def pinned(self) -> bool:
        """Whether every host buffer is registered/pinned for device DMA."""
        return all(a.pinned for a in self._allocations)

    @property
    def nbytes(self) -> int:
        """Total bytes of the host buffers this pool allocated."""
        return sum(a.nbytes for a in self._allocations)

    def close(self) -> None:
        """Unregister and release host memory (idempotent). The pool is unusable afterwards.

        While a thread holds :meth:`io_guard` (raw pointers from :meth:`get_page_buffer_meta` in
        use, e.g. a storage prefetch), the memory stays mapped and is released when the last
        such user leaves: closing never pulls memory from under an in-flight copy."""
        with self.lock:
            if self._closed:
                return
            with self._io_cond:
                self._closed = True
                if self._io_users:
                    self._release_pending = True
            self.buffers = ()
            self._layer_views = ()
            self._host_layers = ()
            self._device_layers = ()
            self._kv_buffer = None
            if not self._release_pending:
                self._release_memory()

    def _release_memory(self) -> None:
        for a in self._allocations:
            a.close()
        self._allocations.clear()

    @contextmanager
    def io_guard(self) -> Iterator[None]:
        """Keep the host memory mapped while raw pointers into it are used (storage backends
        copying through :meth:`get_page_buffer_meta` ranges on another thread). Raises
        ``RuntimeError`` when the pool is already closed; a :meth:`close` meanwhile defers the
        release of the memory until the last guard exits."""
        with self._io_cond:
            if self._closed:
                raise RuntimeError(f"{type(self).__name__} is closed")
            self._io_users += 1
        try:
            yield
        finally:
            with self._io_cond:
                self._io_users -= 1
                release = self._io_users == 0 and self._release_pending
                if release:
                    self._release_pending = False
            if release:
                self._release_memory()

    destroy = close

    def __enter__(self) -> HostKVCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")

    # ----------------------------------------------------------------- slots
    def get_size_per_token(self) -> int:
        """Host bytes one token occupies across all layers (``size_per_token``)."""
        return self.size_per_token

    def available_size(self) -> int:
        """Free host slots (tokens)."""
        return self._slots.available_size()

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` (a multiple of ``page_size``) host slots, CPU int64, or ``None``."""
        self._check_open()
        return self._slots.alloc(need_size)

    def free(self, indices: torch.Tensor) -> int:
        """Free whole pages; returns the number of slots freed (see ``slots.HostSlotAllocator``)."""
        self._check_open()
        return self._slots.free(indices)

    def clear(self) -> None:
        """Free every host slot (data is not zeroed). Mutates the slot allocator."""
        self._slots.clear()

    def is_allocated(self, indices: torch.Tensor) -> bool:
        """Whether every slot in ``indices`` (CPU int64) is currently allocated."""
        return self._slots.is_allocated(indices)

    @property
    def logical_size(self) -> int:
        """SGLang's slot count the radix tree and controller see (``size * dcp_size``; no decode
        context parallelism here, so ``size``)."""
        return self.size * self.dcp_size

    @property
    def logical_page_size(self) -> int:
        """SGLang's page size in that logical space (``page_size * dcp_size``: ``page_size``)."""
        return self.page_size * self.dcp_size

    # SGLang's free-list state, read from the slot allocator (snapshots, CPU; not writable)
    @property
    def free_slots(self) -> torch.Tensor:
        """Free slots not yet merged back (int64, pages whole, in hand-out order)."""
        return self._slots.free_slots()

    @property
    def release_slots(self) -> list[torch.Tensor]:
        """Slots freed since the last merge, one tensor per ``free`` call (merged lazily)."""
        return self._slots.release_slots()

    @property
    def num_release_slots(self) -> int:
        """Total slots in :attr:`release_slots`."""
        return sum(int(t.numel()) for t in self._slots.release_slots())

    @property
    def slot_used(self) -> torch.Tensor:
        """Per slot, whether it is allocated (bool, ``[logical_size]``)."""
        return self._slots.slot_used()

    @property
    def mem_state(self) -> torch.Tensor:
        """SGLang's per-slot uint8 state tensor, which its base allocates zeroed and nothing
        updates: zeros of ``[logical_size]`` (a fresh tensor)."""
        return torch.zeros(self.logical_size, dtype=torch.uint8)

    # ------------------------------------------------------------- SGLang's transfer geometry
    can_use_jit: bool = False
    """SGLang's own JIT HiCache kernels are not used here (our kernels are mem_cache_kernels')."""
    can_use_write_back_jit: bool = False
    """No staged write-back kernel: SGLang's controller then moves host indices to the device
    for ``kernel`` IO, as for every pool without it."""
    staging_page_capacity: int = 0
    staging_token_capacity: int = 0
    page_unified_layout: None = None
    """SGLang's ``page_unified`` layout geometry; that layout is not supported (``None``)."""
    device_rows_packed: bool = True
    """Device rows are contiguous (``KVBufferDesc`` guarantees it)."""

    @property
    def token_stride_size(self) -> int:
        """Bytes of one token's row of one layer (first role; MHA ``H * D * itemsize``)."""
        return self.row_bytes[0]

    @property
    def layout_dim(self) -> int:
        """Bytes of one token's rows across all layers (first role), SGLang's ``layout_dim``."""
        return self.row_bytes[0] * self.layer_num

    @property
    def device_row_stride_bytes(self) -> int:
        """Bytes between consecutive device rows (packed: ``token_stride_size``)."""
        return self.token_stride_size

    def get_ksize_per_token(self) -> int:
        """Bytes per token of the first role across layers (MHA: K, half of a symmetric pool;
        MLA: everything)."""
        return self.row_bytes[0] * self.layer_num

    def _role_layer_refs(self, role: int) -> list[torch.Tensor]:
        """Per-layer views of one role's host tensor, as SGLang's ``*_data_refs``."""
        self._check_open()
        buf = self.buffers[role]
        view = buf if self.layout == "layer_first" else buf.transpose(0, 1)
        return [view[i] for i in range(self.layer_num)]

    def _role_layer_ptrs(self, role: int) -> torch.Tensor:
        """uint64 table of :meth:`_role_layer_refs` data pointers on the device pool's device."""
        ptrs = [t.data_ptr() for t in self._role_layer_refs(role)]
        table = torch.tensor(ptrs, dtype=torch.int64).view(torch.uint64)
        return table.to(self.device_desc.device)

    def _device_role_ptrs(self, role: int) -> torch.Tensor:
        n = self.layer_num
        return self.device_desc.data_ptrs[role * n : (role + 1) * n]

    # ------------------------------------------------------------- transfers
    def _desc_for(self, device_pool: DevicePoolLike | KVBufferDesc) -> KVBufferDesc:
        if device_pool is self._device_source or device_pool is self.device_desc:
            return self.device_desc
        desc = resolve_buffer_desc(device_pool)
        ref = self.device_desc
        if (desc.roles, desc.row_bytes, desc.layer_num, desc.page_size, desc.store_dtype) != (
            ref.roles,
            ref.row_bytes,
            ref.layer_num,
            ref.page_size,
            ref.store_dtype,
        ):
            raise ValueError(
                "device_pool does not match the pool this host pool was built for: "
                f"roles/row_bytes/layer_num/page_size/store_dtype {desc.roles}/{desc.row_bytes}/"
                f"{desc.layer_num}/{desc.page_size}/{desc.store_dtype} vs {ref.roles}/"
                f"{ref.row_bytes}/{ref.layer_num}/{ref.page_size}/{ref.store_dtype}"
            )
        return desc

    def _plan_transfers(self) -> None:
        """Everything about a transfer that depends only on the layout and the device pool this
        host pool was built for, worked out once here so that a transfer call runs nothing of
        ``layout.py`` and builds no per-layer lists: the backend each requested ``io_backend``
        really uses (or why it cannot), the kernel op of each direction, and the per-layer host
        and device tensors those ops take."""
        self._io_effective: dict[str, IOBackend] = {}
        self._io_refused: dict[str, str] = {}
        for name in IO_BACKENDS:
            try:
                self._io_effective[name] = effective_io_backend(self.layout, name)
            except ValueError as exc:
                self._io_refused[name] = str(exc)
        layer_first = self.layout == "layer_first"
        # layer_first: [role][layer] views of the host tensors (what every layer-first op takes)
        self._layer_views = tuple(
            tuple(h[l] for l in range(self.layer_num)) if layer_first else () for h in self.buffers
        )
        # per local layer, the host tensors (one per role) and device tensors a load moves
        self._host_layers = tuple(zip(*self._layer_views)) if layer_first else ()
        self._device_layers = tuple(
            tuple(role[l] for role in self.device_desc.buffers) for l in range(self.layer_num)
        )
        # the kernel op of a backup (device -> host, every layer) and its host operand
        self._backup_op = (
            "transfer_rows_all_layers" if layer_first else "backup_all_layers_to_page_first"
        )

    def _checked_indices(
        self,
        desc: KVBufferDesc,
        backend: IOBackend,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The caller's index tensors, validated, on the device ``backend`` reads them from
        (``kernel``: the device pool's; ``direct``: the CPU). Errors name the caller's arguments.

        Kind, dtype, rank, equal lengths and device are always checked; values (``-1`` = skip,
        else below the host / device row count) when the tensor is on the CPU (no sync); direct
        IO's whole pages (:meth:`_check_direct_pages`). The kernels below trust the result.
        """
        device_rows = int(desc.buffers[0][0].shape[0])
        for name, idx, limit in (
            ("host_indices", host_indices, self.size),
            ("device_indices", device_indices, device_rows),
        ):
            check_index(name, idx)
            self._check_index_device(name, idx, desc.device)
            check_index_values(name, idx, limit=limit, minimum=-1)
        check_same_length(host_indices=host_indices, device_indices=device_indices)
        target = _CPU if backend == "direct" else desc.device
        host_idx = host_indices if host_indices.device == target else host_indices.to(
            target, non_blocking=True
        )
        device_idx = device_indices if device_indices.device == target else device_indices.to(
            target, non_blocking=True
        )
        if backend == "direct":
            self._check_direct_pages(host_idx, device_idx)
        return host_idx, device_idx

    @staticmethod
    def _check_index_device(name: str, idx: torch.Tensor, device: torch.device) -> None:
        """A transfer index lives on the CPU or on the device pool's device *type* (an index on
        another GPU of that type is moved to the pool's), else ``ValueError``."""
        if idx.device.type not in ("cpu", device.type):
            raise ValueError(
                f"{name} must be on the CPU or on the device pool's device {device}, got "
                f"{idx.device}"
            )

    def _check_direct_pages(self, host_idx: torch.Tensor, device_idx: torch.Tensor) -> None:
        """Direct IO moves whole pages: each run of ``page_size`` entries must be one page's
        consecutive slots (host pages also start at a multiple of ``page_size``); a run whose
        first entry is -1 is skipped. Both tensors are on the CPU here."""
        ps = self.page_size
        if host_idx.numel() % ps:
            raise ValueError(
                f"host_indices length must be a multiple of page_size={ps} for direct IO, got "
                f"{host_idx.numel()}"
            )
        step = torch.arange(ps, dtype=torch.int64)
        for name, idx, aligned in (
            ("host_indices", host_idx, True),
            ("device_indices", device_idx, False),
        ):
            pages = idx.to(torch.int64).view(-1, ps)
            live = pages[:, 0] >= 0
            first = pages[live, :1]
            if not bool((pages[live] == first + step).all()):
                raise ValueError(
                    f"{name} must hold whole pages of {ps} consecutive slots for direct IO"
                )
            if aligned and bool((first % ps != 0).any()):
                raise ValueError(f"{name} pages must start at multiples of page_size={ps}")

    def _io_backend(self, io_backend: str, desc: KVBufferDesc) -> IOBackend:
        """The backend a transfer asking for ``io_backend`` really uses (planned at
        construction; see ``layout.effective_io_backend``), else ``TypeError``/``ValueError``."""
        backend = self._io_effective.get(io_backend) if isinstance(io_backend, str) else None
        if backend is None:
            check_choice("io_backend", io_backend, IO_BACKENDS)
            raise ValueError(self._io_refused[io_backend])
        if backend == "kernel" and desc.device.type != "cpu" and not self.pinned:
            raise ValueError(
                f"io_backend 'kernel' on a {desc.device.type} device pool reads host memory "
                "directly and needs it pinned (registered); this pool's memory is not "
                "(pin_memory=False or an allocator without registration): use io_backend='direct'"
            )
        if backend != io_backend and not self._warned_kernel_fixup:
            self._warned_kernel_fixup = True
            _log.info(
                "host pool: layout %r uses io_backend 'direct' for %r", self.layout, io_backend
            )
        return backend

    def prepare_transfer_indices(
        self, host_indices: torch.Tensor, device_indices: torch.Tensor, io_backend: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """SGLang's hook resolving indices that must stay stable through one L2 submission.

        Host slots here are physical (no shared compacting layout), so both come back as
        given; SGLang's controller has already moved them where ``io_backend`` needs them.
        ``TypeError``/``ValueError`` unless both are 1-D index tensors and ``io_backend`` a str
        (the transfer that follows checks the rest)."""
        return _prepare_transfer_indices(host_indices, device_indices, io_backend)

    def backup_from_device_all_layer_physical(
        self,
        device_pool: DevicePoolLike | KVBufferDesc,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
    ) -> None:
        """:meth:`backup_from_device_all_layer` on physical indices (SGLang's transfer engine
        calls this after :meth:`prepare_transfer_indices`)."""
        self.backup_from_device_all_layer(device_pool, host_indices, device_indices, io_backend)

    def load_to_device_per_layer_physical(
        self,
        device_pool: DevicePoolLike | KVBufferDesc,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: str,
        *,
        is_draft: bool = False,
    ) -> None:
        """:meth:`load_to_device_per_layer` on physical indices (SGLang's transfer engine)."""
        self.load_to_device_per_layer(
            device_pool, host_indices, device_indices, layer_id, io_backend, is_draft=is_draft
        )

    def load_to_device_per_layer(
        self,
        device_pool: DevicePoolLike | KVBufferDesc,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: str = "kernel",
        *,
        is_draft: bool = False,
    ) -> None:
        """Copy host rows ``host_indices`` of local layer ``layer_id`` into device rows
        ``device_indices`` and mark the layer done on ``layer_done_counter``.

        As SGLang's: a ``layer_id`` outside ``[0, target_layer_num)`` is a no-op (a controller
        looping over more layers than this pool holds), unless ``is_draft`` (packed MTP draft
        layers, which this pool never holds: then an out-of-range layer is a ``ValueError``).
        The counter only tracks a batch the caller began (``layer_done_counter.begin()`` or
        ``load_batch()`` before the layer loop); without one, completing is a no-op. On any error
        the batch in flight is aborted (readers raise instead of hanging).

        Validated here, once; the copy is the kernels' trusted body
        (``mem_cache_kernels.dispatch.pick``), source (host) before destination (device).
        """
        check_bool("is_draft", is_draft)
        check_int("layer_id", layer_id)
        if not is_draft and not 0 <= layer_id < self.target_layer_num:
            return
        try:
            self._check_open()
            check_int("layer_id", layer_id, minimum=0, maximum=self.layer_num - 1)
            desc = self._desc_for(device_pool)
            backend = self._io_backend(io_backend, desc)
            host_idx, device_idx = self._checked_indices(
                desc, backend, host_indices, device_indices
            )
            device_layer = (
                self._device_layers[layer_id]
                if desc is self.device_desc
                else tuple(role[layer_id] for role in desc.buffers)
            )
            host = self.buffers
            if backend == "direct":
                if self.layout == "layer_first":
                    host_layer: tuple[torch.Tensor, ...] = self._host_layers[layer_id]
                    direct_transfer_rows(
                        [[h] for h in host_layer],
                        [[d] for d in device_layer],
                        host_idx,
                        device_idx,
                        self.page_size,
                    )
                else:
                    direct_load_layer_from_page_first_direct(
                        host, device_layer, host_idx, device_idx, layer_id, self.page_size
                    )
            elif self.layout == "layer_first":
                pick("transfer_rows", "auto", host[0], device_layer[0])(
                    self._host_layers[layer_id], device_layer, host_idx, device_idx
                )
            else:
                pick("load_layer_from_page_first", "auto", host[0], device_layer[0])(
                    host, device_layer, host_idx, device_idx, layer_id
                )
            event: Any = None
            if desc.device.type == "cuda":
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record(torch.cuda.current_stream(desc.device))
        except BaseException as exc:
            self.layer_done_counter.abort(exc)
            raise
        self.layer_done_counter.complete(layer_id, event)

    def backup_from_device_all_layer(
        self,
        device_pool: DevicePoolLike | KVBufferDesc,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str = "kernel",
    ) -> None:
        """Copy device rows ``device_indices`` of every layer into host rows ``host_indices``.

        Validated here, once; the copy is the kernels' trusted body
        (``mem_cache_kernels.dispatch.pick``), source (device) before destination (host)."""
        self._check_open()
        desc = self._desc_for(device_pool)
        backend = self._io_backend(io_backend, desc)
        host_idx, device_idx = self._checked_indices(desc, backend, host_indices, device_indices)
        device = desc.buffers
        if backend == "direct":
            if self.layout == "layer_first":
                direct_transfer_rows(
                    device, self._layer_views, device_idx, host_idx, self.page_size
                )
            else:
                direct_backup_all_layers_to_page_first_direct(
                    device, self.buffers, device_idx, host_idx, self.page_size
                )
            return
        host = self._layer_views if self.layout == "layer_first" else self.buffers
        pick(self._backup_op, "auto", device[0][0], self.buffers[0])(
            device, host, device_idx, host_idx
        )

    # ------------------------------------------------------------------ storage (L3) pages
    def _page_of(self, index: int | torch.Tensor) -> int:
        if isinstance(index, torch.Tensor):
            # SGLang's storage path passes ``host_indices[i * page_size]``, a 0-d tensor
            if index.numel() != 1 or index.dtype.is_floating_point or index.dtype.is_complex:
                raise TypeError(
                    "index must be an int or a one-element integer tensor, got a tensor of "
                    f"shape {tuple(index.shape)} and dtype {index.dtype}"
                )
            if index.dtype == torch.bool:
                raise TypeError("index must be an int or an integer tensor, got a bool tensor")
            index = int(index.item())
        check_int("index", index)
        if index % self.page_size or not 0 <= index < self.size:
            raise ValueError(
                f"index must be the first slot of a page: a multiple of page_size="
                f"{self.page_size} in [0, {self.size}), got {index}"
            )
        return index // self.page_size

    @property
    def page_format(self) -> PageFormat:
        """The format of this pool's flat pages (record ``page_format.tag`` with each page)."""
        return PageFormat.make(
            order=page_order(self.layout),
            roles=self.roles,
            layer_num=self.layer_num,
            page_size=self.page_size,
            row_shapes=self.row_shapes,
            store_dtype=self.store_dtype,
        )

    @property
    def page_numel(self) -> int:
        """Elements (store dtype) of one flat page: all roles, all layers, ``page_size`` tokens."""
        return sum(b // self.buffers[0].element_size() for b in self.row_bytes) * (
            self.layer_num * self.page_size
        )

    def get_data_page(self, index: int | torch.Tensor, flat: bool = True) -> torch.Tensor:
        """The page starting at host slot ``index`` (an int or a one-element integer tensor, as
        SGLang's storage path passes) in the format ``page_format`` (SGLang's
        bytes for this layout; see :mod:`mem_cache_pool_host.page_format`). Always a copy.

        ``flat=True``: 1-D, ``page_numel`` store-dtype elements: roles one after the other, each
        ``[layer_num, page_size, *row]`` (``layer_first``, ``page_first_direct``) or
        ``[page_size, layer_num, *row]`` (``page_first``). ``flat=False``: the same data shaped
        ``[roles, *page_format.role_shape(0)]`` (``ValueError`` when roles have different row
        shapes).
        """
        self._check_open()
        page = self._page_of(index)
        parts = _flat_pages.read_page(self.layout, self.buffers, page, self.page_size)
        if flat:
            return torch.cat([p.reshape(-1) for p in parts])
        if len(set(self.row_shapes)) != 1:
            raise ValueError(f"flat=False needs equal row shapes per role, got {self.row_shapes}")
        return torch.stack(parts)

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        """A zeroed flat page (``page_numel`` elements of the store dtype)."""
        return torch.zeros(self.page_numel, dtype=self.store_dtype)

    def set_from_flat_data_page(self, index: int | torch.Tensor, data_page: torch.Tensor) -> None:
        """Write a flat page of this pool's ``page_format`` (as from ``get_data_page``) into the
        page starting at ``index``. Validated first (``TypeError``/``ValueError`` naming
        ``index`` or ``data_page``); a failed call writes nothing."""
        self._check_open()
        page = self._page_of(index)
        check_tensor("data_page", data_page)
        flat = data_page.reshape(-1)
        if flat.dtype != self.store_dtype:
            if flat.element_size() != self.buffers[0].element_size():
                raise TypeError(
                    f"data_page dtype must be {self.store_dtype}, got {data_page.dtype}"
                )
            flat = flat.view(self.store_dtype)
        if flat.numel() != self.page_numel:
            raise ValueError(f"data_page must have {self.page_numel} elements, got {flat.numel()}")
        _flat_pages.write_page(self.layout, self.buffers, page, self.page_size, flat.cpu())

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """``(ptrs, sizes)`` in bytes for zero-copy backends, layout native, SGLang 0.5.23's list.

        ``indices``: host slots of whole pages (as returned by ``alloc``). Per page, in order:
        ``layer_first``: one range per layer and role (``k0 v0 k1 v1 ...``; MLA ``kv0 kv1 ...``)
        of ``page_size * row_bytes``; ``page_first`` / ``page_first_direct``: one range per role
        (``k v``; MLA ``kv``) of ``layer_num * page_size * row_bytes``, whose concatenation is the
        page's flat page.
        """
        self._check_open()
        if isinstance(indices, torch.Tensor):
            idx = indices
        else:
            if isinstance(indices, (str, bytes)) or not isinstance(indices, Sequence):
                raise TypeError(
                    f"indices must be a tensor or a sequence of ints, got {type(indices).__name__}"
                )
            for k, i in enumerate(indices):
                check_int(f"indices[{k}]", i)
            idx = torch.tensor(list(indices), dtype=torch.int64)
        pages = self._slots.pages_of(idx).tolist()  # checked before the table is cached
        table = self._range_table()
        ptrs = [base + page * stride for page in pages for base, stride, _ in table]
        sizes = [nbytes for _, _, nbytes in table] * len(pages)
        return ptrs, sizes

    def _range_table(self) -> tuple[tuple[int, int, int], ...]:
        """``(base, stride, nbytes)`` of every range of a page, in :meth:`get_page_buffer_meta`
        order (computed once: the host buffers never move while the pool is open)."""
        table: tuple[tuple[int, int, int], ...] | None = getattr(self, "_range_table_cache", None)
        if table is not None:
            return table
        ps, out = self.page_size, []
        if self.layout == "layer_first":  # per layer, per role (k0 v0 k1 v1 ...)
            for layer in range(self.buffers[0].shape[0]):
                for h in self.buffers:
                    span = ps * h.stride(1) * h.element_size()
                    out.append((h.data_ptr() + layer * h.stride(0) * h.element_size(), span, span))
        else:
            rows = ps if self.layout == "page_first" else 1  # page-major: one range per role
            for h in self.buffers:
                span = h.stride(0) * h.element_size() * rows
                out.append((h.data_ptr(), span, span))
        table = tuple(out)
        self._range_table_cache = table
        return table

    def page_range_table(self) -> tuple[tuple[int, int, int], ...] | None:
        """The trusted zero-copy geometry storage backends use instead of
        :meth:`get_page_buffer_meta` on their hot path: ``(base, stride, nbytes)`` per range of
        a page, in that method's order, so range ``r`` of page ``p`` is
        ``(base_r + p * stride_r, nbytes_r)``. Nothing is checked here: pair it with
        :meth:`page_ids` (which checks the slots unless told they are trusted) and use the
        pointers under :meth:`io_guard`. ``RuntimeError`` once closed; ``None`` for a pool
        whose subclass lists its pages its own way (its own ``get_page_buffer_meta``)."""
        self._check_open()
        if type(self).get_page_buffer_meta is not HostKVCache.get_page_buffer_meta:
            return None
        return self._range_table()

    def page_ids(self, indices: torch.Tensor, *, trusted: bool = False) -> list[int]:
        """The page ids of host slots ``indices`` (whole pages, as :meth:`alloc` returns them),
        as ints. Checked as :meth:`get_page_buffer_meta` checks them (``TypeError`` /
        ``ValueError``) unless ``trusted``: the caller already checked a 1-D int64 CPU tensor
        of whole, distinct, in-range pages (a storage controller's I/O thread)."""
        return self._slots.page_ids(indices, trusted=trusted)

    def get_page_buffer_element_size(self, split_factor: int = 1) -> int | None:
        """Bytes of one zero-copy range of :meth:`get_page_buffer_meta` (the first range of
        page 0), SGLang's storage element size. ``split_factor != 1`` asks for split-heads
        ranges (SGLang's ``page_head`` layout only): ``NotImplementedError`` here."""
        check_int("split_factor", split_factor, minimum=1)
        if split_factor != 1:
            raise NotImplementedError(
                "split-heads page ranges need SGLang's page_head layout, which is not supported"
            )
        _, sizes = self.get_page_buffer_meta(torch.arange(self.page_size, dtype=torch.int64))
        return int(sizes[0]) if sizes else None

    def is_stride_page_aligned(self, page_size_bytes: int = 4096) -> bool:
        """Whether every zero-copy range starts at a multiple of ``page_size_bytes``."""
        self._check_open()
        check_int("page_size_bytes", page_size_bytes, minimum=1)
        return _flat_pages.stride_page_aligned(
            self.layout, self.buffers, self.page_size, page_size_bytes
        )
