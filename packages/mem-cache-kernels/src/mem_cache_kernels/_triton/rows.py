"""Triton implementation of the row-moving op families (store, move, transfer).

The executor of the row ops of :mod:`mem_cache_kernels._layout` (the dispatch table binds
:func:`run_jobs` to each op body there; same jobs as the torch executor), one row-copy kernel.
One launch copies rows for a batch of *jobs* that share the row size and word width: grid
``(row_blocks, jobs)``. A job is addressed relative to a base tensor through a small int64 table
(word delta of its base pointer, row stride in words), so one launch serves every role and layer
without int-to-pointer casts. Rows are moved as 8/4/2/1-byte words (the widest that divides the
row size, the strides and the base offsets). Every index is cast to int64 before it is
multiplied by a stride, so rows beyond 2**31 bytes from a buffer's start are addressed
correctly. A pair with a negative index is skipped.

``copy_all_layer_kv_cache`` is overlap-safe in two phases: phase 1 gathers the ``src_loc`` rows of
every buffer into a temporary, phase 2 scatters them to ``tgt_loc``. Since every read finishes
before the first write (two launches on one stream), overlapping source and target rows are safe
for any number of rows, unlike a single-launch load-then-store kernel whose guarantee holds only
within one program.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from mem_cache_kernels import _layout as lay
from mem_cache_kernels._layout import RowJob

__all__ = [
    "copy_all_layer_kv_cache",
    "run_jobs",
    "word_dtype",
]

# Words per program: BLOCK_ROWS * BLOCK_COLS ~= 4096 (32 KiB of int64 words) keeps enough
# bytes in flight per program on a GPU while the interpreter (CPU) stays vectorised.
_TILE_WORDS = 4096
_MAX_COLS = 1024
_WORDS = (torch.int64, torch.int32, torch.int16, torch.uint8)
# Program quotas (CTAs per launch, all jobs together), so a transfer overlaps compute instead of
# taking every SM (the idea of SGLang's block_quota). Host<->device copies are bound by the
# interconnect (~50 GB/s): a few dozen programs with 32 KiB tiles keep it busy. Device<->device
# copies need far more bytes in flight to approach HBM bandwidth. Unmeasured on a GPU so far:
# revisit with tools/bench/kernels.py --device cuda.
HOST_QUOTA = 64
DEVICE_QUOTA = 1024


@triton.jit(do_not_specialize=["n", "src_idx_ptr", "dst_idx_ptr"])
def _copy_rows_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917
    src_ptr,  # word pointer of the base source tensor (job 0)
    dst_ptr,  # word pointer of the base destination tensor (job 0)
    table_ptr,  # int64 [jobs, 4]: src word delta, dst word delta, src stride, dst stride
    src_idx_ptr,  # int32/int64 [n] source rows (unused when not HAS_SRC_IDX)
    dst_idx_ptr,  # int32/int64 [n] destination rows (unused when not HAS_DST_IDX)
    n,  # number of index pairs
    row_words,  # words per row
    HAS_SRC_IDX: tl.constexpr,
    HAS_DST_IDX: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    PAIRS: tl.constexpr,  # every base, stride and row size is a multiple of 2 words (16 bytes)
):
    pid = tl.program_id(0)
    job = tl.program_id(1).to(tl.int64)
    src_delta = tl.load(table_ptr + job * 4)
    dst_delta = tl.load(table_ptr + job * 4 + 1)
    src_stride = tl.load(table_ptr + job * 4 + 2)
    dst_stride = tl.load(table_ptr + job * 4 + 3)
    if PAIRS:  # alignment hints: lets the compiler emit 16-byte vector loads and stores
        src_delta = tl.multiple_of(src_delta, 2)
        dst_delta = tl.multiple_of(dst_delta, 2)
        src_stride = tl.multiple_of(src_stride, 2)
        dst_stride = tl.multiple_of(dst_stride, 2)
    mask_cols = tl.arange(0, BLOCK_COLS)
    # grid-stride loop: the launcher caps the number of programs (see _quota)
    for blk in range(pid, tl.cdiv(n, BLOCK_ROWS), tl.num_programs(0)):
        first = (blk + tl.zeros((), dtype=tl.int64)) * BLOCK_ROWS  # int64 before the multiply
        rows = first + tl.arange(0, BLOCK_ROWS).to(tl.int64)
        in_range = rows < n
        if HAS_SRC_IDX:
            s = tl.load(src_idx_ptr + rows, mask=in_range, other=-1).to(tl.int64)
        else:
            s = rows
        if HAS_DST_IDX:
            d = tl.load(dst_idx_ptr + rows, mask=in_range, other=-1).to(tl.int64)
        else:
            d = rows
        live = in_range & (s >= 0) & (d >= 0)
        src_row = src_ptr + src_delta + s * src_stride
        dst_row = dst_ptr + dst_delta + d * dst_stride
        # BLOCK_COLS divides row_words, so there is no column tail: the mask is per row only,
        # which keeps the loads and stores vectorisable (a per-column mask would split them)
        mask = live[:, None]
        for c0 in range(0, row_words, BLOCK_COLS):
            cols = tl.max_contiguous(tl.multiple_of(c0 + mask_cols, BLOCK_COLS), BLOCK_COLS)
            words = tl.load(src_row[:, None] + cols[None, :], mask=mask, other=0)
            tl.store(dst_row[:, None] + cols[None, :], words, mask=mask)


def word_dtype(jobs: Sequence[RowJob]) -> torch.dtype:
    """Widest integer word that divides every row size, row stride and base address."""
    for dtype in _WORDS:
        w = dtype.itemsize
        if _aligned(jobs, w) and all(t.storage_offset() % w == 0 for job in jobs for t in job):
            return dtype
    return torch.uint8


@functools.lru_cache(maxsize=256)
def _table(
    key: tuple[tuple[int, int, int, int], ...], word: int, device: torch.device
) -> torch.Tensor:
    """Job table for ``key`` = ((src_ptr, dst_ptr, src_stride, dst_stride) in bytes, ...)."""
    s0, d0 = key[0][0], key[0][1]
    rows = [((s - s0) // word, (d - d0) // word, ss // word, ds // word) for s, d, ss, ds in key]
    return torch.tensor(rows, dtype=torch.int64).to(device)


def _blocks(row_words: int) -> tuple[int, int]:
    """(BLOCK_ROWS, BLOCK_COLS): BLOCK_COLS is the largest power of two dividing ``row_words``
    (capped), so rows split into whole column blocks; the tile holds ~_TILE_WORDS words."""
    cols = min(row_words & -row_words, _MAX_COLS)
    return max(1, _TILE_WORDS // cols), cols


def run_jobs(
    jobs: Sequence[RowJob], src_idx: torch.Tensor | None, dst_idx: torch.Tensor | None
) -> None:
    """Copy ``src[src_idx] -> dst[dst_idx]`` for every job in one launch (per row size).

    Jobs must not write rows that another job (or the same job) reads in the same call; see
    :func:`copy_all_layer_kv_cache` for the overlap-safe variant.
    """
    if not jobs:
        return
    if src_idx is not None:
        n = src_idx.shape[0]
    elif dst_idx is not None:
        n = dst_idx.shape[0]
    else:
        n = jobs[0][0].shape[0]
    if n == 0:
        return
    groups: dict[int, list[RowJob]] = {}
    for job in jobs:
        groups.setdefault(job[0].shape[1], []).append(job)
    device = jobs[0][1].device if jobs[0][1].is_cuda else jobs[0][0].device
    if device.type == "cuda":
        _check_pinned(jobs)
    sidx = None if src_idx is None else src_idx.to(device, non_blocking=True)
    didx = None if dst_idx is None else dst_idx.to(device, non_blocking=True)
    if device.type == "cuda":
        with torch.cuda.device(device):
            _launch_groups(groups, sidx, didx, n, device)
    else:
        _launch_groups(groups, sidx, didx, n, device)


def _check_pinned(jobs: Sequence[RowJob]) -> None:
    """A GPU kernel reaches host memory only when it is pinned (mapped into the GPU's address
    space); anything else would be an illegal address at run time, so refuse before launching."""
    for i, job in enumerate(jobs):
        for side, t in zip(("source", "destination"), job):
            if t.device.type == "cpu" and not t.is_pinned():
                raise ValueError(
                    f"host tensors must be pinned for the Triton backend (buffer {i}, {side}): "
                    "allocate them with pin_memory=True, or use backend='torch'"
                )


def _aligned(jobs: Sequence[RowJob], nbytes: int) -> bool:
    """Every row size, row stride and base address of ``jobs`` is a multiple of ``nbytes``."""
    return all(
        t.shape[1] % nbytes == 0
        and (t.shape[0] <= 1 or t.stride(0) % nbytes == 0)
        and t.data_ptr() % nbytes == 0
        for job in jobs
        for t in job
    )


def _launch_groups(
    groups: dict[int, list[RowJob]],
    sidx: torch.Tensor | None,
    didx: torch.Tensor | None,
    n: int,
    device: torch.device,
) -> None:
    for row_bytes, group in groups.items():
        word = word_dtype(group)
        w = word.itemsize
        key = tuple((s.data_ptr(), d.data_ptr(), s.stride(0), d.stride(0)) for s, d in group)
        table = _table(key, w, device)
        src0 = group[0][0].view(word)
        dst0 = group[0][1].view(word)
        row_words = row_bytes // w
        block_rows, block_cols = _blocks(row_words)
        quota = (
            HOST_QUOTA
            if any(t.device.type == "cpu" for job in group for t in job)
            else DEVICE_QUOTA
        )
        grid = (max(1, min(triton.cdiv(n, block_rows), quota // len(group))), len(group))
        dummy = table
        _copy_rows_kernel[grid](
            src0,
            dst0,
            table,
            dummy if sidx is None else sidx,
            dummy if didx is None else didx,
            n,
            row_words,
            HAS_SRC_IDX=sidx is not None,
            HAS_DST_IDX=didx is not None,
            BLOCK_ROWS=block_rows,
            BLOCK_COLS=block_cols,
            PAIRS=w == 8 and _aligned(group, 16),
        )


# ----------------------------------------------------------------------------- the ops
# The other row ops are :mod:`mem_cache_kernels._layout`'s, bound to :func:`run_jobs` by the
# dispatch table; only the overlap-safe move has a Triton body of its own.


_ALIGN = 16


def copy_all_layer_kv_cache(
    buffers: Sequence[torch.Tensor], tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every buffer: rows ``tgt_loc`` get the old contents of rows ``src_loc`` (two phases,
    see the module doc)."""
    n = tgt_loc.shape[0]
    if n == 0:
        return
    views = [lay.byte_rows(f"buffers[{i}]", b) for i, b in enumerate(buffers)]
    # one temporary row holds every buffer's row, each part starting on a 16-byte boundary so the
    # copies keep using the widest words the buffers allow
    widths = [-(-v.shape[1] // _ALIGN) * _ALIGN for v in views]
    tmp = torch.empty((n, sum(widths)), dtype=torch.uint8, device=views[0].device)
    parts: list[torch.Tensor] = []
    col = 0
    for v, width in zip(views, widths):
        parts.append(tmp[:, col : col + v.shape[1]])
        col += width
    # a pair with a negative index is skipped in both phases
    src = torch.where(tgt_loc < 0, -1, src_loc.to(torch.int64))
    tgt = torch.where(src_loc < 0, -1, tgt_loc.to(torch.int64))
    run_jobs(list(zip(views, parts)), src, None)
    run_jobs(list(zip(parts, views)), None, tgt)
