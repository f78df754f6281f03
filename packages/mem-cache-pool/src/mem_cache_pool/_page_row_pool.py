"""Page-row pools (private): ``PageRowPool``, the base of pools that keep one byte row per page
(today the DeepSeek-V4 record pools and the indexer pool).

A page-row pool stores, per layer, one uint8 row of ``page_bytes`` bytes per page
(``[num_pages, page_bytes]``, zero-initialised) instead of one row per token slot. Slots keep the
usual meaning (page ``p`` owns slots ``[p * ps, (p + 1) * ps)``, page 0 is the padding page);
where a token's bytes sit inside its page row is the subclass's layout.

``num_pages = ceil(size / page_size) + 1`` (the padding page plus enough pages for ``size``
slots), so valid slots are ``[0, num_pages * page_size)`` (``slot_limit``).

Buffer descriptor (for host pools and transfer engines) in *page-row units*: role ``"kv"``, one
row per page (``row_shape = (page_bytes,)``), ``size = num_pages - 1`` rows plus the padding row,
``page_size = 1``, dtype and store dtype ``uint8``. A host mirror built from it moves whole page
rows: its "slots" are page ids.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels import checks
from mem_cache_pool.base import KVBufferDesc, KVCache

__all__ = ["PageRowPool", "page_row_desc"]


def page_row_desc(pool: KVCache, buffers: Sequence[torch.Tensor]) -> KVBufferDesc:
    """The page-row-unit descriptor of ``buffers`` (per-layer ``[num_pages, page_bytes]``)."""
    num_pages, page_bytes = buffers[0].shape
    ptrs = torch.tensor([t.data_ptr() for t in buffers], dtype=torch.int64, device=pool.device)
    return KVBufferDesc(
        roles=("kv",),
        buffers=(tuple(buffers),),
        row_shape=((page_bytes,),),
        row_bytes=(page_bytes,),
        data_ptrs=ptrs.view(torch.uint64),
        size=num_pages - 1,
        page_size=1,
        layer_num=pool.layer_num,
        start_layer=pool.start_layer,
        dtype=torch.uint8,
        store_dtype=torch.uint8,
        device=pool.device,
    )


class PageRowPool(KVCache):
    """Base of page-major pools: allocation, slot checks, descriptor (see the module doc).

    Subclasses pass ``page_bytes`` (bytes of one page row) and implement the token layout.
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
        *,
        page_bytes: int,
        debug: bool = False,
    ) -> None:
        super().__init__(
            size,
            page_size,
            dtype,
            layer_num,
            device,
            enable_memory_saver,
            start_layer,
            end_layer,
            debug=debug,
        )
        self.page_bytes = checks.check_int("page_bytes", page_bytes, minimum=1)
        self.num_pages = -(-self.size // self.page_size) + 1
        self.kv_buffer = [
            torch.zeros((self.num_pages, page_bytes), dtype=torch.uint8, device=self.device)
            for _ in range(self.layer_num)
        ]
        self.data_ptrs = self.get_buffer_desc().data_ptrs
        self._finalize_allocation()

    @property
    def slot_limit(self) -> int:
        """Exclusive upper bound of valid slots: ``num_pages * page_size``."""
        return self.num_pages * self.page_size

    def _role_buffers(self) -> tuple[tuple[str, Sequence[torch.Tensor]], ...]:
        return (("kv", self.kv_buffer),)

    def _check_slots(self, name: str, loc: object, *, length: int | None = None) -> torch.Tensor:
        """A validated 1-D int32/int64 slot tensor on the pool's device, as int64."""
        t = checks.check_index(name, loc, length=length, device=self.device)
        checks.check_index_values(name, t, limit=self.slot_limit, full=self.debug)
        return t.long()

    def _get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[layer_id - self.start_layer]

    def _get_value_buffer(self, layer_id: int) -> torch.Tensor:
        raise NotImplementedError(
            f"{type(self).__name__} has no value buffer (one packed page row per page); "
            "use get_key_buffer"
        )

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Not supported: a page-row pool has one packed buffer per layer (``get_key_buffer``)."""
        lid = self._layer(layer_id)  # checked, never waited for: the call fails anyway
        return self._get_key_buffer(lid), self._get_value_buffer(lid)

    def get_kv_size_bytes(self) -> int:
        """Bytes of the page-row buffers summed over layers."""
        return sum(t.numel() for t in self.kv_buffer)

    def get_buffer_desc(self) -> KVBufferDesc:
        """Descriptor in page-row units (module doc): a host mirror moves whole page rows."""
        if self._desc is None:
            self._desc = page_row_desc(self, self.kv_buffer)
        return self._desc

    def page_ids(self, loc: torch.Tensor) -> torch.Tensor:
        """Page id (row of every layer buffer) of each slot of ``loc``: ``loc // page_size``."""
        return self._check_slots("loc", loc) // self.page_size
