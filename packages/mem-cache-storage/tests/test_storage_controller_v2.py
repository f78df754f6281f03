"""StorageController's v2 path: KV pages plus extra host pools (a Mamba state pool with the
``trailing_pages`` policy, an indexer-like pool with ``all_pages``) written and prefetched through
the backend's ``batch_*_v2`` calls: bit-exact, hit policies as SGLang's (a prefix counts only when
every pool can restore it), partial hits, a failing pool part is a miss, every reserved slot of
every pool released, counters per pool."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from mem_cache_pool import Mamba2CacheParams, Mamba2StateShape, MambaPool
from mem_cache_pool_host import MambaPoolHost
from mem_cache_storage import HiCacheFile, HiCacheMemory, page_hashes
from mem_cache_storage.controller import ExtraPool, StorageController

from .conftest import PS, make_host, pages_of


def _mamba_host() -> MambaPoolHost:
    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=8, n_groups=1,
                                    num_heads=2, head_dim=4, state_size=4, conv_kernel=4)
    dev = MambaPool(size=8, spec_state_size=0,
                    cache_params=Mamba2CacheParams(shape=shape, layers=[0, 1]),
                    mamba_layer_ids=[0, 1], device="cpu")
    host = MambaPoolHost(dev, 2.0, 0, device_capacity=8, pin_memory=False)
    gen = torch.Generator().manual_seed(3)
    for buf in [host.temporal_buffer, *host.conv_buffer]:
        raw = buf.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    return host


def _state(host: MambaPoolHost, slot: int) -> list[torch.Tensor]:
    return [b[slot].clone() for b in [host.temporal_buffer, *host.conv_buffer]]


class _Rig:
    """KV host pool + indexer pool (all_pages) + Mamba pool (trailing_pages), one backend."""

    def __init__(self, backend: str, root: str) -> None:
        self.kv = make_host(size=64)
        self.idx = make_host(size=64)
        self.mamba = _mamba_host()
        self.storage: Any = (HiCacheMemory(page_size=PS) if backend == "memory"
                             else HiCacheFile(storage_dir=root, page_size=PS))
        self.pools = [ExtraPool("indexer", self.idx, "all_pages"),
                      ExtraPool("mamba", self.mamba, "trailing_pages")]

    def controller(self, **kw: Any) -> StorageController:
        return StorageController(self.storage, self.kv, extra_pools=self.pools, **kw)

    def close(self) -> None:
        for p in (self.kv, self.idx, self.mamba):
            p.close()


@pytest.fixture(params=["memory", "file"])
def rig(request: pytest.FixtureRequest) -> Iterator[_Rig]:
    with tempfile.TemporaryDirectory() as root:
        r = _Rig(request.param, root)
        yield r
        r.close()


def _free_all(r: _Rig) -> tuple[int, int, int]:
    return r.kv.available_size(), r.idx.available_size(), r.mamba.available_size()


def _write(r: _Rig, c: StorageController, keys: list[str]) -> tuple[Any, torch.Tensor,
                                                                   torch.Tensor, torch.Tensor]:
    n = len(keys)
    kv, ix, st = r.kv.alloc(n * PS), r.idx.alloc(n * PS), r.mamba.alloc(1)
    res = c.write(keys, kv, {"indexer": ix, "mamba": st})
    return res, kv, ix, st


def test_round_trip_bit_exact_and_counted(rig: _Rig) -> None:
    keys = page_hashes(list(range(5 * PS)), PS)
    with rig.controller() as c:
        res, kv, ix, st = _write(rig, c, keys)
        assert (res.written, res.skipped, res.failed, res.extra_failed) == (5, 0, 0, 0)
        want = (pages_of(rig.kv, kv), pages_of(rig.idx, ix), _state(rig.mamba, int(st[0])))
        again = c.write(keys, kv, {"indexer": ix, "mamba": st})  # all stored: nothing written
        assert (again.written, again.skipped) == (0, 5)
        for pool, slots in ((rig.kv, kv), (rig.idx, ix), (rig.mamba, st)):
            pool.free(slots)
        free0 = _free_all(rig)
        assert c.lookup(keys) == 5 and c.lookup(keys[:3]) == 0  # no state at page 3
        r = c.prefetch(keys).wait(30)
        assert (r.status, r.pages) == ("done", 5)
        assert set(r.extra_host_indices) == {"indexer", "mamba"}
        assert all(torch.equal(a.view(torch.int16), b) for a, b in
                   zip(pages_of(rig.kv, r.host_indices), want[0]))
        assert all(torch.equal(a.view(torch.int16), b) for a, b in
                   zip(pages_of(rig.idx, r.extra_host_indices["indexer"]), want[1]))
        m = r.extra_host_indices["mamba"]
        assert m.numel() == 1
        assert all(torch.equal(a, b) for a, b in zip(_state(rig.mamba, int(m[0])), want[2]))
        assert c.reserved_pages == 0
        s = c.stats()
        assert (s.pages_written, s.pages_loaded, s.prefetch_hits) == (5, 5, 1)
        assert s.pools["indexer"].pages_written == 5 and s.pools["indexer"].pages_loaded == 5
        assert s.pools["indexer"].pages_skipped == 5
        assert s.pools["mamba"].pages_written == 1 and s.pools["mamba"].pages_loaded == 1
        assert s.pools["mamba"].bytes_loaded == rig.mamba.get_size_per_token()
        for pool, slots in ((rig.kv, r.host_indices), (rig.idx, r.extra_host_indices["indexer"]),
                            (rig.mamba, m)):
            pool.free(slots)
        assert _free_all(rig) == free0


def test_trailing_policy_picks_a_checkpointed_length(rig: _Rig) -> None:
    """States at 2 and 5 pages: a 4-page request restores 2; a 6-page one restores 5."""
    keys = page_hashes(list(range(6 * PS)), PS)
    with rig.controller() as c:
        for n in (2, 5):
            _, kv, ix, st = _write(rig, c, keys[:n])
            for pool, slots in ((rig.kv, kv), (rig.idx, ix), (rig.mamba, st)):
                pool.free(slots)
        free0 = _free_all(rig)
        assert c.lookup(keys[:4]) == 2 and c.lookup(keys) == 5
        for n, want in ((4, 2), (6, 5)):
            r = c.prefetch(keys[:n]).wait(30)
            assert (r.status, r.pages) == ("done", want)
            assert r.extra_host_indices["indexer"].numel() == want * PS
            rig.kv.free(r.host_indices)
            rig.idx.free(r.extra_host_indices["indexer"])
            rig.mamba.free(r.extra_host_indices["mamba"])
        assert _free_all(rig) == free0 and c.reserved_pages == 0


def test_all_pages_part_missing_cuts_the_prefix(rig: _Rig) -> None:
    """KV pages 0-4, indexer pages 0-2 only, states at 2 and 5 pages (stored through the
    backend's own v1 / v2 calls): 5 pages need indexer pages 3 and 4, so the prefix is 2."""
    from mem_cache_storage import PoolTransfer

    keys = page_hashes(list(range(5 * PS)), PS)
    kv, ix, st = rig.kv.alloc(5 * PS), rig.idx.alloc(5 * PS), rig.mamba.alloc(2)
    rig.storage.register_mem_pool_host(rig.kv)
    rig.storage.register_mem_host_pool_v2(rig.idx, "indexer")
    rig.storage.register_mem_host_pool_v2(rig.mamba, "mamba")
    assert rig.storage.batch_set_v1(keys, kv) == [True] * 5
    assert rig.storage.batch_set_v2([
        PoolTransfer("indexer", ix[: 3 * PS], keys=keys[:3]),
        PoolTransfer("mamba", st[:1], keys=[keys[1]]),
    ]) == {"indexer": [True] * 3, "mamba": [True]}
    assert rig.storage.batch_set_v2([PoolTransfer("mamba", st[1:], keys=[keys[4]])])
    want = pages_of(rig.kv, kv[: 2 * PS])
    for pool, slots in ((rig.kv, kv), (rig.idx, ix), (rig.mamba, st)):
        pool.free(slots)
    with rig.controller() as c:
        free0 = _free_all(rig)
        assert c.lookup(keys) == 2 and c.lookup(keys[:4]) == 2 and c.lookup(keys[:1]) == 0
        r = c.prefetch(keys).wait(30)
        assert (r.status, r.pages) == ("done", 2)
        assert all(torch.equal(a.view(torch.int16), b) for a, b in
                   zip(pages_of(rig.kv, r.host_indices), want))
        rig.kv.free(r.host_indices)
        rig.idx.free(r.extra_host_indices["indexer"])
        rig.mamba.free(r.extra_host_indices["mamba"])
        assert _free_all(rig) == free0 and c.reserved_pages == 0


class _FailingPart(HiCacheMemory):
    """Reads of one pool's pages fail (the backend raises for them, or answers False)."""

    fail_pool = "mamba"
    mode = "false"

    def _trusted_io_v2(self, write: bool, transfers: list[Any]) -> dict[str, list[bool]]:
        # the controller's entry (the SGLang-named batch_get_v2 is not on its path)
        out = super()._trusted_io_v2(write, transfers)
        if not write and self.fail_pool in out:
            if self.mode == "raise":
                raise OSError("injected")
            out[self.fail_pool] = [False] * len(out[self.fail_pool])
        return out


@pytest.mark.parametrize("mode", ["false", "raise"])
@pytest.mark.parametrize("pool", ["mamba", "indexer"])
def test_a_failing_pool_part_is_a_miss_and_atomic(pool: str, mode: str) -> None:
    r = _Rig("memory", "")
    r.storage = _FailingPart(page_size=PS)
    r.storage.fail_pool, r.storage.mode = pool, mode
    keys = page_hashes(list(range(4 * PS)), PS)
    try:
        with r.controller() as c:
            _, kv, ix, st = _write(r, c, keys)
            for p, slots in ((r.kv, kv), (r.idx, ix), (r.mamba, st)):
                p.free(slots)
            free0 = _free_all(r)
            assert c.lookup(keys) == 4
            res = c.prefetch(keys).wait(30)
            assert (res.status, res.pages, dict(res.extra_host_indices)) == ("miss", 0, {})
            assert _free_all(r) == free0 and c.reserved_pages == 0
            s = c.stats()
            assert s.prefetch_misses == 1 and s.pools[pool].part_misses == 1
            assert s.backend_errors == (1 if mode == "raise" else 0)
    finally:
        r.close()


def test_write_arguments_checked_once_at_the_entry(rig: _Rig) -> None:
    keys = page_hashes(list(range(2 * PS)), PS)
    with rig.controller() as c:
        kv = rig.kv.alloc(2 * PS)
        with pytest.raises(TypeError, match="extra_indices"):
            c.write(keys, kv, [1])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="extra_indices must name"):
            c.write(keys, kv, {"indexer": rig.idx.alloc(2 * PS)})
        with pytest.raises(ValueError, match=r"extra_indices\['mamba'\] must hold 1 slots"):
            c.write(keys, kv, {"indexer": rig.idx.alloc(2 * PS), "mamba": rig.mamba.alloc(2)})
        with pytest.raises(ValueError, match="host_indices must hold"):
            c.on_host_evict(keys, kv[:PS], {})
        assert c.stats().pages_written == 0
    with pytest.raises(ValueError, match="hit_policy"):
        ExtraPool("swa", rig.idx, "block_groups")
    with pytest.raises(ValueError, match="not 'kv'"):
        ExtraPool("kv", rig.idx)
    with pytest.raises(TypeError, match="extra_pools"):
        StorageController(rig.storage, rig.kv, extra_pools=[rig.idx])  # type: ignore[list-item]


def test_trusted_entry_checks_host_indices_once(rig: _Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller's I/O goes through the backend's trusted entry: ``check_index`` runs at
    the controller's public entry, not again in the backend (the SGLang-named ``batch_set_v1``
    keeps its own check for outside callers)."""
    import mem_cache_storage._controller_write as controller_mod  # the write path
    import mem_cache_storage.backend as backend_mod

    calls: list[str] = []
    real = backend_mod.check_index

    def counting(where: str) -> Any:
        def check(*a: Any, **k: Any) -> Any:
            calls.append(where)
            return real(*a, **k)
        return check

    monkeypatch.setattr(backend_mod, "check_index", counting("backend"))
    monkeypatch.setattr(controller_mod, "check_index", counting("controller"))
    c = StorageController(rig.storage, rig.kv)
    keys = page_hashes(list(range(3 * PS)), PS)
    kv = rig.kv.alloc(3 * PS)
    assert c.write(keys, kv).written == 3
    assert calls == ["controller"]
    calls.clear()
    rig.storage.batch_set_v1(keys, kv)
    assert calls == ["backend"]
    c.close()
    # the v2 path too: extra pools' parts go through the backend's trusted v2 entry
    calls.clear()
    with rig.controller() as c2:
        ix, st = rig.idx.alloc(3 * PS), rig.mamba.alloc(1)
        res = c2.write(keys, kv, {"indexer": ix, "mamba": st})
        assert (res.failed, res.extra_failed) == (0, 0) and "backend" not in calls
        got = c2.prefetch(keys).wait(30)
        assert got.status == "done" and "backend" not in calls
        for pool, slots in ((rig.kv, got.host_indices),
                            (rig.idx, got.extra_host_indices["indexer"]),
                            (rig.mamba, got.extra_host_indices["mamba"])):
            pool.free(slots)
    from mem_cache_storage import PoolTransfer

    rig.storage.batch_set_v2([PoolTransfer("mamba", st, keys=keys[-1:])])
    assert calls[-1] == "backend"  # the SGLang-named call keeps its check
