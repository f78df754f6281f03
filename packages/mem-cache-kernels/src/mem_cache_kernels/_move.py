"""Row relocation across all layers: ``copy_all_layer_kv_cache`` (speculative-decoding moves)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels import checks as v
from mem_cache_kernels._layout import as_byte_rows
from mem_cache_kernels.dispatch import Backend, pick

__all__ = ["copy_all_layer_kv_cache"]


def copy_all_layer_kv_cache(
    buffers: Sequence[torch.Tensor],
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> None:
    """For every buffer ``b``: ``b[tgt_loc] = old b[src_loc]`` (all reads happen before any write).

    ``buffers``: per-layer (and per-role) ``[rows, *row]`` tensors on one device, rows contiguous;
    buffers may differ in row shape and dtype (e.g. K and V). ``tgt_loc``/``src_loc``: int32/int64,
    equal lengths, on the buffers' device. Correct when the source and target rows overlap; a pair
    with a negative index is skipped. Target indices must be distinct (otherwise which source wins
    is unspecified).
    """
    bufs = v.check_tensor_list("buffers", buffers)
    tgt = v.check_index("tgt_loc", tgt_loc)
    src = v.check_index("src_loc", src_loc)
    v.check_same_length(tgt_loc=tgt, src_loc=src)
    device = bufs[0].device
    v.check_same_device(device, **{f"buffers[{i}]": b for i, b in enumerate(bufs)})
    v.check_same_device(device, tgt_loc=tgt, src_loc=src)
    t_top, s_top = v.IndexBound("tgt_loc", tgt), v.IndexBound("src_loc", src)
    for i, b in enumerate(bufs):
        as_byte_rows(f"buffers[{i}]", b)
        t_top.check(b.shape[0], f"buffers[{i}]")
        s_top.check(b.shape[0], f"buffers[{i}]")
    pick("copy_all_layer_kv_cache", backend, *bufs, tgt, src)(bufs, tgt, src)
