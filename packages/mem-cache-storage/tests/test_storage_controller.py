"""StorageController: write-back skipping stored keys, prefetch into host pages with a budget,
and release of every reserved page on completion, cancel, timeout and backend failure."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from mem_cache_storage import HiCacheMemory, HiCacheStorageConfig, page_hashes
from mem_cache_storage.controller import StorageController

from .conftest import PS, make_host, pages_of

CFG = HiCacheStorageConfig(model_name="m")


def _keys(n: int, salt: int = 0) -> list[str]:
    return page_hashes([salt * 1000 + i for i in range(n * PS)], PS)


def _controller(host: Any, storage: Any = None, **kw: Any) -> StorageController:
    return StorageController(storage or HiCacheMemory(CFG), host, **kw)


def test_write_then_prefetch_round_trip(host: Any) -> None:
    free0 = host.available_size()
    with _controller(host) as c:
        keys = _keys(5)
        src = host.alloc(5 * PS)
        assert c.write(keys[:3], src[: 3 * PS]).written == 3
        again = c.write(keys, src)  # the first 3 are stored: only the rest is written
        assert (again.written, again.skipped, again.failed) == (2, 3, 0)
        res = c.prefetch(keys + _keys(2, salt=9)).wait(timeout=30)
        assert res.status == "done" and res.pages == 5 and res.requested == 7
        assert res.host_indices.numel() == 5 * PS
        for a, b in zip(pages_of(host, src), pages_of(host, res.host_indices)):
            assert torch.equal(a, b)
        assert c.reserved_pages == 0  # taken: the caller owns them now
        host.free(res.host_indices)
        host.free(src)
        s = c.stats()
        assert (s.prefetch_hits, s.pages_loaded, s.pages_written, s.pages_skipped) == (1, 5, 5, 3)
        assert s.bytes_loaded == 5 * PS * host.get_size_per_token()
        assert s.prefetch_latency.count == 1 and s.prefetch_latency.p99_s > 0
    assert host.available_size() == free0


def test_miss_budget_and_host_shortage(host: Any) -> None:
    free0 = host.available_size()
    with _controller(host, prefetch_budget_pages=2) as c:
        miss = c.prefetch(_keys(3)).wait(timeout=30)
        assert miss.status == "miss" and miss.pages == 0
        keys = _keys(4, salt=1)
        src = host.alloc(4 * PS)
        c.write(keys, src)
        host.free(src)
        res = c.prefetch(keys).wait(timeout=30)
        assert res.status == "done" and res.pages == 2  # the budget caps the reservation
        # `res` was taken (the caller owns its pages), so the budget is free again
        held = c.prefetch(keys)
        while not held.done():
            threading.Event().wait(0.005)
        assert c.reserved_pages == 2  # finished, not taken: still counts against the budget
        starved = c.prefetch(keys).wait(timeout=30)
        assert starved.status == "miss" and starved.pages == 0
        second = held.wait(timeout=30)
        assert second.pages == 2 and c.reserved_pages == 0
        host.free(res.host_indices)
        host.free(second.host_indices)
        # the host pool cannot give the pages: a miss, nothing reserved
        grab = host.alloc(host.available_size())
        assert c.prefetch(keys).wait(timeout=30).status == "miss"
        host.free(grab)
    assert host.available_size() == free0


class _Gated(HiCacheMemory):
    """batch_get blocks until released; can fail or return partial results."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.gate = threading.Event()
        self.mode = "ok"

    def _get_pages(self, keys: list[str], pages: Any, fmt: Any) -> list[bool]:
        self.gate.wait(30)
        if self.mode == "raise":
            raise OSError("disk gone")
        ok = super()._get_pages(keys, pages, fmt)
        if self.mode == "partial":
            ok[1] = False
        return ok


@pytest.mark.parametrize("ending", ["cancel", "timeout", "raise", "partial", "close"])
def test_every_ending_releases_reserved_pages(ending: str) -> None:
    host = make_host()
    try:
        free0 = host.available_size()
        storage = _Gated(CFG)
        with _controller(host, storage) as c:
            keys = _keys(4)
            src = host.alloc(4 * PS)
            c.write(keys, src)
            handle = c.prefetch(keys)
            for _ in range(1000):  # the IO thread reserves the pages, then blocks in the get
                if c.reserved_pages:
                    break
                threading.Event().wait(0.005)
            assert c.reserved_pages == 4
            assert host.available_size() == free0 - 8 * PS
            if ending == "cancel":
                handle.cancel()
                storage.gate.set()
                result = handle.wait(30)
                assert result.pages == 0 and result.status == "cancelled"
            elif ending == "timeout":
                result = handle.wait(timeout=0.05)
                assert result.status == "timeout" and result.pages == 0
                storage.gate.set()
            elif ending in ("raise", "partial"):
                storage.mode = ending
                storage.gate.set()
                result = handle.wait(30)
                if ending == "raise":
                    assert result.status == "miss" and result.pages == 0
                else:  # pages 0 read, page 1 failed: a 1-page prefix, the rest released
                    assert result.status == "done" and result.pages == 1
                    for a, b in zip(pages_of(host, src)[:1], pages_of(host, result.host_indices)):
                        assert torch.equal(a, b)
                    host.free(result.host_indices)
            else:
                storage.gate.set()  # finished but never taken: close() frees it
            host.free(src)
        assert c.reserved_pages == 0
        assert host.available_size() == free0
        if ending == "raise":
            assert c.stats().backend_errors == 0  # the base turned the exception into a miss
            assert storage.get_stats().errors == 1
    finally:
        host.close()


def test_write_policies_and_mla_rank(host: Any) -> None:
    keys = _keys(2)
    src = host.alloc(2 * PS)
    with _controller(host, write_policy="write_through") as c:
        assert c.on_host_evict(keys, src).written == 0
        assert c.on_host_insert(keys, src).written == 2
    mla_rank1 = HiCacheMemory(HiCacheStorageConfig(is_mla_model=True, tp_rank=1, tp_size=2))
    with _controller(host, mla_rank1) as c:
        assert c.on_host_evict(_keys(2, 5), src).written == 0  # only TP rank 0 writes MLA
    with pytest.raises(ValueError, match="write_policy must be"):
        _controller(host, write_policy="never")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="host_indices must hold"), _controller(host) as c:
        c.write(keys, src[:PS])
    host.free(src)


class _Jittery(HiCacheMemory):
    """Random delays, exceptions and partial batches on the read path."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        import random

        self.rng = random.Random(3)
        self.lock = threading.Lock()

    def _get_pages(self, keys: list[str], pages: Any, fmt: Any) -> list[bool]:
        with self.lock:
            r = self.rng.random()
            delay = self.rng.random() * 0.004
        threading.Event().wait(delay)
        if r < 0.15:
            raise OSError("flaky")
        ok = super()._get_pages(keys, pages, fmt)
        if r < 0.3 and len(ok) > 1:
            ok[-1] = False
        return ok


def test_concurrent_prefetches_with_cancels_and_timeouts_leak_nothing() -> None:
    import random

    host = make_host(size=256)
    try:
        free0 = host.available_size()
        storage = _Jittery(CFG)
        with _controller(host, storage, prefetch_budget_pages=24, io_threads=3,
                         batch_pages=3) as c:
            chains = [_keys(8, salt=s) for s in range(6)]
            src = host.alloc(8 * PS)
            for keys in chains:
                c.write(keys, src)
            ref = pages_of(host, src)  # page i of every chain holds these bytes
            host.free(src)
            errors: list[str] = []

            def client(seed: int) -> None:
                rng = random.Random(seed)
                for _ in range(25):
                    keys = rng.choice(chains)[: rng.randint(1, 8)]
                    handle = c.prefetch(keys)
                    action = rng.random()
                    if action < 0.25:
                        handle.cancel()
                        continue
                    res = handle.wait(timeout=0.001 if action < 0.5 else 30)
                    if res.pages:
                        got = pages_of(host, res.host_indices)
                        if res.host_indices.numel() != res.pages * PS:
                            errors.append(f"{res.pages} pages, {res.host_indices.numel()} slots")
                        elif not all(torch.equal(a, b) for a, b in zip(got, ref)):
                            errors.append("a prefetched page holds other bytes")
                        host.free(res.host_indices)

            threads = [threading.Thread(target=client, args=(s,)) for s in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, errors[:3]
            assert c.reserved_pages <= 24
        assert c.reserved_pages == 0
        assert host.available_size() == free0
        s = c.stats()
        assert s.prefetches == 100
        assert (s.prefetch_hits + s.prefetch_misses + s.prefetch_failed + s.prefetch_cancelled
                + s.prefetch_timeouts) == 100
    finally:
        host.close()


def test_write_async_frees_through_the_callback(host: Any) -> None:
    free0 = host.available_size()
    with _controller(host) as c:
        keys = _keys(3, salt=11)
        src = host.alloc(3 * PS)
        ref = pages_of(host, src)
        done: list[Any] = []
        future = c.write_async(keys, src, lambda r: (done.append(r), host.free(src)))
        result = future.result(timeout=30)
        assert result.written == 3 and done == [result]
        res = c.prefetch(keys).wait(timeout=30)
        assert res.pages == 3
        assert all(torch.equal(a, b) for a, b in zip(ref, pages_of(host, res.host_indices)))
        host.free(res.host_indices)
        # a wrong slot count is refused at the entry (checked once, before the backup thread)
        with pytest.raises(ValueError, match="host_indices must hold"):
            c.write_async(keys, src[:PS])
        assert c.stats().pages_write_failed == 0
    assert host.available_size() == free0


def test_a_host_pool_closed_under_a_prefetch_never_hangs_the_waiter() -> None:
    host = make_host()
    storage = _Gated(CFG)
    c = _controller(host, storage)
    keys = _keys(2)
    c.write(keys, host.alloc(2 * PS))
    handle = c.prefetch(keys)
    while not c.reserved_pages:
        threading.Event().wait(0.005)
    host.close()
    storage.gate.set()
    result = handle.wait(timeout=30)
    # the close races the IO thread: before it took the pool's io_guard the load misses; after,
    # the guard keeps the memory mapped and the copy completes. Either way nothing hangs.
    assert (result.status, result.pages) in {("miss", 0), ("failed", 0), ("done", 2)}
    assert handle.done() and c.reserved_pages == 0  # wait() handed the pages over
    c.close()
