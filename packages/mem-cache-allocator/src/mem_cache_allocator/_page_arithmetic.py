"""Host-side page arithmetic on the ``*_cpu`` length tensors (never touches device memory).

Page counts are exact for every power-of-two page size, including 1 (SGLang's decode formula
``sum(seq % ps == 1)`` is wrong for ``ps == 1``, where every decode token needs a new page).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from mem_cache_kernels.checks import check_index, check_int

try:  # optional: reductions on a CPU tensor's buffer cost ~1 us in numpy, a few us in torch
    import numpy as _np
except ImportError:  # pragma: no cover - numpy ships with every torch wheel we test
    _np = None  # type: ignore[assignment]

__all__ = [
    "decode_page_count",
    "check_cpu_lengths",
    "check_index_tensor",
    "check_segments_iterable",
    "check_start_pos",
    "trim_segments",
]


_INT_DTYPES = (
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
)


def check_cpu_lengths(name: str, t: torch.Tensor, bs: int | None = None) -> int:
    """Validate a 1-D CPU integer length tensor (``bs`` entries when given); return its length.

    The allocator-specific part is the device: the page counts are host-side, so the tensor must
    be a CPU tensor (``ValueError``); the rest is :func:`mem_cache_kernels.checks.check_index`.
    """
    if isinstance(t, torch.Tensor) and t.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU tensor (host-side page count), got {t.device}")
    check_index(name, t, dtypes=_INT_DTYPES, length=bs)
    return int(t.shape[0])


def decode_page_count(
    seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, page_size: int
) -> tuple[int, Any] | None:
    """Fast path of a decode batch's host checks and page count, or ``None`` (run the detailed
    checks: :func:`mem_cache_allocator._host_checks.check_decode_inputs`, which raise).

    One numpy pass over ``seq_lens_cpu``: ``min >= 1``, when ``seq_lens`` is a CPU tensor too
    ``seq_lens == seq_lens_cpu``, and the requests whose new token starts a page (``seq & (ps -
    1) == 1``; every request for page size 1). Returns ``(count, mask)``: the mask a numpy bool
    array (``None`` for page size 1). Reads no device memory.
    """
    bs = seq_lens_cpu.shape[0]
    if _np is None or not bs:
        return None
    a = seq_lens_cpu.numpy()
    if _np.minimum.reduce(a) < 1:
        return None
    if (
        seq_lens is not seq_lens_cpu
        and seq_lens.device.type == "cpu"
        and _np.count_nonzero(a != seq_lens.numpy())
    ):
        return None
    if page_size == 1:
        return int(bs), None
    need = (a & (page_size - 1)) == 1
    return int(_np.count_nonzero(need)), need


def check_start_pos(start_pos: object, name: str = "start_pos") -> int:
    """``start_pos`` as a non-negative int (``TypeError`` for a non-int, ``bool`` included;
    ``ValueError`` below 0)."""
    return check_int(name, start_pos, minimum=0)


def check_index_tensor(name: str, t: object, device: torch.device) -> None:
    """``TypeError``/``ValueError`` naming ``name`` unless ``t`` is an int32/int64 tensor (any
    shape) with data (not on the meta device, unless the allocator's ``device`` is meta: the
    sync-free tests run allocators there). Host-only: reads no tensor data."""
    flat = t.reshape(-1) if isinstance(t, torch.Tensor) and t.dim() != 1 else t
    check_index(name, flat, allow_meta=device.type == "meta")


def check_segments_iterable(segments: object) -> None:
    """``TypeError`` naming ``segments`` unless it is an iterable (not a tensor) of pairs."""
    if not isinstance(segments, (list, tuple)) and (
        isinstance(segments, torch.Tensor) or not isinstance(segments, Iterable)
    ):
        raise TypeError(
            f"segments must be an iterable of (free_index, start_pos) pairs, "
            f"got {type(segments).__name__}"
        )


def trim_segments(
    segments: Iterable[tuple[torch.Tensor, int]], page_size: int
) -> Iterator[tuple[torch.Tensor, int]]:
    """``(free_index, start_pos)`` segments of one request with shared boundary pages trimmed.

    Segments must be ascending and non-overlapping in positions (``ValueError`` otherwise). A
    segment that starts in the page where the previous one ended loses its slots in that page
    (the previous segment releases it); a segment entirely inside that page yields nothing.
    All arithmetic is on host-known positions and lengths: no device data is read.
    """
    prev_end: int | None = None
    check_segments_iterable(segments)
    for k, seg in enumerate(segments):
        if not isinstance(seg, (tuple, list)) or len(seg) != 2:
            raise TypeError(f"segments[{k}] must be a (free_index, start_pos) pair, got {seg!r}")
        free_index, start_pos = seg
        check_start_pos(start_pos, f"segments[{k}] start_pos")
        # meta tensors: refused by the allocator's free path unless it runs on meta
        n = int(check_index(f"segments[{k}] free_index", free_index, allow_meta=True).shape[0])
        if n == 0:
            continue
        if prev_end is not None and start_pos < prev_end:
            raise ValueError(
                f"segments must be ascending and disjoint: segments[{k}] starts at {start_pos}, "
                f"before the previous segment's end {prev_end}"
            )
        skip = 0
        if prev_end is not None:
            shared_end = ((prev_end - 1) // page_size + 1) * page_size  # end of the shared page
            skip = min(n, max(0, shared_end - start_pos))
        prev_end = start_pos + n
        if skip < n:
            yield (free_index[skip:] if skip else free_index), start_pos + skip
