"""``DeepSeekV4HiSparseTokenToKVPoolAllocator``: HiSparse over DeepSeek-V4's c4 compressed cache.

Wraps the *logical* allocator of a ``DeepSeekV4TokenToKVPool`` (paged or SWA-style; its slots
are the ids requests see) and adds a *device* paged allocator over the pool's
``HiSparseC4DevicePool`` (page ``page_size // 4``). Compression ratio 4: logical full slot ``f``
has a compressed entry iff ``(f + 1) % 4 == 0``, at logical compressed slot ``f // 4``.
``full_to_hisparse_device_index_mapping`` (int64, ``size // 4 + page_size // 4 + 1`` entries,
0 = no device slot, trailing -1) maps logical compressed slots to device slots; it is registered
into the c4 pool, which translates through it on every key read/write.

* ``available_size() = min(logical, 4 x device)`` (tokens).
* ``alloc_extend``: logical slots, then device slots for the ``seq // 4 - prefix // 4`` new
  compressed tokens of every request (capacity of both checked on the host first; a failure
  leaves nothing changed). The device ``last_loc`` is ``mapping[(L - 3) // 4]`` when the
  compressed prefix ends inside a device page (see ``_deepseek_v4_slots.device_last_loc``).
  Contract: when a request's compressed prefix ends inside a device page, its last compressed
  entry must still be device-mapped (true when the request's previous chunk came from
  ``alloc_extend``); debug mode checks it.
* ``alloc(n)``: whole logical pages plus the matching device pages (an extension: SGLang's class
  has no ``alloc``; it lets the allocator conformance kit drive this class).
* ``alloc_decode`` / ``alloc_logical_only``: logical slots only (the HiSparse coordinator places
  decode tokens on the device through :meth:`alloc_device_buffer`).
* ``free`` / ``free_segment``: the logical pages *and* the device slots mapped from the freed
  compressed entries, clearing their mapping (``free_hisparse``); calling ``free_hisparse``
  before is harmless (the mapping is already cleared). Free groups check nesting only.
* ``free_hisparse_indices(device_slots)`` releases device buffers (whole pages).

Deviation from SGLang (documented): SGLang's ``free`` releases only logical slots and relies on
the coordinator to call ``free_hisparse``; here ``free`` releases both so no device slot leaks.
Device frees release every page touched (``torch.unique``: one sync per call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mem_cache_allocator._composite import check_need_size, new_mapping
from mem_cache_allocator._deepseek_v4_slots import device_last_loc, entry_offsets
from mem_cache_allocator._pages import check_cpu_lengths, num_new_pages_extend
from mem_cache_allocator._paired import PairedAllocators, check_own_state
from mem_cache_allocator.base import BaseTokenToKVPoolAllocator
from mem_cache_allocator.paged import PagedTokenToKVPoolAllocator
from mem_cache_pool.deepseek_v4 import (
    DeepSeekV4TokenToKVPool,
    HiSparseC4DevicePool,
    compressed_last_loc,
)

__all__ = ["DeepSeekV4HiSparseAllocatorState", "DeepSeekV4HiSparseTokenToKVPoolAllocator"]

_RATIO = 4


@dataclass(frozen=True, slots=True)
class DeepSeekV4HiSparseAllocatorState:
    """Opaque result of :meth:`DeepSeekV4HiSparseTokenToKVPoolAllocator.backup_state`."""

    owner: int
    logical: Any
    device: Any
    mapping: torch.Tensor


class DeepSeekV4HiSparseTokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """``DeepSeekV4HiSparseTokenToKVPoolAllocator(logical_attn_allocator, *, debug=False)``.

    ``logical_attn_allocator.get_kvcache()`` must be a ``DeepSeekV4TokenToKVPool`` whose
    ``c4_kv_pool`` is a ``HiSparseC4DevicePool`` (``TypeError`` otherwise). ``page_size`` is the
    logical page size; ``hisparse_page_size`` the c4 device page size (``page_size // 4``).
    """

    compress_ratio = _RATIO

    def __init__(
        self, logical_attn_allocator: BaseTokenToKVPoolAllocator, *, debug: bool = False
    ) -> None:
        if not isinstance(logical_attn_allocator, BaseTokenToKVPoolAllocator):
            raise TypeError(
                "logical_attn_allocator must be a BaseTokenToKVPoolAllocator, got "
                f"{type(logical_attn_allocator).__name__}"
            )
        logical = logical_attn_allocator
        pool = logical.get_kvcache()
        if not isinstance(pool, DeepSeekV4TokenToKVPool):
            raise TypeError(
                "logical_attn_allocator.get_kvcache() must be a DeepSeekV4TokenToKVPool, got "
                f"{type(pool).__name__}"
            )
        c4_pool = pool.c4_kv_pool
        if not isinstance(c4_pool, HiSparseC4DevicePool):
            raise TypeError(
                "the pool's c4_kv_pool must be a HiSparseC4DevicePool (enable_hisparse=True), "
                f"got {type(c4_pool).__name__}"
            )
        if logical.page_size % _RATIO or c4_pool.page_size != logical.page_size // _RATIO:
            raise ValueError(
                f"the c4 pool's page size must be page_size // 4 = {logical.page_size // _RATIO}"
                f" (page_size={logical.page_size}), got {c4_pool.page_size}"
            )
        super().__init__(
            logical.size, logical.page_size, logical.dtype, logical.device, pool, logical.need_sort
        )
        self.logical_attn_allocator = logical
        self.hisparse_page_size = c4_pool.page_size
        self.hisparse_attn_allocator = PagedTokenToKVPoolAllocator(
            c4_pool.size,
            c4_pool.page_size,
            logical.dtype,
            self.device,
            c4_pool,
            logical.need_sort,
            debug=debug,
        )
        self.debug = debug
        self.c4_logical_size = logical.size // _RATIO
        self.full_to_hisparse_device_index_mapping = new_mapping(
            self.c4_logical_size + self.hisparse_page_size, self.device
        )
        c4_pool.register_mapping(self.full_to_hisparse_device_index_mapping)
        self._pair = PairedAllocators(
            logical, self.hisparse_attn_allocator, self.full_to_hisparse_device_index_mapping
        )

    # ------------------------------------------------------------------ capacity / delegation
    @property
    def size_hisparse(self) -> int:
        """Device compressed slots (the c4 pool's size)."""
        return self.hisparse_attn_allocator.size

    def available_size(self) -> int:
        return self._pair.available_size(_RATIO)

    def _delegate(self, name: str) -> Any:
        inner = getattr(self.logical_attn_allocator, name, None)
        if inner is None:
            raise AttributeError(
                f"the wrapped {type(self.logical_attn_allocator).__name__} has no {name}"
            )
        return inner

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        return self._delegate("translate_loc_from_full_to_swa")(kv_indices)  # type: ignore[no-any-return]

    def free_swa(self, free_index: torch.Tensor) -> None:
        self._delegate("free_swa")(free_index)

    def full_available_size(self) -> int:
        return int(self._delegate("full_available_size")())

    def swa_available_size(self) -> int:
        return int(self._delegate("swa_available_size")())

    @property
    def size_swa(self) -> int:
        return int(self._delegate("size_swa"))

    # ------------------------------------------------------------------ translation
    def get_last_loc_compressed(self, last_loc: torch.Tensor) -> torch.Tensor:
        """Logical compressed ``last_loc``: ``(L - 3) // 4``; -1 stays -1."""
        return compressed_last_loc(last_loc, _RATIO)

    def get_last_loc_hisparse_device(self, last_loc: torch.Tensor) -> torch.Tensor:
        """Device slot of the compressed ``last_loc`` of full ``last_loc`` (-1 stays -1)."""
        return self.full_to_hisparse_device_index_mapping[self.get_last_loc_compressed(last_loc)]

    def _compressed_of(self, full: torch.Tensor) -> torch.Tensor:
        """Logical compressed slots of the entry-completing slots of ``full`` (syncs)."""
        idx = full.to(device=self.device, dtype=torch.int64)
        return idx[(idx + 1) % _RATIO == 0] // _RATIO

    # ------------------------------------------------------------------ allocation
    def alloc(self, need_size: int) -> torch.Tensor | None:
        """Whole logical pages and the device pages of their compressed entries."""
        check_need_size(need_size)
        if need_size % self.page_size:
            raise ValueError(
                f"need_size must be a multiple of page_size={self.page_size}, got {need_size}"
            )
        pages = need_size // self.page_size
        if not self._pair.fits(pages, pages):
            return None
        got = self._pair.run_in_step(
            lambda: self.logical_attn_allocator.alloc(need_size),
            lambda: self.hisparse_attn_allocator.alloc(need_size // _RATIO),
        )
        if got is None:
            return None
        logical, dev = got
        self.full_to_hisparse_device_index_mapping[logical[_RATIO - 1 :: _RATIO] // _RATIO] = dev
        return logical

    def alloc_extend(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        bs = check_cpu_lengths("seq_lens_cpu", seq_lens_cpu)
        check_cpu_lengths("prefix_lens_cpu", prefix_lens_cpu, bs)
        c_pre_cpu, c_seq_cpu = prefix_lens_cpu // _RATIO, seq_lens_cpu // _RATIO
        logical_pages, _ = num_new_pages_extend(prefix_lens_cpu, seq_lens_cpu, self.page_size)
        dev_pages, dev_tokens = num_new_pages_extend(c_pre_cpu, c_seq_cpu, self.hisparse_page_size)
        if not self._pair.fits(logical_pages, dev_pages):
            return None
        dev_last = self._device_last_loc(prefix_lens, last_loc)
        if self.debug:
            self._check_device_prefix(c_pre_cpu, dev_last)
        lens = (prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu)
        got = self._pair.run_in_step(
            lambda: self.logical_attn_allocator.alloc_extend(*lens, last_loc, extend_num_tokens),
            lambda: self.hisparse_attn_allocator.alloc_extend(
                prefix_lens // _RATIO,
                c_pre_cpu,
                seq_lens // _RATIO,
                c_seq_cpu,
                dev_last,
                dev_tokens,
            ),
        )
        if got is None:
            return None
        logical, dev = got
        if dev_tokens:
            rows = entry_offsets(prefix_lens_cpu, seq_lens_cpu, _RATIO).to(
                self.device, non_blocking=True
            )
            self.full_to_hisparse_device_index_mapping[logical[rows] // _RATIO] = dev
        return logical

    def _device_last_loc(self, prefix_lens: torch.Tensor, last_loc: torch.Tensor) -> torch.Tensor:
        """The device allocator's ``last_loc`` (see :func:`device_last_loc`)."""
        mapped = self.get_last_loc_hisparse_device(last_loc)
        return device_last_loc(prefix_lens, mapped, self.hisparse_page_size, _RATIO)

    def _check_device_prefix(self, c_pre_cpu: torch.Tensor, dev_last: torch.Tensor) -> None:
        mid_page = (c_pre_cpu % self.hisparse_page_size != 0).to(dev_last.device)
        bad = torch.nonzero(mid_page & (dev_last <= 0)).reshape(-1)
        if bad.numel():
            raise ValueError(
                f"requests {bad.tolist()} have a compressed prefix ending mid-page whose last "
                "entry has no device slot (mapping is 0): allocate them with alloc_extend "
                "chunks or place them with alloc_device_buffer"
            )

    def alloc_logical_only(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Logical slots only (mapping stays 0 for their compressed entries)."""
        return self.logical_attn_allocator.alloc_extend(
            prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens
        )

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        """Logical slots only: the coordinator places decode tokens on the device."""
        return self.logical_attn_allocator.alloc_decode(seq_lens, seq_lens_cpu, last_loc)

    def alloc_device_buffer(
        self, allocated_indices: torch.Tensor, need_size: int
    ) -> torch.Tensor | None:
        """Turn one request's c4 device slots into a buffer of exactly ``need_size`` slots.

        ``allocated_indices``: the request's logical full slots for positions ``0..n-1`` (its
        compressed entries are the slots at positions ``3, 7, ...``). Their mapped device slots
        are taken over (mapping cleared) page by page: the first ``need_size / c4_page`` pages
        are kept (the page holding the newest compressed entry always is), surplus pages are
        freed, missing pages are allocated. The buffer lists every slot of the kept pages; the
        slot of the newest compressed entry is swapped into the last, reserved position.
        ``need_size`` must be a positive multiple of ``hisparse_page_size``. Returns ``None``
        (nothing changed) when the device is out of pages. Syncs.
        """
        cps = self.hisparse_page_size
        if isinstance(need_size, bool) or not isinstance(need_size, int) or need_size <= 0:
            raise ValueError(f"need_size must be a positive int, got {need_size!r}")
        if need_size % cps:
            raise ValueError(
                f"need_size must be a multiple of the c4 page size {cps}, got {need_size}"
            )
        if not isinstance(allocated_indices, torch.Tensor) or allocated_indices.dim() != 1:
            raise ValueError("allocated_indices must be a 1-D tensor of logical slots")
        mapping = self.full_to_hisparse_device_index_mapping
        entries = allocated_indices.to(self.device, torch.int64)[_RATIO - 1 :: _RATIO] // _RATIO
        dev = mapping[entries]
        dev = dev[dev > 0]
        pages = torch.unique_consecutive(dev // cps)
        need_pages = need_size // cps
        keep, surplus = pages[:need_pages].clone(), pages[need_pages:]
        if surplus.numel():
            newest = dev[-1] // cps
            if not bool((keep == newest).any()):
                surplus = torch.cat([surplus[surplus != newest], keep[-1:]])
                keep[-1] = newest
        missing = need_pages - int(keep.numel())
        if missing > self.hisparse_attn_allocator.free_page_count():
            return None
        if missing:
            extra = self.hisparse_attn_allocator.alloc(missing * cps)
            if extra is None:  # pragma: no cover - the check above guarantees room
                return None
            keep = torch.cat([keep, extra[::cps] // cps])
        if surplus.numel():
            self.hisparse_attn_allocator.free_page_ids(surplus)
        mapping[entries] = 0
        offsets = torch.arange(cps, dtype=torch.int64, device=self.device)
        buffer: torch.Tensor = (keep[:, None] * cps + offsets).reshape(-1)
        if dev.numel():
            pos = torch.nonzero(buffer == dev[-1]).reshape(-1)[:1]
            last = buffer[-1:].clone()
            buffer[-1:] = buffer[pos]
            buffer[pos] = last
        return buffer

    # ------------------------------------------------------------------ free
    def free(self, free_index: torch.Tensor) -> None:
        """Free logical slots (the logical allocator's ``free`` contract) and the device slots
        of their compressed entries, clearing the mapping."""
        if free_index.numel() == 0:
            return
        self.logical_attn_allocator.free(free_index)
        self.free_hisparse(free_index)

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """Free a request's slots of positions ``[start_pos, ...)`` (page-aligned start)."""
        self._delegate("free_segment")(free_index, start_pos=start_pos)
        self.free_hisparse(free_index)

    def free_hisparse(self, free_indices: torch.Tensor) -> None:
        """Release the device slots of the compressed entries of logical ``free_indices`` and
        clear their mapping (``free_compressed``)."""
        if free_indices.numel() == 0:
            return
        entries = self._compressed_of(free_indices)
        mapping = self.full_to_hisparse_device_index_mapping
        dev = mapping[entries]
        mapping[entries] = 0
        self.free_hisparse_indices(dev)

    def free_hisparse_indices(self, buffer_indices: torch.Tensor) -> None:
        """Release device slots directly (whole pages; entries <= 0 ignored); never deferred."""
        dev = buffer_indices.to(self.device, torch.int64)
        dev = dev[dev > 0]
        if dev.numel():
            # by page, not slot: a buffer claims whole pages, some slots never handed out singly
            pages = torch.unique(dev // self.hisparse_page_size)
            self.hisparse_attn_allocator.free_page_ids(pages)

    # ------------------------------------------------------------------ state
    def merge_and_sort_free(self) -> None:
        self._pair.merge_and_sort_free()

    def clear(self) -> None:
        self._pair.clear()
        self._free_group = None

    def backup_state(self) -> DeepSeekV4HiSparseAllocatorState:
        return DeepSeekV4HiSparseAllocatorState(id(self), *self._pair.snapshot())

    def restore_state(self, state: Any) -> None:
        own = check_own_state(state, DeepSeekV4HiSparseAllocatorState, self)
        self._pair.restore(own.logical, own.device, own.mapping)

    def get_cpu_copy(self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None) -> Any:
        raise NotImplementedError("DeepSeekV4HiSparseTokenToKVPoolAllocator has no CPU copies")

    def load_cpu_copy(
        self, kv_cache_cpu: Any, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> Any:
        raise NotImplementedError("DeepSeekV4HiSparseTokenToKVPoolAllocator has no CPU copies")

    def debug_print(self) -> str:
        return self._pair.describe("logical", "hisparse")
