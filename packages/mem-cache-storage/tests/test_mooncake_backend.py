"""The Mooncake backend on a real store: a ``mooncake_master`` with its HTTP metadata server and
a holder process on loopback ports (``tools.mooncake.store``), clients in this process and in
separate engine processes (``_mooncake_worker.py``).

If the store cannot start (client library or system libraries missing, binary missing), these
tests fail with the reason: ``python3 tools/dev env`` installs everything they need.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from mem_cache_pool import MHATokenToKVPool, MLATokenToKVPool
from mem_cache_pool_host import MHATokenToKVPoolHost, MLATokenToKVPoolHost
from mem_cache_storage.config import HiCacheStorageConfig
from mem_cache_storage.mooncake import HEADER_BYTES, HiCacheMooncake, key_tag
from tools.mooncake.store import LocalMooncakeStore

WORKER = Path(__file__).with_name("_mooncake_worker.py")
ROOT = Path(__file__).resolve().parents[3]
PAGE = 16


@pytest.fixture(scope="module")
def store() -> Iterator[LocalMooncakeStore]:
    with LocalMooncakeStore(segment_bytes=128 << 20) as s:
        yield s


def _host(kind: str, layout: str, seed: int = 0) -> MHATokenToKVPoolHost | MLATokenToKVPoolHost:
    if kind == "mha":
        dev = MHATokenToKVPool(32 * PAGE, PAGE, torch.bfloat16, 2, 8, 3, "cpu")
        host: MHATokenToKVPoolHost | MLATokenToKVPoolHost = MHATokenToKVPoolHost(
            dev, host_to_device_ratio=2.0, layout=layout, pin_memory=False)
    else:
        dev = MLATokenToKVPool(32 * PAGE, PAGE, torch.bfloat16, 16, 8, 3, "cpu")
        host = MLATokenToKVPoolHost(dev, host_to_device_ratio=2.0, layout=layout,
                                    pin_memory=False)
    gen = torch.Generator().manual_seed(seed)
    for buf in host.buffers:
        raw = buf.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    return host


def _backend(store: LocalMooncakeStore, host: object | None = None, *, model: str = "t",
             mla: bool = False, **opts: object) -> HiCacheMooncake:
    cfg = HiCacheStorageConfig(model_name=model, is_mla_model=mla,
                               extra_config={**store.client_options(), **opts})
    b = HiCacheMooncake(cfg, host if host is not None else {"page_size": PAGE})
    assert b.connected, b.last_error
    return b


def _pages(host: object, idx: torch.Tensor, n: int) -> list[torch.Tensor]:
    return [host.get_data_page(int(idx[i * PAGE])).view(torch.uint8).clone()  # type: ignore[attr-defined]
            for i in range(n)]


@pytest.mark.parametrize(("kind", "layout"), [("mha", "page_first"), ("mha", "layer_first"),
                                              ("mla", "page_first"), ("mla", "layer_first")])
def test_zero_copy_round_trip_bit_exact(store: LocalMooncakeStore, kind: str, layout: str) -> None:
    host = _host(kind, layout, seed=1)
    b = _backend(store, host, model=f"rt-{kind}-{layout}", mla=kind == "mla")
    try:
        idx = host.alloc(4 * PAGE)
        assert idx is not None
        want = _pages(host, idx, 4)
        keys = [f"p{i}" for i in range(4)]
        assert b.batch_exists(keys) == 0
        assert b.batch_set_v1(keys, idx) == [True] * 4
        assert b.batch_exists(keys) == 4
        assert b.batch_exists([keys[0], "absent", keys[2]]) == 1
        other = host.alloc(4 * PAGE)
        assert other is not None
        for buf in host.buffers:
            buf.view(torch.uint8)[:] = 0
        assert b.batch_get_v1(keys, other) == [True] * 4
        for i, page in enumerate(_pages(host, other, 4)):
            assert torch.equal(page, want[i])
        assert b.batch_get_v1(["absent"], other[:PAGE]) == [False]
        assert b.get_stats().get_hits == 4
    finally:
        b.clear()
        b.close()


def test_registers_pool_once_and_unregisters_on_close(store: LocalMooncakeStore) -> None:
    host = _host("mha", "layer_first")
    b = _backend(store, host, model="reg")
    regs = dict(b.client.registered)
    for buf in host.buffers:
        assert regs[int(buf.data_ptr())] == buf.numel() * buf.element_size()
    idx = host.alloc(2 * PAGE)
    assert idx is not None
    b.batch_set_v1(["a", "b"], idx)
    b.batch_get_v1(["a", "b"], idx)
    assert b.client.registered == regs  # no per-call registration on the zero-copy path
    b.close()
    assert b.client.registered == {}
    assert not b.connected
    assert b.batch_get_v1(["a"], idx[:PAGE]) == [False]  # closed: a miss, not an exception
    b.close()  # idempotent


def test_writes_only_missing_keys_and_last_value_wins(
    store: LocalMooncakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = _host("mha", "page_first", seed=3)
    b = _backend(store, host, model="missing")
    put_keys: list[str] = []
    upsert_keys: list[str] = []
    put, upsert = b._put_chunk, b._upsert_chunk
    monkeypatch.setattr(b, "_put_chunk", lambda k, *a: put_keys.extend(k) or put(k, *a))
    monkeypatch.setattr(b, "_upsert_chunk", lambda k, *a: upsert_keys.extend(k) or upsert(k, *a))
    try:
        idx = host.alloc(2 * PAGE)
        assert idx is not None
        assert b.batch_set_v1(["k0"], idx[:PAGE]) == [True]
        sk0, sk1 = b.storage_key("k0"), b.storage_key("k1")
        assert put_keys == [sk0]
        # k0 is present with the same bytes: only k1 is written
        assert b.batch_set_v1(["k0", "k1"], idx) == [True, True]
        assert put_keys == [sk0, sk1] and upsert_keys == []
        for buf in host.buffers:  # new bytes in the same slots: k0 is replaced
            buf.view(torch.uint8).add_(1)
        newer = _pages(host, idx, 1)[0]
        assert b.batch_set_v1(["k0"], idx[:PAGE]) == [True]
        assert upsert_keys == [sk0]
        for buf in host.buffers:
            buf.view(torch.uint8)[:] = 0
        assert b.batch_get_v1(["k0"], idx[:PAGE]) == [True]
        assert torch.equal(_pages(host, idx, 1)[0], newer)
        # copying path too
        flat = host.get_data_page(int(idx[PAGE])).clone()
        inverted = flat.view(torch.uint8).bitwise_not().view(flat.dtype)
        assert b.set("c", flat)
        assert b.set("c", inverted)
        out = torch.empty_like(flat)
        assert b.get("c", out) is out
        assert torch.equal(out.view(torch.uint8), inverted.view(torch.uint8))
    finally:
        b.clear()
        b.close()


def test_foreign_or_corrupted_objects_are_misses(store: LocalMooncakeStore) -> None:
    host = _host("mha", "page_first", seed=4)
    b = _backend(store, host, model="corrupt")
    try:
        idx = host.alloc(PAGE)
        assert idx is not None
        assert b.batch_set_v1(["x"], idx) == [True]
        skey = b.storage_key("x")
        size = HEADER_BYTES + _pages(host, idx, 1)[0].numel()
        raw = torch.empty(size, dtype=torch.uint8)
        store_client = b.client.store
        assert store_client.get_into(skey, raw.data_ptr(), size) == size
        assert int.from_bytes(raw[28:36].numpy()
                              .tobytes(), "little") == key_tag(skey)
        # flip one payload byte and store the object back under the same key
        raw[HEADER_BYTES + 5] ^= 0xFF
        assert store_client.upsert_from(skey, raw.data_ptr(), size) == 0
        rejected = b.get_stats().rejected
        assert b.batch_get_v1(["x"], idx) == [False]
        assert b.get_stats().rejected == rejected + 1
        # an object of another size under a key: a miss too
        assert store_client.upsert_from(b.storage_key("y"), raw.data_ptr(), size - 8) == 0
        assert b.batch_get_v1(["y"], idx) == [False]
        # the same key seen through another format (the copying path's flat page) is a miss
        assert b.batch_set_v1(["z"], idx) == [True]
        assert b.get("z", torch.empty_like(host.get_data_page(int(idx[0])))) is None
    finally:
        b.clear()
        b.close()


def test_ranks_and_models_do_not_share_keys(store: LocalMooncakeStore) -> None:
    host = _host("mha", "page_first", seed=5)
    opts = store.client_options()
    a = HiCacheMooncake(HiCacheStorageConfig(model_name="m", tp_rank=0, tp_size=2,
                                             extra_config=opts), host)
    c = HiCacheMooncake(HiCacheStorageConfig(model_name="m", tp_rank=1, tp_size=2,
                                             extra_config=opts), host)
    d = HiCacheMooncake(HiCacheStorageConfig(model_name="m2", extra_config=opts), host)
    try:
        idx = host.alloc(PAGE)
        assert idx is not None
        assert a.batch_set_v1(["h"], idx) == [True]
        assert a.batch_exists(["h"]) == 1
        assert c.batch_exists(["h"]) == 0
        assert d.batch_exists(["h"]) == 0
        c.clear()  # clears only its own rank's keys
        assert a.batch_exists(["h"]) == 1
    finally:
        for x in (a, c, d):
            x.clear()
            x.close()


def test_options_from_environment_and_validation(
    store: LocalMooncakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in store.env().items():
        monkeypatch.setenv(k, v)
    b = HiCacheMooncake(None, {"page_size": PAGE, "replica_num": 1,
                               "replicate_config": {"with_hard_pin": False}})
    assert b.connected and b.settings.master_server_address == store.master_address
    assert b.settings.protocol == "tcp"
    b.close()
    with pytest.raises(ValueError, match="protocol"):
        HiCacheMooncake(None, {"page_size": PAGE, "protocol": "udp"})
    with pytest.raises(ValueError, match="replica_num"):
        HiCacheMooncake(None, {"page_size": PAGE, "replica_num": 0})
    with pytest.raises(TypeError, match="replicate_config"):
        HiCacheMooncake(None, {"page_size": PAGE, "replicate_config": 3})


def test_registry_builds_it(store: LocalMooncakeStore) -> None:
    from mem_cache_storage.registry import create_backend

    host = _host("mha", "page_first")
    cfg = HiCacheStorageConfig(model_name="reg", extra_config=store.client_options())
    b = create_backend("mooncake", cfg, host)
    assert isinstance(b, HiCacheMooncake) and b.connected
    b.close()


def _worker(role: str, store: LocalMooncakeStore, layout: str, *, seed: int, n: int,
            prefix: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, str(WORKER), role, store.master_address, store.metadata_server, layout,
         str(seed), str(n), prefix],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_page_written_by_one_process_is_read_bit_exact_by_another(
    store: LocalMooncakeStore,
) -> None:
    # the writer exits before the reader starts: the pages live in the holder's segment
    layouts = "page_first,layer_first"
    wrote = _worker("write", store, layouts, seed=11, n=6, prefix="xp-")
    read = _worker("read", store, layouts, seed=11, n=6, prefix="xp-")
    for layout in layouts.split(","):
        w, r = wrote[layout], read[layout]
        assert isinstance(w, dict) and isinstance(r, dict)
        assert w["connected"] and w["ok"] == [True] * 6
        assert r["ok"] == [True] * 6
        assert r["exact"] == [True] * 6
        assert r["wrong"] == 0
