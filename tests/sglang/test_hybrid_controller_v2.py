"""SGLang 0.5.23's own ``HybridCacheController`` (the serving controller of hybrid models, loaded
from the wheel, CPU) drives our storage backends through the v2 calls: its ``HostPoolGroup``
holds SGLang's MHA host pool (the KV anchor) and our ``MambaPoolHost``; it attaches our backend
through ``dynamic``, registers both pools (``register_mem_host_pool_v2``), writes a request's KV
pages and its Mamba state (``write_storage`` with a ``trailing_pages`` transfer: its backup
thread calls our ``batch_set_v2`` then the KV write), and prefetches them back (its hit query
calls our ``batch_exists_v2``, its IO thread our KV read then ``batch_get_v2``): KV pages and the
state come back bit-exact. A prefix whose state storage lost is no hit for SGLang's query. Our
own ``StorageController`` (extra pool ``mamba``) then reads what SGLang's controller stored.
"""

from __future__ import annotations

import tempfile
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mem_cache_pool import MHATokenToKVPool
from mem_cache_pool_host import MambaPoolHost, MHATokenToKVPoolHost
from mem_cache_storage import ExtraPool, HiCacheFile, HiCacheStorageConfig, StorageController

from ._storage_support import mamba_pools, random_bytes, sgl_load

PS, LAYERS = 16, 2


def _mods(sglang_load: Callable[..., list[types.ModuleType]]) -> types.SimpleNamespace:
    names = ("memory_pool", "allocator", "pool_host.mha", "pool_host", "utils",
             "hicache_storage", "base_prefix_cache")
    mods = sglang_load(*(f"sglang.srt.mem_cache.{n}" for n in names),
                       "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller",
                       "sglang.srt.runtime_context")
    ns = types.SimpleNamespace(**{n.replace(".", "_"): m for n, m in zip(names, mods)})
    ns.hcc, rc = mods[-2], mods[-1]
    rc.get_parallel().override_permanently(attn_dcp_size=1, attn_dcp_rank=0, tp_rank=0,
                                           tp_size=1, pp_rank=0, pp_size=1)
    return ns


def _states(host: MambaPoolHost, slot: int) -> list[torch.Tensor]:
    return [b[slot].view(torch.uint8).clone() for b in [host.temporal_buffer, *host.conv_buffer]]


def _kv_pages(host: Any, slots: torch.Tensor) -> list[torch.Tensor]:
    return [host.get_data_page(int(i), flat=True).view(torch.uint8).clone()
            for i in slots[::PS].tolist()]


def _extra(kind: str, root: str) -> dict[str, Any]:
    """The storage README's dynamic configuration of our ``kind`` backend."""
    cfg: dict[str, Any] = {
        "backend_name": f"mem_cache_{kind}", "module_path": "mem_cache_storage.sglang_backends",
        "class_name": {"file": "HiCacheFile", "memory": "HiCacheMemory"}[kind],
        "key_scheme": "sglang" if kind == "file" else "mem_cache", "interface_v1": 1,
    }
    if kind == "file":
        cfg["file_storage_path"] = root
    return cfg


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_sglang_hybrid_controller_moves_states_through_our_v2(
    sglang_load: Callable[..., list[types.ModuleType]], kind: str
) -> None:
    ns = _mods(sglang_load)
    hs = ns.hicache_storage
    kv = ns.memory_pool.MHATokenToKVPool(
        size=256, page_size=PS, dtype=torch.bfloat16, head_num=2, head_dim=8,
        layer_num=LAYERS, device="cpu", enable_memory_saver=False)
    host = ns.pool_host_mha.MHATokenToKVPoolHost(
        kv._mha_buffer_info(), 2.0, 0, PS, "page_first", pin_memory=False, device="cpu",
        device_capacity_tokens=256, start_layer=0, end_layer=LAYERS)
    alloc = ns.allocator.PagedTokenToKVPoolAllocator(256, PS, torch.bfloat16, "cpu", kv,
                                                     need_sort=True)
    mdev, mhost = mamba_pools()
    entry = ns.pool_host.PoolEntry
    group = ns.pool_host.HostPoolGroup([
        entry(hs.PoolName.KV, host, kv, lambda layer: layer, is_primary_index_anchor=True),
        entry(hs.PoolName.MAMBA, mhost, mdev, lambda layer: layer),
    ])
    ctl = ns.hcc.HybridCacheController(alloc, group, PS, None, threading.Event(),
                                       io_backend="direct")
    with tempfile.TemporaryDirectory() as root:
        ctl.attach_storage_backend("dynamic", model_name="m",
                                   storage_backend_extra_config=_extra(kind, root),
                                   host_pools=group.entries)
        try:
            backend = ctl.storage_backend
            assert type(backend).__module__ == "mem_cache_storage.sglang_backends"
            assert set(backend.registered_pools) == {"kv", "mamba"}
            n = 3
            tokens = list(range(1000, 1000 + n * PS))
            hashes = ns.utils.get_storage_hash_str(tokens, None, page_size=PS)
            src, state = host.alloc(n * PS), mhost.alloc(1)
            random_bytes([host.kv_buffer], seed=1)
            random_bytes([mhost.temporal_buffer, *mhost.conv_buffer], seed=2)
            want_kv, want_state = _kv_pages(host, src), _states(mhost, int(state[0]))
            pt, trailing = hs.PoolTransfer, hs.PoolHitPolicy.TRAILING_PAGES
            ctl.write_storage(src, tokens, hash_value=hashes, extra_pools=[
                pt(hs.PoolName.MAMBA, host_indices=state, keys=[hashes[-1]],
                   hit_policy=trailing)])
            op = ctl.ack_backup_queue.get(timeout=30)
            assert op.completed_tokens == n * PS
            assert op.pool_storage_result.extra_pool_hit_pages == {"mamba": 1}
            # a longer request: SGLang's query finds the 3-page prefix with its state
            dst_state = mhost.alloc(1)
            handle = ns.base_prefix_cache.CacheRequestHandle("r1", 0)
            hit, loaded, dst = sgl_load(ctl, host, handle, tokens + [7] * PS, extra_pools=[pt(
                hs.PoolName.MAMBA, host_indices=dst_state, keys=[hashes[-1]],
                hit_policy=trailing)])
            assert (hit, loaded) == (n * PS, n * PS)
            assert all(torch.equal(a, b) for a, b in zip(_kv_pages(host, dst), want_kv))
            assert all(torch.equal(a, b)
                       for a, b in zip(_states(mhost, int(dst_state[0])), want_state))
            assert backend.get_stats().get_hits == n + 1  # 3 KV pages and the state
            # our own controller (extra pool "mamba") reads what SGLang's controller stored
            if kind == "file":
                our_dev = MHATokenToKVPool(256, PS, torch.bfloat16, 2, 8, LAYERS, "cpu")
                our_kv = MHATokenToKVPoolHost(our_dev, 2.0, 0, PS, "page_first",
                                              pin_memory=False)
                _, our_states = mamba_pools()
                ours = StorageController(
                    HiCacheFile(HiCacheStorageConfig(model_name="m"),
                                {"storage_dir": root, "key_scheme": "sglang"}),
                    our_kv, extra_pools=[ExtraPool("mamba", our_states, "trailing_pages")])
                try:
                    got = ours.prefetch(hashes).wait(timeout=30)
                    assert (got.status, got.pages) == ("done", n)
                    assert all(torch.equal(a, b) for a, b in
                               zip(_kv_pages(our_kv, got.host_indices), want_kv))
                    slot = int(got.extra_host_indices["mamba"][0])
                    assert all(torch.equal(a, b)
                               for a, b in zip(_states(our_states, slot), want_state))
                finally:
                    ours.close()
                assert ours.reserved_pages == 0
                # storage loses the state: SGLang's hit query finds nothing restorable
                Path(root, f"{hashes[-1]}.mamba_m_0_1.bin").unlink()
                handle = ns.base_prefix_cache.CacheRequestHandle("r2", 0)
                miss = sgl_load(ctl, host, handle, tokens, extra_pools=[pt(
                    hs.PoolName.MAMBA, host_indices=mhost.alloc(1), keys=[hashes[-1]],
                    hit_policy=trailing)])
                assert miss[:2] == (0, 0)
        finally:
            ctl.detach_storage_backend()
