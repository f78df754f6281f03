"""Device-side helpers shared by the two HiSparse allocators (private).

* :func:`lookup` -- a checked ``mapping[indices]`` (out-of-range indices raise ``ValueError``
  naming the caller's argument instead of torch's ``IndexError``).
* :func:`plan_device_extend` -- the device allocator's arguments for an ``alloc_extend`` whose
  requests may continue a prefix whose last token has no device slot (a logical-only decode
  token). SGLang passes the unmapped ``last_loc`` (0) through and the kernel fills slots
  ``1, 2, ...`` of the padding page; here such a request gets a fresh device page instead (same
  in-page offsets, the unused head of the page stays with the request).
* :func:`surplus_pages` / :func:`pad_slots` -- the page arithmetic of ``alloc_device_buffer``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mem_cache_kernels.checks import check_index, check_index_values
from mem_cache_kernels.pages import extend_counts

__all__ = [
    "DevicePlan",
    "check_slots",
    "lookup",
    "pad_slots",
    "plan_device_extend",
    "surplus_pages",
]


def check_slots(indices: torch.Tensor, name: str, upper: int, *, check: bool) -> None:
    """``indices`` must be an int32/int64 tensor (any shape) of slots in ``[-1, upper)`` (-1:
    "no slot", reads the mapping's trailing sentinel).

    The type checks always run; the range check runs when ``check`` (debug mode) or when
    ``indices`` is on the CPU (no device sync needed); otherwise an out-of-range index is left to
    torch. ``TypeError`` / ``ValueError`` name ``name`` (and the offending range).
    """
    flat = indices.reshape(-1) if isinstance(indices, torch.Tensor) else indices
    check_index(name, flat)
    check_index_values(name, flat, limit=upper, minimum=-1, full=check)


def lookup(mapping: torch.Tensor, indices: torch.Tensor, name: str, *, check: bool) -> torch.Tensor:
    """``mapping[indices]`` after :func:`check_slots` (``-1`` reads the trailing sentinel)."""
    check_slots(indices, name, mapping.shape[0] - 1, check=check)
    return mapping[indices]


def mapped_pages(
    mapping: torch.Tensor, keys: torch.Tensor, page_size: int, name: str, *, check: bool
) -> torch.Tensor:
    """The device pages ``mapping[keys]`` points into (sorted, unique; ``torch.unique`` syncs).

    With ``check`` (debug mode), ``ValueError`` if another key still maps into one of them
    (releasing the page would hand that key's slot out again); nothing is changed.
    """
    dev = lookup(mapping, keys, name, check=check)
    dev = dev[dev > 0]
    pages: torch.Tensor = torch.unique(dev // page_size)
    if check and pages.numel():
        rest = mapping[:-1].clone()
        rest[keys] = 0
        still = torch.nonzero((rest > 0) & torch.isin(rest // page_size, pages))
        if still.numel():
            raise ValueError(
                f"{name}: freeing device page(s) {pages.tolist()[:8]} that slots "
                f"{still.reshape(-1).tolist()[:8]} still map into"
            )
    return pages


@dataclass(frozen=True, slots=True)
class DevicePlan:
    """Arguments of the device allocator's ``alloc_extend`` and how to read its output."""

    prefix_lens: torch.Tensor  # on the device of the caller's prefix_lens
    prefix_lens_cpu: torch.Tensor
    last_loc: torch.Tensor
    pages: int
    tokens: int
    keep: torch.Tensor | None  # rows of the device output that belong to the caller's tokens


def plan_device_extend(
    prefix_lens: torch.Tensor,
    prefix_cpu: torch.Tensor,
    seq_cpu: torch.Tensor,
    dev_last: torch.Tensor,
    page_size: int,
) -> DevicePlan:
    """The device ``alloc_extend`` for device lengths ``prefix_cpu``/``seq_cpu``.

    ``dev_last`` is the device slot of each request's last prefix token (0 = unmapped). A
    request that continues a partial page (``prefix % page_size != 0``) with new device tokens
    while ``dev_last <= 0`` is *orphaned*: it is allocated from the page start
    ``prefix - prefix % page_size`` (a fresh page, same in-page offsets) and the output rows of
    the positions before ``prefix`` are dropped (``keep``). Reading ``dev_last`` costs one
    device->host sync, only when some request continues a partial page.
    """
    pre = prefix_cpu.to(torch.int64)
    seq = seq_cpu.to(torch.int64)
    pages, tokens = extend_counts(pre, seq, page_size)
    # the kernel reads last_loc only to continue a partial page with new tokens; elsewhere it
    # may be unmapped (0): pass the congruent placeholder (sync-free: a host->device copy)
    pre_dev = prefix_lens.to(device=dev_last.device, dtype=torch.int64)
    placeholder_dev = torch.where(pre_dev == 0, -1, (pre_dev - 1) % page_size)
    unread = pre_dev % page_size == 0
    if bool((seq == pre).any()):
        unread = unread | (seq == pre).to(dev_last.device, non_blocking=True)
    dev_last = torch.where(unread, placeholder_dev.to(dev_last.dtype), dev_last)
    same = DevicePlan(prefix_lens, prefix_cpu, dev_last, pages, tokens, None)
    mid = (pre % page_size != 0) & (seq > pre)  # continues a partial page with new tokens
    if page_size == 1 or not bool(mid.any()):
        return same
    last_host = dev_last.detach().to("cpu", torch.int64)
    orphan = mid & (last_host <= 0)
    if not bool(orphan.any()):
        return same
    new_pre = torch.where(orphan, pre - pre % page_size, pre)
    placeholder = torch.where(new_pre == 0, -1, page_size - 1)  # congruent, never read
    new_last = torch.where(orphan, placeholder, last_host)
    new_pages, new_tokens = extend_counts(new_pre, seq, page_size)
    lens = seq - new_pre
    starts = torch.cumsum(lens, 0) - lens
    skip = pre - new_pre
    keep = torch.cat(
        [torch.arange(int(s + k), int(s + n)) for s, k, n in zip(starts, skip, lens, strict=True)]
    )
    device = dev_last.device
    return DevicePlan(
        new_pre.to(device=prefix_lens.device, dtype=prefix_lens.dtype),
        new_pre.to(prefix_cpu.dtype),
        new_last.to(device=device, dtype=dev_last.dtype),
        new_pages,
        new_tokens,
        keep.to(device),
    )


def surplus_pages(buffer: torch.Tensor, surplus: torch.Tensor, page_size: int) -> torch.Tensor:
    """Pages of the ``surplus`` slots that hold no ``buffer`` slot (sorted; syncs).

    SGLang's HiSparse allocator frees every page of the surplus slots, including a page the
    buffer keeps a slot of (that slot is then handed out twice); the DeepSeek-V4 one frees only
    these pages.
    """
    buffer_pages: torch.Tensor = torch.unique(buffer // page_size)
    pages: torch.Tensor = torch.unique(surplus // page_size)
    return pages[~torch.isin(pages, buffer_pages)]


def pad_slots(last: int, count: int, page_size: int, device: torch.device) -> torch.Tensor:
    """Up to ``count`` slots after ``last`` that stay inside ``last``'s page.

    SGLang pads ``arange(last + 1, last + 1 + count)`` unconditionally; when ``last`` is not at
    in-page offset ``page_size - 1 - count`` that runs into a page the request does not own (or,
    after the DeepSeek-V4 swap, repeats a slot already in the buffer).
    """
    room = page_size - 1 - last % page_size
    n = min(count, room)
    return torch.arange(last + 1, last + 1 + n, dtype=torch.int64, device=device)
