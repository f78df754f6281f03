"""We load SGLang 0.5.23's backends: our ``create_backend("dynamic")`` builds SGLang's own
``HiCacheFile`` from our config (it reads every field SGLang's backends read, ``dcp_size``
included), and our ``StorageController`` writes and prefetches through it bit-exact over our host
pool, using the generic ``batch_get`` / ``batch_set`` because SGLang's file backend leaves the v1
calls as its base class's stubs.
"""

from __future__ import annotations

import tempfile
import types
from collections.abc import Callable

import torch

from mem_cache_pool_host import MHATokenToKVPoolHost
from mem_cache_storage import HiCacheStorageConfig, StorageController, create_backend, page_hashes

from ._storage_support import mha_host

PS = 4


def _pages(host: MHATokenToKVPoolHost, slots: torch.Tensor) -> list[torch.Tensor]:
    return [host.get_data_page(int(s)).view(torch.int16).clone() for s in slots[::PS]]


def test_our_controller_over_sglang_hicachefile(
    sglang_load: Callable[..., list[types.ModuleType]],
) -> None:
    (hs,) = sglang_load("sglang.srt.mem_cache.hicache_storage")
    with tempfile.TemporaryDirectory() as root:
        config = HiCacheStorageConfig(model_name="m", extra_config={
            "backend_name": "sglang_file", "module_path": "sglang.srt.mem_cache.hicache_storage",
            "class_name": "HiCacheFile", "file_storage_path": root})
        host = mha_host(11)
        backend = create_backend("dynamic", config, host)
        assert type(backend) is hs.HiCacheFile
        ctl = StorageController(backend, host)
        try:
            assert ctl.generic_io  # SGLang's file backend has no v1: the generic calls
            tokens = list(range(6 * PS))
            keys = page_hashes(tokens, PS)
            src = host.alloc(6 * PS)
            want = _pages(host, src)
            result = ctl.write(keys, src)
            assert (result.written, result.failed) == (6, 0)
            assert sorted(p.name for p in __import__("pathlib").Path(root).iterdir()) == sorted(
                f"{k}_m_0_1.bin" for k in keys)
            assert ctl.lookup(keys) == 6
            res = ctl.prefetch([*keys, "f" * 64]).wait(timeout=30)
            assert res.status == "done" and res.pages == 6
            got = _pages(host, res.host_indices)
            assert all(torch.equal(a, b) for a, b in zip(want, got))
            host.free(res.host_indices)
            # a second write skips what SGLang's backend already holds
            assert ctl.write(keys, src).skipped == 6
        finally:
            ctl.close()
        assert ctl.reserved_pages == 0


def test_our_config_carries_every_field_sglang_backends_read(
    sglang_load: Callable[..., list[types.ModuleType]],
) -> None:
    import dataclasses

    (hs,) = sglang_load("sglang.srt.mem_cache.hicache_storage")
    theirs = {f.name for f in dataclasses.fields(hs.HiCacheStorageConfig)}
    ours = {f.name for f in dataclasses.fields(HiCacheStorageConfig)}
    assert theirs <= ours, theirs - ours
    assert HiCacheStorageConfig().is_storage_writer
    assert not HiCacheStorageConfig(tp_rank=1, tp_size=2, is_mla_model=True).is_storage_writer
    # SGLang's config object is accepted by ours, field for field
    theirs_cfg = hs.HiCacheStorageConfig(
        tp_rank=1, tp_size=2, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="m", extra_config={"a": 1})
    mine = HiCacheStorageConfig.from_any(theirs_cfg)
    assert all(getattr(mine, n) == getattr(theirs_cfg, n) for n in theirs)
