"""Host-driven ("direct") transfers: one slice copy per maximal run of consecutive rows or pages.

No kernel: the index tensors are moved to the CPU once, maximal runs where both the source and the
destination indices advance by one are found with vectorised torch ops, and each run of at least
32 KiB is one ``copy_`` per buffer (shorter runs are gathered and scattered with torch index ops,
the torch reference's row copy, which is faster for them; page-first-direct ops treat whole pages
as rows when the device pages are page-aligned), issued with ``non_blocking=True`` like a kernel
launch (synchronise the current stream before reading pinned host memory written by a
device-to-host copy). The
``page_first_direct`` host layout is per role ``[pages, L, page_size, *row]``; its indices are
*slot* indices (host page row = ``idx // page_size``). Indices are page-granular:
``numel % page_size == 0`` and every page's ``page_size`` indices are consecutive (checked). A
negative index skips its row (``direct_transfer_rows``) or its whole page (page-first-direct ops:
the page's first index decides).

``backend`` is accepted for a uniform signature and validated, but every backend runs the same
host-driven copies. Each public op checks its arguments once, then runs its trusted body, which
checks nothing and lives in the torch executor (:mod:`mem_cache_kernels._torch.rows`):
``direct_transfer_rows`` runs the all-layer row copy (``dispatch.TABLE``'s torch column), the
page-first-direct ops run ``load_layer_pages`` / ``backup_all_layer_pages``
(``dispatch.SINGLE``). A host pool that checked its own arguments picks the bodies directly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels import _layout as lay
from mem_cache_kernels import checks as v
from mem_cache_kernels._torch.rows import backup_all_layer_pages, load_layer_pages, run_jobs
from mem_cache_kernels._transfer import check_layers, check_page_first, check_role_pair
from mem_cache_kernels.dispatch import Backend, check_backend

__all__ = [
    "direct_backup_all_layers_to_page_first_direct",
    "direct_load_layer_from_page_first_direct",
    "direct_transfer_rows",
]


def _cpu_indices(
    a: object, b: object, a_name: str, b_name: str, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    ai = v.check_index(a_name, a)
    bi = v.check_index(b_name, b)
    v.check_same_length(**{a_name: ai, b_name: bi})
    if ai.numel() % page_size:
        raise ValueError(
            f"{a_name} length must be a multiple of page_size {page_size}, got {ai.numel()}"
        )
    return ai.to("cpu", torch.int64), bi.to("cpu", torch.int64)


def _check_page_granular(
    name: str, idx: torch.Tensor, page_size: int, aligned: bool, *, row_skips: bool = False
) -> None:
    """Every live page of ``idx`` holds ``page_size`` consecutive indices (a page is live when its
    first index is >= 0, or with ``row_skips`` when none of its indices is negative: there a
    negative index skips its row only)."""
    if page_size == 1 or idx.numel() == 0:
        return
    pages = idx.view(-1, page_size)
    first = pages[:, :1]
    live = (pages >= 0).all(dim=1) if row_skips else first[:, 0] >= 0
    step = torch.arange(page_size, dtype=torch.int64)
    bad = torch.nonzero(live & ~(pages == first + step).all(dim=1))
    if bad.numel():
        p = int(bad[0, 0])
        raise ValueError(
            f"{name} must hold whole pages of {page_size} consecutive indices, got "
            f"{pages[p].tolist()} at page {p}"
        )
    if aligned and bool((first[live] % page_size != 0).any()):
        raise ValueError(f"{name} pages must start at multiples of page_size {page_size}")


def direct_transfer_rows(
    src: Sequence[Sequence[torch.Tensor]],
    dst: Sequence[Sequence[torch.Tensor]],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    page_size: int,
    *,
    backend: Backend = "auto",
) -> None:
    """Layer-first both sides, ``[role][layer]``:
    ``dst[r][l][dst_indices] = src[r][l][src_indices]``, one slice copy per run (host-driven)."""
    check_backend(backend)
    ps = v.check_page_size(page_size)
    s = check_layers("src", src, None)
    d = check_layers("dst", dst, len(s))
    if len(s[0]) != len(d[0]):
        raise ValueError(f"dst must have {len(s[0])} layers per role like src, got {len(d[0])}")
    si, di = _cpu_indices(src_indices, dst_indices, "src_indices", "dst_indices", ps)
    _check_page_granular("src_indices", si, ps, aligned=False, row_skips=True)
    _check_page_granular("dst_indices", di, ps, aligned=False, row_skips=True)
    pairs = [(a, b) for sl, dl in zip(s, d) for a, b in zip(sl, dl)]
    s_top, d_top = v.IndexBound("src_indices", si), v.IndexBound("dst_indices", di)
    for i, (a, b) in enumerate(pairs):
        check_role_pair(f"src (buffer {i})", a, f"dst (buffer {i})", b)
        s_top.check(a.shape[0], f"src (buffer {i})")
        d_top.check(b.shape[0], f"dst (buffer {i})")
    # the trusted body: the torch executor's all-layer row copy (dispatch.TABLE's
    # transfer_rows_all_layers, torch column): one slice copy per run of >= 32 KiB, shorter runs
    # gathered/scattered. A host pool that checked its own arguments calls that row directly.
    lay.transfer_rows_all_layers(run_jobs, s, d, si, di)


def direct_load_layer_from_page_first_direct(  # noqa: PLR0917
    host: Sequence[torch.Tensor],
    device: Sequence[torch.Tensor],
    host_indices: torch.Tensor,
    device_indices: torch.Tensor,
    layer_id: int,
    page_size: int,
    *,
    backend: Backend = "auto",
) -> None:
    """Host page-first-direct ``[pages, L, page_size, *row]`` -> one device layer ``[rows, *row]``:
    for each page, ``device[r][d:d+ps] = host[r][h // ps, layer_id]`` (runs coalesced)."""
    check_backend(backend)
    ps = v.check_page_size(page_size)
    h = check_page_first("host", host, None, min_dim=4)
    d = v.check_tensor_list("device", device, length=len(h))
    layer = v.check_int("layer_id", layer_id, minimum=0)
    hi, di = _cpu_indices(host_indices, device_indices, "host_indices", "device_indices", ps)
    _check_page_granular("host_indices", hi, ps, aligned=True)
    _check_page_granular("device_indices", di, ps, aligned=False)
    h_top, d_top = v.IndexBound("host_indices", hi // ps), v.IndexBound("device_indices", di)
    for r, (a, b) in enumerate(zip(h, d)):
        if layer >= a.shape[1]:
            raise ValueError(f"layer_id must be < host[{r}].shape[1] = {a.shape[1]}, got {layer}")
        if a.shape[2] != ps:
            raise ValueError(
                f"host[{r}] must be [pages, L, page_size = {ps}, *row], got {tuple(a.shape)}"
            )
        check_role_pair(f"host[{r}][:, layer_id, 0]", a[:, layer, 0], f"device[{r}]", b)
        h_top.check(a.shape[0], f"host[{r}] pages")
        d_top.check(b.shape[0], f"device[{r}]")
    load_layer_pages(h, d, hi, di, layer, ps)


def direct_backup_all_layers_to_page_first_direct(
    device: Sequence[Sequence[torch.Tensor]],
    host: Sequence[torch.Tensor],
    device_indices: torch.Tensor,
    host_indices: torch.Tensor,
    page_size: int,
    *,
    backend: Backend = "auto",
) -> None:
    """Device layers ``[role][layer]`` -> host page-first-direct ``[pages, L, page_size, *row]``,
    every layer: ``host[r][h // ps, l] = device[r][l][d:d+ps]`` per page (runs coalesced)."""
    check_backend(backend)
    ps = v.check_page_size(page_size)
    d = check_layers("device", device, None)
    h = check_page_first("host", host, len(d), min_dim=4)
    di, hi = _cpu_indices(device_indices, host_indices, "device_indices", "host_indices", ps)
    _check_page_granular("host_indices", hi, ps, aligned=True)
    _check_page_granular("device_indices", di, ps, aligned=False)
    h_top, d_top = v.IndexBound("host_indices", hi // ps), v.IndexBound("device_indices", di)
    for r, (layers, a) in enumerate(zip(d, h)):
        if a.shape[2] != ps or a.shape[1] != len(layers):
            raise ValueError(
                f"host[{r}] must be [pages, {len(layers)}, {ps}, *row], got {tuple(a.shape)}"
            )
        h_top.check(a.shape[0], f"host[{r}] pages")
        for i, b in enumerate(layers):
            check_role_pair(f"device[{r}][{i}]", b, f"host[{r}][:, {i}, 0]", a[:, i, 0])
            d_top.check(b.shape[0], f"device[{r}][{i}]")
    backup_all_layer_pages(d, h, di, hi, ps)


