"""Request-table ops: ``write_req_to_token`` and ``get_last_loc``.

``req_to_token`` is an int32 ``[rows, max_len]`` table: row ``r`` holds the slots of the request
that owns pool row ``r``, by sequence position.
"""

from __future__ import annotations

import torch

from mem_cache_kernels import checks as v
from mem_cache_kernels.dispatch import Backend, pick

__all__ = ["get_last_loc", "write_req_to_token"]


def _check_table(req_to_token: object) -> torch.Tensor:
    table = v.check_tensor_of(
        "req_to_token", req_to_token, dtypes=v.INDEX_DTYPES, dim=2, shape="[rows, max_len]"
    )
    if table.stride(1) != 1:
        raise ValueError(f"req_to_token rows must be contiguous, got strides {table.stride()}")
    return table


def _check_rows(rows: torch.Tensor, table: torch.Tensor, *, distinct: bool = False) -> None:
    """Row indices must name rows of the table: a negative one is an error here, not a skip (torch
    would wrap -1 to the last row, another request's). With ``distinct`` (writes) no row may
    appear twice in a batch: two requests writing one row would race for it."""
    v.check_nonnegative("req_pool_indices", rows, "row indices of req_to_token")
    v.check_index_range("req_pool_indices", rows, table.shape[0], "req_to_token")
    if distinct and rows.numel() > 1:
        values = rows.tolist() if rows.numel() <= v.SMALL_BATCH else None
        n_unique = len(set(values)) if values is not None else int(torch.unique(rows).numel())
        if n_unique != rows.numel():
            seen: set[int] = set()
            dup = -1
            for r in rows.tolist():
                if r in seen:
                    dup = r
                    break
                seen.add(r)
            raise ValueError(
                f"req_pool_indices must hold distinct rows (one per request), got row {dup} twice"
            )


def _check_write_values(  # noqa: PLR0917
    table: torch.Tensor,
    rows: torch.Tensor,
    pre: torch.Tensor,
    seq: torch.Tensor,
    new: torch.Tensor,
    prefix: torch.Tensor | None,
) -> None:
    """The value checks of :func:`write_req_to_token` (CPU tensors; any device in debug mode)."""
    host = [v.host_values(t) for t in (rows, pre, seq, new)]
    h_rows, h_pre, h_seq, h_new = host
    if h_rows is None or h_pre is None or h_seq is None or h_new is None:
        return
    h_prefix = None if prefix is None else v.host_values(prefix)
    if bool((h_seq < h_pre).any()) or bool((h_pre < 0).any()):
        bad = int(torch.nonzero((h_seq < h_pre) | (h_pre < 0))[0, 0])
        raise ValueError(
            "prefix_lens and seq_lens must satisfy 0 <= prefix_lens <= seq_lens, got "
            f"prefix_lens[{bad}] = {int(h_pre[bad])}, seq_lens[{bad}] = {int(h_seq[bad])}"
        )
    if h_rows.numel() and int(h_seq.max()) > table.shape[1]:
        raise ValueError(
            f"seq_lens must be <= max_len {table.shape[1]} (req_to_token columns), "
            f"got {int(h_seq.max())}"
        )
    _check_rows(h_rows, table, distinct=True)
    total = int((h_seq.to(torch.int64) - h_pre).sum())
    if h_new.numel() != total:
        raise ValueError(
            f"out_cache_loc must have sum(seq_lens - prefix_lens) = {total} elements, "
            f"got {h_new.numel()}"
        )
    v.check_fits_dtype("out_cache_loc", h_new, table.dtype, "req_to_token")
    if h_prefix is not None:
        if h_prefix.numel() != int(h_pre.sum()):
            raise ValueError(
                f"prefix_slots must have sum(prefix_lens) = {int(h_pre.sum())} elements, "
                f"got {h_prefix.numel()}"
            )
        v.check_fits_dtype("prefix_slots", h_prefix, table.dtype, "req_to_token")


def write_req_to_token(  # noqa: PLR0917
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    prefix_slots: torch.Tensor | None = None,
    *,
    backend: Backend = "auto",
) -> None:
    """Write each request's slots into its row of ``req_to_token``.

    For request ``i`` with row ``r = req_pool_indices[i]``:
    ``req_to_token[r, prefix_lens[i]:seq_lens[i]] = out_cache_loc[off_i : off_i + ext_i]``
    (``off_i`` = sum of the earlier requests' new lengths) and, when ``prefix_slots`` (the flat
    concatenation of every request's prefix slots, length ``sum(prefix_lens)``) is given,
    ``req_to_token[r, :prefix_lens[i]] = prefix``. Slots are stored as the table's dtype.

    All tensors share the table's device. Value checks (``0 <= prefix <= seq <= max_len``, every
    row in ``[0, rows)`` and distinct - a negative row raises, it is not a skip - the lengths of
    ``out_cache_loc`` / ``prefix_slots``, every slot fits the table's dtype) run on CPU tensors,
    and on any device in debug mode (``MEM_CACHE_DEBUG=1``, one synchronisation). On a GPU
    without debug they are the caller's guarantee; both backends then still write nothing for a
    row outside the table and nothing past ``max_len`` (no out-of-bounds write).
    """
    table = _check_table(req_to_token)
    rows = v.check_index("req_pool_indices", req_pool_indices)
    pre = v.check_index("prefix_lens", prefix_lens)
    seq = v.check_index("seq_lens", seq_lens)
    new = v.check_index("out_cache_loc", out_cache_loc)
    v.check_same_length(req_pool_indices=rows, prefix_lens=pre, seq_lens=seq)
    named = {"req_pool_indices": rows, "prefix_lens": pre, "seq_lens": seq, "out_cache_loc": new}
    prefix = None if prefix_slots is None else v.check_index("prefix_slots", prefix_slots)
    if prefix is not None:
        named["prefix_slots"] = prefix
    v.check_same_device(table.device, **named)
    _check_write_values(table, rows, pre, seq, new, prefix)
    impl = pick("write_req_to_token", backend, table, *named.values())
    impl(table, rows, pre, seq, new, prefix)


def get_last_loc(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Return int64 ``[bs]``: ``req_to_token[req_pool_indices[i], prefix_lens[i] - 1]``, or -1 where
    ``prefix_lens[i] == 0``. Reads only; all tensors on the table's device.

    ``req_pool_indices`` must be rows of the table (a negative one raises) and ``prefix_lens`` in
    ``[0, max_len]``: checked on CPU tensors and in debug mode; on a GPU otherwise both backends
    answer -1 for such a request (nothing outside the table is read)."""
    table = _check_table(req_to_token)
    rows = v.check_index("req_pool_indices", req_pool_indices)
    pre = v.check_index("prefix_lens", prefix_lens)
    v.check_same_length(req_pool_indices=rows, prefix_lens=pre)
    v.check_same_device(table.device, req_pool_indices=rows, prefix_lens=pre)
    host_rows, host_pre = v.host_values(rows), v.host_values(pre)
    if host_rows is not None and host_pre is not None and rows.numel():
        _check_rows(host_rows, table)
        if int(host_pre.max()) > table.shape[1] or int(host_pre.min()) < 0:
            bad = (
                int(host_pre.max()) if int(host_pre.max()) > table.shape[1] else int(host_pre.min())
            )
            raise ValueError(
                f"prefix_lens must be in [0, max_len = {table.shape[1]}] (req_to_token columns), "
                f"got {bad}"
            )
    result: torch.Tensor = pick("get_last_loc", backend, table, rows, pre)(table, rows, pre)
    return result
