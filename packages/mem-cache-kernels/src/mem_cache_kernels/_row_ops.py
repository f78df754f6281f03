"""Backend-independent bodies of the data-movement ops.

Each function takes ``run``, a backend's row-job executor (``run(jobs, src_idx, dst_idx)``; see
:mod:`mem_cache_kernels._layout`), and does everything else (casts, views, output allocation) in
torch. The op catalogue (:mod:`mem_cache_kernels._registry`) names each body with the row-job
executor of each backend; :mod:`mem_cache_kernels._dispatch` binds the chosen executor as ``run``
(:mod:`mem_cache_kernels.reference` binds the torch one), so both backends move exactly the same
bytes. Arguments are assumed valid (the
public ops validate).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from mem_cache_kernels import _layout as lay

__all__ = [
    "RunJobs",
    "backup_all_layers_to_page_first",
    "copy_all_layer_kv_cache",
    "get_mla_kv_buffer",
    "load_layer_from_page_first",
    "set_mla_kv_buffer",
    "store_kv",
    "transfer_rows",
    "transfer_rows_all_layers",
]

RunJobs = Callable[[Sequence[lay.RowJob], "torch.Tensor | None", "torch.Tensor | None"], None]


def store_kv(  # noqa: PLR0917
    run: RunJobs,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dtype: torch.dtype | None,
) -> None:
    k_src = lay.cast_for_storage(k, k_cache.dtype, dtype)
    v_src = lay.cast_for_storage(v, v_cache.dtype, dtype)
    jobs = [
        (lay.byte_rows("k", k_src, copy_ok=True), lay.byte_rows("k_cache", k_cache)),
        (lay.byte_rows("v", v_src, copy_ok=True), lay.byte_rows("v_cache", v_cache)),
    ]
    run(jobs, None, loc)


def set_mla_kv_buffer(  # noqa: PLR0917
    run: RunJobs,
    kv_buffer: torch.Tensor,
    loc: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    dtype: torch.dtype | None,
) -> None:
    nope = lay.cast_for_storage(k_nope, kv_buffer.dtype, dtype)
    rope = lay.cast_for_storage(k_rope, kv_buffer.dtype, dtype)
    run(lay.mla_jobs(kv_buffer, nope, rope, to_buffer=True), None, loc)


def get_mla_kv_buffer(
    run: RunJobs,
    kv_buffer: torch.Tensor,
    loc: torch.Tensor,
    nope_dim: int,
    dtype: torch.dtype | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    lead = (loc.shape[0], *kv_buffer.shape[1:-1])
    dt, dev = kv_buffer.dtype, kv_buffer.device
    nope = torch.zeros((*lead, nope_dim), dtype=dt, device=dev)
    rope = torch.zeros((*lead, kv_buffer.shape[-1] - nope_dim), dtype=dt, device=dev)
    run(lay.mla_jobs(kv_buffer, nope, rope, to_buffer=False), loc, None)
    if dtype is not None and dtype != kv_buffer.dtype:
        return nope.view(dtype), rope.view(dtype)
    return nope, rope


def copy_all_layer_kv_cache(
    run: RunJobs, buffers: Sequence[torch.Tensor], tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    jobs = [
        (lay.byte_rows(f"buffers[{i}]", b), lay.byte_rows(f"buffers[{i}]", b))
        for i, b in enumerate(buffers)
    ]
    run(jobs, src_loc, tgt_loc)


def transfer_rows(
    run: RunJobs,
    src: Sequence[torch.Tensor],
    dst: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
) -> None:
    run(lay.role_jobs(src, dst), src_indices, dst_indices)


def transfer_rows_all_layers(
    run: RunJobs,
    src: Sequence[Sequence[torch.Tensor]],
    dst: Sequence[Sequence[torch.Tensor]],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
) -> None:
    run(lay.all_layer_jobs(src, dst), src_indices, dst_indices)


def load_layer_from_page_first(  # noqa: PLR0917
    run: RunJobs,
    host: Sequence[torch.Tensor],
    device: Sequence[torch.Tensor],
    host_indices: torch.Tensor,
    device_indices: torch.Tensor,
    layer_id: int,
) -> None:
    run(lay.load_page_first_jobs(host, device, layer_id), host_indices, device_indices)


def backup_all_layers_to_page_first(
    run: RunJobs,
    device: Sequence[Sequence[torch.Tensor]],
    host: Sequence[torch.Tensor],
    device_indices: torch.Tensor,
    host_indices: torch.Tensor,
) -> None:
    run(lay.backup_page_first_jobs(device, host), device_indices, host_indices)
