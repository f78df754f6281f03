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
  range; whole pages for direct IO; ``-1`` entries skipped) are validated by the kernel ops before
  any copy, so a rejected call copies nothing. ``"kernel"`` IO gets its indices on the device
  pool's device, ``"direct"`` on the CPU. A failing load aborts the counter's batch in flight so
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
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from mem_cache_kernels.checks import (
    check_bool,
    check_device_arg,
    check_index,
    check_index_values,
    check_int,
    check_optional_int,
    check_same_length,
    check_tensor,
)
from mem_cache_pool.base import KVBufferDesc
from mem_cache_pool_host import _flat_pages, _transfer
from mem_cache_pool_host._checks import check_index_device
from mem_cache_pool_host.capacity import (
    DEFAULT_HOST_TO_DEVICE_RATIO,
    HostCapacity,
    plan_host_capacity,
    preflight_host_memory,
)
from mem_cache_pool_host.layer_counter import LayerDoneCounter
from mem_cache_pool_host.layout import (
    IOBackend,
    Layout,
    effective_io_backend,
    host_buffer_shape,
    resolve_layout,
)
from mem_cache_pool_host.memory import (
    HostAllocation,
    HostTensorAllocator,
    default_host_tensor_allocator,
)
from mem_cache_pool_host.page_format import PageFormat, page_order
from mem_cache_pool_host.slots import HostSlotAllocator

__all__ = ["DevicePoolLike", "HostKVCache", "resolve_buffer_desc"]

_log = logging.getLogger(__name__)


@runtime_checkable
class DevicePoolLike(Protocol):
    """Anything that describes its buffers (every mem_cache_pool device pool)."""

    def get_buffer_desc(self) -> KVBufferDesc: ...


def resolve_buffer_desc(device_pool: DevicePoolLike | KVBufferDesc) -> KVBufferDesc:
    """``device_pool`` if it is a ``KVBufferDesc``, else ``device_pool.get_buffer_desc()``."""
    if isinstance(device_pool, KVBufferDesc):
        return device_pool
    getter = getattr(device_pool, "get_buffer_desc", None)
    if getter is None:
        raise TypeError(
            "device_pool must be a KVBufferDesc or have get_buffer_desc(), got "
            f"{type(device_pool).__name__}"
        )
    desc = getter()
    if not isinstance(desc, KVBufferDesc):
        raise TypeError(f"get_buffer_desc() must return a KVBufferDesc, got {type(desc).__name__}")
    return desc


class HostKVCache:
    """Base of the host pools (see the module docstring). Subclasses pin the expected roles."""

    expected_roles: ClassVar[tuple[str, ...] | None] = None

    def __init__(  # noqa: PLR0917 (SGLang-compatible positional signature)
        self,
        device_pool: DevicePoolLike | KVBufferDesc,
        host_to_device_ratio: float = DEFAULT_HOST_TO_DEVICE_RATIO,
        host_size_bytes: int | None = None,
        page_size: int | None = None,
        layout: str = "page_first",
        pin_memory: bool = True,
        device: str | torch.device = "cpu",
        *,
        io_backend: str | None = None,
        allocator: HostTensorAllocator | None = None,
        reserve_bytes: int | None = None,
    ) -> None:
        """Build the host mirror of ``device_pool`` (a pool with ``get_buffer_desc()`` or a
        ``KVBufferDesc``).

        ``host_to_device_ratio`` / ``host_size_bytes`` (bytes, wins when > 0; SGLang's
        ``host_size`` is in GB): capacity, in whole pages rounded down. ``page_size``: must equal
        the device pool's (default). ``layout``: see ``layout.py``; ``io_backend``: the backend
        the pool will mostly use (``"direct"`` turns ``page_first`` into ``page_first_direct``).
        ``pin_memory``: register the memory with CUDA when available (default allocator only).
        ``allocator``: a :class:`HostTensorAllocator` supplying the memory (one allocation per
        role). ``reserve_bytes``: host memory the preflight check leaves free. ``device`` must be
        ``"cpu"``. Raises ``ValueError``/``TypeError`` (naming the argument) before allocating
        anything.
        """
        desc = resolve_buffer_desc(device_pool)
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
        self.device_desc = desc
        self._device_source: object = device_pool
        self.layout: Layout = resolve_layout(layout, io_backend)
        self.capacity: HostCapacity = plan_host_capacity(
            device_size=desc.size,
            bytes_per_token=desc.bytes_per_token,
            page_size=page_size,
            host_to_device_ratio=host_to_device_ratio,
            host_size_bytes=host_size_bytes,
        )
        if self.capacity.size < desc.size:
            _log.warning(
                "host pool (%d tokens) is smaller than the device pool (%d tokens)",
                self.capacity.size,
                desc.size,
            )
        preflight_host_memory(self.capacity.nbytes, reserve_bytes=reserve_bytes)
        self.page_size = page_size
        self.page_num = self.capacity.num_pages
        self.size = self.capacity.size
        self.size_per_token = desc.bytes_per_token
        self.layer_num = desc.layer_num
        self.start_layer = desc.start_layer
        self.dtype = desc.dtype
        self.store_dtype = desc.store_dtype
        self.roles = desc.roles
        self.row_shapes = desc.row_shape
        self.row_bytes = desc.row_bytes
        self.pin_memory = pin_memory
        self.device = torch.device("cpu")
        if allocator is not None and not callable(getattr(allocator, "allocate", None)):
            raise TypeError(
                "allocator must have allocate(nbytes) -> HostAllocation, got "
                f"{type(allocator).__name__}"
            )
        tensor_allocator = allocator or default_host_tensor_allocator(pin_memory)
        self._allocations: list[HostAllocation] = []
        self.buffers: tuple[torch.Tensor, ...] = self._allocate_buffers(tensor_allocator)
        self._layer_views: tuple[tuple[torch.Tensor, ...], ...] = tuple(
            tuple(h[l] for l in range(self.layer_num)) if self.layout == "layer_first" else ()
            for h in self.buffers
        )
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
    def _allocate_buffers(self, tensor_allocator: HostTensorAllocator) -> tuple[torch.Tensor, ...]:
        item = torch.empty((), dtype=self.store_dtype).element_size()
        out: list[torch.Tensor] = []
        try:
            for shape_r in self.row_shapes:
                shape = host_buffer_shape(
                    self.layout,
                    num_pages=self.page_num,
                    page_size=self.page_size,
                    layer_num=self.layer_num,
                    row_shape=shape_r,
                )
                numel = 1
                for d in shape:
                    numel *= d
                alloc = tensor_allocator.allocate(numel * item)
                self._allocations.append(alloc)
                out.append(alloc.tensor.view(self.store_dtype).view(shape))
        except BaseException:
            for a in self._allocations:
                a.close()
            self._allocations.clear()
            raise
        return tuple(out)

    @property
    def pinned(self) -> bool:
        """Whether every host buffer is registered/pinned for device DMA."""
        return all(a.pinned for a in self._allocations)

    @property
    def nbytes(self) -> int:
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
        return self.size_per_token

    def available_size(self) -> int:
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
        self._slots.clear()

    def is_allocated(self, indices: torch.Tensor) -> bool:
        return self._slots.is_allocated(indices)

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

    def _check_indices(
        self, desc: KVBufferDesc, host_indices: torch.Tensor, device_indices: torch.Tensor
    ) -> None:
        """Validate the caller's index tensors (names in errors are the caller's arguments).

        Kind, dtype, rank, equal lengths and device are always checked; values (``-1`` = skip,
        else below the host / device row count) when the tensor is on the CPU (no sync).
        """
        device_rows = int(desc.buffers[0][0].shape[0])
        for name, idx, limit in (
            ("host_indices", host_indices, self.size),
            ("device_indices", device_indices, device_rows),
        ):
            check_index(name, idx)
            check_index_device(name, idx, desc.device)
            check_index_values(name, idx, limit=limit, minimum=-1)
        check_same_length(host_indices=host_indices, device_indices=device_indices)

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
        backend = effective_io_backend(self.layout, io_backend)
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

    def _indices_for(self, backend: str, desc: KVBufferDesc, idx: torch.Tensor) -> torch.Tensor:
        target = torch.device("cpu") if backend == "direct" else desc.device
        return idx if idx.device == target else idx.to(target, non_blocking=True)

    def load_to_device_per_layer(
        self,
        device_pool: DevicePoolLike | KVBufferDesc,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: str = "kernel",
    ) -> None:
        """Copy host rows ``host_indices`` of local layer ``layer_id`` into device rows
        ``device_indices`` and mark the layer done on ``layer_done_counter``.

        The counter only tracks a batch the caller began (``layer_done_counter.begin()`` or
        ``load_batch()`` before the layer loop); without one, completing is a no-op. On any error
        the batch in flight is aborted (readers raise instead of hanging).
        """
        try:
            self._check_open()
            check_int("layer_id", layer_id, minimum=0, maximum=self.layer_num - 1)
            desc = self._desc_for(device_pool)
            backend = self._io_backend(io_backend, desc)
            self._check_indices(desc, host_indices, device_indices)
            host_idx = self._indices_for(backend, desc, host_indices)
            device_idx = self._indices_for(backend, desc, device_indices)
            if backend == "direct":
                self._check_direct_pages(host_idx, device_idx)
            device_layer = [desc.buffers[r][layer_id] for r in range(len(self.roles))]
            _transfer.load_one_layer(
                layout=self.layout,
                backend=backend,
                host=self.buffers,
                device_layer=device_layer,
                host_indices=host_idx,
                device_indices=device_idx,
                layer=layer_id,
                page_size=self.page_size,
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
        """Copy device rows ``device_indices`` of every layer into host rows ``host_indices``."""
        self._check_open()
        desc = self._desc_for(device_pool)
        backend = self._io_backend(io_backend, desc)
        self._check_indices(desc, host_indices, device_indices)
        host_idx = self._indices_for(backend, desc, host_indices)
        device_idx = self._indices_for(backend, desc, device_indices)
        if backend == "direct":
            self._check_direct_pages(host_idx, device_idx)
        _transfer.backup_all_layers(
            layout=self.layout,
            backend=backend,
            device=desc.buffers,
            host=self.buffers,
            host_layer_views=self._layer_views,
            device_indices=device_idx,
            host_indices=host_idx,
            page_size=self.page_size,
        )

    # ------------------------------------------------------------------ storage (L3) pages
    def _page_of(self, index: int) -> int:
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

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        """The page starting at host slot ``index`` in the format ``page_format`` (SGLang's
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

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
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
        pages = self._slots.pages_of(idx).tolist()
        return _flat_pages.page_buffer_meta(self.layout, self.buffers, pages, self.page_size)

    def is_stride_page_aligned(self, page_size_bytes: int = 4096) -> bool:
        """Whether every zero-copy range starts at a multiple of ``page_size_bytes``."""
        self._check_open()
        check_int("page_size_bytes", page_size_bytes, minimum=1)
        return _flat_pages.stride_page_aligned(
            self.layout, self.buffers, self.page_size, page_size_bytes
        )
