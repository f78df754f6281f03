"""v2 multi-pool pages: ``batch_set_v2`` / ``batch_exists_v2`` / ``batch_get_v2`` with SGLang
0.5.23's own ``PoolTransfer`` / ``PoolHitPolicy`` objects over two host pools (KV and an SWA-like
pool), checked against SGLang's own ``HiCacheFile`` on the same directory (``key_scheme
sglang``): the same hit answers, each reads the other's pool pages bit-exact, and a damaged pool
page is a miss for ours."""

from __future__ import annotations

import tempfile
import types
from collections.abc import Callable
from pathlib import Path

import torch

from mem_cache_pool_host import MHATokenToKVPoolHost
from mem_cache_storage import HiCacheFile, HiCacheStorageConfig, page_hashes

from ._storage_support import mha_host

PS = 4


def _flat(host: MHATokenToKVPoolHost, slots: torch.Tensor) -> list[torch.Tensor]:
    return [host.get_data_page(int(i)).view(torch.int16).clone() for i in slots[::PS].tolist()]


def test_v2_pools_against_sglang_file_backend(
    sglang_load: Callable[..., list[types.ModuleType]],
) -> None:
    (hs,) = sglang_load("sglang.srt.mem_cache.hicache_storage")
    PT, POL = hs.PoolTransfer, hs.PoolHitPolicy
    with tempfile.TemporaryDirectory() as root:
        kv, swa = mha_host(1), mha_host(2)
        ours = HiCacheFile(HiCacheStorageConfig(model_name="m"),
                           {"storage_dir": root, "key_scheme": "sglang"})
        ours.register_mem_pool_host(kv)
        ours.register_mem_host_pool_v2(kv, hs.PoolName.KV)
        ours.register_mem_host_pool_v2(swa, hs.PoolName.SWA)
        theirs = hs.HiCacheFile(hs.HiCacheStorageConfig(
            tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
            model_name="m", extra_config={"file_storage_path": root}))
        kv2, swa2 = mha_host(3), mha_host(4)
        theirs.register_mem_pool_host(kv2)
        theirs.register_mem_host_pool_v2(kv2, hs.PoolName.KV)
        theirs.register_mem_host_pool_v2(swa2, hs.PoolName.SWA)
        n = 5
        keys = page_hashes(list(range(n * PS)), PS)
        kslots, sslots = kv.alloc(n * PS), swa.alloc(n * PS)
        res = ours.batch_set_v2([PT(hs.PoolName.KV, kslots, keys=keys),
                                 PT(hs.PoolName.SWA, sslots, keys=keys)])
        assert res == {"kv": [True] * n, "swa": [True] * n}
        # SWA pages of pages 0 and 1 go away (a window pool keeps only the tail)
        for k in keys[:2]:
            (Path(root) / f"{k}.swa_m_0_1.bin").unlink()
        for policy, trailing in ((POL.ALL_PAGES, None), (POL.TRAILING_PAGES, keys[:2]),
                                 (POL.TRAILING_PAGES, keys[:4])):
            pt = [PT(hs.PoolName.SWA, keys=trailing, hit_policy=policy)]
            a, b = ours.batch_exists_v2(keys, pt), theirs.batch_exists_v2(keys, pt)
            assert (a.kv_hit_pages, a.extra_pool_hit_pages, a.restorable_prefix_pages) == (
                b.kv_hit_pages, b.extra_pool_hit_pages, b.restorable_prefix_pages), policy
        assert ours.batch_exists_v2(keys, [PT("swa", keys=keys[:2],
                                              hit_policy=POL.TRAILING_PAGES)]).kv_hit_pages == n
        assert ours.batch_exists_v2(keys, [PT("swa")]).kv_hit_pages == 0  # all pages needed
        # SGLang reads the pool pages we wrote; we read pages SGLang wrote
        d_kv, d_swa = kv2.alloc(n * PS), swa2.alloc(n * PS)
        got = theirs.batch_get_v2([PT(hs.PoolName.KV, d_kv, keys=keys),
                                   PT(hs.PoolName.SWA, d_swa, keys=keys)])
        assert got == {"kv": [True] * n, "swa": [False, False, True, True, True]}
        assert all(torch.equal(a, b) for a, b in zip(_flat(kv, kslots), _flat(kv2, d_kv)))
        assert all(torch.equal(a, b) for a, b in
                   zip(_flat(swa, sslots)[2:], _flat(swa2, d_swa)[2:]))
        keys2 = page_hashes(list(range(100, 100 + n * PS)), PS)
        assert theirs.batch_set_v2([PT(hs.PoolName.SWA, d_swa, keys=keys2)]) == {
            "swa": [True] * n}
        back = swa.alloc(n * PS)
        assert ours.batch_get_v2([PT("swa", back, keys=keys2)]) == {"swa": [True] * n}
        assert all(torch.equal(a, b) for a, b in zip(_flat(swa2, d_swa), _flat(swa, back)))
        # a damaged pool page that we wrote is a miss for us (its side-car CRC)
        path = Path(root) / f"{keys[3]}.swa_m_0_1.bin"
        raw = bytearray(path.read_bytes())
        raw[7] = (raw[7] + 1) % 256
        path.write_bytes(bytes(raw))
        out = ours.batch_get_v2([PT("swa", back[: 3 * PS], keys=keys[2:])])
        assert out == {"swa": [True, False, True]}
        # an unregistered pool or wrong slot count: all False, nothing raised
        assert ours.batch_get_v2([PT("indexer", back, keys=keys[:2])]) == {"indexer": [False] * 2}
        assert ours.batch_set_v2([PT("swa", back[:PS], keys=keys[:2])]) == {"swa": [False] * 2}
