"""The Mooncake backend under faults, on a real store: no master, the master killed mid-batch and
restarted, the holder stopped, a full store. Every failure is a miss / failed set, never an
exception and never wrong bytes, and the backend serves again once the store is back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch

from mem_cache_pool import MHATokenToKVPool
from mem_cache_pool_host import MHATokenToKVPoolHost
from mem_cache_storage.config import HiCacheStorageConfig
from mem_cache_storage.mooncake import HiCacheMooncake
from tools.mooncake.store import LocalMooncakeStore, free_port

PAGE = 16
FAST = {"retry_backoff_s": 0.2, "max_backoff_s": 0.5, "reconnect_after": 2}


def _host(seed: int, pages: int = 64, heads: int = 2, dim: int = 8) -> MHATokenToKVPoolHost:
    dev = MHATokenToKVPool(pages * PAGE, PAGE, torch.bfloat16, heads, dim, 3, "cpu")
    host = MHATokenToKVPoolHost(dev, host_to_device_ratio=2.0, layout="page_first",
                                pin_memory=False)
    gen = torch.Generator().manual_seed(seed)
    for buf in host.buffers:
        raw = buf.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    return host


def _pages(host: MHATokenToKVPoolHost, idx: torch.Tensor, n: int) -> list[torch.Tensor]:
    return [host.get_data_page(int(idx[i * PAGE])).view(torch.uint8).clone() for i in range(n)]


def _backend(store: LocalMooncakeStore, host: MHATokenToKVPoolHost, model: str
             ) -> HiCacheMooncake:
    cfg = HiCacheStorageConfig(model_name=model, extra_config={**store.client_options(), **FAST})
    return HiCacheMooncake(cfg, host)


def _until(pred: object, timeout: float = 40.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


@pytest.fixture
def store() -> Iterator[LocalMooncakeStore]:
    with LocalMooncakeStore(segment_bytes=64 << 20) as s:
        yield s


def test_no_master_is_a_miss_and_connects_later() -> None:
    s = LocalMooncakeStore(segment_bytes=32 << 20, rpc_port=free_port(), http_port=free_port())
    host = _host(1)
    b = _backend(s, host, "nomaster")  # nothing listens yet
    assert not b.connected and "not reachable" in b.last_error
    idx = host.alloc(2 * PAGE)
    assert idx is not None
    assert b.batch_set_v1(["a", "b"], idx) == [False, False]
    assert b.batch_get_v1(["a", "b"], idx) == [False, False]
    assert b.batch_exists(["a"]) == 0
    assert b.get_stats().set_failed == 2
    with s:
        assert _until(lambda: b.batch_set_v1(["a", "b"], idx) == [True, True])
        assert b.connected and b.client.connects == 1
        want = _pages(host, idx, 2)
        other = host.alloc(2 * PAGE)
        assert other is not None
        assert b.batch_get_v1(["a", "b"], other) == [True, True]
        assert all(torch.equal(p, w) for p, w in zip(_pages(host, other, 2), want))
        b.close()


def test_master_killed_mid_batch_then_restarted(store: LocalMooncakeStore) -> None:
    host = _host(2)
    b = _backend(store, host, "killmaster")
    src = host.alloc(16 * PAGE)
    dst = host.alloc(16 * PAGE)
    assert src is not None and dst is not None
    want = _pages(host, src, 16)
    keys = [f"k{i}" for i in range(16)]
    assert b.batch_set_v1(keys, src) == [True] * 16
    wrong: list[int] = []
    errors: list[BaseException] = []
    results: list[list[bool]] = []
    stop = threading.Event()

    def traffic() -> None:
        try:
            while not stop.is_set():
                ok = b.batch_get_v1(keys, dst)
                results.append(ok)
                got = _pages(host, dst, 16)
                wrong.extend(i for i in range(16) if ok[i] and not torch.equal(got[i], want[i]))
                b.batch_set_v1([f"n{len(results)}-{i}" for i in range(4)], src[: 4 * PAGE])
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=traffic)
    t.start()
    assert _until(lambda: len(results) >= 3)
    store.kill_master()  # while batches are in flight
    assert _until(lambda: any(not all(r) for r in results[-2:]))
    store.start_master()  # same ports; the holder re-mounts its segment by itself
    fresh = [f"f{i}" for i in range(4)]
    assert _until(lambda: b.batch_set_v1(fresh, src[: 4 * PAGE]) == [True] * 4)
    stop.set()
    t.join(timeout=60)
    assert not errors, errors
    assert wrong == []
    assert any(not any(r) for r in results)  # the kill was seen as misses
    # the restarted master knows nothing of the old pages: misses, never stale bytes
    assert b.batch_exists(keys) == 0
    assert b.batch_get_v1(fresh, dst[: 4 * PAGE]) == [True] * 4
    assert all(torch.equal(p, w) for p, w in zip(_pages(host, dst, 4), want[:4]))
    assert b.get_stats().errors > 0
    b.close()


def test_holder_stopped_is_a_miss_and_a_new_holder_serves(store: LocalMooncakeStore) -> None:
    host = _host(3)
    b = _backend(store, host, "holder")
    src = host.alloc(8 * PAGE)
    dst = host.alloc(8 * PAGE)
    assert src is not None and dst is not None
    want = _pages(host, src, 8)
    keys = [f"h{i}" for i in range(8)]
    assert b.batch_set_v1(keys, src) == [True] * 8
    store.stop_holder()  # every page it held is gone
    ok = b.batch_get_v1(keys, dst)
    assert ok == [False] * 8
    assert b.batch_set_v1(["late"], src[:PAGE]) == [False]  # no segment to write to
    store.start_holder()
    assert _until(lambda: b.batch_set_v1(["again"], src[:PAGE]) == [True])
    assert b.batch_get_v1(["again"], dst[:PAGE]) == [True]
    assert torch.equal(_pages(host, dst, 1)[0], want[0])
    b.close()


def test_full_store_evicts_or_fails_sets_and_keeps_serving() -> None:
    # the smallest segment Mooncake accepts (16 MiB) holds about 170 pages of 96 KiB
    with LocalMooncakeStore(segment_bytes=16 << 20) as s:
        host = _host(4, pages=256, heads=8, dim=64)
        b = _backend(s, host, "full")
        n = 240
        src = host.alloc(n * PAGE)
        assert src is not None
        keys = [f"full{i}" for i in range(n)]
        ok: list[bool] = []
        for lo in range(0, n, 20):
            ok += b.batch_set_v1(keys[lo : lo + 20], src[lo * PAGE : (lo + 20) * PAGE])
        assert True in ok
        want = _pages(host, src, n)
        for buf in host.buffers:
            buf.view(torch.uint8)[:] = 0
        got_ok: list[bool] = []
        for lo in range(0, n, 50):
            got_ok += b.batch_get_v1(keys[lo : lo + 50], src[lo * PAGE : (lo + 50) * PAGE])
        got = _pages(host, src, n)
        # more pages than fit: the master evicted old ones (or refused writes): misses
        assert any(got_ok) and not all(got_ok)
        assert all(torch.equal(got[i], want[i]) for i in range(n) if got_ok[i])
        assert all(not g for g, w in zip(got_ok, ok) if not w)  # never written, never served
        b.close()


def test_controller_prefetch_releases_every_page_when_the_master_dies(
    store: LocalMooncakeStore,
) -> None:
    from mem_cache_storage.controller import StorageController

    host = _host(5, pages=64)
    b = _backend(store, host, "ctl")
    ctl = StorageController(b, host, prefetch_budget_pages=32)
    free_before = host.available_size()
    src = host.alloc(12 * PAGE)
    assert src is not None
    want = _pages(host, src, 12)
    keys = [f"c{i}" for i in range(12)]
    assert ctl.write(keys, src).failed == 0
    res = ctl.prefetch(keys).wait(timeout=60)
    assert res.status == "done" and res.pages == 12
    assert all(torch.equal(p, w) for p, w in zip(_pages(host, res.host_indices, 12), want))
    host.free(res.host_indices)
    # master killed: prefetches end as misses or failures; a wait timeout cancels one while
    # the store call is still running, and its pages are freed once that call returns
    store.kill_master()
    outcomes = []
    for timeout in (60.0, 0.05, 60.0):
        h = ctl.prefetch(keys)
        r = h.wait(timeout=timeout)
        outcomes.append(r.status)
        assert r.pages == 0
        assert h.join(timeout=60)
    assert ctl.reserved_pages == 0
    assert set(outcomes) <= {"miss", "failed", "timeout"}
    assert ctl.write([f"d{i}" for i in range(4)], src[: 4 * PAGE]).written == 0
    store.start_master()
    assert _until(lambda: ctl.write(["e0"], src[:PAGE]).written == 1)
    r = ctl.prefetch(["e0"]).wait(timeout=60)
    assert r.status == "done"
    assert torch.equal(_pages(host, r.host_indices, 1)[0], want[0])
    host.free(r.host_indices)
    host.free(src)
    ctl.close()
    assert ctl.reserved_pages == 0
    assert host.available_size() == free_before
    b.close()
