"""One store, two engines: an SGLang 0.5.23 instance (its own ``HiCacheController`` and its own
``HiCacheFile``) and an engine on our packages (our ``StorageController``, our host pool and our
``HiCacheFile`` with ``key_scheme="sglang"``) share one directory. Same model, same tokens: each
reads the pages the other wrote (hits both ways, bytes verified against the writer's host
pages), for MHA and MLA, ``page_first`` and ``page_first_direct``. Integrity holds in that scheme:
a page SGLang wrote that was truncated, and a page we wrote that was flipped, are misses.
"""

from __future__ import annotations

import os
import tempfile
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mem_cache_pool import MHATokenToKVPool, MLATokenToKVPool
from mem_cache_pool_host import MHATokenToKVPoolHost, MLATokenToKVPoolHost
from mem_cache_storage import HiCacheFile, HiCacheStorageConfig, StorageController, page_hashes

from ._storage_support import sgl_load
from .test_storage_sglang_loads_ours import (
    LAYERS,
    PS,
    _mods,
    fill,
    sgl_write,
    sglang_stack,
)


def _our_host(layout: str, mla: bool) -> Any:
    if mla:
        dev = MLATokenToKVPool(256, PS, torch.bfloat16, 16, 8, LAYERS, "cpu")
        return MLATokenToKVPoolHost(dev, 2.0, 0, PS, layout, pin_memory=False)
    dev = MHATokenToKVPool(256, PS, torch.bfloat16, 2, 8, LAYERS, "cpu")
    return MHATokenToKVPoolHost(dev, 2.0, 0, PS, layout, pin_memory=False)


def _flat(host: Any, slots: torch.Tensor) -> list[torch.Tensor]:
    return [host.get_data_page(int(i), flat=True).view(torch.int16).clone()
            for i in slots[::PS].tolist()]


@pytest.fixture(scope="module")
def ns(sglang_load: Callable[..., list[types.ModuleType]]) -> types.SimpleNamespace:
    return _mods(sglang_load)


@pytest.mark.parametrize("pool", ["mha-page_first", "mha-page_first_direct", "mla-page_first",
                                  "mla-page_first_direct"])
def test_sglang_and_ours_read_each_others_pages(ns: types.SimpleNamespace, pool: str) -> None:
    model, layout = pool.split("-")
    mla = model == "mla"
    with tempfile.TemporaryDirectory() as root:
        sgl, sgl_host = sglang_stack(ns, layout, mla)
        sgl.attach_storage_backend("file", model_name="org/m",
                                   storage_backend_extra_config={"file_storage_path": root})
        host = _our_host(layout, mla)
        ours = HiCacheFile(HiCacheStorageConfig(model_name="org/m", is_mla_model=mla),
                           {"storage_dir": root, "key_scheme": "sglang"})
        ctl = StorageController(ours, host)
        try:
            assert type(sgl.storage_backend).__module__ == "sglang.srt.mem_cache.hicache_storage"
            n = 4
            # SGLang writes A; we read it
            tok_a = list(range(100, 100 + n * PS))
            keys_a = ns.utils.get_storage_hash_str(tok_a, None, page_size=PS)
            assert keys_a == page_hashes(tok_a, PS)
            src = sgl_host.alloc(n * PS)
            fill(sgl_host, src, seed=1)
            want_a = _flat(sgl_host, src)
            assert sgl_write(sgl, src, tok_a, keys_a) == n * PS
            res = ctl.prefetch(keys_a).wait(timeout=30)
            assert res.status == "done" and res.pages == n
            assert all(torch.equal(a, b) for a, b in zip(want_a, _flat(host, res.host_indices)))
            host.free(res.host_indices)
            # we write B; SGLang reads it
            tok_b = list(range(5000, 5000 + n * PS))
            keys_b = page_hashes(tok_b, PS)
            slots = host.alloc(n * PS)
            for first in slots[::PS].tolist():
                page = host.get_dummy_flat_data_page()
                page.view(torch.int16).copy_(torch.randint(-999, 999, page.view(torch.int16).shape,
                                                           dtype=torch.int16))
                host.set_from_flat_data_page(first, page)
            want_b = _flat(host, slots)
            assert ctl.write(keys_b, slots).written == n
            hit, loaded, dst = sgl_load(sgl, sgl_host, "rb", tok_b)
            assert (hit, loaded) == (n * PS, n * PS)
            assert all(torch.equal(a, b) for a, b in zip(want_b, _flat(sgl_host, dst)))
            # one name per page, SGLang's: {hash}_{model}[_{tp_rank}_{tp_size}].bin
            suffix = "_org-m.bin" if mla else "_org-m_0_1.bin"
            names = {p.name for p in Path(root).iterdir() if p.suffix == ".bin"}
            assert names == {f"{k}{suffix}" for k in keys_a + keys_b}
            # integrity: SGLang's page truncated, ours flipped -> misses, never wrong bytes
            with open(Path(root) / f"{keys_a[1]}{suffix}", "r+b") as f:
                f.truncate(os.path.getsize(f.name) - 2)
            path_b = Path(root) / f"{keys_b[2]}{suffix}"
            raw = bytearray(path_b.read_bytes())
            raw[len(raw) // 3] ^= 0x01
            path_b.write_bytes(bytes(raw))
            got = ctl.prefetch(keys_a).wait(timeout=30)
            assert got.status == "done" and got.pages == 1
            host.free(got.host_indices)
            got = ctl.prefetch(keys_b).wait(timeout=30)
            assert got.status == "done" and got.pages == 2
            assert all(torch.equal(a, b) for a, b in zip(want_b, _flat(host, got.host_indices)))
            host.free(got.host_indices)
            assert ours.get_stats().rejected == 2
        finally:
            ctl.close()
            sgl.detach_storage_backend()
        assert ctl.reserved_pages == 0


@pytest.mark.parametrize("shape", [
    {"tp_rank": 1, "tp_size": 2}, {"is_mla_model": True, "tp_rank": 1, "tp_size": 2},
    {"pp_rank": 1, "pp_size": 2}, {"attn_cp_rank": 1, "attn_cp_size": 4, "tp_size": 4},
    {"is_mla_model": True, "pp_rank": 0, "pp_size": 3},
])
def test_sglang_scheme_names_match_sglang_file_backend(
    ns: types.SimpleNamespace, shape: dict[str, Any]
) -> None:
    """Every rank shape: our ``sglang`` scheme's suffixes are SGLang's file backend's, and a
    page's file name is ``{hash}{config_suffix}.bin`` (Mamba states: ``tp_config_suffix``)."""
    full = {"tp_rank": 0, "tp_size": 1, "pp_rank": 0, "pp_size": 1, "attn_cp_rank": 0,
            "attn_cp_size": 1, "is_mla_model": False, **shape}
    with tempfile.TemporaryDirectory() as root:
        theirs = ns.hicache_storage.HiCacheFile(ns.hicache_storage.HiCacheStorageConfig(
            **full, enable_storage_metrics=False, is_page_first_layout=True,
            model_name="org/model-1.5", extra_config={"file_storage_path": root}))
        ours = HiCacheFile(HiCacheStorageConfig(**full, model_name="org/model-1.5"),
                           {"storage_dir": root, "key_scheme": "sglang", "page_size": PS})
        assert ours.config_suffix == theirs.config_suffix
        assert ours.tp_config_suffix == theirs.tp_config_suffix
        key = "ab" * 32
        assert ours.page_path(key).name == f"{theirs._get_suffixed_key(key)}.bin"
        assert ours.page_path(f"{key}.mamba").name == (
            f"{theirs._get_suffixed_key(key + '.mamba')}.bin")
        assert ours.page_path(f"{key}.swa").name == (
            f"{theirs._get_component_key(key, 'swa')}.bin")
