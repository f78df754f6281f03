"""Host<->device KV row transfers through kernels (layer-first and page-first host layouts).

A *role* is one buffer kind (``("k", "v")`` for MHA, ``("kv",)`` for MLA); every op takes one
tensor (or one list of per-layer tensors) per role, so one function serves MHA and MLA. A *row* is
one token of one layer of one role (``row_bytes`` bytes). Layouts:

* device / layer-first: per role, per layer ``[rows, *row]``;
* host page-first: per role ``[slots, L, *row]`` (all layers of a token adjacent).

Rows are copied bit-exactly: ``dst[..][dst_indices[i]] = src[..][src_indices[i]]``; a pair with a
negative index is skipped. Source and destination may be on different devices (host tensors must be
pinned for the Triton path). Index tensors: int32/int64, equal lengths, any device (moved where
needed). Offsets are 64-bit: rows beyond 2**31 bytes from a buffer's start work.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels import checks as v
from mem_cache_kernels._layout import as_byte_rows, row_bytes
from mem_cache_kernels.dispatch import Backend, pick

__all__ = [
    "backup_all_layers_to_page_first",
    "check_layers",
    "check_page_first",
    "check_role_pair",
    "load_layer_from_page_first",
    "transfer_rows",
    "transfer_rows_all_layers",
]


def check_role_pair(src_name: str, src: torch.Tensor, dst_name: str, dst: torch.Tensor) -> None:
    """Rows of ``src`` and ``dst`` must have equal byte sizes and contiguous rows."""
    as_byte_rows(src_name, src)
    as_byte_rows(dst_name, dst)
    sb = row_bytes(src)
    if sb != row_bytes(dst):
        raise ValueError(
            f"{dst_name} rows must have the {sb} bytes of {src_name} rows, got {row_bytes(dst)}"
        )


def check_layers(name: str, value: object, roles: int | None) -> list[list[torch.Tensor]]:
    """``[role][layer]`` nested sequence of tensors, every role with the same layer count."""
    if isinstance(value, torch.Tensor) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence (roles) of sequences (layers) of tensors")
    items = list(value)
    if not items or (roles is not None and len(items) != roles):
        want = "at least 1" if roles is None else str(roles)
        raise ValueError(f"{name} must hold {want} roles, got {len(items)}")
    layers = [v.check_tensor_list(f"{name}[{r}]", layer) for r, layer in enumerate(items)]
    counts = {len(ls) for ls in layers}
    if len(counts) != 1:
        raise ValueError(f"{name} must have the same layer count per role, got {sorted(counts)}")
    return layers


def check_page_first(
    name: str, value: object, roles: int | None, min_dim: int = 3
) -> list[torch.Tensor]:
    """Per-role host buffers with a ``[slots, L, ...]`` layout."""
    host = v.check_tensor_list(name, value, length=roles)
    for r, h in enumerate(host):
        v.check_tensor_of(f"{name}[{r}]", h, min_dim=min_dim)
    return host


def _indices(
    src_indices: object, dst_indices: object, src_name: str, dst_name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    si = v.check_index(src_name, src_indices)
    di = v.check_index(dst_name, dst_indices)
    v.check_same_length(**{src_name: si, dst_name: di})
    return si, di


def _one_device(name: str, tensors: Sequence[torch.Tensor]) -> torch.device:
    device = tensors[0].device
    v.check_same_device(device, **{f"{name}[{i}]": t for i, t in enumerate(tensors)})
    return device


def transfer_rows(
    src: Sequence[torch.Tensor],
    dst: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> None:
    """One layer, layer-first both sides: ``dst[r][dst_indices] = src[r][src_indices]`` per role."""
    s = v.check_tensor_list("src", src)
    d = v.check_tensor_list("dst", dst, length=len(s))
    si, di = _indices(src_indices, dst_indices, "src_indices", "dst_indices")
    _one_device("src", s)
    _one_device("dst", d)
    s_top, d_top = v.IndexBound("src_indices", si), v.IndexBound("dst_indices", di)
    for r, (a, b) in enumerate(zip(s, d)):
        check_role_pair(f"src[{r}]", a, f"dst[{r}]", b)
        s_top.check(a.shape[0], f"src[{r}]")
        d_top.check(b.shape[0], f"dst[{r}]")
    pick("transfer_rows", backend, *s, *d, si, di)(s, d, si, di)


def transfer_rows_all_layers(
    src: Sequence[Sequence[torch.Tensor]],
    dst: Sequence[Sequence[torch.Tensor]],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> None:
    """Every layer, layer-first both sides: ``src[r][l] -> dst[r][l]`` for all roles and layers."""
    s = check_layers("src", src, None)
    d = check_layers("dst", dst, len(s))
    if len(s[0]) != len(d[0]):
        raise ValueError(f"dst must have {len(s[0])} layers per role like src, got {len(d[0])}")
    si, di = _indices(src_indices, dst_indices, "src_indices", "dst_indices")
    flat_s = [t for layers in s for t in layers]
    flat_d = [t for layers in d for t in layers]
    _one_device("src", flat_s)
    _one_device("dst", flat_d)
    s_top, d_top = v.IndexBound("src_indices", si), v.IndexBound("dst_indices", di)
    for r in range(len(s)):
        for i, (a, b) in enumerate(zip(s[r], d[r])):
            check_role_pair(f"src[{r}][{i}]", a, f"dst[{r}][{i}]", b)
            s_top.check(a.shape[0], f"src[{r}][{i}]")
            d_top.check(b.shape[0], f"dst[{r}][{i}]")
    pick("transfer_rows_all_layers", backend, *flat_s, *flat_d, si, di)(s, d, si, di)


def load_layer_from_page_first(
    host: Sequence[torch.Tensor],
    device: Sequence[torch.Tensor],
    host_indices: torch.Tensor,
    device_indices: torch.Tensor,
    layer_id: int,
    *,
    backend: Backend = "auto",
) -> None:
    """Page-first host ``[slots, L, *row]`` -> one device layer ``[rows, *row]``, per role:
    ``device[r][device_indices] = host[r][host_indices, layer_id]`` (``layer_id`` = local index
    into the host L axis)."""
    h = check_page_first("host", host, None)
    d = v.check_tensor_list("device", device, length=len(h))
    hi, di = _indices(host_indices, device_indices, "host_indices", "device_indices")
    layer = v.check_int("layer_id", layer_id, minimum=0)
    _one_device("host", h)
    _one_device("device", d)
    h_top, d_top = v.IndexBound("host_indices", hi), v.IndexBound("device_indices", di)
    for r, (a, b) in enumerate(zip(h, d)):
        if layer >= a.shape[1]:
            raise ValueError(f"layer_id must be < host[{r}].shape[1] = {a.shape[1]}, got {layer}")
        check_role_pair(f"host[{r}][:, layer_id]", a.select(1, layer), f"device[{r}]", b)
        h_top.check(a.shape[0], f"host[{r}]")
        d_top.check(b.shape[0], f"device[{r}]")
    pick("load_layer_from_page_first", backend, *h, *d, hi, di)(h, d, hi, di, layer)


def backup_all_layers_to_page_first(
    device: Sequence[Sequence[torch.Tensor]],
    host: Sequence[torch.Tensor],
    device_indices: torch.Tensor,
    host_indices: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> None:
    """Device layers ``[role][layer]`` -> page-first host ``[slots, L, *row]``, every layer:
    ``host[r][host_indices, l] = device[r][l][device_indices]``."""
    d = check_layers("device", device, None)
    h = check_page_first("host", host, len(d))
    di, hi = _indices(device_indices, host_indices, "device_indices", "host_indices")
    flat_d = [t for layers in d for t in layers]
    _one_device("device", flat_d)
    _one_device("host", h)
    h_top, d_top = v.IndexBound("host_indices", hi), v.IndexBound("device_indices", di)
    for r, (layers, a) in enumerate(zip(d, h)):
        if a.shape[1] != len(layers):
            raise ValueError(
                f"host[{r}].shape[1] must equal the {len(layers)} device layers, got {a.shape[1]}"
            )
        h_top.check(a.shape[0], f"host[{r}]")
        for i, b in enumerate(layers):
            check_role_pair(f"device[{r}][{i}]", b, f"host[{r}][:, {i}]", a.select(1, i))
            d_top.check(b.shape[0], f"device[{r}][{i}]")
    pick("backup_all_layers_to_page_first", backend, *flat_d, *h, di, hi)(d, h, di, hi)
