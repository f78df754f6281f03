"""The file backend's ``sglang`` key scheme (a base of
:class:`~mem_cache_storage.file.HiCacheFile`): one file per page, named and laid out as SGLang
0.5.23's ``HiCacheFile`` does (the raw flat page, no header), written to a temporary file and
renamed; a side-car ``{name}.mcs`` (magic, version, byte count, ``sum64``; version 1: CRC-32),
written before the page, is checked when present, so a page this backend wrote and that was
damaged later is a miss (a page SGLang wrote has none: its size is checked)."""

from __future__ import annotations

import contextlib
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from mem_cache_storage._sum64 import sum64, sum64_many
from mem_cache_storage.backend import (
    PageBatch,
    PageFormat,
    PageRanges,
    StorageStats,
    checksum,
    view,
)

__all__ = ["SGLangFiles"]

_SIDE = struct.Struct("<4sHQQ")  # magic, version 2, payload bytes, sum64
_SIDE_V1 = struct.Struct("<4sHQI")  # magic, version 1, payload bytes, crc32
_SIDE_MAGIC = b"MCSs"


class SGLangFiles:
    """The ``sglang`` scheme's page files (see the module docstring); the backend's state and
    calls they use are declared here for mypy."""

    fsync: bool
    capacity_bytes: int
    stats: StorageStats
    _tmp: str
    _serial: Iterator[int]
    _lock: threading.Lock
    _index: OrderedDict[str, int]

    if TYPE_CHECKING:  # the backend's, used here

        @property
        def verify_checksum(self) -> bool: ...

        def _spath(self, skey: str) -> str: ...

        def _sidecar(self, skey: str) -> str: ...

    def _write_sglang(self, skey: str, page: PageRanges, fmt: PageFormat) -> int:
        """SGLang's layout: the side-car in place, then the page to a temporary file renamed
        over its name (open, writev, close, rename)."""
        if self.verify_checksum:
            side = os.open(self._sidecar(skey), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(side, _SIDE.pack(_SIDE_MAGIC, 2, fmt.nbytes, sum64(page)))
            finally:
                os.close(side)
        tmp = f"{self._tmp}{next(self._serial)}"
        bufs: list[Any] = [view(ptr, n) for ptr, n in page]
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                done = os.writev(fd, bufs)
                while done < fmt.nbytes:  # a short write: the rest, range by range
                    rest = memoryview(b"".join(bytes(b) for b in bufs))[done:]
                    step = os.write(fd, rest)
                    if not step:
                        raise OSError(f"short write to {tmp}")
                    done += step
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self._spath(skey))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return fmt.nbytes

    def _sidecar_check(self, skey: str, nbytes: int) -> Callable[[int, PageRanges], bool] | None:
        """How to check a page read under ``skey`` against its side-car: ``check(sum64 of the
        page, page) -> ok``; ``None`` without a side-car (or with checksums off)."""
        if not self.verify_checksum:
            return None
        try:
            fd = os.open(self._sidecar(skey), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            raw = os.read(fd, _SIDE.size + 1)
        finally:
            os.close(fd)
        if len(raw) == _SIDE.size:
            magic, version, n, want = _SIDE.unpack(raw)
            ok = magic == _SIDE_MAGIC and version == 2 and n == nbytes
            return lambda got, _page: ok and got == want
        if len(raw) == _SIDE_V1.size:  # written by an earlier development version
            magic, version, n, crc = _SIDE_V1.unpack(raw)
            ok = magic == _SIDE_MAGIC and version == 1 and n == nbytes
            return lambda _got, page: ok and checksum(page) == crc
        return lambda _got, _page: False

    def _read_sglang(self, skey: str, page: PageRanges, fmt: PageFormat) -> bool | None:
        """Open, one ``preadv`` (plus one byte: a longer file is foreign), close: ``None`` when
        absent, else whether the size was right."""
        try:
            fd = os.open(self._spath(skey), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            extra = bytearray(1)
            got = os.preadv(fd, [*(view(ptr, n) for ptr, n in page), extra], 0)
            if got == fmt.nbytes and self.capacity_bytes:
                with contextlib.suppress(OSError):
                    os.utime(fd)  # LRU: a hit refreshes the page
        finally:
            os.close(fd)
        return got == fmt.nbytes

    def _get_sglang(self, keys: list[str], pages: PageBatch, fmt: PageFormat) -> list[bool]:
        """Every page file, then every side-car; the checksums of the pages in one pass."""
        plist = list(pages)
        out = [False] * len(keys)
        checks: list[tuple[int, Callable[[int, PageRanges], bool]]] = []
        for i, (skey, page) in enumerate(zip(keys, plist)):
            try:
                read = self._read_sglang(skey, page, fmt)
                check = self._sidecar_check(skey, fmt.nbytes) if read else None
            except OSError:
                self.stats.add(errors=1)
                continue
            if read is None:
                continue
            if not read:
                self.stats.add(rejected=1)
            elif check is None:
                out[i] = True
            else:
                checks.append((i, check))
        if checks:
            sums = sum64_many(plist) if len(checks) > 1 else [0] * len(plist)
            for i, check in checks:
                got = sums[i] if len(checks) > 1 else sum64(plist[i])
                out[i] = check(got, plist[i])
                if not out[i]:
                    self.stats.add(rejected=1)
        if self.capacity_bytes:
            with self._lock:
                for skey, ok in zip(keys, out):
                    if ok and skey in self._index:
                        self._index.move_to_end(skey)
        return out
