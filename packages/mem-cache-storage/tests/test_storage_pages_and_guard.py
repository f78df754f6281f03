"""Pages as the host pool lists them (PageBatch), the one failure guard (counted once, logged
once, a clean miss) and the one declaration of the controller's counters."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
import torch

from mem_cache_storage import (
    ControllerStats,
    HiCacheMemory,
    HiCacheStorageConfig,
    PageBatch,
    PoolStats,
    StorageController,
    page_hashes,
)
from mem_cache_storage.backend import bools, guarded, host_page_ranges

from .conftest import PS, make_host, pages_of

CFG = HiCacheStorageConfig(model_name="m")


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_page_batch_is_the_pools_buffer_meta_page_by_page(layout: str) -> None:
    host = make_host(layout)
    try:
        slots = host.alloc(3 * PS)
        ptrs, sizes = host.get_page_buffer_meta(slots)
        batch, fmt = host_page_ranges(host, slots, 3)
        assert (batch.ptrs, batch.sizes) == (ptrs, sizes)  # the pool's lists, not regrouped
        per = len(ptrs) // 3
        assert batch.per == per and len(batch) == 3 and len(fmt.sizes) == per
        grouped = [tuple(zip(ptrs[p * per : (p + 1) * per], sizes[p * per : (p + 1) * per]))
                   for p in range(3)]
        assert list(batch) == grouped
        assert [batch[i] for i in range(3)] == grouped and batch[-1] == grouped[2]
        assert batch[1:] == grouped[1:] and batch[::2] == [grouped[0], grouped[2]]
        assert PageBatch.of(grouped).ptrs == ptrs and PageBatch.of(batch) is batch
        with pytest.raises(IndexError):
            batch[3]
        assert fmt.nbytes == sum(sizes[:per]) == host.page_numel * host.buffers[0].element_size()
        host.free(slots)
    finally:
        host.close()


def test_few_slots_are_accepted_exactly_as_the_pool_accepts_them() -> None:
    """``host_page_ranges`` takes the pages of the pool's ``page_ids`` (a few slots: one
    ``tolist``; more: tensor checks): it accepts the index tensors ``get_page_buffer_meta``
    accepts (same ranges) and rejects the same ones (the pool's error)."""
    host = make_host()
    try:
        size = host.size

        def run(f: Any) -> object:
            try:
                return f()
            except (TypeError, ValueError) as exc:
                return type(exc)

        cases = [
            torch.arange(0, PS), torch.arange(PS, 3 * PS), torch.arange(size - PS, size),
            torch.arange(0, PS, dtype=torch.int32),
            torch.cat([torch.arange(2 * PS, 3 * PS), torch.arange(0, PS)]),  # any page order
            torch.arange(1, PS + 1),  # not page aligned
            torch.arange(PS - 1, -1, -1),  # a page's slots descending
            torch.cat([torch.arange(0, PS), torch.arange(0, PS)]),  # a page twice
            torch.arange(size, size + PS),  # past the pool
            torch.arange(-PS, 0),  # negative
            torch.tensor([0, 1, 3, 2] if PS == 4 else list(range(PS))[::-1]),
        ]
        for idx in cases:
            n = idx.numel() // PS
            got = run(lambda idx=idx, n=n: host_page_ranges(host, idx, n)[0].ptrs)
            meta = run(lambda idx=idx: host.get_page_buffer_meta(idx)[0])
            assert got == meta, idx.tolist()
        accepted = [c for c in cases if not isinstance(run(lambda c=c: host.page_ids(c)), type)]
        assert len(accepted) == 5  # the first five; every other case is refused by both
    finally:
        host.close()


def test_cached_views_and_sums_follow_the_memory() -> None:
    """A range's view and checksum array are cached by (address, bytes): they read the memory
    as it is at each call, and a new buffer at the same address is read as itself."""
    from mem_cache_storage._sum64 import sum64, sum64_bytes
    from mem_cache_storage.backend import page_views

    data = bytearray(range(256)) * 4
    ptr = PageBatch.of([((torch.frombuffer(data, dtype=torch.uint8).data_ptr(), 1024),)])[0]
    first = page_views(ptr)[0]
    assert bytes(first) == bytes(data) and sum64(ptr) == sum64_bytes(bytes(data))
    data[5] ^= 0xFF
    assert page_views(ptr)[0] is first and bytes(page_views(ptr)[0]) == bytes(data)
    assert sum64(ptr) == sum64_bytes(bytes(data))


def test_an_empty_page_batch() -> None:
    empty = PageBatch([], [], 0)
    assert len(empty) == 0 and list(empty) == [] and empty[:] == []


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_zero_copy_round_trip_is_bit_exact(layout: str) -> None:
    host = make_host(layout)
    try:
        storage = HiCacheMemory(CFG, host)
        keys = page_hashes(list(range(3 * PS)), PS)
        src = host.alloc(3 * PS)
        assert storage.batch_set_v1(keys, src) == [True] * 3
        dst = host.alloc(3 * PS)
        assert storage.batch_get_v1(keys, dst) == [True] * 3
        for a, b in zip(pages_of(host, src), pages_of(host, dst)):
            assert torch.equal(a, b)
        # a page stored for another layout's ranges is never read back into this one
        if layout == "layer_first":
            assert len(host.get_page_buffer_meta(src)[0]) == 3 * 2 * host.layer_num
    finally:
        host.close()


def test_guard_counts_and_logs_each_failure_once(caplog: pytest.LogCaptureFixture) -> None:
    errors: list[int] = []

    def count() -> None:
        errors.append(1)

    def boom() -> object:
        raise OSError("disk gone")

    with caplog.at_level(logging.WARNING, logger="mem_cache_storage"):
        assert guarded(boom, lambda r: bools(2, r), [False, False], owner="B", what="get",
                       count_error=count) == [False, False]
        assert guarded(lambda: [True], lambda r: bools(2, r), [False, False], owner="B",
                       what="get", count_error=count) == [False, False]  # short answer
        assert guarded(lambda: [True, 1], lambda r: bools(2, r), [False, False], owner="B",
                       what="get", count_error=count) == [True, False]  # only True is True
    assert len(errors) == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "disk gone" in warnings[0].getMessage()


class _Foreign:
    """A backend that is not ours (like SGLang's): every call raises."""

    def __init__(self) -> None:
        self.mem_pool_host: Any = None
        self.present = True

    def register_mem_pool_host(self, pool: Any) -> None:
        self.mem_pool_host = pool

    def batch_exists(self, keys: list[str], extra_info: object = None) -> int:
        return len(keys) if self.present else 0

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: object = None) -> list[bool]:
        raise ConnectionError("store unreachable")

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: object = None) -> list[bool]:
        raise ConnectionError("store unreachable")


def test_a_failing_foreign_backend_is_counted_once_by_the_controller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    host = make_host()
    try:
        keys = page_hashes(list(range(2 * PS)), PS)
        storage = _Foreign()
        with StorageController(storage, host) as c, \
                caplog.at_level(logging.WARNING, logger="mem_cache_storage"):
            src = host.alloc(2 * PS)
            free = host.available_size()
            result = c.prefetch(keys).wait(30)
            assert (result.status, result.pages) == ("miss", 0)
            assert host.available_size() == free  # every reserved page released
            storage.present = False
            assert c.write(keys, src).failed == 2
            stats = c.stats()
            assert stats.backend_errors == 2 and stats.prefetch_misses == 1
            assert stats.pages_write_failed == 2
        warnings = [r for r in caplog.records if "store unreachable" in r.getMessage()]
        assert len(warnings) == 2
    finally:
        host.close()


def test_controller_stats_is_the_one_declaration_and_sums() -> None:
    names = [f.name for f in dataclasses.fields(ControllerStats)]
    assert len(names) == 18
    assert names[-3:] == ["prefetch_latency", "write_latency", "pools"]  # pools: extra pools'
    a = ControllerStats(pages_loaded=2, bytes_loaded=100, load_seconds=1.0, backend_errors=1,
                        pools={"mamba": PoolStats(pages_loaded=1, part_misses=1)})
    b = ControllerStats(pages_loaded=3, bytes_loaded=300, load_seconds=1.0, prefetches=4,
                        pools={"mamba": PoolStats(pages_loaded=2), "swa": PoolStats(1, 9)})
    total = a + b
    assert (total.pages_loaded, total.bytes_loaded, total.prefetches, total.backend_errors) == (
        5, 400, 4, 1)
    assert dict(total.pools) == {"mamba": PoolStats(pages_loaded=3, part_misses=1),
                                 "swa": PoolStats(1, 9)}
    assert total.load_gb_per_s == pytest.approx(400 / 2.0 / 1e9)
    assert ControllerStats() + ControllerStats() == ControllerStats()
    host = make_host()
    try:
        with StorageController(HiCacheMemory(CFG), host) as c:
            keys = page_hashes(list(range(2 * PS)), PS)
            c.write(keys, host.alloc(2 * PS))
            s = c.stats()
            assert isinstance(s, ControllerStats)
            assert (s.pages_written, s.bytes_written) == (2, 2 * c.page_bytes)
            assert s.write_latency.total == 1
            with pytest.raises(dataclasses.FrozenInstanceError):
                s.pages_written = 0  # type: ignore[misc]
    finally:
        host.close()


def test_one_page_memo_equals_host_page_ranges_and_refuses_the_same_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``OnePage`` (the file backend's one-page get) gives ``host_page_ranges``' ranges and
    format for every page and every layout, also once it starts over (``MAX_PAGES``), and
    raises the same error kind for every slot tensor the pool refuses."""
    from mem_cache_storage import _one_page

    monkeypatch.setattr(_one_page, "MAX_PAGES", 3)
    for layout in ("layer_first", "page_first", "page_first_direct"):
        host = make_host(layout)
        memo = _one_page.OnePage()
        try:
            size = host.size
            for rnd in range(2):  # the second round reads remembered pages
                for first in range(0, size, PS):
                    idx = torch.arange(first, first + PS, dtype=torch.int32 if rnd else None)
                    batch, fmt = host_page_ranges(host, idx, 1)
                    assert memo(host, idx) == (batch[0], fmt), (layout, first)
            state = memo._state
            assert state is not None and len(state[4]) <= 3
            bad: list[Any] = [
                torch.arange(1, PS + 1), torch.arange(PS - 1, -1, -1),
                torch.arange(size, size + PS), torch.arange(-PS, 0), torch.arange(0, 2 * PS),
                torch.arange(0, PS).view(1, PS), torch.arange(0, PS, dtype=torch.float32),
                [0] * PS, torch.arange(0, PS - 1),
                torch.tensor([0, *range(PS - 1, 0, -1)]),  # the first slot aligned, the rest not
                torch.tensor([PS, PS + 1, *[PS] * (PS - 2)]),
            ]
            for idx in bad:
                with pytest.raises((TypeError, ValueError)) as ours:
                    memo(host, idx)
                with pytest.raises((TypeError, ValueError)) as general:
                    host_page_ranges(host, idx, 1)
                assert ours.type is general.type, (layout, idx)
        finally:
            host.close()


def test_one_page_memo_reads_only_tensors_whose_memory_is_their_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A remembered page is found by the bytes of the slot tensor's memory: a plain tensor of
    its slots (a fresh one, a view at an offset, int32) finds it without the pool's check,
    and a tensor whose memory holds a remembered page's slots but whose values differ (a
    strided view, the negative bit) or which has no memory (a zero tensor) is judged by its
    values, as ``host_page_ranges`` judges it."""
    from mem_cache_storage import _one_page

    host = make_host()
    memo = _one_page.OnePage()
    calls = [0]
    checked = host.page_ids

    def page_ids(indices: torch.Tensor, **kw: Any) -> list[int]:
        calls[0] += 1
        return checked(indices, **kw)

    def string_at(ptr: int, size: int) -> bytes:
        assert ptr, "read the memory of a tensor without memory"
        return _one_page.ctypes.string_at(ptr, size)

    monkeypatch.setattr(host, "page_ids", page_ids)
    monkeypatch.setattr(_one_page, "_string_at", string_at)
    try:
        for dtype in (torch.int64, torch.int32):
            for page in range(3):  # the first call of all takes the general path
                memo(host, torch.arange(page * PS, (page + 1) * PS, dtype=dtype))
        found = [torch.arange(PS, 2 * PS), torch.arange(0, 3 * PS)[PS : 2 * PS],
                 torch.arange(2 * PS, 3 * PS, dtype=torch.int32)]
        for idx in found:
            batch, fmt = host_page_ranges(host, idx.clone(), 1)
            before = calls[0]
            assert memo(host, idx) == (batch[0], fmt) and calls[0] == before, idx
        judged: list[torch.Tensor] = [
            torch.arange(PS, 3 * PS)[::2],  # memory: page 1's slots, values PS, PS + 2, ...
            torch._neg_view(torch.arange(PS, 2 * PS)),  # memory: page 1, values negative
            torch._neg_view(-torch.arange(PS, 2 * PS)),  # values: page 1
            torch._efficientzerotensor(PS, dtype=torch.int64),  # no memory
        ]
        for idx in judged:
            try:
                batch, fmt = host_page_ranges(host, idx, 1)
            except Exception as exc:  # the same kind must come back
                before = calls[0]
                with pytest.raises(type(exc)):
                    memo(host, idx)
            else:
                before = calls[0]
                assert memo(host, idx) == (batch[0], fmt), idx
            assert calls[0] == before + 1, idx  # the pool judged it
    finally:
        host.close()


def test_one_page_memo_follows_the_pool() -> None:
    """The memo holds the last pool it saw: another pool is looked up afresh (its own ranges),
    and so is the first pool again, so no read lands in another pool's memory."""
    from mem_cache_storage._one_page import OnePage

    a, b = make_host(), make_host()
    memo = OnePage()
    try:
        for idx in (torch.arange(PS, 2 * PS), torch.arange(0, PS, dtype=torch.int32)):
            for pool in (a, b, a, a, b):
                batch, fmt = host_page_ranges(pool, idx, 1)
                assert memo(pool, idx) == (batch[0], fmt)
            assert memo(a, idx)[0] != memo(b, idx)[0]
    finally:
        a.close()
        b.close()


def test_one_page_get_reads_into_the_pool_registered_last(tmp_path: Any) -> None:
    """The file backend's one-page get after ``register_mem_pool_host`` of another pool reads
    into that pool's memory (the memo starts over), bit-exact."""
    from mem_cache_storage import HiCacheFile

    a, b = make_host(), make_host()
    try:
        st = HiCacheFile(CFG, a, storage_dir=str(tmp_path))
        keys = page_hashes(list(range(PS)), PS)
        src = a.alloc(PS)
        assert st.batch_set_v1(keys, src) == [True]
        dst = torch.arange(3 * PS, 4 * PS)
        assert st.batch_get_v1(keys, dst) == [True]
        st.register_mem_pool_host(b)
        assert not torch.equal(pages_of(b, dst)[0], pages_of(a, src)[0])
        assert st.batch_get_v1(keys, dst) == [True]
        assert torch.equal(pages_of(b, dst)[0], pages_of(a, src)[0])
        st.close()
    finally:
        a.close()
        b.close()


def test_one_page_set_takes_the_memo_and_refuses_what_the_pool_refuses(tmp_path: Any) -> None:
    """The file backend's one-page ``batch_set_v1`` (our scheme) writes through the memo: a
    round trip is bit-exact and counted once; slots the pool refuses raise the pool's error
    kind, as a two-page call of the same slots does, and nothing is written or counted."""
    from mem_cache_storage import HiCacheFile

    host = make_host()
    try:
        st = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
        keys = page_hashes(list(range(3 * PS)), PS)
        src = host.alloc(3 * PS)
        for i in range(3):
            assert st.batch_set_v1(keys[i : i + 1], src[i * PS : (i + 1) * PS]) == [True]
        stats = st.get_stats()
        assert (stats.set_ok, stats.set_failed) == (3, 0)
        assert stats.set_bytes == 3 * host.page_numel * host.buffers[0].element_size()
        dst = host.alloc(3 * PS)
        assert st.batch_get_v1(keys, dst) == [True] * 3
        assert all(torch.equal(a, b) for a, b in zip(pages_of(host, src), pages_of(host, dst)))
        fresh = page_hashes(list(range(100, 100 + PS)), PS)
        bad: list[Any] = [torch.arange(1, PS + 1), torch.arange(host.size, host.size + PS),
                          torch.arange(0, PS, dtype=torch.float32), [0] * PS]
        for idx in bad:
            with pytest.raises((TypeError, ValueError)) as one:
                st.batch_set_v1(fresh, idx)
            two = torch.cat([idx, idx]) if isinstance(idx, torch.Tensor) else idx * 2
            with pytest.raises((TypeError, ValueError)) as general:
                st.batch_set_v1(fresh + page_hashes(list(range(200, 200 + PS)), PS), two)
            assert one.type is general.type, idx
        assert st.batch_exists(fresh) == 0 and st.get_stats().set_ok == 3
        st.close()
    finally:
        host.close()


def test_one_page_put_writes_the_record_a_batch_put_writes(tmp_path: Any) -> None:
    """``SegmentStore.put_one`` (a one-page set's write) and ``put`` of a batch write the same
    bytes: two pages put one at a time in one directory and as one batch in another leave
    byte-identical segments and index entries at the same offsets."""
    from mem_cache_storage import HiCacheFile

    host = make_host()
    try:
        one = HiCacheFile(CFG, host, storage_dir=str(tmp_path / "one"))
        two = HiCacheFile(CFG, host, storage_dir=str(tmp_path / "two"))
        keys = page_hashes(list(range(2 * PS)), PS)
        skeys = [one.storage_key(k) for k in keys]
        src = host.alloc(2 * PS)
        batch, fmt = host_page_ranges(host, src, 2)
        assert one._segments is not None and two._segments is not None
        sizes = [one._segments.put_one(k, page, fmt) for k, page in zip(skeys, batch)]
        assert two._segments.put(skeys, batch, fmt) == sum(sizes)
        (a,), (b,) = (list((tmp_path / d).glob("seg-*.kvp")) for d in ("one", "two"))
        assert a.read_bytes() == b.read_bytes()
        locs = [s.locations(skeys) for s in (one._segments, two._segments)]
        assert [(x.offset, x.nbytes) for x in locs[0] if x] == [
            (x.offset, x.nbytes) for x in locs[1] if x] == [(0, sizes[0]), (sizes[0], sizes[1])]
        dst = host.alloc(2 * PS)
        assert one.batch_get_v1(keys, dst) == [True, True]
        assert all(torch.equal(x, y) for x, y in zip(pages_of(host, src), pages_of(host, dst)))
        one.close()
        two.close()
    finally:
        host.close()


def test_one_page_set_that_fails_is_counted_once_and_publishes_nothing(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A one-page set whose write fails: ``[False]``, one failed page and one error counted,
    nothing published; an OS error is counted quietly, anything else is also logged once.
    The failed write's bytes are not reused: the next page is written after them."""
    import mem_cache_storage._segments as segments_module
    from mem_cache_storage import HiCacheFile

    host = make_host()
    try:
        st = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
        segments = st._segments
        assert segments is not None
        keys = page_hashes(list(range(4 * PS)), PS)
        src, dst = host.alloc(PS), host.alloc(PS)
        assert st.batch_set_v1(keys[:1], src) == [True]
        (seg,) = segments._segs.values()
        end = seg.size

        def disk_full(*_: object) -> None:
            raise OSError("disk full")

        monkeypatch.setattr(segments_module, "_pwritev_all", disk_full)
        with caplog.at_level(logging.WARNING, logger="mem_cache_storage"):
            assert st.batch_set_v1(keys[1:2], src) == [False]
        stats = st.get_stats()
        assert (stats.set_ok, stats.set_failed, stats.errors) == (1, 1, 1)
        assert not caplog.records
        assert st.batch_exists(keys[1:2]) == 0
        assert seg.size == 2 * end  # the failed record's bytes: skipped
        monkeypatch.undo()

        def broken(*_: object) -> int:
            raise RuntimeError("bug")

        monkeypatch.setattr(segments, "put_one", broken)
        with caplog.at_level(logging.WARNING, logger="mem_cache_storage"):
            assert st.batch_set_v1(keys[2:3], src) == [False]
        assert [r.getMessage().count("bug") for r in caplog.records] == [1]
        stats = st.get_stats()
        assert (stats.set_ok, stats.set_failed, stats.errors) == (1, 2, 2)
        monkeypatch.undo()

        assert st.batch_set_v1(keys[3:4], src) == [True]
        (after,) = segments.locations([st.storage_key(keys[3])])
        assert after is not None and after.offset == 2 * end
        assert st.batch_get_v1(keys[3:4], dst) == [True]
        assert torch.equal(pages_of(host, src)[0], pages_of(host, dst)[0])
        assert st.get_stats().set_bytes == 2 * host.page_numel * host.buffers[0].element_size()
        st.close()
    finally:
        host.close()
