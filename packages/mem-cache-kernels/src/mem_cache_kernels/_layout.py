"""Byte-row views shared by both backends: every data-movement op becomes a list of row copies.

A *job* is a pair ``(src, dst)`` of uint8 ``[rows, row_bytes]`` views (no data copied; rows
contiguous, any row stride). Each data-movement op of a backend family module
(:mod:`mem_cache_kernels._torch.rows`, :mod:`mem_cache_kernels._triton.rows`) builds its jobs with
the one function of this module for that op (``store_jobs``, ``mla_set_jobs``, ``role_jobs``, ...)
and runs them with one pair of index tensors on its own executor, so the torch reference and the
Triton kernels move exactly the same bytes. Casts (e.g. bf16 -> fp8) are arithmetic and happen
here, in torch, before any byte is moved.

Also here: run detection on index pairs (:func:`run_starts`, :func:`find_runs`), used by the torch
executor's CPU fast path and the host-driven ``direct_*`` copies. Nothing here validates user
input: the public ops do (a broken view raises ``ValueError`` naming the buffer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = [
    "RowJob",
    "RunJobs",
    "backup_all_layers_to_page_first",
    "get_mla_kv_buffer",
    "load_layer_from_page_first",
    "set_mla_kv_buffer",
    "store_kv",
    "transfer_rows",
    "transfer_rows_all_layers",
    "all_layer_jobs",
    "as_byte_rows",
    "as_logical",
    "backup_page_first_jobs",
    "byte_rows",
    "cast_for_storage",
    "copy_jobs",
    "find_runs",
    "load_page_first_jobs",
    "mla_get_jobs",
    "mla_jobs",
    "mla_set_jobs",
    "role_jobs",
    "row_bytes",
    "run_starts",
    "store_jobs",
]

RowJob = tuple[torch.Tensor, torch.Tensor]
RunJobs = Callable[[Sequence[RowJob], "torch.Tensor | None", "torch.Tensor | None"], None]
"""A backend's executor: ``run_jobs(jobs, src_idx, dst_idx)`` copies ``src[src_idx] ->
dst[dst_idx]`` for every job (``None``: the identity; a negative index skips the pair)."""


def _rows_contiguous(t: torch.Tensor) -> bool:
    expected = 1
    for size, stride in zip(reversed(t.shape[1:]), reversed(t.stride()[1:])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def byte_rows(name: str, t: torch.Tensor, *, copy_ok: bool = False) -> torch.Tensor:
    """uint8 ``[rows, row_bytes]`` view of ``t``; ``copy_ok``: copy non-contiguous rows."""
    if copy_ok and not t.is_contiguous() and not _rows_contiguous(t):
        t = t.contiguous()
    return as_byte_rows(name, t)


def cast_for_storage(
    x: torch.Tensor, storage: torch.dtype, dtype: torch.dtype | None
) -> torch.Tensor:
    """Cast ``x`` to the logical ``dtype`` (default ``storage``), then view as ``storage``."""
    logical = storage if dtype is None else dtype
    y = x if x.dtype is logical else x.to(logical)  # a no-op .to still costs about 1 us
    return y if logical is storage else y.view(storage)


def as_logical(t: torch.Tensor, storage: torch.dtype, dtype: torch.dtype | None) -> torch.Tensor:
    """``t`` (holding ``storage`` values) viewed as the logical ``dtype`` when one is given."""
    return t.view(dtype) if dtype is not None and dtype != storage else t


def store_jobs(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dtype: torch.dtype | None,
) -> list[RowJob]:
    """``store_kv``: ``k -> k_cache`` and ``v -> v_cache`` (cast to the logical ``dtype``)."""
    k_src = cast_for_storage(k, k_cache.dtype, dtype)
    v_src = cast_for_storage(v, v_cache.dtype, dtype)
    return [
        (byte_rows("k", k_src, copy_ok=True), byte_rows("k_cache", k_cache)),
        (byte_rows("v", v_src, copy_ok=True), byte_rows("v_cache", v_cache)),
    ]


def mla_set_jobs(
    kv_buffer: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor, dtype: torch.dtype | None
) -> list[RowJob]:
    """``set_mla_kv_buffer``: nope and rope parts into the buffer's byte columns."""
    nope = cast_for_storage(k_nope, kv_buffer.dtype, dtype)
    rope = cast_for_storage(k_rope, kv_buffer.dtype, dtype)
    return mla_jobs(kv_buffer, nope, rope, to_buffer=True)


def mla_get_jobs(
    kv_buffer: torch.Tensor, rows: int, nope_dim: int
) -> tuple[torch.Tensor, torch.Tensor, list[RowJob]]:
    """``get_mla_kv_buffer``: zeroed ``(nope, rope)`` outputs of ``rows`` rows (the buffer's
    storage dtype) and the jobs that gather into them."""
    lead = (rows, *kv_buffer.shape[1:-1])
    dt, dev = kv_buffer.dtype, kv_buffer.device
    nope = torch.zeros((*lead, nope_dim), dtype=dt, device=dev)
    rope = torch.zeros((*lead, kv_buffer.shape[-1] - nope_dim), dtype=dt, device=dev)
    return nope, rope, mla_jobs(kv_buffer, nope, rope, to_buffer=False)


def copy_jobs(buffers: Sequence[torch.Tensor]) -> list[RowJob]:
    """``copy_all_layer_kv_cache``: every buffer onto itself."""
    return [
        (byte_rows(f"buffers[{i}]", b), byte_rows(f"buffers[{i}]", b))
        for i, b in enumerate(buffers)
    ]


def role_jobs(src: Sequence[torch.Tensor], dst: Sequence[torch.Tensor]) -> list[RowJob]:
    """One job per role: ``src[r] -> dst[r]`` (both ``[rows, *row]``)."""
    return [
        (as_byte_rows(f"src[{r}]", s), as_byte_rows(f"dst[{r}]", d))
        for r, (s, d) in enumerate(zip(src, dst))
    ]


def all_layer_jobs(
    src: Sequence[Sequence[torch.Tensor]], dst: Sequence[Sequence[torch.Tensor]]
) -> list[RowJob]:
    """One job per role and layer: ``src[r][l] -> dst[r][l]``."""
    return [
        (as_byte_rows(f"src[{r}][{i}]", s), as_byte_rows(f"dst[{r}][{i}]", d))
        for r, (src_layers, dst_layers) in enumerate(zip(src, dst))
        for i, (s, d) in enumerate(zip(src_layers, dst_layers))
    ]


def load_page_first_jobs(
    host: Sequence[torch.Tensor], device: Sequence[torch.Tensor], layer_id: int
) -> list[RowJob]:
    """Page-first host ``[slots, L, *row]`` at ``layer_id`` -> device layer ``[rows, *row]``."""
    return [
        (as_byte_rows(f"host[{r}]", h.select(1, layer_id)), as_byte_rows(f"device[{r}]", d))
        for r, (h, d) in enumerate(zip(host, device))
    ]


def backup_page_first_jobs(
    device: Sequence[Sequence[torch.Tensor]], host: Sequence[torch.Tensor]
) -> list[RowJob]:
    """Device layers ``[role][layer]`` -> page-first host ``[slots, L, *row]`` (every layer)."""
    return [
        (as_byte_rows(f"device[{r}][{i}]", d), as_byte_rows(f"host[{r}]", h.select(1, i)))
        for r, (layers, h) in enumerate(zip(device, host))
        for i, d in enumerate(layers)
    ]


def mla_jobs(
    kv_buffer: torch.Tensor, nope: torch.Tensor, rope: torch.Tensor, *, to_buffer: bool
) -> list[RowJob]:
    """Jobs between the nope/rope byte columns of an MLA buffer and separate nope/rope tensors.

    ``to_buffer`` True: ``nope -> buffer[:, :nope_bytes]``, ``rope -> buffer[:, nope_bytes:]``;
    False: the reverse (gather). ``nope``/``rope`` hold the storage dtype already.
    """
    buf = as_byte_rows("kv_buffer", kv_buffer)
    n_rows = byte_rows("k_nope", nope, copy_ok=to_buffer)
    r_rows = byte_rows("k_rope", rope, copy_ok=to_buffer)
    nb = n_rows.shape[1]
    parts = [(n_rows, buf[:, :nb]), (r_rows, buf[:, nb:])]
    return parts if to_buffer else [(b, x) for x, b in parts]


def row_bytes(t: torch.Tensor) -> int:
    """Bytes of one row (everything after the leading dimension)."""
    n = t.element_size()
    for size in t.shape[1:]:
        n *= size
    return n


def as_byte_rows(name: str, t: torch.Tensor) -> torch.Tensor:
    """View ``t`` (``[rows, *row]``, any row stride, C-contiguous rows) as uint8 ``[rows, bytes]``.

    No data is copied. Raises ``ValueError`` when a row is not contiguous in memory (the row
    stride itself may be anything, e.g. a page-first host buffer sliced at one layer).
    """
    if t.dtype is torch.uint8 and t.dim() == 2 and t.stride(1) == 1 and t.numel():
        return t  # already byte rows (a pool's cached view of its buffer): no view to build
    if t.is_contiguous() and t.dim() >= 1 and t.numel():  # the common case: one reshape
        u = t if t.dtype is torch.uint8 else t.view(torch.uint8)
        return u.view(t.shape[0], -1)
    if t.dim() < 1:
        raise ValueError(f"{name} must have a leading row dimension, got a 0-d tensor")
    if t.dim() == 1:
        t = t.unsqueeze(1)
    expected = 1
    for size, stride in zip(reversed(t.shape[1:]), reversed(t.stride()[1:])):
        if size != 1 and stride != expected:
            raise ValueError(
                f"{name} must have C-contiguous rows (inner strides {_contig_strides(t)}), "
                f"got strides {tuple(t.stride())} for shape {tuple(t.shape)}"
            )
        expected *= size
    rows = t.shape[0]
    row_elems = expected
    if row_elems == 0:
        raise ValueError(
            f"{name} must have rows of at least one element, got shape {tuple(t.shape)}"
        )
    row_stride = t.stride(0) if rows > 1 else row_elems
    flat = t.as_strided((rows, row_elems), (row_stride, 1))
    return flat.view(torch.uint8)


def _contig_strides(t: torch.Tensor) -> tuple[int, ...]:
    out: list[int] = []
    acc = 1
    for size in reversed(t.shape[1:]):
        out.append(acc)
        acc *= size
    return tuple(reversed(out))


# ----------------------------------------------------------------------------- the row ops
# One body per op, for both backends: the dispatch table binds each backend's executor
# (``_torch.rows.run_jobs`` / ``_triton.rows.run_jobs``) as the first argument, so the torch
# reference and the Triton kernels move exactly the same bytes. Arguments are trusted (the
# public ops of :mod:`mem_cache_kernels` and the pools check them). ``copy_all_layer_kv_cache``
# is not here: its Triton body is two-phase (overlap-safe), each backend has its own.
def store_kv(  # noqa: PLR0917
    run_jobs: RunJobs,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dtype: torch.dtype | None,
) -> None:
    """``k_cache[loc] = k``, ``v_cache[loc] = v`` (cast to ``dtype``, stored as the cache dtype)."""
    run_jobs(store_jobs(k_cache, v_cache, k, v, dtype), None, loc)


def set_mla_kv_buffer(  # noqa: PLR0917
    run_jobs: RunJobs,
    kv_buffer: torch.Tensor,
    loc: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    dtype: torch.dtype | None,
) -> None:
    """``kv_buffer[loc, ..., :nope] = k_nope``; ``kv_buffer[loc, ..., nope:] = k_rope``."""
    run_jobs(mla_set_jobs(kv_buffer, k_nope, k_rope, dtype), None, loc)


def get_mla_kv_buffer(
    run_jobs: RunJobs,
    kv_buffer: torch.Tensor,
    loc: torch.Tensor,
    nope_dim: int,
    dtype: torch.dtype | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather ``(kv_buffer[loc, ..., :nope_dim], kv_buffer[loc, ..., nope_dim:])`` (zeros for
    negative ``loc`` entries), viewed as ``dtype`` when given."""
    nope, rope, jobs = mla_get_jobs(kv_buffer, loc.shape[0], nope_dim)
    run_jobs(jobs, loc, None)
    return as_logical(nope, kv_buffer.dtype, dtype), as_logical(rope, kv_buffer.dtype, dtype)


def transfer_rows(
    run_jobs: RunJobs,
    src: Sequence[torch.Tensor],
    dst: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
) -> None:
    """One layer, layer-first both sides: ``dst[r][dst_indices] = src[r][src_indices]``."""
    run_jobs(role_jobs(src, dst), src_indices, dst_indices)


def transfer_rows_all_layers(
    run_jobs: RunJobs,
    src: Sequence[Sequence[torch.Tensor]],
    dst: Sequence[Sequence[torch.Tensor]],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
) -> None:
    """Every layer, ``[role][layer]`` both sides."""
    run_jobs(all_layer_jobs(src, dst), src_indices, dst_indices)


def load_layer_from_page_first(  # noqa: PLR0917
    run_jobs: RunJobs,
    host: Sequence[torch.Tensor],
    device: Sequence[torch.Tensor],
    host_indices: torch.Tensor,
    device_indices: torch.Tensor,
    layer_id: int,
) -> None:
    """Page-first host ``[slots, L, *row]`` at ``layer_id`` -> device layer ``[rows, *row]``."""
    run_jobs(load_page_first_jobs(host, device, layer_id), host_indices, device_indices)


def backup_all_layers_to_page_first(
    run_jobs: RunJobs,
    device: Sequence[Sequence[torch.Tensor]],
    host: Sequence[torch.Tensor],
    device_indices: torch.Tensor,
    host_indices: torch.Tensor,
) -> None:
    """Device layers ``[role][layer]`` -> page-first host ``[slots, L, *row]`` (every layer)."""
    run_jobs(backup_page_first_jobs(device, host), device_indices, host_indices)


# ----------------------------------------------------------------------------- runs of indices
def run_starts(src: torch.Tensor, dst: torch.Tensor, *, dst_step: int = 1) -> torch.Tensor:
    """Positions where a new run begins (``src`` +1 and ``dst`` +``dst_step`` otherwise).

    ``src``/``dst``: int64 tensors of equal length, no negative entries.
    """
    n = src.numel()
    brk = torch.ones(n, dtype=torch.bool, device=src.device)
    if n > 1:
        brk[1:] = (src[1:] != src[:-1] + 1) | (dst[1:] != dst[:-1] + dst_step)
    return torch.nonzero(brk, as_tuple=True)[0]


def find_runs(
    src: torch.Tensor, dst: torch.Tensor, *, dst_step: int = 1
) -> list[tuple[int, int, int]]:
    """Maximal runs ``(src_start, dst_start, length)`` of pairs where ``src`` advances by one and
    ``dst`` by ``dst_step``.

    ``src``/``dst`` are CPU int64 tensors of equal length; pairs with a negative index are dropped
    first (a dropped pair also ends a run). Vectorised; the only Python loop is the caller's loop
    over runs.
    """
    keep = (src >= 0) & (dst >= 0)
    n = src.numel()
    if n == 0:
        return []
    if bool(keep.all()):
        starts = run_starts(src, dst, dst_step=dst_step)
    else:
        pos = torch.nonzero(keep, as_tuple=True)[0]
        src, dst = src[keep], dst[keep]
        if src.numel() == 0:
            return []
        brk = torch.zeros(src.numel(), dtype=torch.bool)
        brk[run_starts(src, dst, dst_step=dst_step)] = True
        brk[1:] |= pos[1:] != pos[:-1] + 1  # a dropped pair breaks the run around it
        starts = torch.nonzero(brk, as_tuple=True)[0]
    ends = torch.cat([starts[1:], torch.tensor([src.numel()])])
    return list(
        zip(src[starts].tolist(), dst[starts].tolist(), (ends - starts).tolist(), strict=True)
    )
