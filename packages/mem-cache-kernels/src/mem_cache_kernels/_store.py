"""KV store ops: ``store_kv`` (MHA K and V rows) and the MLA nope/rope ``set``/``get``.

A cache buffer is ``[rows, *row]`` (rows contiguous in memory). ``dtype`` is the *logical* dtype of
the cache: inputs are cast to it, then reinterpreted as the buffer's storage dtype (fp8 pools store
uint8), so the kernels only move bytes. A negative ``loc`` entry skips that row (nothing written;
reads give zeros).
"""

from __future__ import annotations

import torch

from mem_cache_kernels import checks as val
from mem_cache_kernels._layout import as_byte_rows
from mem_cache_kernels.dispatch import Backend, pick

__all__ = ["get_mla_kv_buffer", "set_mla_kv_buffer", "store_kv"]


def _check_cache(name: str, cache: object) -> torch.Tensor:
    t = val.check_tensor_of(name, cache, min_dim=2, shape="[rows, *row]")
    as_byte_rows(name, t)  # raises if rows are not contiguous
    return t


def check_dtype_itemsize(name: str, logical: torch.dtype, storage: torch.dtype) -> None:
    """Check that ``logical`` values can be reinterpreted as ``storage`` (same item size)."""
    if logical.itemsize != storage.itemsize:
        raise ValueError(
            f"{name} must have the item size of the storage dtype {storage} "
            f"({storage.itemsize} bytes), got {logical} ({logical.itemsize} bytes)"
        )


def _check_logical(
    name: str, cache: torch.Tensor, x: torch.Tensor, dtype: torch.dtype | None
) -> None:
    """Check that ``x`` can be stored in ``cache`` given the logical ``dtype``."""
    if dtype is None:
        if cache.dtype == torch.uint8 and x.dtype != torch.uint8:
            raise TypeError(
                f"{name} is {x.dtype} but the cache stores uint8: pass dtype= the logical "
                f"(e.g. fp8) dtype of the cache"
            )
        return
    if dtype != cache.dtype:
        check_dtype_itemsize("dtype", dtype, cache.dtype)


def _check_loc_rows(loc: torch.Tensor, cache: torch.Tensor, name: str) -> None:
    val.check_index_range("loc", loc, cache.shape[0], name)


def store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
    backend: Backend = "auto",
) -> None:
    """Write ``k_cache[loc] = k`` and ``v_cache[loc] = v``.

    Shapes: caches ``[rows, H, D]`` / ``[rows, Hv, Dv]``, inputs ``[n, *row]``
    matching the caches' row shapes, ``loc`` int32/int64 ``[n]``; all on one device. Inputs are cast
    to ``dtype`` (default: the cache dtype) and stored bit-exactly as the cache's storage dtype;
    ``dtype`` must have the storage dtype's item size. Only the ``loc`` rows of the caches change.
    """
    kc = _check_cache("k_cache", k_cache)
    vc = _check_cache("v_cache", v_cache)
    idx = val.check_index("loc", loc)
    kx = val.check_tensor("k", k)
    vx = val.check_tensor("v", v)
    logical = val.check_dtype_arg("dtype", dtype)
    for name, x, cache in (("k", kx, kc), ("v", vx, vc)):
        if x.dim() != cache.dim() or x.shape[1:] != cache.shape[1:]:
            raise ValueError(
                f"{name} must have shape [n, {', '.join(map(str, cache.shape[1:]))}] to match its "
                f"cache, got {tuple(x.shape)}"
            )
        _check_logical(name, cache, x, logical)
    if kx.shape[0] != idx.shape[0] or vx.shape[0] != idx.shape[0]:
        raise ValueError(
            f"k, v and loc must have the same number of rows, got k={kx.shape[0]}, "
            f"v={vx.shape[0]}, loc={idx.shape[0]}"
        )
    val.check_same_device(kc.device, v_cache=vc, loc=idx, k=kx, v=vx)
    _check_loc_rows(idx, kc, "k_cache")
    _check_loc_rows(idx, vc, "v_cache")
    impl = pick("store_kv", backend, kc, vc, idx, kx, vx)
    impl(kc, vc, idx, kx, vx, logical)


def _check_mla_buffer(kv_buffer: object) -> torch.Tensor:
    buf = _check_cache("kv_buffer", kv_buffer)
    for size in buf.shape[1:-1]:
        if size != 1:
            raise ValueError(
                f"kv_buffer must be [rows, D] or [rows, 1, D] (one latent head), got shape "
                f"{tuple(buf.shape)}"
            )
    return buf


def set_mla_kv_buffer(
    kv_buffer: torch.Tensor,
    loc: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
    backend: Backend = "auto",
) -> None:
    """Write ``kv_buffer[loc, ..., :nope] = k_nope`` and ``kv_buffer[loc, ..., nope:] = k_rope``.

    ``kv_buffer`` ``[rows, 1, D]`` (or ``[rows, D]``); ``k_nope`` ``[n, 1, nope]``, ``k_rope``
    ``[n, 1, D - nope]`` (same middle dims as the buffer); no concatenation is materialised.
    ``dtype``: as in :func:`store_kv`.
    """
    buf = _check_mla_buffer(kv_buffer)
    idx = val.check_index("loc", loc)
    nope = val.check_tensor("k_nope", k_nope)
    rope = val.check_tensor("k_rope", k_rope)
    logical = val.check_dtype_arg("dtype", dtype)
    for name, x in (("k_nope", nope), ("k_rope", rope)):
        if x.dim() != buf.dim() or x.shape[1:-1] != buf.shape[1:-1] or x.shape[0] != idx.shape[0]:
            raise ValueError(
                f"{name} must have shape [{idx.shape[0]}, "
                f"{', '.join(map(str, buf.shape[1:-1]))}{', ' if buf.dim() > 2 else ''}d], "
                f"got {tuple(x.shape)}"
            )
        _check_logical(name, buf, x, logical)
    if min(nope.shape[-1], rope.shape[-1]) < 1 or nope.shape[-1] + rope.shape[-1] != buf.shape[-1]:
        raise ValueError(
            f"k_nope and k_rope last dims must be >= 1 and sum to the buffer's {buf.shape[-1]}, "
            f"got {nope.shape[-1]} + {rope.shape[-1]}"
        )
    val.check_same_device(buf.device, loc=idx, k_nope=nope, k_rope=rope)
    _check_loc_rows(idx, buf, "kv_buffer")
    pick("set_mla_kv_buffer", backend, buf, idx, nope, rope)(buf, idx, nope, rope, logical)


def get_mla_kv_buffer(
    kv_buffer: torch.Tensor,
    loc: torch.Tensor,
    nope_dim: int,
    *,
    dtype: torch.dtype | None = None,
    backend: Backend = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather rows ``loc`` into new tensors ``(nope [n, 1, nope_dim], rope [n, 1, D - nope_dim])``.

    The results are viewed as ``dtype`` when given (same item size as the storage dtype, e.g. fp8
    over uint8). Rows of negative ``loc`` entries are zero. ``kv_buffer`` is not modified.
    """
    buf = _check_mla_buffer(kv_buffer)
    idx = val.check_index("loc", loc)
    nd = val.check_int("nope_dim", nope_dim, minimum=1)
    if nd >= buf.shape[-1]:
        raise ValueError(f"nope_dim must be < the buffer's last dim {buf.shape[-1]}, got {nd}")
    logical = val.check_dtype_arg("dtype", dtype)
    if logical is not None and logical != buf.dtype:
        check_dtype_itemsize("dtype", logical, buf.dtype)
    val.check_same_device(buf.device, loc=idx)
    _check_loc_rows(idx, buf, "kv_buffer")
    impl = pick("get_mla_kv_buffer", backend, buf, idx)
    result: tuple[torch.Tensor, torch.Tensor] = impl(buf, idx, nd, logical)
    return result
