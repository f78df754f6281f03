"""The speculative-decoding intermediate state of :class:`~mem_cache_pool.mamba.MambaPool`.

Target verification keeps, per request slot and draft token, the SSM state
(``intermediate_ssm`` ``[L, spec + 1, D, *temporal]``) and the conv window
(``intermediate_conv_window[i]`` ``[L, spec + 1, D, *conv[i]]``). SGLang deduplicates the conv
windows on CUDA for a linear draft chain: consecutive draft tokens' ``K - 1`` windows overlap by
``K - 2``, so one ``[dim, D + K - 2]`` buffer per (layer, slot) backs an overlapping
``as_strided`` view of the same logical shape (a memory layout choice; the reads are equal).
"""

from __future__ import annotations

from typing import Any

import torch

from mem_cache_kernels import checks

__all__ = ["build_intermediate_state"]


def build_intermediate_state(  # noqa: PLR0917
    conv_shapes: list[tuple[int, ...]],
    temporal_shape: tuple[int, ...],
    dtypes: tuple[torch.dtype, torch.dtype],
    sizes: tuple[int, int, int],
    device: torch.device,
    cache_params: Any,
    dedup_conv_window: bool | None,
    speculative_eagle_topk: int | None,
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """``(intermediate_ssm, conv window views, their physical buffers)``, zeroed, for
    ``sizes = (layers, spec_state_size, draft tokens)`` and ``dtypes = (conv, temporal)``.
    ``dedup_conv_window=None`` applies SGLang's rule (on for a CUDA device with a linear draft
    chain and a non-KDA model; never when the shape sets ``disable_conv_window_dedup``)."""
    n_layers, spec, draft = sizes
    conv_dtype, ssm_dtype = dtypes
    shape = cache_params.shape
    if dedup_conv_window is None:  # SGLang's rule: CUDA, a linear draft chain, not KDA
        dedup_conv_window = (
            device.type == "cuda"
            and not bool(getattr(cache_params, "is_kda", False))
            and (speculative_eagle_topk is None or speculative_eagle_topk <= 1)
        )
    dedup = checks.check_bool("dedup_conv_window", dedup_conv_window) and not bool(
        getattr(shape, "disable_conv_window_dedup", False)
    )
    windows: list[torch.Tensor] = []
    physical: list[torch.Tensor] = []
    for s in conv_shapes:
        if dedup:
            phys, view = _dedup_window(s, n_layers, spec, draft, conv_dtype, device, shape)
        else:
            phys = view = torch.zeros(
                (n_layers, spec + 1, draft, *s), dtype=conv_dtype, device=device
            )
        physical.append(phys)
        windows.append(view)
    ssm = torch.zeros((n_layers, spec + 1, draft, *temporal_shape), dtype=ssm_dtype, device=device)
    return ssm, windows, physical


def _dedup_window(  # noqa: PLR0917
    conv_shape: tuple[int, ...],
    n_layers: int,
    spec: int,
    draft: int,
    dtype: torch.dtype,
    device: torch.device,
    shape: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One deduplicated conv window: ``[L, spec + 1, *conv_shape]`` with the window axis
    widened to ``D + K - 2`` (physical) and its ``as_strided`` view ``[L, spec + 1, D,
    *conv_shape]``."""
    win = int(getattr(shape, "conv_kernel", 0)) - 1
    if len(conv_shape) != 2 or win not in conv_shape:
        raise ValueError(
            f"conv shape {conv_shape} has no axis of length conv_kernel - 1 = {win}; cannot "
            "build the deduplicated conv window (pass dedup_conv_window=False)"
        )
    axis = 1 if conv_shape[1] == win else 0
    physical = list(conv_shape)
    physical[axis] = draft + win - 1
    phys = torch.zeros((n_layers, spec + 1, *physical), dtype=dtype, device=device)
    inner = phys.stride()[2:]
    view = phys.as_strided(
        (n_layers, spec + 1, draft, *conv_shape),
        (phys.stride(0), phys.stride(1), inner[axis], *inner),
    )
    return phys, view
