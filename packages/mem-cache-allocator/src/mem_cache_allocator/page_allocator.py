"""The page allocator: the engine of ``TokenToKVPoolAllocator`` and ``PagedTokenToKVPoolAllocator``.

:class:`PageAllocatorCore` is the whole implementation of SGLang 0.5.23's token and paged KV slot
allocators; :mod:`mem_cache_allocator.token` and :mod:`mem_cache_allocator.paged` are its two
configurations (two class flags, no methods of their own but the token allocator's signature):

=============================  =================  ===============================================
class                          freed pages go     ``free(slots)``
=============================  =================  ===============================================
``PagedTokenToKVPoolAllocator`` to the front       ``unique(slots // page_size)``, ascending
``TokenToKVPoolAllocator``      to the back        the slots as given (no dedup), page size 1
=============================  =================  ===============================================

Index conventions (:mod:`mem_cache_allocator.base`): page ``p`` owns slots ``[p * ps, (p + 1) *
ps)``; page 0 is the padding page, never handed out; slots are int64 on the allocator's
``device``; a request's slot of position ``j`` is congruent to ``j`` modulo ``ps``; ``last_loc
== -1`` means an empty prefix.

State (lengths on the host, never read from the device):

* ``_free``: a ``ChunkedFreeList`` (:mod:`mem_cache_allocator._free_list`) of free page ids
  (slot ids for page size 1); every allocation takes its prefix, in request order.
* ``_release``: ``need_sort`` only, the staged frees, merged into ``_free`` and sorted when an
  allocation finds ``_free`` short (SGLang's trigger conditions: same calls, same slots).
* ``_free_group``: the queued frees between ``free_group_begin`` and ``free_group_end``.
* ``_debug``: debug mode's ownership bitmaps (:mod:`mem_cache_allocator._debug`), or ``None``.

This module holds what an allocation or a ``free`` runs (the host checks, the core's alloc /
free, the kernel calls) and the state backup; the members off that path (SGLang-name views,
``resize``, ``free_page_ids`` / ``free_segment(s)``, the free-group flush) are the private mixin
``_scheduler_members.SchedulerMembers``, the class's base.

One way down. Every public method checks its arguments once, at its entry, on the host: structure
and dtypes with :mod:`mem_cache_kernels.checks`, page counts with :mod:`mem_cache_kernels.pages`
(:func:`check_extend_inputs`, :func:`check_decode_structure`); then it runs the trusted kernel body
``mem_cache_kernels.dispatch.pick("alloc_extend" | "alloc_decode", "auto", out)`` with the page
count it computed (no second validation below it). The body is picked on the allocator's first
allocation that runs a kernel and kept (the kernels' backend setting,
``MEM_CACHE_KERNELS_BACKEND``, is read then, by the kernels). Errors: ``TypeError`` for the wrong
kind, ``ValueError`` for a wrong value (naming the argument, the requests and their values), raised
before any state changes; debug mode raises ``mem_cache_allocator.AllocatorDebugError``.
Shortage returns ``None`` and changes nothing.

Frees. ``free`` (any slot set: any order, int32 or int64, partial pages, duplicates, several
requests concatenated, SGLang's contract) validates the structure, then on CPU tensors range
checks and deduplicates in one numpy pass over the slots (:func:`host_unique_pages`); inside a
free group the slots are queued and checked once, at ``free_group_end``. ``free_segment(s)``
(page ids by stride at caller-stated positions: no dedup, no device sync) and ``free_page_ids``
release exact pages. Every path checks first (range, the capacity count that catches a double
free, debug ownership) and changes state only after (:meth:`PageAllocatorCore.commit_free`).

Cost (host, per call): O(1) torch ops plus the kernel for an allocation; a free is O(pages
freed), never O(free list); ``available_size()`` is host arithmetic. A paged ``free`` of GPU
slots syncs once (``torch.unique``; once per group inside a group); nothing else reads device
memory outside debug mode.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

try:  # optional: the CPU dedup of ``free`` and the CPU decode run in numpy (cheaper than torch)
    import numpy as _np
except ImportError:  # pragma: no cover - numpy ships with every torch wheel we test
    _np = None  # type: ignore[assignment]

from mem_cache_allocator import _debug
from mem_cache_allocator._debug import DebugTracker
from mem_cache_allocator._free_list import ChunkedFreeList, FreeListSnapshot
from mem_cache_allocator._page_inputs import (
    _DECODE_DEV,
    _EXTEND_DEV,
    check_decode_inputs,
    check_decode_structure,
    check_extend_inputs,
)
from mem_cache_allocator._scheduler_members import _SLOTS, SchedulerMembers
from mem_cache_kernels.checks import (
    INDEX_DTYPES,
    SMALL_BATCH,
    check_index,
    check_int,
    check_same_device,
    debug_enabled,
    describe,
    host_bounds,
)
from mem_cache_kernels.pages import decode_counts, decode_page_starts

if TYPE_CHECKING:
    from mem_cache_pool.base import KVCache

# the public surface; the argument checks are shared with the package's other allocators
# (composites: _page_inputs), the free list is _free_list
__all__ = ["PageAllocatorCore", "PageAllocatorState"]


# ====================================================================== kernels
def pick(op: str, backend: str, *tensors: torch.Tensor) -> Callable[..., Any]:
    """:func:`mem_cache_kernels.dispatch.pick`, imported on the first allocation (``import
    mem_cache_allocator`` loads the kernels package only as far as its checks): this
    placeholder binds the module global ``pick`` to the real function and forwards once."""
    from mem_cache_kernels import dispatch

    globals()["pick"] = dispatch.pick
    return dispatch.pick(op, backend, *tensors)


def _torch_impl(op: str) -> Any:
    """The torch implementation of kernel op ``op``: its entry in the dispatch table (read there,
    not through this module's ``pick``, which tests replace by a stub)."""
    from mem_cache_kernels import dispatch

    return dispatch.TABLE[op][0]


def host_decode(last_loc: torch.Tensor, need: Any, pages: torch.Tensor, shift: int) -> torch.Tensor:
    """The decode slots of CPU tensors in numpy, where the torch kernel would run: ``last_loc +
    1``, and ``pages << shift`` (the first slot of the next free page, request order) for the
    requests whose new token starts a page (``need``: the numpy mask of
    :func:`mem_cache_kernels.pages.decode_page_starts`, ``len(pages)`` true entries). The slots
    of the ``alloc_decode`` kernel (tested against it), without a torch op per call. A new int64
    CPU tensor; reads and writes nothing else."""
    out = _np.add(last_loc.numpy(), 1, dtype=_np.int64)
    if pages.shape[0]:
        out[need] = pages.numpy() << shift
    return torch.from_numpy(out)


def host_decode_small(
    last_loc: torch.Tensor, need: list[bool], pages: torch.Tensor, shift: int
) -> torch.Tensor:
    """:func:`host_decode` for a batch of at most ``SMALL_BATCH`` requests, on lists (the
    dozen numpy calls of :func:`decode_page_starts` and :func:`host_decode` each pay a dispatch
    that a scheduler step finds cold: 54 us a call at page size 16, batch 32, in
    ``tools.bench.sglang_step``, against 27-34 us on lists): ``need`` the requests whose new
    token starts a page (``len & (ps - 1) == 1``), ``pages`` the free-list prefix of as many
    pages. Same slots as the kernel, a new int64 CPU tensor."""
    loc = last_loc.tolist()
    if pages.shape[0]:
        it = iter(pages.tolist())
        loc = [next(it) << shift if n else x + 1 for x, n in zip(loc, need)]
    else:
        loc = [x + 1 for x in loc]
    return torch.frombuffer(array("q", loc), dtype=torch.int64)  # 1.5 us; torch.tensor: 5


# ====================================================================== the allocator
@dataclass(frozen=True, slots=True)
class PageAllocatorState:
    """Opaque result of ``backup_state()`` (tensor references; debug bitmaps are copies)."""

    owner: int
    free: FreeListSnapshot
    release: tuple[torch.Tensor, ...]
    num_release: int
    debug: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None


def unique_sorted(t: torch.Tensor) -> torch.Tensor:
    """``torch.unique(t)``: ascending, deduplicated (a data-dependent shape: syncs on GPUs)."""
    out: torch.Tensor = torch.unique(t)
    return out


def host_unique_pages(parts: list[torch.Tensor], shift: int, num_pages: int) -> torch.Tensor | None:
    """``torch.unique(torch.cat(parts) >> shift)`` of non-empty CPU int32/int64 slot tensors, in
    numpy, as int64, or ``None`` when a page falls outside ``[1, num_pages]`` (the caller's error
    path names the slots): one copy, an in-place shift and sort, an adjacent-difference mask.
    Same values, int64, at about a third of ``torch.unique``'s cost on a CPU. (A scatter into a
    page bitmap plus a scan measured no faster on the benchmark's trace.)"""
    assert _np is not None
    if len(parts) > 1:
        a = _np.concatenate([t.numpy() for t in parts])
        if shift:
            _np.right_shift(a, shift, out=a)
    else:
        a = _np.right_shift(parts[0].numpy(), shift)  # a new array (shift 0 included)
    a.sort()
    if a[0] < 1 or a[-1] > num_pages:
        return None
    n = a.shape[0]
    if n > 1:
        keep = _np.empty(n, dtype=_np.bool_)
        keep[0] = True
        _np.not_equal(a[1:], a[:-1], out=keep[1:])
        a = a[keep]
    if a.dtype != _np.int64:
        a = a.astype(_np.int64)
    return torch.from_numpy(a)


def host_sorted_ids(ids: torch.Tensor, limit: int) -> torch.Tensor | None:
    """``torch.sort(ids).values`` of a 1-D int64 CPU tensor of distinct ids in ``[0, limit]``,
    through a bitmap in numpy: one scatter and one scan of ``limit + 1`` flags, against a
    comparison sort (the ``need_sort`` merge of a page-size-1 pool of 2**18 slots: 0.8 ms
    against 6.5-7.7 ms). ``None`` when an id falls outside the range or two ids are equal (the
    caller sorts: a duplicate stays, as SGLang's sort keeps it)."""
    assert _np is not None
    a = ids.numpy()
    if not a.shape[0] or a.min() < 0 or a.max() > limit:
        return None
    flags = _np.zeros(limit + 1, dtype=_np.bool_)
    flags[a] = True
    out = _np.flatnonzero(flags)
    if out.shape[0] != a.shape[0]:
        return None
    return torch.from_numpy(out.astype(_np.int64, copy=False))


_INT64 = (torch.int64,)


class PageAllocatorCore(SchedulerMembers):
    """Page-granular free-list allocator; see :class:`PagedTokenToKVPoolAllocator`."""

    _FREE_TO_FRONT: ClassVar[bool] = True
    _SORT_FREES: ClassVar[bool] = True

    def __init__(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        device: str | torch.device,
        kvcache: KVCache | None,
        need_sort: bool = False,
        *,
        debug: bool = False,
    ) -> None:
        super().__init__(size, page_size, dtype, device, kvcache, need_sort)
        self.num_pages = size // page_size
        self._page_shift = page_size.bit_length() - 1  # slot >> shift == slot // page_size
        self._cpu = self.device.type == "cpu"  # CPU frees keep the caller's index dtype
        # kernel bodies by op name, picked on the first allocation that needs each (_bind)
        self._impls: dict[str, Callable[..., Any]] = {}
        self._decode_on_host = False  # the decode's torch body would run: numpy twin instead
        self._free = ChunkedFreeList(self.device, arena_size=self.num_pages)
        self._release: list[torch.Tensor] = []
        self._num_release = 0
        self._page_offsets = torch.arange(page_size, dtype=torch.int64, device=self.device)
        self._free_empty = torch.empty(0, dtype=torch.int64, device=self.device)
        self._debug: DebugTracker | None = (
            DebugTracker(type(self).__name__, self.num_pages, page_size)
            if debug_enabled(debug)
            else None
        )
        self.clear()

    # ------------------------------------------------------------------ queries
    @property
    def debug(self) -> bool:
        """Whether debug-mode ownership checks run (constructor flag or ``MEM_CACHE_DEBUG``)."""
        return self._debug is not None

    @property
    def capacity(self) -> int:
        """Tokens this allocator can hand out at most: ``(size // page_size) * page_size``."""
        return self.num_pages * self.page_size

    def available_size(self) -> int:
        return (len(self._free) + self._num_release) * self.page_size

    def free_page_count(self) -> int:
        """Pages on the free list plus staged pages (host-side)."""
        return len(self._free) + self._num_release

    @property
    def use_triton_kernels(self) -> bool:
        """Whether allocations run the Triton kernels (a GPU allocator under the ``auto`` or
        ``triton`` kernel backend); ``False`` for CPU allocators, which use the torch / host
        path."""
        if self.device.type != "cuda":
            return False
        return pick("alloc_extend", "auto", self._page_offsets) is not _torch_impl("alloc_extend")

    # ------------------------------------------------------------------ state
    def clear(self) -> None:
        self._free.clear()
        self._free.push_back(
            torch.arange(1, self.num_pages + 1, dtype=torch.int64, device=self.device)
        )
        self._release = []
        self._num_release = 0
        self._free_group = None
        if self._debug is not None:
            self._debug.reset()

    def backup_state(self) -> PageAllocatorState:
        return PageAllocatorState(
            owner=id(self),
            free=self._free.snapshot(),
            release=tuple(self._release),
            num_release=self._num_release,
            debug=None if self._debug is None else self._debug.snapshot(),
        )

    def restore_state(self, state: Any) -> None:
        if not isinstance(state, PageAllocatorState) or state.owner != id(self):
            raise ValueError(
                f"state must come from this allocator's backup_state(), got {type(state).__name__}"
            )
        self._free.restore(state.free)
        self._release = list(state.release)
        self._num_release = state.num_release
        if self._debug is not None and state.debug is not None:
            self._debug.restore(state.debug)

    def merge_and_sort_free(self) -> None:
        """SGLang's ``need_sort`` merge: the free list becomes ``sort(cat(free, staged frees))``
        and the staged frees are emptied. CPU ids covering at least 1/64 of the page range are
        sorted through a bitmap (:func:`host_sorted_ids`), others by ``torch.sort``; the same
        ids in the same order either way."""
        if not self._num_release:
            return
        ids = torch.cat([self._free.to_tensor(), *self._release])
        merged = None
        # a bitmap beats a comparison sort once the ids cover 1/64 of the page range
        if self._cpu and _np is not None and ids.shape[0] * 64 >= self.num_pages:
            merged = host_sorted_ids(ids, self.num_pages)
        if merged is None:
            merged = torch.sort(ids).values
        self._free.clear()
        self._free.push_back(merged)
        self._release = []
        self._num_release = 0

    def merge_for_decode(self, bs: int) -> None:
        """SGLang's ``alloc_decode`` merge trigger (``need_sort`` and ``bs > len(free)``); the
        paired allocators run it on both sides before their capacity pre-check."""
        check_int("bs", bs)
        if self.need_sort and bs > len(self._free):
            self.merge_and_sort_free()

    # ------------------------------------------------------------------ allocation
    def _pages_to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        if self.page_size == 1:
            return pages  # a view of an immutable free-list chunk (as in SGLang)
        return (pages[:, None] * self.page_size + self._page_offsets).reshape(-1)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if type(need_size) is not int or need_size < 0:  # the hot path skips the call
            check_int("need_size", need_size, minimum=0)  # raises (an int subclass passes)
        ps = self.page_size
        n = need_size
        if ps != 1:
            if need_size % ps:
                raise ValueError(
                    f"need_size must be a multiple of page_size={ps} (whole pages), got {need_size}"
                )
            n = need_size // ps
        if n > len(self._free):
            if self.need_sort:
                self.merge_and_sort_free()
            if n > len(self._free):
                return None
        if self._debug is None:  # the hot path: one take (page size 1: the slots themselves)
            pages = self._free.take(n)
            return pages if ps == 1 else self._pages_to_slots(pages)
        pages = self._free.head(n)
        out = self._pages_to_slots(pages)
        if self._debug is not None:
            self._debug_commit(pages, out)
        self._free.drop(n)
        return out

    def alloc_extend(  # noqa: PLR0917 - SGLang-compatible positional signature
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        num_new_pages: int | None = None,
    ) -> torch.Tensor | None:
        """Slots of an extend batch: request-major, positions ``prefix_lens[i] ..
        seq_lens[i] - 1`` (the module doc's layout), int64 on this device, or ``None``.

        Checks every argument once, on the host (:func:`check_extend_inputs`, which counts the
        new pages), then runs the trusted kernel body (``pick("alloc_extend", ...)``): nothing
        below re-checks or re-counts. Page size 1 hands out the free-list prefix (no kernel).
        """
        ps = self.page_size
        pages, tokens = check_extend_inputs(
            prefix_lens,
            prefix_lens_cpu,
            seq_lens,
            seq_lens_cpu,
            last_loc,
            extend_num_tokens,
            ps,
            num_new_pages=num_new_pages,
        )
        if ps > 1:
            self._check_operand_devices(_EXTEND_DEV, (prefix_lens, seq_lens, last_loc))
        if not self._reserve(pages, extend_num_tokens // ps + seq_lens_cpu.shape[0] + 1):
            return None
        if self._debug is not None:
            _debug.check_extend_inputs(
                ps, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc
            )
        head = self._free.head(pages)
        if ps == 1:
            out = head
        else:
            out = torch.empty(tokens, dtype=torch.int64, device=self.device)
            if tokens:
                impl = self._impls.get("alloc_extend") or self._bind("alloc_extend", out)
                impl(
                    prefix_lens,
                    seq_lens,
                    last_loc,
                    head,
                    out,
                    ps,
                    num_new_pages=pages,
                    num_tokens=tokens,
                )
        return self._hand_out(head, out, pages)

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        """One slot per request (``seq_lens`` count the new token): ``last_loc + 1``, or the
        first slot of the next free page for a request whose new token starts a page (request
        order). int64 ``[bs]`` on this device, or ``None``.

        Checks once on the host (:func:`check_decode_structure`, the page count of
        :mod:`mem_cache_kernels.pages`; ``last_loc`` of a GPU batch only in debug mode), then
        runs the trusted kernel body, or on CPU tensors under the torch backend its numpy twin
        :func:`host_decode` (its list twin :func:`host_decode_small` for a batch of at most
        ``SMALL_BATCH`` requests).
        """
        bs = check_decode_structure(seq_lens, seq_lens_cpu, last_loc)
        ps = self.page_size
        if ps > 1:
            self._check_operand_devices(_DECODE_DEV, (seq_lens, last_loc))
            if (
                0 < bs <= SMALL_BATCH
                and self._decode_on_host
                and last_loc.is_cpu
                and seq_lens.is_cpu
            ):
                lens = seq_lens_cpu.tolist()
                if min(lens) >= 1 and (seq_lens is seq_lens_cpu or seq_lens.tolist() == lens):
                    return self._decode_small(lens, seq_lens, seq_lens_cpu, last_loc)
        plan = decode_page_starts(seq_lens_cpu, ps)
        need = None
        if plan is None or (
            seq_lens is not seq_lens_cpu
            and seq_lens.is_cpu
            and _np.count_nonzero(seq_lens_cpu.numpy() != seq_lens.numpy())
        ):
            check_decode_inputs(seq_lens, seq_lens_cpu)  # raises naming the argument, or passes
            pages = decode_counts(seq_lens_cpu, ps, name="seq_lens_cpu")
        else:
            pages, need = plan
        if not self._reserve(pages, bs):
            return None
        if self._debug is not None:
            _debug.check_decode_inputs(ps, seq_lens, seq_lens_cpu, last_loc)
        head = self._free.head(pages)
        if ps == 1:
            out = head
        else:
            impl = self._impls.get("alloc_decode") or self._bind("alloc_decode", head)
            if need is not None and self._decode_on_host and last_loc.is_cpu and seq_lens.is_cpu:
                out = host_decode(last_loc, need, head, self._page_shift)
            else:
                out = torch.empty(bs, dtype=torch.int64, device=self.device)
                if bs:
                    impl(seq_lens, last_loc, head, out, ps, num_new_pages=pages)
        return self._hand_out(head, out, pages)

    def _decode_small(
        self,
        lens: list[int],
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
    ) -> torch.Tensor | None:
        """``alloc_decode`` of a small CPU batch whose lengths ``lens`` passed the checks:
        the plan and the slots on lists (:func:`host_decode_small`), then the same
        reservation, debug check and hand-out as the numpy path."""
        mask = self.page_size - 1
        need = [n & mask == 1 for n in lens]
        pages = need.count(True)
        if not self._reserve(pages, len(lens)):
            return None
        if self._debug is not None:
            _debug.check_decode_inputs(self.page_size, seq_lens, seq_lens_cpu, last_loc)
        head = self._free.head(pages)
        out = host_decode_small(last_loc, need, head, self._page_shift)
        return self._hand_out(head, out, pages)

    # the steps alloc_extend and alloc_decode share (between them: the debug-mode input check
    # and the kernel)
    def _check_operand_devices(
        self, names: tuple[str, ...], tensors: tuple[torch.Tensor, ...]
    ) -> None:
        """The kernel's operands share the allocator's device (``ValueError`` naming the one
        that does not); CPU operands of a CPU allocator are recognised without building devices."""
        dev = self.device
        if all(t.is_cpu for t in tensors) if self._cpu else all(t.device == dev for t in tensors):
            return
        check_same_device(dev, **dict(zip(names, tensors, strict=True)))

    def _reserve(self, pages: int, merge_when: int) -> bool:
        """Whether ``pages`` pages are free, after SGLang's ``need_sort`` trigger (merge the staged
        pages first when ``merge_when`` exceeds the free list)."""
        if self.need_sort and merge_when > len(self._free):
            self.merge_and_sort_free()
        return pages <= len(self._free)

    def _hand_out(self, head: torch.Tensor, out: torch.Tensor, pages: int) -> torch.Tensor:
        """Take the ``pages`` pages ``head`` (the free list's prefix) that ``out`` was built from:
        debug-mode ownership first (nothing changes if it raises), then the free list."""
        if self._debug is not None:
            self._debug_commit(head, out)
        self._free.drop(pages)
        return out

    def _bind(self, op: str, operand: torch.Tensor) -> Callable[..., Any]:
        """The trusted kernel body of ``op`` for this allocator's device, picked once
        (``pick(op, "auto", operand)``: the kernels' backend setting is read on the allocator's
        first allocation that runs a kernel, then kept for its lifetime)."""
        impl = self._impls[op] = pick(op, "auto", operand)
        if op == "alloc_decode":
            self._decode_on_host = _np is not None and impl is _torch_impl(op)
        return impl

    # ------------------------------------------------------------------ free
    def free(self, free_index: torch.Tensor) -> None:
        """Release every page any slot of ``free_index`` touches (SGLang 0.5.23's ``free``).

        Any slot set: any order, int32 or int64, partial pages, several requests concatenated,
        duplicates. Paged: the pages ``unique(free_index // page_size)`` go, ascending, in front
        of the free list (``need_sort``: staged). Token allocator (page size 1): the slots are
        appended in the given order, no dedup (as SGLang). Inside a free group the call is
        queued and the group's pages are deduplicated at :meth:`free_group_end`.

        Cost: ``torch.unique`` has a data-dependent output shape, so a paged ``free`` outside a
        group makes one device->host sync (one per group inside a group). The sync-free release
        is :meth:`free_segment` / :meth:`free_segments` (the caller states the positions).

        Errors (before any state change): ``TypeError``/``ValueError`` for a non-tensor or a
        non-integer / non-1-D tensor; on CPU tensors ``ValueError`` for a slot of the padding
        page 0 or out of range; ``ValueError`` when the free would push ``available_size()``
        above capacity (a double free the host-side count can see); debug mode checks ownership.
        """
        group = self._free_group
        t = free_index
        if (
            self._cpu
            and isinstance(t, torch.Tensor)
            and t.dim() == 1
            and t.dtype in INDEX_DTYPES
            and t.is_cpu
        ):  # CPU slots of either index dtype; the range is checked once: on the deduplicated
            # pages (paged), in the token free's one pass, or at the group's end
            if not t.shape[0]:
                return
            if group is not None:  # the group owns a copy (the caller may reuse t), int64:
                # one op either way, and the group's end then concatenates one dtype
                group.append((t.clone() if t.dtype is torch.int64 else t.to(torch.int64), _SLOTS))
                return
            if not self._SORT_FREES:
                self._check_cpu_range("free_index", t, page_ids=False)
            self.commit_free(self.prepare_free(t, free_index))
            return
        # other devices: int64 on this device (range checks as above, on CPU inputs only)
        idx = self._index_input(
            "free_index",
            free_index,
            page_ids=False,
            check_range=group is None and not self._SORT_FREES,
        )
        if idx is None:
            return
        if group is not None:
            group.append((idx.clone() if idx is free_index else idx, _SLOTS))
            return
        self.commit_free(self.prepare_free(idx, free_index))

    def prepare_free(self, idx: torch.Tensor, caller: object = None) -> torch.Tensor:
        """The pages ``free`` would release for validated slots ``idx`` (int64, this device),
        checked (range on CPU, capacity count, debug ownership) but not released:
        :meth:`commit_free` does. Composites validate both sides before changing either."""
        self._check_validated("idx", idx, any_index_dtype=self._cpu)
        if not self._SORT_FREES:
            if idx.dtype is not torch.int64:
                pages = idx.to(torch.int64)  # a new tensor, owned
            else:
                pages = idx.clone() if idx is caller else idx
            if self._debug is not None:
                self._debug.check_free_slots(idx, pages, aligned=False)
            self._check_count(pages.shape[0])
            return pages
        uniq = self._unique_pages([idx])
        if self._debug is not None:
            self._debug.check_free_slots(idx, uniq, aligned=False, dedup=True)
        self._check_count(uniq.shape[0])
        return uniq

    def commit_free(self, pages: torch.Tensor) -> None:
        """Release ``pages`` from :meth:`prepare_free` (only a type check: a 1-D int64 tensor on
        this device, else ``TypeError``/``ValueError`` before any change)."""
        self._check_validated("pages", pages)
        if self._debug is not None:
            self._debug.on_free_pages(pages)
        self._push(pages)

    def check_free_input(self, name: str, t: object) -> torch.Tensor | None:
        """Validate a slot tensor as ``free`` does; int64 on this device, ``None`` if empty.
        ``name`` (a str) is the caller's argument name used in the error messages."""
        if not isinstance(name, str):
            raise TypeError(f"name must be a str (the argument name), got {type(name).__name__}")
        return self._free_input(name, t)

    # ------------------------------------------------------------------ free helpers
    def _check_validated(self, name: str, t: object, *, any_index_dtype: bool = False) -> None:
        """Host-only type check of an already validated index tensor (int64, 1-D, this device:
        what :meth:`check_free_input` returns; int32 too with ``any_index_dtype``)."""
        if not (
            isinstance(t, torch.Tensor)
            and (t.dtype is torch.int64 or (any_index_dtype and t.dtype in INDEX_DTYPES))
            and t.dim() == 1
            and t.device == self.device
        ):  # the fast path above; the generic check names what is wrong
            dtypes = INDEX_DTYPES if any_index_dtype else _INT64
            check_index(name, t, dtypes=dtypes, device=self.device, allow_meta=True)

    def _free_input(self, name: str, t: object) -> torch.Tensor | None:
        """``t`` as int64 on the allocator's device (``None`` when empty), validated."""
        return self._index_input(name, t, page_ids=False)

    def _unique_pages(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """``unique(cat(parts) // page_size)`` of validated, non-empty slot tensors: int64,
        ascending; range-checked on CPU (``ValueError`` naming ``free_index``). CPU: one numpy
        pass (:func:`host_unique_pages`); else ``torch.unique`` (a device sync)."""
        cpu = parts[0].device.type == "cpu"
        host = (
            host_unique_pages(parts, self._page_shift, self.num_pages)
            if cpu and _np is not None  # one numpy pass: range check, sort, mask
            else None
        )
        if host is not None:
            return host
        slots = torch.cat(parts) if len(parts) > 1 else parts[0]
        uniq = unique_sorted(slots >> self._page_shift if self.page_size > 1 else slots)
        if cpu:
            self._check_sorted_pages("free_index", uniq, slots)
        return uniq if uniq.dtype is torch.int64 else uniq.to(torch.int64)

    def _check_sorted_pages(self, name: str, pages: torch.Tensor, slots: torch.Tensor) -> None:
        """Range of ascending CPU page ids ``pages`` derived from ``slots`` (two reads)."""
        lo, hi = int(pages[0]), int(pages[-1])
        if lo >= 1 and hi <= self.num_pages:
            return
        if lo < 0 or hi > self.num_pages:
            limit = (self.num_pages + 1) * self.page_size
            bad = slots[(slots < 0) | (slots >= limit)]
            raise ValueError(
                f"{name} has out-of-range slots {describe(bad)} (valid: [{self.page_size}, "
                f"{limit}))"
            )
        bad = slots[slots < self.page_size]
        raise ValueError(
            f"{name}: free of the padding page 0: {describe(bad)} (page 0 is never handed out)"
        )

    def _index_input(
        self, name: str, t: object, *, page_ids: bool, check_range: bool = True
    ) -> torch.Tensor | None:
        # the structural check: a fast path, else the generic check, which raises naming what
        # is wrong (meta tensors pass it; they are refused below unless the allocator is on meta)
        if isinstance(t, torch.Tensor) and t.dim() == 1 and t.dtype in INDEX_DTYPES:
            idx = t
        else:
            idx = check_index(name, t, allow_meta=True)
        if idx.shape[0] == 0:
            return None
        if check_range and idx.device.type == "cpu":
            self._check_cpu_range(name, idx, page_ids=page_ids)
        if idx.dtype is torch.int64 and idx.device == self.device:
            return idx
        if idx.is_meta:
            raise ValueError(f"{name} must hold data (on {self.device}), got a meta tensor")
        return idx.to(device=self.device, dtype=torch.int64)

    def _check_cpu_range(self, name: str, t: torch.Tensor, *, page_ids: bool) -> None:
        """Host-side checks on CPU inputs (no device sync): padding page 0 and out-of-range."""
        lo, hi = host_bounds(t)
        unit = 1 if page_ids else self.page_size
        limit = (self.num_pages + 1) * unit
        if lo < 0 or hi >= limit:
            bad = t[(t < 0) | (t >= limit)]
            what = "page ids" if page_ids else "slots"
            raise ValueError(
                f"{name} has out-of-range {what} {describe(bad)} (valid: [{unit}, {limit}))"
            )
        if lo < unit:
            bad = t[t < unit]
            raise ValueError(
                f"{name}: free of the padding page 0: {describe(bad)} (page 0 is never handed out)"
            )

    def _check_count(self, n: int, queued: int = 0) -> None:
        """A free of ``n`` pages must not push the free count above capacity (double free)."""
        have = len(self._free) + self._num_release + queued
        if have + n > self.num_pages:
            raise ValueError(
                f"{type(self).__name__}: double free: releasing {n} pages with {have} of "
                f"{self.num_pages} already free would exceed capacity (available_size() "
                f"{(have + n) * self.page_size} > {self.capacity})"
            )

    def _push(self, pages: torch.Tensor) -> None:
        if self.need_sort:
            self._release.append(pages)
            self._num_release += pages.shape[0]
        elif self._FREE_TO_FRONT:
            self._free.push_front(pages)
        else:
            self._free.push_back(pages)

    # ------------------------------------------------------------------ debug helpers
    def _debug_commit(self, pages: torch.Tensor, slots: torch.Tensor) -> None:
        assert self._debug is not None
        snap = self._debug.snapshot()
        try:
            self._debug.on_take_pages(pages)
            self._debug.on_hand_out(slots)
        except BaseException:
            self._debug.restore(snap)
            raise
