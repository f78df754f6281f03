"""Our ``StorageController``'s v2 path over SGLang 0.5.23's own ``HiCacheFile`` (loaded from the
wheel through our ``create_backend("dynamic")``): the KV pages go through SGLang's generic
``batch_set`` / ``batch_get`` (its v1 calls are stubs), the extra pools (a Mamba state pool with
``trailing_pages``, an indexer-like pool with ``all_pages``) through SGLang's own
``batch_exists_v2`` / ``batch_set_v2`` / ``batch_get_v2``, so SGLang's backend decides the
restorable prefix lengths. Bytes come back bit-exact; a state SGLang's backend no longer holds
makes that length unrestorable (a shorter prefix, or a miss) with every pool's slots released;
our own file backend with ``key_scheme="sglang"`` reads on the same directory what SGLang's
backend stored, state included.
"""

from __future__ import annotations

import tempfile
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mem_cache_storage import (
    ExtraPool,
    HiCacheFile,
    HiCacheStorageConfig,
    StorageController,
    create_backend,
    page_hashes,
)

from ._storage_support import mamba_pools, mha_host

PS = 4


def _pages(pool: Any, slots: torch.Tensor) -> list[torch.Tensor]:
    ps = int(pool.page_size)
    return [pool.get_data_page(int(s)).view(torch.uint8).clone() for s in slots[::ps]]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_our_v2_controller_over_sglang_hicachefile(
    sglang_load: Callable[..., list[types.ModuleType]],
) -> None:
    (hs,) = sglang_load("sglang.srt.mem_cache.hicache_storage")
    with tempfile.TemporaryDirectory() as root:
        config = HiCacheStorageConfig(model_name="m", extra_config={
            "backend_name": "sglang_file", "module_path": "sglang.srt.mem_cache.hicache_storage",
            "class_name": "HiCacheFile", "file_storage_path": root})
        kv, idx, mamba = mha_host(1), mha_host(2), mamba_pools(3)[1]
        backend = create_backend("dynamic", config, kv)
        assert type(backend) is hs.HiCacheFile
        ctl = StorageController(backend, kv, extra_pools=[
            ExtraPool("indexer", idx, "all_pages"), ExtraPool("mamba", mamba, "trailing_pages")])
        keys = page_hashes(list(range(6 * PS)), PS)
        try:
            assert ctl.generic_io and set(backend.registered_pools) == {"indexer", "mamba"}
            src = {"kv": kv.alloc(6 * PS), "indexer": idx.alloc(6 * PS), "mamba": mamba.alloc(2)}
            want = (_pages(kv, src["kv"]), _pages(idx, src["indexer"]),
                    _pages(mamba, src["mamba"]))
            # two cached prefixes: 3 pages (state in slot 0) and 6 pages (state in slot 1)
            for n, st in ((3, src["mamba"][:1]), (6, src["mamba"][1:])):
                res = ctl.write(keys[:n], src["kv"][: n * PS],
                                {"indexer": src["indexer"][: n * PS], "mamba": st})
                assert res.failed == 0 and res.extra_failed == 0
            names = {p.name for p in Path(root).iterdir()}
            assert f"{keys[2]}.mamba_m_0_1.bin" in names and f"{keys[5]}.mamba_m_0_1.bin" in names
            assert ctl.lookup(keys) == 6 and ctl.lookup(keys[:5]) == 3  # SGLang's answer
            free0 = (kv.available_size(), idx.available_size(), mamba.available_size())
            got = ctl.prefetch(keys[:5]).wait(timeout=30)
            assert (got.status, got.pages) == ("done", 3)
            extra = got.extra_host_indices
            assert _same(_pages(kv, got.host_indices), want[0][:3])
            assert _same(_pages(idx, extra["indexer"]), want[1][:3])
            assert _same(_pages(mamba, extra["mamba"]), want[2][:1])
            kv.free(got.host_indices)
            idx.free(extra["indexer"])
            mamba.free(extra["mamba"])
            # the 3-page state goes away in SGLang's store: 5 pages restore nothing now
            (Path(root) / f"{keys[2]}.mamba_m_0_1.bin").unlink()
            assert ctl.lookup(keys[:5]) == 0
            miss = ctl.prefetch(keys[:5]).wait(timeout=30)
            assert (miss.status, miss.pages) == ("miss", 0)
            assert (kv.available_size(), idx.available_size(), mamba.available_size()) == free0
            # our file backend (SGLang's key scheme) reads what SGLang's backend stored
            ours = HiCacheFile(HiCacheStorageConfig(model_name="m"),
                               {"storage_dir": root, "key_scheme": "sglang"})
            kv2, idx2, mamba2 = mha_host(4), mha_host(5), mamba_pools(6)[1]
            ctl2 = StorageController(ours, kv2, extra_pools=[
                ExtraPool("indexer", idx2, "all_pages"),
                ExtraPool("mamba", mamba2, "trailing_pages")])
            try:
                got2 = ctl2.prefetch(keys).wait(timeout=30)
                assert (got2.status, got2.pages) == ("done", 6)
                assert _same(_pages(kv2, got2.host_indices), want[0])
                assert _same(_pages(idx2, got2.extra_host_indices["indexer"]), want[1])
                assert _same(_pages(mamba2, got2.extra_host_indices["mamba"]), want[2][1:])
            finally:
                ctl2.close()
            assert ctl2.reserved_pages == 0
            st = ctl.stats()
            assert st.pools["mamba"].pages_written == 2 and st.pools["mamba"].pages_loaded == 1
            assert st.pools["indexer"].pages_written == 6  # 3 skipped by the second write
        finally:
            ctl.close()
        assert ctl.reserved_pages == 0
