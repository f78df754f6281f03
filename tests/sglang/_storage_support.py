"""Builders and an SGLang controller driver shared by the storage tests of this folder: host
pools filled with seeded random bytes (every byte value, NaN patterns included) and SGLang's
prefetch as its scheduler and IO thread run it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mem_cache_pool import Mamba2CacheParams, Mamba2StateShape, MambaPool, MHATokenToKVPool
from mem_cache_pool_host import MambaPoolHost, MHATokenToKVPoolHost

__all__ = ["mamba_pools", "mha_host", "random_bytes", "sgl_load"]


def random_bytes(bufs: Sequence[torch.Tensor], seed: int) -> None:
    """Seeded random bytes into every buffer of ``bufs``, in order."""
    gen = torch.Generator().manual_seed(seed)
    for buf in bufs:
        raw = buf.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))


def mha_host(seed: int, *, page_size: int = 4, layout: str = "page_first") -> MHATokenToKVPoolHost:
    """A bf16 MHA host pool (2 heads x 8, 2 layers, twice a 64-slot device pool), every buffer
    filled from ``seed``."""
    dev = MHATokenToKVPool(64, page_size, torch.bfloat16, 2, 8, 2, "cpu")
    host = MHATokenToKVPoolHost(dev, 2.0, 0, page_size, layout, pin_memory=False)
    random_bytes(host.buffers, seed)
    return host


def mamba_pools(seed: int | None = None) -> tuple[MambaPool, MambaPoolHost]:
    """A two-layer Mamba2 device pool of 8 slots and its host pool; the host's state buffers
    filled from ``seed`` when one is given."""
    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=8, n_groups=1,
                                    num_heads=2, head_dim=4, state_size=4, conv_kernel=4)
    dev = MambaPool(size=8, spec_state_size=0,
                    cache_params=Mamba2CacheParams(shape=shape, layers=[0, 1]),
                    mamba_layer_ids=[0, 1], device="cpu")
    host = MambaPoolHost(dev, 2.0, 0, device_capacity=8, pin_memory=False)
    if seed is not None:
        random_bytes([host.temporal_buffer, *host.conv_buffer], seed)
    return dev, host


def sgl_load(ctl: Any, host: Any, request: Any, tokens: list[int],
             **prefetch: Any) -> tuple[int, int, torch.Tensor]:
    """SGLang's prefetch of ``request`` (a request id, or the cache handle of a hybrid
    controller; ``prefetch``: the rest of its ``prefetch`` arguments): its hit query, then (as
    the scheduler does) host slots for the hit and the IO thread's transfer. Returns (hit
    tokens, loaded tokens, host slots)."""
    ctl.prefetch(request, tokens, **prefetch)
    op = ctl.prefetch_hit_queue.get(timeout=30)
    hit = int(op.storage_hit_count)
    slots = host.alloc(hit) if hit else torch.empty(0, dtype=torch.int64)
    if not hit:
        return 0, 0, slots
    op.host_indices = slots
    ctl.prefetch_buffer.put(op)
    done = 0
    while True:
        ack = ctl.ack_prefetch_queue.get(timeout=30)
        if ack.completed_tokens is not None:
            done = max(done, int(ack.completed_tokens))
        if ack.completed_req:
            return hit, done, slots
