"""What the two HiSparse allocators share (private): ``HiSparseAllocatorCommon``.

``HiSparseTokenToKVPoolAllocator`` (:mod:`mem_cache_allocator.hisparse`, compress ratio 1: the
device pages hold logical tokens) and ``DeepSeekV4HiSparseTokenToKVPoolAllocator``
(:mod:`mem_cache_allocator.deepseek_v4_hisparse`, ratio 4: the device pages hold c4 entries) are
both a *logical* allocator (the slots requests see), a *device* page allocator and the int64
``full_to_hisparse_device_index_mapping`` from logical keys (logical slots, or logical compressed
slots) to device slots (0 = none), driven through one ``PairedAllocators``. This base holds the
methods whose bodies are the same for both: the scheduler hooks, the paired extend, the
logical-only allocations,
the device buffer of the HiSparse coordinator, the device-page releases and the state plumbing.

A subclass sets, in ``__init__``: ``logical_attn_allocator``, ``hisparse_attn_allocator``,
``full_to_hisparse_device_index_mapping``, ``_pair``, and
``_device_page_size`` (slots per device page) and implements ``_device_extend_last_loc``; it
has a ``debug`` attribute or property (checks
that sync run only then) and may override ``_buffer_index_limit`` (``None``: no range check of
``free_hisparse_indices``' argument).
"""

from __future__ import annotations

from typing import Any

import torch

from mem_cache_allocator._hisparse_device import (
    check_slots,
    lookup,
    mapped_pages,
    pad_slots,
    plan_device_extend,
    surplus_pages,
)
from mem_cache_allocator._page_inputs import CPU_LENGTH_NAMES, check_extend_inputs
from mem_cache_allocator._paired import PairedAllocators
from mem_cache_allocator.base import BaseTokenToKVPoolAllocator, _optional, check_index_tensor
from mem_cache_allocator.page_allocator import PageAllocatorCore
from mem_cache_kernels.checks import check_bool, check_int
from mem_cache_kernels.pages import compressed_entry_offsets, extend_counts

__all__ = ["HiSparseAllocatorCommon"]


class HiSparseAllocatorCommon(BaseTokenToKVPoolAllocator):
    """Shared methods of the HiSparse allocators (see the module doc); not instantiated."""

    logical_attn_allocator: BaseTokenToKVPoolAllocator
    hisparse_attn_allocator: PageAllocatorCore
    full_to_hisparse_device_index_mapping: torch.Tensor
    _spec_scratch_capacity: int = 0
    _spec_device_buffer_size: int = 0
    _pair: PairedAllocators
    _device_page_size: int

    @property
    def _checks(self) -> bool:
        """Whether the checks that sync run (the subclass's ``debug``)."""
        return bool(getattr(self, "debug", False))

    @property
    def _buffer_index_limit(self) -> int | None:
        """Exclusive upper bound of ``free_hisparse_indices``' slots, or ``None``: unchecked."""
        return None

    # ------------------------------------------------------------------ scheduler hooks
    def configure_spec_scratch(self, capacity: int, *, device_buffer_size: int = 0) -> None:
        """Record the speculative-decoding workspace (SGLang's HiSparse coordinator calls it):
        ``capacity`` scratch tokens a request without a request-table row still needs, and the
        ``device_buffer_size`` tokens of its persistent device buffer (ignored, 0, while
        ``capacity`` is 0). Both non-negative multiples of ``page_size`` (``ValueError``);
        :meth:`request_slot_reserve` charges them."""
        ps = self.page_size
        for name, value in (("capacity", capacity), ("device_buffer_size", device_buffer_size)):
            if check_int(name, value, minimum=0) % ps:
                raise ValueError(
                    f"{name} must be a non-negative multiple of page_size={ps}, got {value}"
                )
        self._spec_scratch_capacity = capacity
        self._spec_device_buffer_size = device_buffer_size if capacity else 0

    @property
    def spec_scratch_tokens(self) -> int:
        """The speculative scratch capacity set by :meth:`configure_spec_scratch` (0: off)."""
        return self._spec_scratch_capacity

    def request_slot_reserve(self, *, has_req_pool_slot: bool, prefill_tokens: int = 0) -> int:
        """Extra KV slots a request needs beyond its prefill (SGLang's HiSparse answer): the
        device buffer's slots its prefill (``prefill_tokens``, whole pages) does not already
        cover, plus the scratch capacity unless the request holds a request-table row
        (``has_req_pool_slot``: its scratch was allocated with it). 0 until configured."""
        check_bool("has_req_pool_slot", has_req_pool_slot)
        ps = self.page_size
        paged_prefill = -(-check_int("prefill_tokens", prefill_tokens, minimum=0) // ps) * ps
        buffer_reserve = max(self._spec_device_buffer_size - paged_prefill, 0)
        scratch_reserve = 0 if has_req_pool_slot else self._spec_scratch_capacity
        return buffer_reserve + scratch_reserve

    # ------------------------------------------------------------------ logical-only allocation
    def alloc_logical_only(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Logical slots only (KV written straight to host memory; the mapping of their keys
        stays 0)."""
        return self.logical_attn_allocator.alloc_extend(
            prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens
        )

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        """Logical slots only: the HiSparse coordinator places decode tokens on the device
        (``alloc_device_buffer``)."""
        return self.logical_attn_allocator.alloc_decode(seq_lens, seq_lens_cpu, last_loc)

    # ------------------------------------------------------------------ paired extend
    def _device_extend_last_loc(
        self, prefix_lens: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor:
        """The device allocator's ``last_loc`` for an extend from logical ``last_loc``."""
        raise NotImplementedError

    def _alloc_extend_in_step(  # noqa: PLR0917 - the alloc_extend arguments, then the ratio
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        ratio: int,
    ) -> torch.Tensor | None:
        """The body of ``alloc_extend``: logical slots, and device slots for the keys the new
        tokens create (every token for ``ratio`` 1; the ``seq // r - prefix // r`` entries each
        request completes otherwise).

        Capacity of both sides is checked on the host first (SGLang's pre-check: staged frees
        count, nothing merges when it fails); a request whose device prefix ends inside a device
        page on a key without device slot gets a fresh device page (``plan_device_extend``;
        SGLang hands out the padding page there). ``None``: nothing changed.
        """
        # host-side input checks before the capacity check (out of room answers None only for
        # valid inputs); the logical allocator repeats them (cheap, no device sync)
        logical_pages, _ = check_extend_inputs(
            prefix_lens,
            prefix_lens_cpu,
            seq_lens,
            seq_lens_cpu,
            last_loc,
            extend_num_tokens,
            self.page_size,
            allow_meta=self.device.type == "meta",
        )
        dps = self._device_page_size
        c_pre_cpu, c_seq_cpu = prefix_lens_cpu, seq_lens_cpu
        dev_pages = logical_pages
        if ratio != 1:
            c_pre_cpu, c_seq_cpu = prefix_lens_cpu // ratio, seq_lens_cpu // ratio
            dev_pages, _ = extend_counts(c_pre_cpu, c_seq_cpu, dps, names=CPU_LENGTH_NAMES)
        if not self._pair.fits(logical_pages, dev_pages):
            return None
        plan = plan_device_extend(
            prefix_lens if ratio == 1 else prefix_lens // ratio,
            c_pre_cpu,
            c_seq_cpu,
            self._device_extend_last_loc(prefix_lens, last_loc),
            dps,
        )
        if plan.pages > dev_pages and not self._pair.fits(logical_pages, plan.pages):
            return None
        lens = (prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu)
        got = self._pair.run_in_step(
            lambda: self.logical_attn_allocator.alloc_extend(*lens, last_loc, extend_num_tokens),
            lambda: self.hisparse_attn_allocator.alloc_extend(
                plan.prefix_lens,
                plan.prefix_lens_cpu,
                seq_lens if ratio == 1 else seq_lens // ratio,
                c_seq_cpu,
                plan.last_loc,
                plan.tokens,
            ),
        )
        if got is None:
            return None
        logical, dev = got
        if plan.keep is not None:
            dev = dev[plan.keep]
        mapping = self.full_to_hisparse_device_index_mapping
        if ratio == 1:
            mapping[logical] = dev
        elif dev.numel():
            rows = compressed_entry_offsets(prefix_lens_cpu, seq_lens_cpu, ratio).to(
                self.device, non_blocking=True
            )
            mapping[logical[rows] // ratio] = dev
        return logical

    # ------------------------------------------------------------------ device buffer
    def _take_device_buffer(
        self, allocated_indices: torch.Tensor, need_size: int, swap_at: int | None
    ) -> torch.Tensor | None:
        """The body of ``alloc_device_buffer`` (``need_size`` validated by the caller).

        Takes the device slots mapped from the keys ``allocated_indices`` (in order; unmapped ones
        skipped). ``swap_at``: when given and there are more than ``swap_at + 1`` of them, the
        newest is swapped into index ``swap_at``. With at least ``need_size`` slots the first
        ``need_size`` are the buffer and the surplus pages holding no buffer slot are freed;
        otherwise the rest of the newest slot's page pads the buffer and new pages supply the
        remainder. The mapping of ``allocated_indices`` is cleared only on success; ``None``
        (nothing changed) when the device is out of pages. Syncs.
        """
        ps = self._device_page_size
        mapping = self.full_to_hisparse_device_index_mapping
        dev = lookup(mapping, allocated_indices, "allocated_indices", check=self._checks)
        dev = dev[dev > 0]  # a new tensor (boolean indexing copies): the swap cannot touch mapping
        n = int(dev.shape[0])
        swapped = swap_at is not None and n > swap_at + 1
        if swapped:
            old = dev[swap_at].clone()
            dev[swap_at] = dev[n - 1]
            dev[n - 1] = old
        if n >= need_size:
            buffer = dev[:need_size]
            surplus = dev[need_size:]
            mapping[allocated_indices] = 0
            if surplus.numel():
                pages = surplus_pages(buffer, surplus, ps)
                if pages.numel():
                    self.hisparse_attn_allocator.free_page_ids(pages)
            return buffer
        if n % ps:  # pad inside the newest slot's page (at swap_at after a swap)
            newest = int(dev[swap_at] if swapped and swap_at is not None else dev[-1])
            dev = torch.cat([dev, pad_slots(newest, ps - n % ps, ps, self.device)])
        extra_size = need_size - int(dev.shape[0])
        extra_pages = -(-extra_size // ps)
        if extra_pages > self.hisparse_attn_allocator.free_page_count():
            return None
        extra = self.hisparse_attn_allocator.alloc(extra_pages * ps)
        if extra is None:
            return None
        mapping[allocated_indices] = 0
        return torch.cat([dev, extra[:extra_size]])

    # ------------------------------------------------------------------ device releases
    def _device_pages_of(self, keys: torch.Tensor, name: str) -> torch.Tensor:
        """The device pages mapped from ``keys`` (debug: none still mapped from other keys)."""
        mapping = self.full_to_hisparse_device_index_mapping
        return mapped_pages(mapping, keys, self._device_page_size, name, check=self._checks)

    def _release(self, keys: torch.Tensor, pages: torch.Tensor) -> None:
        """Clear the mapping of ``keys`` and free the device ``pages``."""
        self.full_to_hisparse_device_index_mapping[keys] = 0
        if pages.numel():
            self.hisparse_attn_allocator.free_page_ids(pages)

    def free_hisparse_indices(self, buffer_indices: torch.Tensor) -> None:
        """Release device slots directly: every page they touch (SGLang's set-semantics
        ``free``; a buffer owns whole pages, some of whose slots were never handed out singly).
        Entries <= 0 are ignored; never deferred. Syncs (``torch.unique``)."""
        check_index_tensor("buffer_indices", buffer_indices, self.device)
        limit = self._buffer_index_limit
        if limit is not None:
            check_slots(buffer_indices, "buffer_indices", limit, check=self._checks)
        dev = buffer_indices.to(self.device, torch.int64)
        dev = dev[dev > 0]
        if dev.numel():
            pages = torch.unique(dev // self._device_page_size)
            self.hisparse_attn_allocator.free_page_ids(pages)

    # ------------------------------------------------------------------ pool pass-through
    def _check_cpu_copy_args(self, indices: object, mamba_indices: object) -> None:
        """The host-side checks of :meth:`get_cpu_copy` / :meth:`load_cpu_copy`' index
        arguments, run before anything reaches the pool (or finds it missing)."""
        check_index_tensor("indices", indices, self.device)
        if mamba_indices is not None:
            check_index_tensor("mamba_indices", mamba_indices, self.device)

    def _forward_cpu_copy(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """The pool's ``name``; its ``NotImplementedError`` is raised again naming this class
        (the pools of both HiSparse stacks have no per-token CPU copy)."""
        method = self._pool_method(name)  # RuntimeError without a kvcache
        try:
            return method(*args, **kwargs)
        except NotImplementedError as exc:
            raise NotImplementedError(
                f"{type(self).__name__} does not support {name}: {exc}"
            ) from exc

    def get_cpu_copy(
        self,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: Any = None,
    ) -> Any:
        """The pool's ``get_cpu_copy`` (see the base class). ``indices`` (and ``mamba_indices``)
        are checked first (``TypeError``/``ValueError`` naming them); then ``RuntimeError``
        without a kvcache, or ``NotImplementedError`` naming this class and the pool when the
        pool has no CPU copy. ``mamba_indices`` / ``req_pool_index`` forwarded only when
        given."""
        self._check_cpu_copy_args(indices, mamba_indices)
        return self._forward_cpu_copy(
            "get_cpu_copy",
            indices,
            **_optional(mamba_indices=mamba_indices, req_pool_index=req_pool_index),
        )

    def load_cpu_copy(
        self,
        kv_cache_cpu: Any,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: Any = None,
    ) -> Any:
        """The pool's ``load_cpu_copy`` (inverse of :meth:`get_cpu_copy`); the same order of
        checks (``kv_cache_cpu`` is the pool's to check)."""
        self._check_cpu_copy_args(indices, mamba_indices)
        return self._forward_cpu_copy(
            "load_cpu_copy",
            kv_cache_cpu,
            indices,
            **_optional(mamba_indices=mamba_indices, req_pool_index=req_pool_index),
        )

    # ------------------------------------------------------------------ state
    def merge_and_sort_free(self) -> None:
        self._pair.merge_and_sort_free()

    def clear(self) -> None:
        self._pair.clear()
        self._free_group = None

    def debug_print(self) -> str:
        """SGLang 0.5.23's debug line (free tokens of both sides; reads only):
        ``"#logical-available-size: N, #hisparse-available-size: M, "``."""
        return self._pair.describe("logical", "hisparse")
