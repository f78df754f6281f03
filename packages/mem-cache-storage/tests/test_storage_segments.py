"""The file backend's segment layout (our key scheme): crash safety (a writer killed between its
records and its index entry, or mid-record, leaves misses), torn and pending index entries,
foreign / truncated / corrupted records, sharing a directory between instances and processes
(clear, eviction), log compaction, many ranges per page, and the ``sum64`` checksum."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from mem_cache_storage import HiCacheFile, HiCacheStorageConfig, page_hashes
from mem_cache_storage._segment_format import (
    _BODY,
    _ENT,
    _ENT_MAGIC,
    INDEX_NAME,
    RETIRED,
    Location,
)
from mem_cache_storage._sum64 import sum64, sum64_bytes, sum64_many, use_numpy

from .conftest import PS, make_host, pages_of

CFG = HiCacheStorageConfig(model_name="m", extra_config={"model_fingerprint": "w1"})


def _keys(n: int, salt: int = 0) -> list[str]:
    return page_hashes([salt * 1000 + i for i in range(n * PS)], PS)


def _same(host: Any, a: torch.Tensor, b: torch.Tensor) -> bool:
    return all(torch.equal(x, y) for x, y in zip(pages_of(host, a), pages_of(host, b)))


def _entry(segment: str, offset: int, nbytes: int, skey: str, *, fid: int = 0,
           s: int = 0) -> bytes:
    """An index entry, built here from the format's description (not the store's code)."""
    body = _BODY.pack(offset, nbytes, fid, s, len(segment)) + segment.encode() + skey.encode()
    return _ENT.pack(_ENT_MAGIC, len(body), zlib.crc32(body)) + body


def _location(st: HiCacheFile, key: str) -> Location:
    segments = st._segments
    assert segments is not None
    (loc,) = segments.locations([st.storage_key(key)])
    assert loc is not None
    return loc


def _count_preadv(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the store's ``preadv`` calls from now on (in the returned one-item list)."""
    reads = [0]
    preadv = os.preadv

    def counted(*args: Any) -> int:
        reads[0] += 1
        return preadv(*args)

    monkeypatch.setattr(os, "preadv", counted)
    return reads


def _record(st: HiCacheFile, key: str) -> tuple[str, int, int]:
    """(segment name, record offset, record bytes) of ``key``."""
    loc = _location(st, key)
    return loc.segment, loc.offset, loc.nbytes


def test_round_trip_one_segment_one_log(tmp_path: Path, host: Any) -> None:
    st = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    keys = _keys(6)
    src, dst = host.alloc(6 * PS), host.alloc(6 * PS)
    assert st.batch_set_v1(keys, src) == [True] * 6
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2 and INDEX_NAME in names, names  # one segment, one index log
    assert st.batch_get_v1(keys, dst) == [True] * 6 and _same(host, src, dst)
    assert st.batch_exists(keys) == 6


def _crash_script(tmp_path: Path, patch: str) -> str:
    return textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from conftest import make_host, PS
        from mem_cache_storage import HiCacheFile, HiCacheStorageConfig, page_hashes
        import mem_cache_storage._segments as seg
        host = make_host()
        st = HiCacheFile(HiCacheStorageConfig(model_name="m",
                         extra_config={{"model_fingerprint": "w1"}}), host,
                         storage_dir={str(tmp_path)!r})
        src = host.alloc(4 * PS)
        assert st.batch_set_v1(page_hashes(list(range(4 * PS)), PS), src) == [True] * 4
        {patch}
        st.batch_set_v1(page_hashes(list(range(1000, 1000 + 4 * PS)), PS), src)
        print("not reached")
        """
    )


@pytest.mark.parametrize("where", ["before the index entry", "mid-record", "mid-entry"])
def test_a_writer_killed_mid_batch_leaves_misses(tmp_path: Path, where: str) -> None:
    """A process dies while writing its second batch: the first batch stays readable, the
    pages of the second whose entries were not whole are misses (the entries cut a third of
    the way in: the first page's entry is whole, so that page is published), never wrong bytes,
    and the directory keeps working for others."""
    patch = {
        # records written, then killed before the index append
        "before the index entry": "seg.SegmentStore._append_log = lambda self, data: os._exit(9)",
        # half the bytes of the batch written, then killed
        "mid-record": (
            "real = os.pwritev\n"
            "seg.os.pwritev = lambda fd, bufs, off: (real(fd, [bytes(b)[: len(b) // 2] for b "
            "in bufs[:1]], off), os._exit(9))"
        ),
        # the index entries of the batch cut in the middle (a torn O_APPEND write)
        "mid-entry": (
            "real_write = os.write\n"
            "seg.os.write = lambda fd, data: (real_write(fd, data[: len(data) // 3 + 5]), "
            "os._exit(9))"
        ),
    }[where]
    script = _crash_script(tmp_path, textwrap.indent(patch, " " * 8).lstrip())
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 9, proc.stderr
    host = make_host()  # same seed: the bytes the crashed writer wrote
    try:
        st = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
        first = page_hashes(list(range(4 * PS)), PS)
        second = page_hashes(list(range(1000, 1000 + 4 * PS)), PS)
        src, dst = host.alloc(4 * PS), host.alloc(4 * PS)
        assert st.batch_get_v1(first, dst) == [True] * 4 and _same(host, src, dst)
        published = 1 if where == "mid-entry" else 0
        assert st.batch_exists(second) == published
        assert st.batch_get_v1(second, dst) == [True] * published + [False] * (4 - published)
        assert _same(host, src[: published * PS], dst[: published * PS])
        # the next writer's pages are found after the torn bytes
        third = _keys(3, salt=7)
        assert st.batch_set_v1(third, src[: 3 * PS]) == [True] * 3
        other = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
        assert other.batch_get_v1(third, dst[: 3 * PS]) == [True] * 3
        assert _same(host, src[: 3 * PS], dst[: 3 * PS])
    finally:
        host.close()


def test_a_pending_entry_is_seen_once_complete(tmp_path: Path, host: Any) -> None:
    """An entry still being appended (only its first bytes visible) is not a hit yet and is not
    skipped: once its last bytes land, the page is found."""
    st = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    keys = _keys(2)
    src, dst = host.alloc(2 * PS), host.alloc(2 * PS)
    assert st.batch_set_v1(keys[:1], src[:PS]) == [True]
    seg, off, rec = _record(st, keys[0])
    # a record of keys[1]'s bytes at the end of a segment of our own, then its entry in 2 parts
    writer = HiCacheFile(CFG, host, storage_dir=str(tmp_path / "w"))
    assert writer.batch_set_v1(keys[1:], src[PS:]) == [True]
    wloc = _location(writer, keys[1])
    data = (tmp_path / "w" / wloc.segment).read_bytes()[wloc.offset : wloc.offset + wloc.nbytes]
    (tmp_path / wloc.segment).write_bytes(data)
    entry = _entry(wloc.segment, 0, wloc.nbytes, st.storage_key(keys[1]),
                   fid=wloc.format_id, s=wloc.sum64)
    log = tmp_path / INDEX_NAME
    with open(log, "ab") as f:
        f.write(entry[:9])
    assert st.batch_exists(keys) == 1
    with open(log, "ab") as f:
        f.write(entry[9:])
    assert st.batch_exists(keys) == 2
    assert st.batch_get_v1(keys, dst) == [True, True] and _same(host, src, dst)
    assert _record(st, keys[0]) == (seg, off, rec)  # the first page is where it was


def test_foreign_truncated_and_corrupted_records_are_misses(tmp_path: Path, host: Any) -> None:
    """A record is checked against its entry: an entry that points at another page's record (a
    misplaced entry, with its own page's checksum), one that names another format (its record
    right after a good one: the run stops there), a flipped payload byte and a cut segment are
    misses (``rejected``), never wrong bytes, and the other pages of the batch still hit."""
    st = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    keys = _keys(6)
    src, dst = host.alloc(6 * PS), host.alloc(6 * PS)
    assert st.batch_set_v1(keys, src) == [True] * 6
    locs = [_location(st, k) for k in keys]
    # an entry naming key 3, with key 3's checksum, pointing at key 0's record
    with open(tmp_path / INDEX_NAME, "ab") as f:
        f.write(_entry(locs[0].segment, locs[0].offset, locs[0].nbytes, st.storage_key(keys[3]),
                       fid=locs[3].format_id, s=locs[3].sum64))
    assert st.batch_get_v1(keys[3:4], dst[3 * PS : 4 * PS]) == [False]
    assert st.get_stats().rejected == 1
    # an entry naming key 1 (its place, bytes and checksum right) in another format: not read
    with open(tmp_path / INDEX_NAME, "ab") as f:
        f.write(_entry(locs[1].segment, locs[1].offset, locs[1].nbytes, st.storage_key(keys[1]),
                       fid=locs[1].format_id ^ 1, s=locs[1].sum64))
    assert st.batch_get_v1(keys[:3], dst[: 3 * PS]) == [True, False, True]
    assert st.get_stats().rejected == 2
    # a flipped byte in key 2's payload: a miss, the others still hit
    path = tmp_path / locs[0].segment
    raw = bytearray(path.read_bytes())
    raw[locs[2].offset + 8] ^= 1
    path.write_bytes(bytes(raw))
    assert st.batch_get_v1(keys[:3], dst[: 3 * PS]) == [True, False, False]
    assert st.get_stats().rejected == 4
    # the segment cut inside key 5's payload: keys 4 and 5 are one run, whose preadv comes back
    # short; then page by page: key 4 hits, key 5 is a miss
    os.truncate(path, locs[5].offset + locs[5].nbytes - 3)
    assert st.batch_get_v1(keys[4:], dst[4 * PS :]) == [True, False]
    assert _same(host, src[:PS], dst[:PS])
    assert _same(host, src[4 * PS : 5 * PS], dst[4 * PS : 5 * PS])


def test_another_instance_clears_and_evicts(tmp_path: Path, host: Any) -> None:
    a = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    b = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    keys = _keys(3)
    src, dst = host.alloc(3 * PS), host.alloc(3 * PS)
    assert a.batch_set_v1(keys, src) == [True] * 3
    assert b.batch_exists(keys) == 3
    b.clear()  # removes a's segment and the log
    assert a.batch_exists(keys) == 0 and a.batch_get_v1(keys, dst) == [False] * 3
    assert a.batch_set_v1(keys, src) == [True] * 3  # a notices its segment is gone
    assert b.batch_get_v1(keys, dst) == [True] * 3 and _same(host, src, dst)
    assert a.batch_get_v1(keys, dst) == [True] * 3  # a keeps its segment open now
    # c evicts every segment (capacity 1 byte): its tombstones tell a at once
    c = HiCacheFile(CFG, host, storage_dir=str(tmp_path), capacity_bytes=1)
    assert c.batch_set_v1(_keys(1, salt=5), src[:PS]) == [True]
    assert a.batch_exists(keys) == 0
    assert a.batch_get_v1(keys, dst) == [False] * 3
    # a segment deleted by hand: a miss for a reader that had not opened it yet
    assert a.batch_set_v1(keys, src) == [True] * 3
    d = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    extent = a.page_extent(keys[0])
    assert extent is not None
    extent[0].unlink()
    assert d.batch_get_v1(keys, dst) == [False] * 3 and d.batch_exists(keys) == 0


def test_eviction_compacts_the_log(tmp_path: Path, host: Any) -> None:
    st = HiCacheFile(CFG, host, storage_dir=str(tmp_path), segment_bytes=1)
    src = host.alloc(PS)
    assert st.batch_set_v1(_keys(1), src) == [True]
    record = next(tmp_path.glob("seg-*.kvp")).stat().st_size
    st.clear()
    st = HiCacheFile(CFG, host, storage_dir=str(tmp_path), capacity_bytes=4 * record,
                     segment_bytes=1)
    for salt in range(40):
        assert st.batch_set_v1(_keys(1, salt), src) == [True]
    assert st.get_stats().evicted >= 30
    entry = len(_entry("seg-x-1.kvp", 0, 0, st.storage_key(_keys(1)[0])))
    log = (tmp_path / INDEX_NAME).stat().st_size
    assert log <= 12 * (entry + 16), f"the index log kept dead entries ({log} bytes)"
    live = [salt for salt in range(40) if st.exists(_keys(1, salt)[0])]
    assert live and live == list(range(40 - len(live), 40))
    dst = host.alloc(PS)
    assert st.batch_get_v1(_keys(1, live[-1]), dst) == [True] and _same(host, src, dst)


def test_many_ranges_per_page_and_long_batches(tmp_path: Path) -> None:
    """layer_first: 4 ranges per page; 250 pages are 1250 buffers, more than one preadv /
    pwritev takes (IOV_MAX)."""
    host = make_host("layer_first", size=1024)
    try:
        st = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
        n = 250
        keys = _keys(n)
        src, dst = host.alloc(n * PS), host.alloc(n * PS)
        assert st.batch_set_v1(keys, src) == [True] * n
        assert st.batch_get_v1(keys, dst) == [True] * n and _same(host, src, dst)
        assert st.batch_exists(keys) == n
    finally:
        host.close()


def test_large_pages_are_read_one_per_preadv(tmp_path: Path, host: Any,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of pages smaller than ``_PAGE_RUN_BYTES`` is read as one run (one ``preadv``);
    pages at least that big are read one per ``preadv``, each summed right after its read;
    both round-trip bit-exact, and a corrupted page is a miss alone in either."""
    from mem_cache_storage import _segments

    st = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    n = 6
    keys = _keys(n)
    src, dst = host.alloc(n * PS), host.alloc(n * PS)
    assert st.batch_set_v1(keys, src) == [True] * n
    page_bytes = st.get_stats().set_bytes // n
    reads = _count_preadv(monkeypatch)
    for threshold, calls in ((page_bytes + 1, 1), (page_bytes, n)):
        monkeypatch.setattr(_segments, "_PAGE_RUN_BYTES", threshold)
        reads[0] = 0
        dst_pages = host.alloc(n * PS)
        assert st.batch_get_v1(keys, dst_pages) == [True] * n and _same(host, src, dst_pages)
        assert reads[0] == calls, threshold
    seg, off, rec = _record(st, keys[2])
    with open(tmp_path / seg, "r+b") as f:
        f.seek(off + rec - 1)
        last = f.read(1)
        f.seek(off + rec - 1)
        f.write(bytes([last[0] ^ 0x01]))
    for threshold in (page_bytes + 1, page_bytes):
        monkeypatch.setattr(_segments, "_PAGE_RUN_BYTES", threshold)
        assert st.batch_get_v1(keys, dst) == [k != 2 for k in range(n)], threshold


def test_threads_share_one_instance(tmp_path: Path, host: Any) -> None:
    st = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    src = host.alloc(8 * PS)
    errors: list[str] = []

    def work(t: int) -> None:
        dst = host.alloc(2 * PS)
        for i in range(20):
            keys = _keys(2, salt=100 * t + i)
            if st.batch_set_v1(keys, src[2 * PS * t : 2 * PS * (t + 1)]) != [True, True]:
                errors.append("set")
            if st.batch_get_v1(keys, dst) != [True, True] or not _same(
                    host, src[2 * PS * t : 2 * PS * (t + 1)], dst):
                errors.append("get")
        host.free(dst)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors


@pytest.fixture(params=["numpy", "torch"])
def reductions(request: pytest.FixtureRequest) -> Any:
    """Both reduction paths of ``sum64`` (numpy's when installed, torch's always)."""
    if request.param == "numpy":
        pytest.importorskip("numpy", reason="sum64's numpy path needs numpy")
    assert use_numpy(request.param == "numpy") == (request.param == "numpy")
    yield request.param
    use_numpy(True)


def _page(data: bytearray, split: int | None = None) -> tuple[tuple[int, int], ...]:
    base = ctypes.addressof((ctypes.c_ubyte * len(data)).from_buffer(data))
    if split is None:
        return ((base, len(data)),)
    return ((base, split), (base + split, len(data) - split))


def test_sum64_catches_every_changed_byte_and_ignores_the_split(reductions: str) -> None:
    gen = torch.Generator().manual_seed(3)
    data = bytearray(torch.randint(0, 256, (256,), dtype=torch.uint8, generator=gen).numpy())
    want = sum64(_page(data))
    assert want == sum64_bytes(bytes(data))
    assert sum64(_page(data, 128)) == want  # whole words per range: the fast path
    assert sum64(_page(data, 13)) == want  # ranges that split words: the same sum
    for i in range(len(data)):
        for delta in (1, 0x80, 0xFF):
            data[i] = (data[i] + delta) % 256
            assert sum64(_page(data)) != want, (i, delta)
            data[i] = (data[i] - delta) % 256
    assert sum64(_page(bytearray(256))) != sum64(_page(bytearray(248)))  # zeros: length mixed


def test_sum64_of_one_page_in_one_reduction_equals_its_flat_bytes(reductions: str) -> None:
    """A page whose equal ranges lie at one stride (a host page's K and V, in any order, with
    a gap between them) takes one strided reduction: the same sum as its flat bytes; every
    changed byte of either range and a zeroed page change it; other strides fall back."""
    gen = torch.Generator().manual_seed(7)
    data = bytearray(torch.randint(0, 256, (4 * 64,), dtype=torch.uint8, generator=gen).numpy())
    base = ctypes.addressof((ctypes.c_ubyte * len(data)).from_buffer(data))
    k, v, w = (base, 64), (base + 96, 64), (base + 192, 64)  # stride 96: a 32-byte gap
    flat = lambda *rs: b"".join(ctypes.string_at(p, n) for p, n in rs)  # noqa: E731
    for page in ((k, v), (v, k), (k, v, w), (w, k, v), (k, w), ((base, 64), (base + 96, 32))):
        assert sum64(page) == sum64_bytes(flat(*page)), page
    want = sum64((v, k))
    for i in list(range(0, 64)) + list(range(96, 160)):
        for delta in (1, 0x80):
            data[i] = (data[i] + delta) % 256
            assert sum64((v, k)) != want, (i, delta)
            data[i] = (data[i] - delta) % 256
    assert sum64((v, k)) == want
    ctypes.memset(base, 0, 160)
    assert sum64((v, k)) != want and sum64((v, k)) == sum64_bytes(bytes(128))


def test_sum64_many_equals_page_by_page(reductions: str) -> None:
    """The one-reduction path (pages at a fixed stride, two ranges each, as a page_first host
    pool hands them out) and its fallback (no common stride) give ``sum64`` of each page."""
    gen = torch.Generator().manual_seed(5)
    data = bytearray(torch.randint(0, 256, (2 * 8 * 96,), dtype=torch.uint8,
                                   generator=gen).numpy())
    base = ctypes.addressof((ctypes.c_ubyte * len(data)).from_buffer(data))
    half = len(data) // 2  # "K" and "V" buffers, 8 pages of 96 bytes each
    pages = [((base + 96 * j, 96), (base + half + 96 * j, 96)) for j in range(8)]
    want = [sum64(p) for p in pages]
    assert sum64_many(pages) == want
    assert sum64_many(pages[::-1]) == want[::-1]  # no common stride: page by page
    data[half + 96 * 5 + 17] ^= 0x10  # one byte of page 5's second range
    got = sum64_many(pages)
    assert [g != w for g, w in zip(got, want)] == [j == 5 for j in range(8)]


def test_tombstones_tell_readers_with_open_segments(tmp_path: Path, host: Any) -> None:
    """Another instance evicts a few segments (too few to compact the log): a reader that holds
    them open learns of it from the tombstones in the log, not from the file system."""
    a = HiCacheFile(CFG, host, storage_dir=str(tmp_path), segment_bytes=1)
    src, dst = host.alloc(PS), host.alloc(PS)
    keys = [_keys(1, salt)[0] for salt in range(10)]
    for key in keys:  # one page per segment, oldest first
        assert a.batch_set_v1([key], src) == [True]
    for key in keys:
        assert a.batch_get_v1([key], dst) == [True]  # a opens every segment
    record = next(tmp_path.glob("seg-*.kvp")).stat().st_size
    for age, key in enumerate(keys):  # mtimes in write order, 10 s apart
        extent = a.page_extent(key)
        assert extent is not None
        os.utime(extent[0], (1e9 + 10 * age, 1e9 + 10 * age))
    c = HiCacheFile(CFG, host, storage_dir=str(tmp_path), capacity_bytes=int(8.5 * record),
                    segment_bytes=1)
    assert c.batch_set_v1(_keys(1, salt=99), src) == [True]  # 11 segments: evicts 4 down to 7
    gone = [k for k in keys if not c.exists(k)]
    assert gone == keys[: len(gone)] and 0 < len(gone) < 5, gone
    assert [a.exists(k) for k in keys] == [k not in gone for k in keys]
    assert a.batch_get_v1(gone[:1], dst) == [False]


def test_a_retired_log_tells_the_readers_holding_it(tmp_path: Path, host: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Another instance's ``clear`` and log compaction reach a reader that holds the old log
    open at its next call, through the retirement entry appended to that log (readers check
    the open log's size; the look-up of the log's path, every 50 ms, is switched off here)."""
    from mem_cache_storage import _segments

    monkeypatch.setattr(_segments, "_RESTAT_S", 1e9)
    compactions = [0]
    compact = _segments.SegmentStore._compact

    def counted(self: Any) -> None:
        compactions[0] += 1
        compact(self)

    monkeypatch.setattr(_segments.SegmentStore, "_compact", counted)
    a = HiCacheFile(CFG, host, storage_dir=str(tmp_path), segment_bytes=1)
    b = HiCacheFile(CFG, host, storage_dir=str(tmp_path), segment_bytes=1)
    keys = _keys(3)
    src, dst = host.alloc(3 * PS), host.alloc(3 * PS)
    assert b.batch_set_v1(keys, src) == [True] * 3
    assert a.batch_get_v1(keys, dst) == [True] * 3  # a holds the log and b's segment open
    b.clear()
    assert a.batch_exists(keys) == 0 and a.batch_get_v1(keys, dst) == [False] * 3
    assert b.batch_set_v1(keys, src) == [True] * 3  # a new log: a follows it
    assert a.batch_get_v1(keys, dst) == [True] * 3 and _same(host, src, dst)
    b.clear()
    record = 0
    c = None
    for salt in range(40):  # c evicts and compacts (replaces the log) again and again
        key = _keys(1, salt)
        if c is None:
            assert b.batch_set_v1(key, src[:PS]) == [True]
            record = next(tmp_path.glob("seg-*.kvp")).stat().st_size
            c = HiCacheFile(CFG, host, storage_dir=str(tmp_path), capacity_bytes=4 * record,
                            segment_bytes=1)
            continue
        assert c.batch_set_v1(key, src[:PS]) == [True]
        assert a.batch_exists(key) == c.batch_exists(key) == 1, salt  # a sees the newest page
        assert a.batch_get_v1(key, dst[:PS]) == [True], salt
    assert c is not None and c.get_stats().evicted >= 30 and compactions[0] >= 5
    assert RETIRED not in (tmp_path / INDEX_NAME).read_bytes()  # only in logs taken away


def test_version_3_entries_are_skipped_whole(tmp_path: Path, host: Any) -> None:
    """A log that still holds entries of version 3 (magic ``MCSI``, a head before each record,
    no checksum in the entry): a reader skips them whole (their pages are misses, its place in
    the log moves past them) and finds the pages written after them."""
    from mem_cache_storage._segment_format import _OLD_BODY, _OLD_ENT_MAGIC

    keys = _keys(3)
    st = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    old = []
    for k in keys[:2]:  # what a version 3 writer appended for two pages
        body = _OLD_BODY.pack(0, 4096, 11) + b"seg-old.kvp" + st.storage_key(k).encode()
        old.append(_ENT.pack(_OLD_ENT_MAGIC, len(body), zlib.crc32(body)) + body)
    log = tmp_path / INDEX_NAME
    log.write_bytes(b"".join(old))
    reader = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    segments = reader._segments
    assert segments is not None
    assert reader.batch_exists(keys) == 0 and segments._log_pos == log.stat().st_size
    src, dst = host.alloc(PS), host.alloc(PS)
    assert st.batch_set_v1(keys[2:], src) == [True]
    assert [reader.exists(k) for k in keys] == [False, False, True]
    assert reader.batch_get_v1(keys[2:], dst) == [True] and _same(host, src, dst)
    assert segments._log_pos == log.stat().st_size


def test_clear_without_write_access_to_the_log_still_clears(
        tmp_path: Path, host: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``clear`` unlinks the log even when it may not append the retirement entry to it (a log
    another user owns): the directory is emptied and a reader holding the old log sees misses
    once it looks the path up again (``_RESTAT_S``, 0 here)."""
    from mem_cache_storage import _segments

    a = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    b = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    keys = _keys(2)
    src, dst = host.alloc(2 * PS), host.alloc(2 * PS)
    assert a.batch_set_v1(keys, src) == [True, True]
    assert b.batch_get_v1(keys, dst) == [True, True]
    real_open = os.open

    def no_append(path: str, flags: int, *args: Any) -> int:
        if str(path).endswith(INDEX_NAME) and flags & os.O_APPEND and not flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(_segments.os, "open", no_append)
    a.clear()
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    monkeypatch.setattr(_segments, "_RESTAT_S", 0.0)
    assert b.batch_exists(keys) == 0 and b.batch_get_v1(keys, dst) == [False, False]


def test_a_page_of_more_ranges_than_a_run_may_hold_is_read_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run always takes its first page, whatever its number of ranges: with the buffer limit
    of a run (``_IOV_MAX``) below a page's 4 ranges (layer_first), each page is read by a
    ``preadv`` of its own, bit-exact. A run that could not take its first page had read nothing
    and looped forever."""
    from mem_cache_storage import _segments

    host = make_host("layer_first", size=64)
    try:
        st = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
        keys = _keys(3)
        src, dst = host.alloc(3 * PS), host.alloc(3 * PS)
        assert st.batch_set_v1(keys, src) == [True] * 3
        monkeypatch.setattr(_segments, "_IOV_MAX", 2)
        reads = _count_preadv(monkeypatch)
        assert st.batch_get_v1(keys, dst) == [True] * 3 and _same(host, src, dst)
        assert reads[0] == 3
    finally:
        host.close()
