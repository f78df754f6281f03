"""``HostBuffers``: how a host pool is built and how its memory is held (private; the base
of :class:`~mem_cache_pool_host.base.HostKVCache`).

Construction from the device pool's :class:`~mem_cache_pool.base.KVBufferDesc` (never its
internals): the SGLang arguments checked, the capacity planned in whole pages
(``capacity.plan_host_capacity``) and checked against free host memory, one host tensor per role
in the layout of ``layout.py`` (roles of one row shape share one allocation, SGLang's
``kv_buffer``), the slot allocator and the layer counter, and the transfer plan worked out once
(``_plan_transfers``). Then the memory's views (``kv_buffer``, ``fd``, ``nbytes``) and its release
(``close``, deferred while :meth:`~mem_cache_pool_host.base.HostKVCache.io_guard` users copy).
``DevicePoolLike`` / ``resolve_buffer_desc`` (public through ``mem_cache_pool_host.base``) turn a
device pool into its descriptor.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import torch

from mem_cache_kernels.checks import check_bool, check_device_arg, check_optional_int
from mem_cache_pool.base import KVBufferDesc
from mem_cache_pool_host import _sglang_args
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
from mem_cache_pool_host.slots import HostSlotAllocator

__all__ = ["DevicePoolLike", "HostBuffers", "resolve_buffer_desc"]

_log = logging.getLogger(__name__)


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


class HostBuffers:
    """Construction and memory of :class:`~mem_cache_pool_host.base.HostKVCache` (see the
    module doc); not used alone."""

    if TYPE_CHECKING:  # declared by HostKVCache
        expected_roles: ClassVar[tuple[str, ...] | None]

        def _check_open(self) -> None: ...

    # transfer plan (``_plan_transfers``): [role][layer] host views (layer_first), and per local
    # layer the host (layer_first) and device tensors of every role
    _layer_views: tuple[tuple[torch.Tensor, ...], ...]
    _host_layers: tuple[tuple[torch.Tensor, ...], ...]
    _device_layers: tuple[tuple[torch.Tensor, ...], ...]

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
        self._io_lock = threading.Lock()
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
            with self._io_lock:
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

    destroy = close

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
