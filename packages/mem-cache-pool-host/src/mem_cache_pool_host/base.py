"""``HostKVCache``: the host (L2) mirror of a device KV pool.

One class, four modules, one concept each. This module holds what a transfer or a storage
controller's I/O thread runs per call, so such a call enters no other module of this package
(``tools/dev chain``): the open check, ``alloc`` / ``free``, the transfers with their one argument
check, and the zero-copy page ranges (``page_range_table``, ``page_ids``, ``io_guard``). Its bases:

* :class:`~mem_cache_pool_host._buffers.HostBuffers` (``_buffers``): construction from the device
  pool's :class:`~mem_cache_pool.base.KVBufferDesc` (never its internals), capacity in whole
  pages (``host_token_capacity``, else ``host_size`` / ``host_size_bytes``, else
  ``device.size * host_to_device_ratio``, rounded down; checked against free host memory before
  anything is allocated), one host tensor per role in a layout of ``layout.py``, the transfer plan,
  and ``close()`` (idempotent; unregisters the memory, deferred while :meth:`io_guard` users copy);
* :class:`~mem_cache_pool_host._storage_pages.StoragePages` (``_storage_pages``): the storage (L3)
  page API, whole pages as flat tensors in the named, versioned ``page_format``;
* :class:`~mem_cache_pool_host._sglang_views.SGLangViews` (``_sglang_views``): SGLang's
  read-only slot state and transfer geometry.

Contract of the members here:

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
  indices on the device pool's device, ``"direct"`` on the CPU: host-driven copies, the torch
  executor's (``pick(op, "torch")``) for ``layer_first``, the page-granular bodies of the public
  ``direct_*`` ops (``dispatch.SINGLE``) for ``page_first_direct``. A failing load aborts the
  counter's batch in flight so readers never deadlock.
* Thread safety: alloc/free/clear/available_size/close hold ``self.lock`` (an RLock); transfers do
  not (IO threads move disjoint slots concurrently).
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch

from mem_cache_kernels.checks import (
    check_bool,
    check_choice,
    check_index,
    check_index_values,
    check_int,
    check_same_length,
)
from mem_cache_kernels.dispatch import pick
from mem_cache_pool.base import KVBufferDesc
from mem_cache_pool_host._buffers import DevicePoolLike, HostBuffers, resolve_buffer_desc
from mem_cache_pool_host._sglang_views import SGLangViews
from mem_cache_pool_host._storage_pages import StoragePages
from mem_cache_pool_host.layout import IO_BACKENDS, IOBackend

__all__ = ["DevicePoolLike", "HostKVCache", "resolve_buffer_desc"]

_log = logging.getLogger(__name__)
_CPU = torch.device("cpu")
# the kernel backend of each IO backend: "direct" is host-driven, the torch executor's copies (the
# body mem_cache_kernels.direct_transfer_rows runs after its checks); "kernel" picks by device
_KERNEL: dict[IOBackend, str] = {"kernel": "auto", "direct": "torch"}


def _int64(idx: torch.Tensor) -> torch.Tensor:
    """A validated CPU index tensor as int64 (the direct bodies' index dtype)."""
    return idx if idx.dtype is torch.int64 else idx.to(torch.int64)


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


class _IOGuard:
    """The context manager :meth:`HostKVCache.io_guard` returns: counts an I/O user of the
    pool's memory in, and out (the last one out releases memory a ``close`` left pending)."""

    __slots__ = ("_pool",)

    def __init__(self, pool: HostKVCache) -> None:
        self._pool = pool

    def __enter__(self) -> None:
        pool = self._pool
        with pool._io_lock:
            if pool._closed:
                raise RuntimeError(f"{type(pool).__name__} is closed")
            pool._io_users += 1

    def __exit__(self, *exc: object) -> None:
        pool = self._pool
        with pool._io_lock:
            pool._io_users -= 1
            release = pool._io_users == 0 and pool._release_pending
            if release:
                pool._release_pending = False
        if release:
            pool._release_memory()


class HostKVCache(StoragePages, SGLangViews, HostBuffers):
    """Base of the host pools (see the module docstring): construction and memory in
    :class:`~mem_cache_pool_host._buffers.HostBuffers`, the storage page API and SGLang's
    read-only members in the other two bases. Subclasses pin the expected roles."""

    expected_roles: ClassVar[tuple[str, ...] | None] = None

    # SGLang 0.5.23's class-level answers for features this package does not have: decode context
    # parallelism (one rank holds every token), shared compacting host layouts, page envelopes
    # and a page format of its own (our flat pages are SGLang's default format, so no tag).
    dcp_size: int = 1
    dcp_rank: int = 0
    shared_allocation_domain: None = None
    stores_page_envelope: bool = False
    storage_format_tag: str | None = None

    @property
    def pinned(self) -> bool:
        """Whether every host buffer is registered/pinned for device DMA."""
        return all(a.pinned for a in self._allocations)

    def io_guard(self) -> AbstractContextManager[None]:
        """Keep the host memory mapped while raw pointers into it are used (storage backends
        copying through :meth:`get_page_buffer_meta` ranges on another thread). Entering raises
        ``RuntimeError`` when the pool is already closed; a :meth:`close` meanwhile defers the
        release of the memory until the last guard exits. A small object per call (the count is
        the pool's), so a storage call pays two lock round trips and no generator."""
        return _IOGuard(self)

    def __enter__(self) -> HostKVCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")

    # ----------------------------------------------------------------- slots
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
            if self.layout == "page_first_direct":  # indices on the CPU (direct IO)
                pick("direct_load_layer_from_page_first_direct", "torch")(
                    host, device_layer, _int64(host_idx), _int64(device_idx), layer_id,
                    self.page_size,
                )  # fmt: skip
            elif self.layout == "layer_first":
                pick("transfer_rows", _KERNEL[backend], host[0], device_layer[0])(
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
        if self.layout == "page_first_direct":  # indices on the CPU (direct IO)
            pick("direct_backup_all_layers_to_page_first_direct", "torch")(
                device, self.buffers, _int64(device_idx), _int64(host_idx), self.page_size
            )
            return
        host = self._layer_views if self.layout == "layer_first" else self.buffers
        pick(self._backup_op, _KERNEL[backend], device[0][0], self.buffers[0])(
            device, host, device_idx, host_idx
        )

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
