"""Torch executor of the row-moving op families (store, move, transfer).

The op bodies (``store_kv``, ``set_mla_kv_buffer``, ``get_mla_kv_buffer``, ``transfer_rows``,
``transfer_rows_all_layers``, ``load_layer_from_page_first``, ``backup_all_layers_to_page_first``)
live once in :mod:`mem_cache_kernels._layout`: each builds its byte-row jobs and runs them with
the executor the dispatch table binds as its first argument, :func:`run_jobs` here (the Triton
executor in :mod:`mem_cache_kernels._triton.rows`), so both backends move exactly the same
bytes. ``copy_all_layer_kv_cache`` is this module's own (Triton's is two-phase). This executor is
the CPU path of the library and the oracle of the tests (:mod:`mem_cache_kernels.reference`).

``copy_rows(src, dst, src_idx, dst_idx)`` copies byte rows: ``dst[dst_idx[i]] = src[src_idx[i]]``
for every ``i`` where both indices are non-negative (a negative index skips the pair). ``src`` and
``dst`` are uint8 ``[rows, row_bytes]`` views (any row stride, contiguous rows, possibly on
different devices); ``None`` for an index means the identity ``0..n-1``. All reads happen before
any write, so overlapping source and target rows of one buffer are safe.

Two strategies, chosen per call (both plain torch, bit-exact):

* **runs** (indices on the CPU, distinct source and destination storage, runs averaging at least
  ``_RUN_BYTES``): one slice ``copy_`` per maximal run of consecutive rows on both sides - a
  single pass over the bytes (page-granular transfers are runs of at least one page);
* **gather/scatter** otherwise: ``index_select`` then ``index_copy_`` on the widest integer view,
  in chunks of ``_CHUNK_BYTES`` so the temporary stays in cache (measured 2-3x faster on CPU than
  one batch-sized temporary for multi-MiB transfers).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels import _layout as lay
from mem_cache_kernels._layout import RowJob, as_byte_rows, find_runs, run_starts
from mem_cache_kernels.checks import host_bounds

__all__ = [
    "Runs",
    "backup_all_layer_pages",
    "copy_all_layer_kv_cache",
    "copy_rows",
    "drop_negative",
    "load_layer_pages",
    "plan_runs",
    "run_jobs",
]

_RUN_BYTES = 32 << 10  # a slice copy_ costs several microseconds: worth it from ~32 KiB per run
_CHUNK_BYTES = 256 << 10  # gather/scatter temporary (L2-sized)
_ONE_SHOT_BYTES = 1 << 20  # below this, one gather + one scatter


_WIDTHS = ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2))


def _wide(t: torch.Tensor) -> torch.Tensor:
    """Reinterpret a uint8 ``[rows, B]`` view with the widest integer element that divides it."""
    row_bytes = t.shape[1]
    stride, offset = t.stride(0), t.storage_offset()
    for dtype, w in _WIDTHS:  # torch's view checks the row stride even for a single row
        if not (row_bytes % w or offset % w or stride % w):
            return t.view(dtype)
    return t


def drop_negative(
    src_idx: torch.Tensor | None, dst_idx: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Drop the pairs where either index is negative; an identity (``None``) side becomes explicit.

    Returns the inputs unchanged when no index is negative (the common case).
    """
    given = [idx for idx in (src_idx, dst_idx) if idx is not None]
    for idx in given:  # CPU indices: their bounds (a short one: one tolist), no mask
        if not idx.is_cpu or (idx.numel() and host_bounds(idx)[0] < 0):
            break
    else:  # none given, or none negative
        return src_idx, dst_idx
    keep = given[0] >= 0
    if len(given) == 2:
        keep = keep & (given[1] >= 0).to(keep.device)
    if bool(keep.all()):
        return src_idx, dst_idx
    pos = torch.nonzero(keep, as_tuple=True)[0]

    def pick(idx: torch.Tensor | None) -> torch.Tensor:
        return pos if idx is None else idx[keep.to(idx.device)]

    return pick(src_idx), pick(dst_idx)


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.device == b.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


Runs = tuple[list[int], list[int], list[int]]
"""Maximal runs of an index pair as lists: (source starts, destination starts, lengths)."""


def plan_runs(src_idx: torch.Tensor, dst_idx: torch.Tensor, row_bytes: int) -> Runs | None:
    """The runs of a (negative-free) CPU index pair, or None when they are not on the CPU or
    too short on average for rows of ``row_bytes`` (see ``_RUN_BYTES``).

    Computed once per op and shared by every buffer (role x layer) the op copies.
    """
    if src_idx.device.type != "cpu" or dst_idx.device.type != "cpu":
        return None
    s = src_idx.to(torch.int64)
    d = dst_idx.to(torch.int64)
    starts = run_starts(s, d)
    if starts.numel() * _RUN_BYTES > s.numel() * row_bytes:
        return None  # decided before building the (possibly long) Python lists
    ends = torch.cat([starts[1:], torch.tensor([s.numel()])])
    return s[starts].tolist(), d[starts].tolist(), (ends - starts).tolist()


def _copy_runs(src: torch.Tensor, dst: torch.Tensor, runs: Runs | None) -> bool:
    """Copy run by run when the runs are long enough; return False (nothing done) otherwise."""
    if runs is None or _same_storage(src, dst):
        return False
    s_starts, d_starts, lengths = runs
    row_bytes = src.shape[1]
    if sum(lengths) * row_bytes < _RUN_BYTES * max(1, len(lengths)):
        return False  # runs too short: one copy_ call per run would cost more than it moves
    non_blocking = src.device != dst.device
    for s0, d0, k in zip(s_starts, d_starts, lengths):
        dst[d0 : d0 + k].copy_(src[s0 : s0 + k], non_blocking=non_blocking)
    return True


def _gather_scatter(
    s: torch.Tensor, d: torch.Tensor, src_idx: torch.Tensor | None, dst_idx: torch.Tensor | None
) -> None:
    on_cpu = s.is_cpu and d.is_cpu  # the common case: no device objects built
    if src_idx is None:
        rows = s
    else:
        rows = s.index_select(0, src_idx if on_cpu and src_idx.is_cpu else src_idx.to(s.device))
    if not on_cpu and rows.device != d.device:
        rows = rows.to(d.device)
    if dst_idx is None:
        d[: rows.shape[0]].copy_(rows)
    elif on_cpu and dst_idx.is_cpu and dst_idx.dtype is torch.int64:
        d.index_copy_(0, dst_idx, rows)
    else:
        d.index_copy_(0, dst_idx.to(device=d.device, dtype=torch.int64), rows)


def _chunked(
    s: torch.Tensor, d: torch.Tensor, src_idx: torch.Tensor, dst_idx: torch.Tensor
) -> None:
    """Gather/scatter through one cache-sized temporary (CPU, distinct storages only)."""
    n = src_idx.numel()
    chunk = max(1, _CHUNK_BYTES // (s.shape[1] * s.element_size()))
    tmp = torch.empty((min(chunk, n), s.shape[1]), dtype=s.dtype)
    dst64 = dst_idx.to(torch.int64)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        part = tmp[: hi - lo]
        torch.index_select(s, 0, src_idx[lo:hi], out=part)
        d.index_copy_(0, dst64[lo:hi], part)


def copy_rows(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_idx: torch.Tensor | None,
    dst_idx: torch.Tensor | None,
) -> None:
    """Copy byte rows ``src[src_idx] -> dst[dst_idx]`` (see the module docstring)."""
    run_jobs(((src, dst),), src_idx, dst_idx)


def _copy_clean(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_idx: torch.Tensor | None,
    dst_idx: torch.Tensor | None,
    runs: Runs | None,
) -> None:
    """One job of :func:`run_jobs`: negative pairs already dropped, runs already planned."""
    if _copy_runs(src, dst, runs):
        return
    s, d = _wide(src), _wide(dst)
    if s.dtype != d.dtype:
        s, d = src, dst
    if (
        src_idx is not None
        and dst_idx is not None
        and s.device.type == d.device.type == src_idx.device.type == dst_idx.device.type == "cpu"
        and src_idx.numel() * src.shape[1] > _ONE_SHOT_BYTES
        and not _same_storage(src, dst)
    ):
        _chunked(s, d, src_idx, dst_idx)
        return
    _gather_scatter(s, d, src_idx, dst_idx)


def run_jobs(
    jobs: Sequence[RowJob], src_idx: torch.Tensor | None, dst_idx: torch.Tensor | None
) -> None:
    """Run every job with the same indices: negatives dropped and runs planned once for all
    jobs (not per job)."""
    src_idx, dst_idx = drop_negative(src_idx, dst_idx)
    runs = None
    if src_idx is not None and dst_idx is not None:
        row = max(src.shape[1] for src, _ in jobs) if jobs else 0
        if src_idx.numel() * row >= _RUN_BYTES:
            runs = plan_runs(src_idx, dst_idx, row)
    for src, dst in jobs:
        _copy_clean(src, dst, src_idx, dst_idx, runs)


# ----------------------------------------------------------------------------- the ops
# The other row ops are :mod:`mem_cache_kernels._layout`'s, bound to :func:`run_jobs` by the
# dispatch table (the Triton executor gets the same bodies); the move is backend-specific.
def copy_all_layer_kv_cache(
    buffers: Sequence[torch.Tensor], tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every buffer: rows ``tgt_loc`` get the old contents of rows ``src_loc`` (every read
    happens before any write)."""
    run_jobs(lay.copy_jobs(buffers), src_loc, tgt_loc)


# ----------------------------------------------------------------------------- direct IO
# The page-first-direct bodies (host-driven page copies): trusted, checked by their public op
# (mem_cache_kernels._direct) or by the host pool that picks them from dispatch.TABLE.
def _page_runs(
    host_idx: torch.Tensor, dev_idx: torch.Tensor, page_size: int
) -> list[tuple[int, int, int]]:
    """Runs ``(host_page, device_slot, n_pages)`` of consecutive pages on both sides."""
    hp = host_idx.view(-1, page_size)[:, 0]
    dp = dev_idx.view(-1, page_size)[:, 0]
    live = (hp >= 0) & (dp >= 0)
    minus = torch.full_like(hp, -1)
    return find_runs(
        torch.where(live, hp // page_size, minus), torch.where(live, dp, minus), dst_step=page_size
    )


def _page_ids(
    host_idx: torch.Tensor, dev_idx: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(host page, device page) per page (-1: skipped), or None if a device page is unaligned."""
    hp = host_idx.view(-1, page_size)[:, 0]
    dp = dev_idx.view(-1, page_size)[:, 0]
    live = (hp >= 0) & (dp >= 0)
    if bool((dp[live] % page_size != 0).any()):
        return None
    minus = torch.full_like(hp, -1)
    return torch.where(live, hp // page_size, minus), torch.where(live, dp // page_size, minus)


def _device_pages(name: str, t: torch.Tensor, page_size: int) -> torch.Tensor | None:
    """uint8 ``[rows // ps, ps * row_bytes]`` page view of a device layer (None if rows are not
    densely packed, so pages are not contiguous)."""
    rows = as_byte_rows(name, t)
    n = rows.shape[0] // page_size * page_size
    if n == 0 or (rows.shape[0] > 1 and rows.stride(0) != rows.shape[1]):
        return None
    return rows[:n].view(n // page_size, page_size * rows.shape[1])


def _page_jobs(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], page_size: int, *, to_host: bool
) -> list[RowJob] | None:
    """Page-granular row jobs for (host layer view ``[pages, ps, *row]``, device layer) pairs."""
    jobs: list[RowJob] = []
    for i, (host_layer, dev) in enumerate(pairs):
        pages = _device_pages(f"device buffer {i}", dev, page_size)
        if pages is None:
            return None
        h = as_byte_rows(f"host buffer {i}", host_layer)
        jobs.append((pages, h) if to_host else (h, pages))
    return jobs


def load_layer_pages(  # noqa: PLR0917
    host: Sequence[torch.Tensor],
    device: Sequence[torch.Tensor],
    host_indices: torch.Tensor,
    device_indices: torch.Tensor,
    layer_id: int,
    page_size: int,
) -> None:
    """The trusted body of :func:`direct_load_layer_from_page_first_direct`: its arguments
    checked (``backend`` dropped), indices int64 on the CPU. Checks nothing."""
    ps = page_size
    ids = _page_ids(host_indices, device_indices, ps)
    jobs = _page_jobs([(a[:, layer_id], b) for a, b in zip(host, device)], ps, to_host=False)
    if ids is not None and jobs is not None:  # pages as rows: runs coalesced, else gathered
        run_jobs(jobs, ids[0], ids[1])
        return
    for h0, d0, n in _page_runs(host_indices, device_indices, ps):
        for a, b in zip(host, device):
            dst = b[d0 : d0 + n * ps].view(n, ps, *b.shape[1:])
            dst.copy_(a[h0 : h0 + n, layer_id], non_blocking=True)


def backup_all_layer_pages(
    device: Sequence[Sequence[torch.Tensor]],
    host: Sequence[torch.Tensor],
    device_indices: torch.Tensor,
    host_indices: torch.Tensor,
    page_size: int,
) -> None:
    """The trusted body of :func:`direct_backup_all_layers_to_page_first_direct`: its
    arguments checked (``backend`` dropped), indices int64 on the CPU. Checks nothing."""
    ps = page_size
    ids = _page_ids(host_indices, device_indices, ps)
    pairs = [(a[:, i], b) for layers, a in zip(device, host) for i, b in enumerate(layers)]
    jobs = _page_jobs(pairs, ps, to_host=True)
    if ids is not None and jobs is not None:  # pages as rows: runs coalesced, else gathered
        run_jobs(jobs, ids[1], ids[0])
        return
    for h0, d0, n in _page_runs(host_indices, device_indices, ps):
        for layers, a in zip(device, host):
            for i, b in enumerate(layers):
                src = b[d0 : d0 + n * ps].view(n, ps, *b.shape[1:])
                a[h0 : h0 + n, i].copy_(src, non_blocking=True)
