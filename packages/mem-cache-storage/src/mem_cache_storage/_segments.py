"""Segment files: the file backend's layout for its own key scheme (many pages per file).

A directory holds *segments* (append-only files of page records, each written by one backend
instance) and one shared *index log* that publishes them; their format is in
:mod:`mem_cache_storage._segment_format`.

Publishing a page is appending its index entry after its record: a reader that sees the entry
sees the whole record. A writer killed mid-batch leaves records without entries (never seen) or a
torn entry; readers skip an entry whose CRC fails when a valid entry follows it (a torn append)
and wait at one that ends the log (an append still being copied). Every read checks the record
against its entry: the format and byte count before the read, the payload's ``sum64`` after it;
a torn, truncated, misplaced or corrupted record is a miss, never wrong bytes.

Readers keep a map (storage key -> segment, offset, bytes) and parse only the log's new bytes; a
call costs one ``lseek`` of the open log for its size (a ``pread`` when it grew; a ``stat`` of its
path when it shrank, and every 50 ms) and one ``preadv`` / ``pwritev`` per run of adjacent
records (at most 8 MiB or ``IOV_MAX`` buffers; a read run is one page of 256 KiB or more);
segment files stay open (an ``open`` on first use). ``clear`` and compaction, which unlink or
replace the log, then append the retirement entry to the log they took away: a reader holding
it sees it grow, reads that entry and starts over from the published log (its map reset), at
its next call. A log removed by other means is noticed within 50 ms (the path's ``stat``).

Capacity evicts whole segments, least recently used first (a hit refreshes its segment's mtime,
at most once a second): the evicting instance appends a *tombstone* per segment (an entry with
an empty key) before it unlinks them, so every reader drops those pages at its next call; then
it rewrites the log without the entries of deleted segments when they are most of it. A segment
deleted by hand is noticed when a reader first opens it (one it has open keeps serving its
verified bytes).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from typing import Any

from mem_cache_storage._segment_format import (
    _BODY,
    _ENT,
    _ENT_MAGIC,
    _IOV_MAX,
    _OLD_ENT_MAGIC,
    INDEX_NAME,
    RESERVE_BYTES,
    RETIRED,
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    Location,
    _entry,
    _pwritev_all,
    reserve,
)
from mem_cache_storage._sum64 import sum64, sum64_many
from mem_cache_storage.backend import PageBatch, PageFormat, PageRanges, page_views

__all__ = ["INDEX_NAME", "SEGMENT_SUFFIX", "Location", "SegmentStore"]

_TOUCH_S = 1.0
_LOW_WATER = 0.9
_FD_CACHE = 64
#: the open index log is checked with ``lseek`` (its size: an ``fstat`` builds a Python object of
#: 19 fields, 1.5-2.5 us of a 512 KiB page's 40 us read); its path is looked up again at least
#: this often (a log removed without the retirement entry, by hand or by an older version)
_RESTAT_S = 0.05
#: a run read by one ``preadv`` (written by one ``pwritev``) stops past this many bytes, so its
#: pages are still in the last-level cache when their checksums run (after a read, before a
#: write): 1, 4, 8 MiB and unbounded measured, 8 MiB best or even here
_RUN_BYTES = 8 << 20
#: a read run holds one page when pages are at least this big: the page's checksum then runs
#: while the read has just left it in the core's L2 cache (1 MiB here), not in L3 or memory:
#: 8-15% less per page at 256 and 512 KiB than 8 MiB runs; 128 KiB pages read one per
#: ``preadv`` took 10-25% more (the call costs more than the cache saves)
_PAGE_RUN_BYTES = 256 << 10
_NO_RESERVE = 1 << 62


class _Segment:
    __slots__ = ("fd", "name", "reserved", "size")

    def __init__(self, fd: int, name: str) -> None:
        self.fd, self.name, self.size = fd, name, 0
        self.reserved = 0  # blocks reserved up to here (:func:`reserve`); _NO_RESERVE: none

    def close(self) -> None:
        """Close, first giving back the blocks reserved past the end (truncating to the size)."""
        if self.size < self.reserved < _NO_RESERVE:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.size)
        os.close(self.fd)


def _next_entry(data: bytes, start: int) -> int:
    """Where the next entry of either version may start in ``data`` from ``start``; -1: none."""
    found = [i for i in (data.find(_ENT_MAGIC, start), data.find(_OLD_ENT_MAGIC, start)) if i >= 0]
    return min(found) if found else -1


class SegmentStore:
    """The segment layout of one directory (see the module docstring). Thread safe."""

    def __init__(self, root: str, *, segment_bytes: int, fsync: bool, verify: bool,
                 count: Callable[..., None]) -> None:
        self.root = root if root.endswith(os.sep) else root + os.sep
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.verify = verify
        self._count = count
        self._log_path = self.root + INDEX_NAME
        self._token = f"{SEGMENT_PREFIX}{os.getpid():x}-{uuid.uuid4().hex[:12]}"
        self._serial = 0
        self._wlock = threading.Lock()
        #: the segment each record size is appended to (one per size: records of one size lie
        #: back to back, so each starts at a multiple of its size; see the format module)
        self._segs: dict[int, _Segment] = {}
        self._wlog: tuple[int, int] | None = None  # (fd, inode) of the log, for appends
        self._wstat_at = 0.0
        self._rlock = threading.Lock()
        self._map: dict[str, Location] = {}
        self._log: tuple[int, int] | None = None  # (fd, inode) of the log, for reading
        self._log_pos = 0
        self._stat_at = 0.0  # when the log's path was last looked up
        self._fds: dict[str, tuple[int, int]] = {}  # segment -> (fd, inode), reads
        self._dead: set[str] = set()
        self._touched: dict[str, float] = {}
        self.touch_on_hit = False

    # ------------------------------------------------------------------ writes
    def _writable(self, nbytes: int) -> _Segment:
        """The open segment for records of ``nbytes`` (a new one when it is full or was
        deleted)."""
        seg = self._segs.get(nbytes)
        if seg is not None and seg.size < self.segment_bytes and os.fstat(seg.fd).st_nlink:
            return seg
        if seg is not None:
            seg.close()
            del self._segs[nbytes]
        self._serial += 1
        name = f"{self._token}-{self._serial}{SEGMENT_SUFFIX}"
        fd = os.open(self.root + name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        seg = self._segs[nbytes] = _Segment(fd, name)
        return seg

    def _append_log(self, data: bytes) -> None:
        now = time.monotonic()
        if (self._wlog is not None and now - self._wstat_at < _RESTAT_S
                and os.fstat(self._wlog[0]).st_nlink):
            ino = self._wlog[1]  # still the published log
        else:
            self._wstat_at = now
            try:
                ino = os.stat(self._log_path).st_ino
            except FileNotFoundError:
                ino = -1
        if self._wlog is None or self._wlog[1] != ino:
            if self._wlog is not None:
                os.close(self._wlog[0])
                self._wlog = None
            fd = os.open(self._log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._wlog = (fd, os.fstat(fd).st_ino)
        fd = self._wlog[0]
        if os.write(fd, data) != len(data):  # a torn entry: readers skip it
            raise OSError("short append to the index log")
        if self.fsync:
            os.fsync(fd)

    def _reserve(self, seg: _Segment, need: int) -> None:
        """Reserve blocks for ``need`` more bytes, and ahead up to the segment's end."""
        off = seg.size
        if off + need > seg.reserved:
            n = max(need, min(RESERVE_BYTES, self.segment_bytes - off))
            seg.reserved = off + n if reserve(seg.fd, off, n) else _NO_RESERVE

    def put(self, keys: list[str], pages: PageBatch, fmt: PageFormat) -> int:
        """Append ``pages`` under ``keys`` and publish them; the bytes written (``OSError``
        when the batch could not be written: none of it is published)."""
        if len(keys) == 1:
            return self.put_one(keys[0], pages[0], fmt)
        nbytes, fid = fmt.nbytes, fmt.format_id
        with self._wlock:
            seg = self._writable(nbytes)
            bufs: list[Any] = []
            entries: list[bytes] = []
            start = off = flushed = seg.size
            self._reserve(seg, len(keys) * nbytes)
            step = max(1, _RUN_BYTES // max(1, nbytes))
            try:
                for c in range(0, len(keys), step):  # chunks: summed, then written, in cache
                    chunk = pages[c : c + step]
                    sums = sum64_many(chunk) if self.verify else [0] * len(chunk)
                    for key, page, s in zip(keys[c : c + step], chunk, sums):
                        bufs += page_views(page)
                        entries.append(_entry(seg.name, off, nbytes, key, format_id=fid, s=s))
                        off += nbytes
                    _pwritev_all(seg.fd, bufs, flushed)
                    bufs, flushed = [], off
                if self.fsync:
                    os.fdatasync(seg.fd)
            finally:
                seg.size = off  # a failed batch leaves unindexed bytes: never reused
            self._append_log(b"".join(entries))
            return off - start

    def put_one(self, key: str, page: PageRanges, fmt: PageFormat) -> int:
        """:meth:`put` of one page: one checksum, one ``pwritev``, one log append."""
        with self._wlock:
            seg = self._writable(fmt.nbytes)
            off, nbytes = seg.size, fmt.nbytes
            self._reserve(seg, nbytes)
            s = sum64(page) if self.verify else 0
            try:
                _pwritev_all(seg.fd, page_views(page), off)
                if self.fsync:
                    os.fdatasync(seg.fd)
            finally:
                seg.size = off + nbytes  # a failed write leaves unindexed bytes: never reused
            self._append_log(_entry(seg.name, off, nbytes, key, format_id=fmt.format_id, s=s))
            return nbytes

    # ------------------------------------------------------------------- index
    def _reset(self) -> None:
        if self._log is not None:
            os.close(self._log[0])
            self._log = None
        for fd, _ in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._map.clear()
        self._dead.clear()
        self._touched.clear()
        self._log_pos = 0

    def _parse(self, data: bytes) -> int:
        """Add the entries of ``data`` (the log from ``_log_pos``); the bytes consumed, or -1
        at the retirement entry (the log was unlinked or replaced: start over)."""
        pos, n, head = 0, len(data), _ENT.size
        m = self._map
        while pos + head <= n:
            magic, blen, crc = _ENT.unpack_from(data, pos)
            end = pos + head + blen
            known = magic in (_ENT_MAGIC, _OLD_ENT_MAGIC)
            if known and end > n:
                break  # runs past the end: still being appended
            body = data[pos + head : end] if known else b""
            if known and zlib.crc32(body) == crc:
                pos = end
                if magic == _OLD_ENT_MAGIC:  # version 3: its records are not read
                    continue
                off, nbytes, fid, s, slen = _BODY.unpack_from(body)
                seg = body[_BODY.size : _BODY.size + slen].decode()
                key = body[_BODY.size + slen :].decode()
                if key:
                    m[key] = Location(seg, off, nbytes, fid, s)
                elif seg:  # a tombstone: the segment was deleted
                    self._drop(seg)
                else:  # the retirement entry
                    return -1
                continue
            nxt = _next_entry(data, pos + 1)
            if nxt < 0:
                break  # nothing valid after it yet: wait
            pos = nxt  # a torn entry followed by others: skip it
        return pos

    def refresh(self) -> None:
        """Catch up with the log: one ``lseek`` of the open log for its size (a ``pread`` when
        it grew); a ``stat`` of its path when it has none open, when the open one shrank or
        ended with the retirement entry (``clear``, compaction), and at least every
        ``_RESTAT_S``."""
        log = self._log
        if log is not None and time.monotonic() - self._stat_at < _RESTAT_S:
            size = os.lseek(log[0], 0, os.SEEK_END)
            if size == self._log_pos or (size > self._log_pos and self._catch_up(log[0], size)):
                return
        self._stat_at = time.monotonic()
        try:
            st = os.stat(self._log_path)
        except FileNotFoundError:
            if self._log is not None or self._map:
                self._reset()
            return
        if self._log is None or self._log[1] != st.st_ino or st.st_size < self._log_pos:
            self._reset()
            try:
                fd = os.open(self._log_path, os.O_RDONLY)
            except FileNotFoundError:
                return
            self._log = (fd, os.fstat(fd).st_ino)
        if st.st_size > self._log_pos:
            self._catch_up(self._log[0], st.st_size)  # retired meanwhile: the next call looks

    def _catch_up(self, fd: int, size: int) -> bool:
        """Parse the open log (``fd``) up to ``size``; ``False`` (and the map reset) when it
        was retired."""
        used = self._parse(os.pread(fd, size - self._log_pos, self._log_pos))
        if used < 0:
            self._reset()
            return False
        self._log_pos += used
        return True

    def _live(self, names: set[str]) -> set[str]:
        """The segments of ``names`` not known dead, with a read ``fd`` open on each (opened on
        first use: a segment missing then is dead). Deletions by other instances arrive as
        tombstones in the log, so a cached segment costs no system call."""
        live: set[str] = set()
        for name in names:
            if name in self._dead:
                continue
            if name not in self._fds:
                if len(self._fds) >= _FD_CACHE:
                    old = next(iter(self._fds))
                    os.close(self._fds.pop(old)[0])
                try:
                    fd = os.open(self.root + name, os.O_RDONLY)
                except FileNotFoundError:
                    self._drop(name)
                    continue
                self._fds[name] = (fd, 0)
            live.add(name)
        return live

    def _drop(self, name: str) -> None:
        self._dead.add(name)
        cached = self._fds.pop(name, None)
        if cached is not None:
            os.close(cached[0])

    def locations(self, keys: list[str]) -> list[Location | None]:
        """The record of each key in a live segment (``None``: absent)."""
        with self._rlock:
            self.refresh()
            locs = [self._map.get(k) for k in keys]
            live = self._live({loc.segment for loc in locs if loc is not None})
        return [loc if loc is not None and loc.segment in live else None for loc in locs]

    def exists(self, keys: list[str]) -> list[bool]:
        return [loc is not None for loc in self.locations(keys)]

    def exists_prefix(self, keys: list[str]) -> int:
        with self._rlock:
            self.refresh()
            n = 0
            for k in keys:
                loc = self._map.get(k)
                if loc is None or not (loc.segment in self._fds or self._live({loc.segment})):
                    break
                n += 1
        return n

    # ------------------------------------------------------------------- reads
    def get_one(self, key: str, page: PageRanges, fmt: PageFormat) -> bool:
        """:meth:`get` of one page: one lookup, one ``preadv``, one checksum."""
        with self._rlock:  # held through the read: no fd is closed under it
            self.refresh()
            loc = self._map.get(key)
            if loc is None or not (loc.segment in self._fds or self._live({loc.segment})):
                return False
            ok = self._fits(loc, fmt) and self._read_one(self._fds[loc.segment][0], loc, page)
            if ok and self.touch_on_hit:
                self._touch({loc.segment})
        return ok

    def get(self, keys: list[str], pages: PageBatch, fmt: PageFormat) -> list[bool]:
        """Read and verify each page; ``False``: absent or rejected (counted)."""
        if len(keys) == 1:
            return [self.get_one(keys[0], pages[0], fmt)]
        with self._rlock:  # held through the reads: no fd is closed under them
            self.refresh()
            plist = list(pages)
            locs = [self._map.get(k) for k in keys]
            live = self._live({loc.segment for loc in locs if loc is not None})
            out = [False] * len(keys)
            nbytes, fid = fmt.nbytes, fmt.format_id
            limit = nbytes if nbytes >= _PAGE_RUN_BYTES else _RUN_BYTES
            i, n = 0, len(keys)
            while i < n:  # runs of adjacent records of one segment: one preadv each
                loc = locs[i]
                if loc is None or loc.segment not in live or not self._fits(loc, fmt):
                    i += 1
                    continue
                bufs: list[Any] = page_views(plist[i])
                run = [loc]
                j, end = i + 1, loc.offset + nbytes
                while j < n:  # the run grows by the records that follow it
                    nxt = locs[j]
                    if (nxt is None or nxt.segment != loc.segment or nxt.offset != end
                            or nxt.format_id != fid or nxt.nbytes != nbytes
                            or len(bufs) + len(plist[j]) > _IOV_MAX
                            or end - loc.offset >= limit):
                        break
                    bufs += page_views(plist[j])
                    run.append(nxt)
                    end += nbytes
                    j += 1
                fd = self._fds[loc.segment][0]
                try:
                    got = os.preadv(fd, bufs, loc.offset)
                except OSError:
                    self._count(errors=1)
                    got = -1
                if got == end - loc.offset:
                    sums = sum64_many(plist[i:j]) if self.verify else [0] * (j - i)
                    for k, rec in enumerate(run, i):
                        out[k] = self._verify(rec, plist[k], sums[k - i])
                elif got >= 0:  # short: the file was cut; page by page
                    for k, rec in enumerate(run, i):
                        out[k] = self._read_one(fd, rec, plist[k])
                i = j
            if self.touch_on_hit:
                self._touch({loc.segment for loc, ok in zip(locs, out) if ok and loc})
        return out

    def _fits(self, loc: Location, fmt: PageFormat) -> bool:
        """Whether the record's entry names ``fmt`` (its format id and bytes): else a miss,
        counted as rejected, without a read."""
        if loc.format_id == fmt.format_id and loc.nbytes == fmt.nbytes:
            return True
        self._count(rejected=1)
        return False

    def _read_one(self, fd: int, loc: Location, page: Any) -> bool:
        try:
            got = os.preadv(fd, page_views(page), loc.offset)
        except OSError:
            self._count(errors=1)
            return False
        if got != loc.nbytes:
            self._count(rejected=1)
            return False
        return self._verify(loc, page)

    def _verify(self, loc: Location, page: Any, got: int | None = None) -> bool:
        """Check the payload read into ``page`` against its entry's ``sum64`` (``got``: the
        page's ``sum64`` when the caller computed it)."""
        if self.verify and loc.sum64 != (sum64(page) if got is None else got):
            self._count(rejected=1)
            return False
        return True

    def _touch(self, names: set[str]) -> None:
        now = time.monotonic()
        for name in names:
            if now - self._touched.get(name, -_TOUCH_S) >= _TOUCH_S:
                self._touched[name] = now
                with contextlib.suppress(OSError):
                    os.utime(self._fds[name][0])

    # ----------------------------------------------------------- space, clear
    def scan(self) -> list[tuple[float, str, int]]:
        """(mtime, name, bytes) of every segment file in the directory."""
        found: list[tuple[float, str, int]] = []
        with os.scandir(self.root) as it:
            for entry in it:
                name = entry.name
                if not (name.startswith(SEGMENT_PREFIX) and name.endswith(SEGMENT_SUFFIX)):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat()
                    found.append((st.st_mtime, name, st.st_size))
        return found

    def evict(self, capacity: int) -> tuple[int, int]:
        """Delete least recently used segments until they hold at most 90% of ``capacity``;
        (pages evicted, bytes left)."""
        found = sorted(self.scan())
        total = sum(n for _, _, n in found)
        target = int(capacity * _LOW_WATER)
        gone: list[str] = []
        for _, name, n in found:
            if total <= target:
                break
            gone.append(name)
            total -= n
        if gone:  # tombstones first: every reader learns of the deletions from the log
            with self._wlock, contextlib.suppress(OSError):
                self._append_log(b"".join(_entry(name, 0, 0, "") for name in gone))
        for name in gone:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.root + name)
        with self._rlock:
            self.refresh()
            dropped = set(gone)
            pages = sum(1 for loc in self._map.values() if loc.segment in dropped)
            for name in gone:
                self._drop(name)
            dead = sum(1 for loc in self._map.values() if loc.segment in self._dead)
            if gone and 2 * dead > len(self._map):
                self._compact()
        return pages, total

    def _compact(self) -> None:
        """Rewrite the log with the entries of live segments (caller holds ``_rlock``). Entries
        another process appends meanwhile are lost: those pages become misses."""
        keep = [(k, loc) for k, loc in self._map.items() if loc.segment not in self._dead]
        parts = [_entry(loc.segment, loc.offset, loc.nbytes, key, format_id=loc.format_id,
                        s=loc.sum64) for key, loc in keep]
        tmp = f"{self.root}.tmp-{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as f:
                f.write(b"".join(parts))
            self._retire(lambda: os.replace(tmp, self._log_path))
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            return
        self._reset()

    def _retire(self, take_away: Callable[[], None]) -> None:
        """Run ``take_away`` (it unlinks or replaces the published log), then append the
        retirement entry to the log it took away: every reader holding that log open sees it
        grow and starts over at its next call (see the module docstring)."""
        try:
            fd = os.open(self._log_path, os.O_WRONLY | os.O_APPEND)
        except OSError:  # no log, or not ours to write: readers notice within _RESTAT_S
            take_away()
            return
        try:
            take_away()
            with contextlib.suppress(OSError):  # then readers notice within _RESTAT_S
                os.write(fd, RETIRED)
        finally:
            os.close(fd)

    def _unlink_log(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._log_path)

    def clear(self) -> None:
        """Remove every segment and the log (of every process: the directory is shared)."""
        with self._wlock, self._rlock:
            self._retire(self._unlink_log)
            for _, name, _ in self.scan():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.root + name)
            for seg in self._segs.values():
                os.close(seg.fd)
            self._segs.clear()
            self._reset()

    def close(self) -> None:
        with self._wlock, self._rlock:
            for seg in self._segs.values():
                seg.close()
            self._segs.clear()
            if self._wlog is not None:
                os.close(self._wlog[0])
                self._wlog = None
            self._reset()
