"""Builds the memory stack (device pool, allocator, request table, host pool) from a config, and
writes/reads K/V rows with the deterministic content through the device pool's public API."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mem_cache_allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from mem_cache_pool import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool
from mem_cache_pool_host import MHATokenToKVPoolHost, MLATokenToKVPoolHost
from tools.simulate.config import SimConfig
from tools.simulate.content import ContentModel

__all__ = ["MemoryStack", "build_stack"]

DevicePool = MHATokenToKVPool | MLATokenToKVPool
Allocator = TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator
HostPool = MHATokenToKVPoolHost | MLATokenToKVPoolHost


@dataclass(slots=True)
class MemoryStack:
    """The four packages wired together the way an engine wires them.

    ``device_capacity`` / ``host_capacity`` are the token capacities the allocators report when
    empty; the leak check compares against them at the end.
    """

    cfg: SimConfig
    device: torch.device
    kv_pool: DevicePool
    allocator: Allocator
    req_pool: ReqToTokenPool
    host_pool: HostPool
    content: ContentModel
    page_size: int
    device_capacity: int
    host_capacity: int
    req_capacity: int
    bytes_per_token: int

    @property
    def layer_ids(self) -> range:
        return range(self.kv_pool.start_layer, self.kv_pool.start_layer + self.kv_pool.layer_num)

    def write_kv(self, loc: torch.Tensor, sessions: torch.Tensor, positions: torch.Tensor) -> None:
        """Write every layer's rows for tokens (``sessions[i]``, ``positions[i]``) at ``loc[i]``.

        MLA alternates between ``set_kv_buffer`` (packed rows) and ``set_mla_kv_buffer``
        (nope/rope halves) by layer, so both write paths carry verified data.
        """
        pool = self.kv_pool
        content = self.content
        h = content.hashes(sessions, positions, pool.layer_num)
        for i, layer_id in enumerate(self.layer_ids):
            if isinstance(pool, MHATokenToKVPool):
                k = content.rows_from(h[i, 0], 0)
                v = content.rows_from(h[i, 1], 1)
                pool.set_kv_buffer(layer_id, loc, k, v)
            else:
                kv = content.rows_from(h[i, 0], 0)
                if i % 2 == 0:
                    pool.set_kv_buffer(layer_id, loc, kv, None)
                else:
                    rank = pool.kv_lora_rank
                    pool.set_mla_kv_buffer(layer_id, loc, kv[..., :rank], kv[..., rank:])

    def layer_rows(self, layer_index: int, loc: torch.Tensor) -> list[torch.Tensor]:
        """Rows ``loc`` of local layer ``layer_index``, one tensor per role, read through
        ``get_key_buffer``/``get_value_buffer`` (which wait on a registered layer counter)."""
        layer_id = self.kv_pool.start_layer + layer_index
        key = self.kv_pool.get_key_buffer(layer_id)
        if isinstance(self.kv_pool, MHATokenToKVPool):
            return [key[loc], self.kv_pool.get_value_buffer(layer_id)[loc]]
        return [key[loc]]

    def hashes(self, sessions: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Content hashes ``[layers, roles, n]`` of the given tokens (see ``ContentModel``)."""
        return self.content.hashes(sessions, positions, self.kv_pool.layer_num)

    def count_mismatches(self, layer_index: int, loc: torch.Tensor, h: torch.Tensor) -> int:
        """Tokens at ``loc`` whose stored rows of ``layer_index`` (any role) differ from the
        content with hashes ``h`` (``[layers, roles, n]``)."""
        bad = 0
        for role, rows in enumerate(self.layer_rows(layer_index, loc)):
            bad = max(bad, self.content.mismatches(rows, h[layer_index, role], role))
        return bad


def build_stack(cfg: SimConfig, max_context_len: int) -> MemoryStack:
    """Construct every pool of ``cfg`` on ``cfg.device`` (host pool on the CPU)."""
    device = torch.device(cfg.device)
    ps = cfg.page_size
    size = cfg.device_tokens // ps * ps
    dtype = cfg.torch_dtype
    kv_pool: DevicePool
    if cfg.model == "mha":
        kv_pool = MHATokenToKVPool(size, ps, dtype, cfg.heads, cfg.head_dim, cfg.layers, device)
    else:
        kv_pool = MLATokenToKVPool(
            size, ps, dtype, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.layers, device
        )
    allocator: Allocator
    if ps == 1:
        allocator = TokenToKVPoolAllocator(size, dtype, device, kv_pool)
    else:
        allocator = PagedTokenToKVPoolAllocator(size, ps, dtype, device, kv_pool)
    req_pool = ReqToTokenPool(cfg.max_running, max_context_len, device)
    desc = kv_pool.get_buffer_desc()
    host_cls = MHATokenToKVPoolHost if cfg.model == "mha" else MLATokenToKVPoolHost
    host_pool = host_cls(
        kv_pool,
        host_size_bytes=cfg.host_tokens // ps * ps * desc.bytes_per_token,
        layout=cfg.host_layout,
        pin_memory=device.type == "cuda",
        io_backend=cfg.io_backend,
    )
    content = ContentModel(desc.row_shape, dtype, device, cfg.seed, cfg.shared_prefix_tokens)
    return MemoryStack(
        cfg=cfg,
        device=device,
        kv_pool=kv_pool,
        allocator=allocator,
        req_pool=req_pool,
        host_pool=host_pool,
        content=content,
        page_size=ps,
        device_capacity=allocator.available_size(),
        host_capacity=host_pool.available_size(),
        req_capacity=req_pool.available_size(),
        bytes_per_token=desc.bytes_per_token,
    )
