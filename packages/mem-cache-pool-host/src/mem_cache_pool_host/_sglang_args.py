"""The host pools' handling of SGLang 0.5.23's constructor arguments (checked once, at entry).

SGLang builds a host pool from geometry its caller prepared (dtype, bytes per token, layer range,
a capacity in GB or in tokens). Ours reads the geometry from the device pool's
:class:`~mem_cache_pool.base.KVBufferDesc`; SGLang's values, when given, must agree with it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels.checks import check_bool, check_int, check_number, check_optional_int
from mem_cache_pool.base import KVBufferDesc

__all__ = [
    "check_geometry",
    "check_no_draft_layers",
    "check_unsupported",
    "resolve_capacity_bytes",
]


def resolve_capacity_bytes(
    desc: KVBufferDesc,
    page_size: int,
    *,
    host_size: float,
    host_size_bytes: int | None,
    host_token_capacity: int | None,
) -> int | None:
    """The byte budget for :func:`~mem_cache_pool_host.capacity.plan_host_capacity` (``None``
    or 0: size by ratio).

    ``host_token_capacity`` (SGLang: positive and page aligned, else ``ValueError``) wins, then
    ``host_size`` (GB, SGLang's ``--hicache-size``), then ``host_size_bytes``; giving both of the
    last two (> 0) is a ``ValueError``.
    """
    check_number("host_size", host_size)
    if host_size < 0:
        raise ValueError(f"host_size must be >= 0 (GB), got {host_size}")
    check_optional_int("host_size_bytes", host_size_bytes)
    tokens = check_optional_int("host_token_capacity", host_token_capacity)
    if tokens is not None:
        if tokens <= 0 or tokens % page_size:
            raise ValueError(
                "host_token_capacity must be positive and a multiple of page_size="
                f"{page_size}, got {tokens}"
            )
        return tokens * desc.bytes_per_token
    if host_size > 0:
        if host_size_bytes:
            raise ValueError(
                f"give host_size (GB) or host_size_bytes, not both: got {host_size} and "
                f"{host_size_bytes}"
            )
        return int(host_size * 1e9)
    return host_size_bytes


def check_geometry(
    desc: KVBufferDesc,
    *,
    dtype: torch.dtype | None,
    size_per_token: int | None,
    start_layer: int | None,
    end_layer: int | None,
) -> None:
    """SGLang's geometry keywords, when given, equal the device pool's (else ``ValueError``)."""
    if dtype is not None:
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
        if dtype != desc.dtype:
            raise ValueError(f"dtype must be the device pool's {desc.dtype}, got {dtype}")
    expected = {
        "size_per_token": desc.bytes_per_token,
        "start_layer": desc.start_layer,
        "end_layer": desc.start_layer + desc.layer_num,
    }
    given = {"size_per_token": size_per_token, "start_layer": start_layer, "end_layer": end_layer}
    for name, value in given.items():
        if check_optional_int(name, value) is not None and value != expected[name]:
            raise ValueError(f"{name} must be the device pool's {expected[name]}, got {value}")


def check_no_draft_layers(draft_buffer_infos: object) -> None:
    """SGLang's packed MTP draft layers (``draft_buffer_infos``, its MHA and MLA host pools'
    argument) are not supported: ``TypeError`` unless a sequence, ``NotImplementedError`` unless
    empty."""
    if isinstance(draft_buffer_infos, (str, bytes)) or not isinstance(
        draft_buffer_infos, Sequence
    ):
        raise TypeError(
            f"draft_buffer_infos must be a sequence, got {type(draft_buffer_infos).__name__}"
        )
    if draft_buffer_infos:
        raise NotImplementedError("packed MTP draft layers (draft_buffer_infos) not supported")


def check_unsupported(*, dcp_size: int, dcp_rank: int, is_dummy: bool) -> None:
    """Features of SGLang's host pools this package does not have raise ``NotImplementedError``:
    decode context parallelism (``dcp_size > 1``, rank-striped rows) and allocator-only dummy
    pools (``is_dummy``, SGLang's MLA pools without host memory)."""
    check_int("dcp_size", dcp_size, minimum=1)
    check_int("dcp_rank", dcp_rank, minimum=0, maximum=dcp_size - 1)
    check_bool("is_dummy", is_dummy)
    if dcp_size != 1:
        raise NotImplementedError(
            f"dcp_size={dcp_size}: decode context parallel host pools are not supported"
        )
    if is_dummy:
        raise NotImplementedError("is_dummy=True: allocator-only host pools are not supported")
