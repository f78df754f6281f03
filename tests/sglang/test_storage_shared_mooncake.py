"""One Mooncake store, two engines: SGLang 0.5.23's own ``MooncakeStore`` (its client, over its
host pool) and our ``HiCacheMooncake`` with ``key_scheme="sglang"`` (over our host pool) on one
local store (``tools.mooncake.store``). Each reads the pages the other wrote, bit-exact: SGLang's
objects are ``{model}_{hash}_{tp_rank}_k`` / ``_v`` (MHA) or ``{model}_{hash}__k`` (MLA), raw
bytes. A page we wrote that was damaged in the store is a miss for us (side-car CRC)."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from mem_cache_storage import HiCacheStorageConfig, StorageController, page_hashes
from mem_cache_storage.mooncake import HiCacheMooncake
from tools.mooncake.store import LocalMooncakeStore

from .test_storage_sglang_loads_ours import PS, _mods, fill, sglang_stack
from .test_storage_shared_store import _flat, _our_host


@pytest.fixture(scope="module")
def ns(sglang_load: Callable[..., list[types.ModuleType]]) -> types.SimpleNamespace:
    out = _mods(sglang_load)
    (out.mc,) = sglang_load("sglang.srt.mem_cache.storage.mooncake_store.mooncake_store")
    return out


@pytest.fixture(scope="module")
def store() -> Iterator[LocalMooncakeStore]:
    with LocalMooncakeStore(segment_bytes=64 << 20) as s:
        yield s


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_sglang_mooncake_and_ours_share_pages(
    ns: types.SimpleNamespace, store: LocalMooncakeStore, mla: bool
) -> None:
    opts: dict[str, Any] = store.client_options()
    model = f"org/mc-{'mla' if mla else 'mha'}"
    _, sgl_host = sglang_stack(ns, "page_first", mla)
    cfg = ns.hicache_storage.HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=model, extra_config={
            "master_server_address": opts["master_server_address"],
            "metadata_server": opts["metadata_server"], "protocol": "tcp",
            "global_segment_size": 0, "local_hostname": "127.0.0.1"})
    theirs = ns.mc.MooncakeStore(cfg, sgl_host)
    theirs.register_mem_pool_host(sgl_host)  # as SGLang's controller does after create
    host = _our_host("page_first", mla)
    ours = HiCacheMooncake(HiCacheStorageConfig(model_name=model, is_mla_model=mla),
                           {**opts, "key_scheme": "sglang"})
    ctl = StorageController(ours, host)
    try:
        n = 3
        # SGLang writes A (zero copy, its batch_set_v1); we read it
        tok_a = list(range(7, 7 + n * PS))
        keys_a = page_hashes(tok_a, PS)
        src = sgl_host.alloc(n * PS)
        fill(sgl_host, src, seed=5)
        want_a = _flat(sgl_host, src)
        assert theirs.batch_set_v1(keys_a, src) == [True] * n
        res = ctl.prefetch(keys_a).wait(timeout=60)
        assert res.status == "done" and res.pages == n
        assert all(torch.equal(a, b) for a, b in zip(want_a, _flat(host, res.host_indices)))
        host.free(res.host_indices)
        # we write B; SGLang reads it
        tok_b = list(range(900, 900 + n * PS))
        keys_b = page_hashes(tok_b, PS)
        slots = host.alloc(n * PS)
        for first in slots[::PS].tolist():
            page = host.get_dummy_flat_data_page()
            page.view(torch.int16).copy_(torch.randint(-999, 999, page.view(torch.int16).shape,
                                                       dtype=torch.int16))
            host.set_from_flat_data_page(first, page)
        want_b = _flat(host, slots)
        assert ctl.write(keys_b, slots).written == n
        assert theirs.batch_exists(keys_b) == n
        dst = sgl_host.alloc(n * PS)
        assert theirs.batch_get_v1(keys_b, dst) == [True] * n
        assert all(torch.equal(a, b) for a, b in zip(want_b, _flat(sgl_host, dst)))
        # integrity: one of our pages overwritten in the store behind our back -> a miss
        bad = sgl_host.alloc(PS)
        fill(sgl_host, bad, seed=99)
        suffix = "_" if mla else "_0"
        okey = f"{model.replace('/', '-')}_{keys_b[1]}{suffix}_k"
        client = ours.client.store
        page = sgl_host.get_data_page(int(bad[0]), flat=True).contiguous()
        k_bytes = page.numel() * page.element_size() // (1 if mla else 2)
        assert client.batch_upsert_from([okey], [page.data_ptr()], [k_bytes]) == [0]
        got = ctl.prefetch(keys_b).wait(timeout=60)
        assert got.status == "done" and got.pages == 1
        host.free(got.host_indices)
        assert ours.get_stats().rejected >= 1
    finally:
        ctl.close()
        ours.close()
        theirs.close()
