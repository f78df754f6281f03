"""The argument checks of the page allocators' ``alloc_extend`` and ``alloc_decode``: structure
(kinds, dtypes, lengths, devices), the host-side lengths and the requested token count, each
raising ``TypeError`` / ``ValueError`` naming the argument before any state changes.

Shared by :class:`mem_cache_allocator.page_allocator.PageAllocatorCore` and the package's
composite allocators (SWA, HiSparse), which check once at their own public method and then call
the core's trusted body.
"""

from __future__ import annotations

import torch

from mem_cache_allocator.base import check_cpu_lengths
from mem_cache_kernels.checks import INDEX_DTYPES, SMALL_BATCH, check_index, check_int, describe
from mem_cache_kernels.pages import extend_counts

__all__ = [
    "CPU_LENGTH_NAMES",
    "check_batch",
    "check_decode_inputs",
    "check_decode_structure",
    "check_extend_device_inputs",
    "check_extend_inputs",
    "check_extend_num_tokens",
    "lengths_ok",
]

CPU_LENGTH_NAMES = ("prefix_lens_cpu", "seq_lens_cpu")
"""The argument names the page count of an extend reports (the host copies of the lengths)."""


def lengths_ok(bs: int, cpus: tuple[object, ...], tensors: tuple[object, ...]) -> bool:
    """Fast path of the structural checks (all fine): ``cpus`` 1-D CPU int32/int64 tensors of
    ``bs`` entries, ``tensors`` 1-D int32/int64 tensors of ``bs`` entries. ``False``: run the
    detailed checks (:func:`check_cpu_lengths`, :func:`mem_cache_kernels.checks.check_index`),
    which raise naming the argument."""
    for cpu in cpus:
        if not (
            isinstance(cpu, torch.Tensor)
            and cpu.dtype in INDEX_DTYPES
            and cpu.dim() == 1
            and cpu.shape[0] == bs
            and cpu.is_cpu
        ):
            return False
    for t in tensors:
        if not (isinstance(t, torch.Tensor) and t.dtype in INDEX_DTYPES and t.dim() == 1):
            return False
        if t.shape[0] != bs:
            return False
    return True


_DECODE_CPU = ("seq_lens_cpu",)
_DECODE_DEV = ("seq_lens", "last_loc")
_EXTEND_CPU = ("seq_lens_cpu", "prefix_lens_cpu")
_EXTEND_DEV = ("prefix_lens", "seq_lens", "last_loc")


def check_batch(
    cpu_names: tuple[str, ...],
    cpus: tuple[torch.Tensor, ...],
    names: tuple[str, ...],
    tensors: tuple[torch.Tensor, ...],
    *,
    allow_meta: bool = True,
) -> int:
    """The batch size of an ``alloc_extend`` / ``alloc_decode`` call (the structural checks both
    share): ``cpus`` 1-D CPU integer tensors of one length ``bs`` (the first sets it),
    ``tensors`` 1-D int32/int64 tensors of ``bs`` entries (on the meta device only with
    ``allow_meta``: the sync-free tests run allocators there). :func:`lengths_ok` inline on good
    arguments; else the detailed checks raise ``TypeError`` / ``ValueError`` naming the
    argument (``cpu_names`` / ``names``, in order)."""
    first = cpus[0]
    bs = first.shape[0] if isinstance(first, torch.Tensor) and first.dim() == 1 else -1
    if lengths_ok(bs, cpus, tensors) and (allow_meta or not any(t.is_meta for t in tensors)):
        return bs
    bs = check_cpu_lengths(cpu_names[0], first)
    for name, cpu in zip(cpu_names[1:], cpus[1:], strict=True):
        check_cpu_lengths(name, cpu, bs)
    for name, t in zip(names, tensors, strict=True):
        check_index(name, t, length=bs, allow_meta=allow_meta)
    return bs


def check_decode_structure(
    seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
) -> int:
    """The batch size of an ``alloc_decode`` call (:func:`check_batch`: ``seq_lens_cpu`` a 1-D
    CPU integer tensor, ``seq_lens`` / ``last_loc`` 1-D int32/int64 tensors of as many
    entries, meta allowed)."""
    return check_batch(_DECODE_CPU, (seq_lens_cpu,), _DECODE_DEV, (seq_lens, last_loc))


def check_extend_num_tokens(tokens: int, extend_num_tokens: object) -> None:
    """``extend_num_tokens`` is an int equal to ``sum(seq_lens_cpu - prefix_lens_cpu)``
    (``tokens``)."""
    if type(extend_num_tokens) is not int:  # the hot path skips the call
        check_int("extend_num_tokens", extend_num_tokens)  # raises (an int subclass passes)
    if tokens != extend_num_tokens:
        raise ValueError(
            f"extend_num_tokens must equal sum(seq_lens_cpu - prefix_lens_cpu) = {tokens}, "
            f"got {extend_num_tokens}"
        )


def check_extend_inputs(  # noqa: PLR0917 - mirrors alloc_extend
    prefix_lens: torch.Tensor,
    prefix_lens_cpu: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    last_loc: torch.Tensor,
    extend_num_tokens: int,
    page_size: int,
    *,
    allow_meta: bool = True,
    num_new_pages: int | None = None,
) -> tuple[int, int]:
    """Every host-side check of an ``alloc_extend`` call, in this order; ``(new pages, new
    tokens)``.

    1. ``seq_lens_cpu`` / ``prefix_lens_cpu``: 1-D CPU integer tensors of one length ``bs``;
       ``prefix_lens`` / ``seq_lens`` / ``last_loc``: 1-D int32/int64 tensors of ``bs`` entries
       (on the meta device only with ``allow_meta``);
    2. ``0 <= prefix_lens_cpu <= seq_lens_cpu`` (:func:`mem_cache_kernels.pages.extend_counts`,
       which also counts the new pages and tokens);
    3. ``extend_num_tokens`` an int equal to the new tokens; ``num_new_pages`` (when given)
       equal to the new pages;
    4. :func:`check_extend_device_inputs` (CPU "device" tensors against their host copies).

    ``TypeError`` / ``ValueError`` naming the argument; reads no device memory.
    """
    check_batch(
        _EXTEND_CPU,
        (seq_lens_cpu, prefix_lens_cpu),
        _EXTEND_DEV,
        (prefix_lens, seq_lens, last_loc),
        allow_meta=allow_meta,
    )
    pages, tokens = extend_counts(prefix_lens_cpu, seq_lens_cpu, page_size, names=CPU_LENGTH_NAMES)
    check_extend_num_tokens(tokens, extend_num_tokens)
    if num_new_pages is not None and num_new_pages != pages:
        raise ValueError(f"num_new_pages must be {pages} for these lengths, got {num_new_pages}")
    check_extend_device_inputs(
        prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, page_size
    )
    return pages, tokens


def _same(name: str, t: torch.Tensor, cpu_name: str, cpu: torch.Tensor) -> None:
    if t is cpu:
        return
    a = t if t.dtype is torch.int64 else t.to(torch.int64)
    b = cpu if cpu.dtype is torch.int64 else cpu.to(torch.int64)
    if not torch.equal(a, b):
        bad = torch.nonzero(a != b).reshape(-1)
        raise ValueError(
            f"{name} must equal {cpu_name}; requests {describe(bad)} have {name}="
            f"{describe(a[bad])}, {cpu_name}={describe(b[bad])}"
        )


def _device_inputs_ok(  # noqa: PLR0917 - mirrors alloc_extend
    prefix_lens: torch.Tensor,
    prefix_lens_cpu: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    last_loc: torch.Tensor,
    page_size: int,
) -> bool:
    """Small batches: every check of :func:`check_extend_device_inputs` on Python lists (a few
    ints beat a chain of small tensor ops); ``False`` when one fails (the caller raises)."""
    pre: list[int] = prefix_lens_cpu.tolist()
    if prefix_lens is not prefix_lens_cpu and prefix_lens.is_cpu and prefix_lens.tolist() != pre:
        return False
    if (
        seq_lens is not seq_lens_cpu
        and seq_lens.is_cpu
        and seq_lens.tolist() != seq_lens_cpu.tolist()
    ):
        return False
    if not last_loc.is_cpu:
        return True
    m = page_size - 1
    for x, p in zip(last_loc.tolist(), pre, strict=True):  # a plain loop: no generator frames
        if (x != -1) if p == 0 else (x < 0 or (x + 1) & m != p & m):
            return False
    return True


def check_extend_device_inputs(  # noqa: PLR0917 - mirrors alloc_extend
    prefix_lens: torch.Tensor,
    prefix_lens_cpu: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    last_loc: torch.Tensor,
    page_size: int,
) -> None:
    """CPU "device" tensors: equal to their ``*_cpu`` copies, and ``last_loc`` consistent with
    ``prefix_lens`` (-1 exactly for an empty prefix, ``(last_loc + 1) % ps == prefix % ps``)."""
    if not (prefix_lens.is_cpu or seq_lens.is_cpu or last_loc.is_cpu):
        return
    if seq_lens_cpu.shape[0] <= SMALL_BATCH and _device_inputs_ok(
        prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, page_size
    ):
        return
    if prefix_lens.is_cpu:
        _same("prefix_lens", prefix_lens, "prefix_lens_cpu", prefix_lens_cpu)
    if seq_lens.is_cpu:
        _same("seq_lens", seq_lens, "seq_lens_cpu", seq_lens_cpu)
    if not last_loc.is_cpu:
        return
    m = page_size - 1
    last64, pre64 = last_loc.to(torch.int64), prefix_lens_cpu.to(torch.int64)
    bad_mask = torch.where(
        pre64 == 0, last64 != -1, (last64 < 0) | (((last64 + 1) & m) != (pre64 & m))
    )
    bad = torch.nonzero(bad_mask).reshape(-1)
    if bad.numel():
        raise ValueError(
            f"misaligned alloc_extend inputs: last_loc must be -1 for an empty prefix and "
            f"the slot of position prefix_lens - 1 otherwise "
            f"((last_loc + 1) % {page_size} == prefix_lens % {page_size}); requests "
            f"{describe(bad)} have last_loc={describe(last64[bad])}, "
            f"prefix_lens={describe(pre64[bad])}"
        )


def check_decode_inputs(seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor) -> None:
    """``seq_lens_cpu >= 1`` (a decode includes its new token: 0 would hand out slot 0) and, for
    a CPU ``seq_lens``, ``seq_lens == seq_lens_cpu``. (``last_loc`` of a decode batch is checked
    by debug mode: on every step, a vectorised check costs more than the allocation itself.)"""
    if seq_lens_cpu.shape[0] and int(seq_lens_cpu.min()) < 1:
        s64 = seq_lens_cpu.to(torch.int64)
        bad = torch.nonzero(s64 < 1).reshape(-1)
        raise ValueError(
            f"seq_lens_cpu must be >= 1 (they include the new token); requests {describe(bad)} "
            f"have seq_lens_cpu={describe(s64[bad])}"
        )
    if seq_lens.device.type == "cpu":
        _same("seq_lens", seq_lens, "seq_lens_cpu", seq_lens_cpu)
