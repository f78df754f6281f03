"""Compressed-slot arithmetic of the DeepSeek-V4 HiSparse allocator (private; host-side index
math and sync-free device expressions)."""

from __future__ import annotations

import torch

__all__ = ["device_last_loc", "entry_offsets"]


def entry_offsets(prefix_cpu: torch.Tensor, seq_cpu: torch.Tensor, ratio: int) -> torch.Tensor:
    """Indices into an ``alloc_extend`` output of the tokens that complete a compressed entry.

    Request ``i`` owns output rows ``[o_i, o_i + seq_i - prefix_i)`` for positions
    ``prefix_i..seq_i-1``; entry ``e`` completes at position ``ratio * e + ratio - 1``. Host-side
    (CPU int64), request-major and ascending, so it lines up with the device allocator's output.
    Example (ratio 4): prefixes ``[2, 0]``, seqs ``[9, 4]`` -> ``[1, 5, 10]``.
    """
    pre, seq = prefix_cpu.to(torch.int64), seq_cpu.to(torch.int64)
    counts = seq // ratio - pre // ratio
    starts = torch.cumsum(seq - pre, 0) - (seq - pre)
    total = int(counts.sum())
    first_entry = torch.repeat_interleave(pre // ratio, counts)
    rank = torch.arange(total) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    base = torch.repeat_interleave(starts - pre, counts)
    return base + ratio * (first_entry + rank) + (ratio - 1)


def device_last_loc(
    prefix_lens: torch.Tensor, mapped_last: torch.Tensor, c_page: int, ratio: int
) -> torch.Tensor:
    """The device (compressed) allocator's ``last_loc`` per request (sync-free).

    ``mapped_last`` is ``mapping[(L - ratio + 1) // ratio]`` for the full ``last_loc`` ``L``.

    * empty compressed prefix (``prefix < ratio``): -1;
    * compressed prefix ending inside a device page: ``mapped_last``; the prefix's last entry then
      shares ``L``'s logical page (``L``'s offset is ``>= ratio - 1``), so this is its slot;
    * compressed prefix ending on a device page boundary: the device allocator does not read
      ``last_loc`` (no partial page to continue) and ``(L - ratio + 1) // ratio`` may name another
      page's entry, so the congruent placeholder ``c_page - 1`` is passed.
    """
    c_prefix = prefix_lens.to(torch.int64) // ratio
    aligned = torch.full_like(mapped_last, c_page - 1)
    dev_last = torch.where(c_prefix % c_page == 0, aligned, mapped_last)
    return torch.where(c_prefix == 0, torch.full_like(mapped_last, -1), dev_last)
