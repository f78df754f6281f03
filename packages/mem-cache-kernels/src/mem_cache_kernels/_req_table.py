"""Request-table ops: ``write_req_to_token`` and ``get_last_loc``.

``req_to_token`` is an int32 ``[rows, max_len]`` table: row ``r`` holds the slots of the request
that owns pool row ``r``, by sequence position.
"""

from __future__ import annotations

import torch

from mem_cache_kernels import _validate as v
from mem_cache_kernels._dispatch import Backend, resolve_backend, triton_impl
from mem_cache_kernels._torch import req_table as ref

__all__ = ["get_last_loc", "write_req_to_token"]


def _check_table(req_to_token: object) -> torch.Tensor:
    table = v.check_tensor("req_to_token", req_to_token)
    if table.dtype not in v.INDEX_DTYPES:
        raise TypeError(f"req_to_token must be int32 or int64, got {table.dtype}")
    if table.dim() != 2:
        raise ValueError(
            f"req_to_token must be 2-D [rows, max_len], got shape {tuple(table.shape)}"
        )
    if table.stride(1) != 1:
        raise ValueError(f"req_to_token rows must be contiguous, got strides {table.stride()}")
    return table


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
    All tensors share the table's device; value checks run on CPU tensors only.
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
    if table.device.type == "cpu":
        if bool((seq < pre).any()) or bool((pre < 0).any()):
            raise ValueError("prefix_lens and seq_lens must satisfy 0 <= prefix_lens <= seq_lens")
        if rows.numel() and int(seq.max()) > table.shape[1]:
            raise ValueError(f"seq_lens must be <= max_len {table.shape[1]}, got {int(seq.max())}")
        v.check_index_range("req_pool_indices", rows, table.shape[0], "req_to_token")
        total = int((seq.to(torch.int64) - pre).sum())
        if new.numel() != total:
            raise ValueError(
                f"out_cache_loc must have sum(seq_lens - prefix_lens) = {total} elements, "
                f"got {new.numel()}"
            )
        if prefix is not None and prefix.numel() != int(pre.sum()):
            raise ValueError(
                f"prefix_slots must have sum(prefix_lens) = {int(pre.sum())} elements, "
                f"got {prefix.numel()}"
            )
    tensors = (table, *named.values())
    if resolve_backend(backend, *tensors) == "triton":
        triton_impl("req_table").write_req_to_token(table, rows, pre, seq, new, prefix)
    else:
        ref.write_req_to_token(table, rows, pre, seq, new, prefix)


def get_last_loc(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Return int64 ``[bs]``: ``req_to_token[req_pool_indices[i], prefix_lens[i] - 1]``, or -1 where
    ``prefix_lens[i] == 0``. Reads only; all tensors on the table's device."""
    table = _check_table(req_to_token)
    rows = v.check_index("req_pool_indices", req_pool_indices)
    pre = v.check_index("prefix_lens", prefix_lens)
    v.check_same_length(req_pool_indices=rows, prefix_lens=pre)
    v.check_same_device(table.device, req_pool_indices=rows, prefix_lens=pre)
    if table.device.type == "cpu" and rows.numel():
        v.check_index_range("req_pool_indices", rows, table.shape[0], "req_to_token")
        if int(pre.max()) > table.shape[1] or int(pre.min()) < 0:
            raise ValueError(f"prefix_lens must be in [0, {table.shape[1]}]")
    if resolve_backend(backend, table, rows, pre) == "triton":
        result: torch.Tensor = triton_impl("req_table").get_last_loc(table, rows, pre)
        return result
    return ref.get_last_loc(table, rows, pre)
