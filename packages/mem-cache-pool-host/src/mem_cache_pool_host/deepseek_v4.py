"""``DeepSeekV4SingleKVPoolHost``: the host mirror of a ``DeepSeekV4SingleKVPool``.

The device pool stores one uint8 *page row* per page and layer (584-byte token records in the
split layout ``[values][scales][pad]`` of :mod:`mem_cache_kernels.deepseek_v4`) and describes
itself in page-row units (one descriptor row per page, ``page_size = 1``). This host pool
mirrors those rows: its *host slots are page rows* (``alloc(n)`` returns ``n`` host page rows;
``size`` counts page rows; every layout of :mod:`mem_cache_pool_host.layout` works, a row being
one page of one layer).

Two kinds of transfer:

* Page-aligned (the inherited ``backup_from_device_all_layer`` / ``load_to_device_per_layer``
  with *page ids* on both sides, or :meth:`backup_pages` / :meth:`load_pages_per_layer`): whole
  page rows move with the kernels' row-transfer ops, bit-exact, tail padding included.
* Token-granular (:meth:`backup_tokens_from_device_all_layer`,
  :meth:`load_tokens_to_device_per_layer`): a token's record is two runs inside its page row, so
  these gather the records of the given token slots and scatter them into the other side's page
  rows (the trusted bodies of ``mem_cache_kernels.deepseek_v4.read_records`` / ``write_records``
  through ``mem_cache_kernels.dispatch.pick``, after the method validated its arguments). Host
  token slot ``h`` lives in host page row ``h // tokens_per_page`` at offset
  ``h % tokens_per_page``.

Token-granular loads mark the layer done on ``layer_done_counter`` like page loads.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from mem_cache_kernels.checks import (
    check_index,
    check_index_values,
    check_int,
    check_on_device,
    check_same_length,
)
from mem_cache_kernels.deepseek_v4 import TOKEN_BYTES, page_row_bytes
from mem_cache_kernels.dispatch import pick
from mem_cache_pool.base import KVBufferDesc
from mem_cache_pool.deepseek_v4 import DeepSeekV4SingleKVPool
from mem_cache_pool_host.base import HostKVCache
from mem_cache_pool_host.capacity import DEFAULT_HOST_TO_DEVICE_RATIO
from mem_cache_pool_host.memory import HostBytesAllocator, HostTensorAllocator

__all__ = ["DeepSeekV4SingleKVPoolHost"]


class DeepSeekV4SingleKVPoolHost(HostKVCache):
    """Host page-row mirror of a :class:`~mem_cache_pool.deepseek_v4.DeepSeekV4SingleKVPool`
    (or its HiSparse c4 subclass); see the module doc.

    ``DeepSeekV4SingleKVPoolHost(device_pool, *, host_to_device_ratio=2.0,
    host_size_bytes=None, layout="page_first", pin_memory=True, io_backend=None,
    allocator=None, reserve_bytes=None)``: capacity in page rows is
    ``device page rows x ratio`` (or ``host_size_bytes``), as for every host pool.
    ``tokens_per_page`` is the device pool's page size.
    """

    expected_roles: ClassVar[tuple[str, ...] | None] = ("kv",)

    def __init__(
        self,
        device_pool: DeepSeekV4SingleKVPool,
        *,
        host_to_device_ratio: float = DEFAULT_HOST_TO_DEVICE_RATIO,
        host_size_bytes: int | None = None,
        layout: str = "page_first",
        pin_memory: bool = True,
        io_backend: str | None = None,
        allocator: HostTensorAllocator | HostBytesAllocator | None = None,
        reserve_bytes: int | None = None,
    ) -> None:
        if not isinstance(device_pool, DeepSeekV4SingleKVPool):
            raise TypeError(
                f"device_pool must be a DeepSeekV4SingleKVPool, got {type(device_pool).__name__}"
            )
        super().__init__(
            device_pool,
            host_to_device_ratio=host_to_device_ratio,
            host_size_bytes=host_size_bytes,
            layout=layout,
            pin_memory=pin_memory,
            io_backend=io_backend,
            allocator=allocator,
            reserve_bytes=reserve_bytes,
        )
        self.tokens_per_page = device_pool.page_size
        self.page_bytes = device_pool.bytes_per_page_padded
        if self.page_bytes != page_row_bytes(self.tokens_per_page):
            self.close()
            raise ValueError(
                f"device_pool page rows must be {page_row_bytes(self.tokens_per_page)} bytes "
                f"(page_size={self.tokens_per_page} records, padded), got {self.page_bytes}"
            )

    @property
    def kv_buffer(self) -> torch.Tensor:
        """Host page-row tensor in the pool's layout (row = one page of one layer)."""
        self._check_open()
        return self.buffers[0]

    @property
    def token_size(self) -> int:
        """Host token slots: ``size * tokens_per_page`` (``size`` counts page rows)."""
        return self.size * self.tokens_per_page

    # ---------------------------------------------------------------- page-aligned
    def backup_pages(
        self,
        device_pool: DeepSeekV4SingleKVPool | KVBufferDesc,
        host_pages: torch.Tensor,
        device_pages: torch.Tensor,
        io_backend: str = "kernel",
    ) -> None:
        """Copy device page rows ``device_pages`` of every layer to host rows ``host_pages``."""
        self.backup_from_device_all_layer(device_pool, host_pages, device_pages, io_backend)

    def load_pages_per_layer(
        self,
        device_pool: DeepSeekV4SingleKVPool | KVBufferDesc,
        host_pages: torch.Tensor,
        device_pages: torch.Tensor,
        layer_id: int,
        io_backend: str = "kernel",
    ) -> None:
        """Copy host rows ``host_pages`` of local layer ``layer_id`` (``0..layer_num-1``, else
        ``ValueError``) to device pages."""
        check_int("layer_id", layer_id, minimum=0, maximum=self.layer_num - 1)
        self.load_to_device_per_layer(device_pool, host_pages, device_pages, layer_id, io_backend)

    # ---------------------------------------------------------------- token-granular
    def _host_layer(self, layer: int) -> torch.Tensor:
        """Host page rows ``[rows, page_bytes]`` of local layer ``layer`` (a strided view)."""
        buf = self.buffers[0]
        if self.layout == "layer_first":
            return buf[layer]
        if self.layout == "page_first":
            return buf[:, layer]
        return buf[:, layer, 0]  # page_first_direct: [pages, L, 1, page_bytes]

    def _token_args(
        self,
        device_pool: DeepSeekV4SingleKVPool | KVBufferDesc,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
    ) -> tuple[KVBufferDesc, torch.Tensor, torch.Tensor]:
        self._check_open()
        desc = self._desc_for(device_pool)
        host = check_index("host_indices", host_indices)
        dev = check_index("device_indices", device_indices)
        check_same_length(host_indices=host, device_indices=dev)
        check_on_device("host_indices", host, torch.device("cpu"))
        self._check_index_device("device_indices", dev, desc.device)
        limit = int(desc.buffers[0][0].shape[0]) * self.tokens_per_page
        check_index_values("device_indices", dev, limit=limit)
        check_index_values("host_indices", host, limit=self.token_size)
        return desc, host, dev.to(desc.device)

    def backup_tokens_from_device_all_layer(
        self,
        device_pool: DeepSeekV4SingleKVPool | KVBufferDesc,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
    ) -> None:
        """Copy the records of device token slots ``device_indices`` (every layer) to host token
        slots ``host_indices`` (CPU). Only those tokens' bytes change on the host."""
        desc, host, dev = self._token_args(device_pool, host_indices, device_indices)
        if not host.numel():
            return
        ps = self.tokens_per_page
        for layer, device_layer in enumerate(desc.buffers[0]):
            out = torch.zeros(
                (dev.shape[0], TOKEN_BYTES), dtype=torch.uint8, device=desc.device
            )
            pick("read_records", "auto", device_layer, dev)(device_layer, dev, out, ps)
            records = out.cpu()
            host_layer = self._host_layer(layer)
            pick("write_records", "auto", host_layer, host, records)(host_layer, host, records, ps)

    def load_tokens_to_device_per_layer(
        self,
        device_pool: DeepSeekV4SingleKVPool | KVBufferDesc,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
    ) -> None:
        """Copy the records of host token slots ``host_indices`` of local layer ``layer_id`` to
        device token slots ``device_indices`` and mark the layer done (aborting the counter's
        batch on error, like ``load_to_device_per_layer``)."""
        try:
            check_int("layer_id", layer_id, minimum=0, maximum=self.layer_num - 1)
            desc, host, dev = self._token_args(device_pool, host_indices, device_indices)
            event: Any = None
            if host.numel():
                ps = self.tokens_per_page
                host_layer = self._host_layer(layer_id)
                out = torch.zeros((host.shape[0], TOKEN_BYTES), dtype=torch.uint8)
                pick("read_records", "auto", host_layer, host)(host_layer, host, out, ps)
                records = out.to(desc.device)
                device_layer = desc.buffers[0][layer_id]
                pick("write_records", "auto", device_layer, dev, records)(
                    device_layer, dev, records, ps
                )
                if desc.device.type == "cuda":
                    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                    event.record(torch.cuda.current_stream(desc.device))
        except BaseException as exc:
            self.layer_done_counter.abort(exc)
            raise
        self.layer_done_counter.complete(layer_id, event)
