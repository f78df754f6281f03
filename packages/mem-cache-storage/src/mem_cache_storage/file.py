"""``HiCacheFile``: the embedded storage backend, one file per page under a directory.

File ``{storage_dir}/{storage_key}.kvp``::

    magic "MCSP" | version u16 | key length u16 | format id u64 | payload bytes u64 | CRC-32 u32
    | storage key (UTF-8) | payload (the page's ranges, in order)

(little endian). Guarantees:

* **Atomic writes**: a page is written to a temporary file in the same directory and renamed
  over the final name, so a reader sees a complete old page, a complete new page or nothing;
  concurrent writers of one key leave one complete page. ``fsync=True`` also flushes it.
* **Verified reads**: the magic, version, key, format id, byte count, the file size and the CRC
  of the payload are checked; a torn, truncated, foreign or corrupted file is a miss (counted in
  ``rejected``), never wrong data.
* **Capacity** (``capacity_bytes``, 0 = unlimited): when this process's running estimate of the
  directory size passes the capacity, it rescans the directory and deletes the least recently
  used pages (oldest modification time; a hit refreshes it) down to 90% of the capacity.
* **Sharing**: several processes (engine ranks, instances) may use one directory: names are
  unique per key, renames are atomic, and a page deleted while another process reads it stays
  readable through the open handle (POSIX). Each writer enforces the capacity, so the directory
  exceeds it by at most the pages in flight.

Options (``extra_config``, the SGLang ``kwargs`` dict or keywords): ``storage_dir`` (also
``file_path``; default ``$MEM_CACHE_STORAGE_DIR`` or ``/tmp/mem_cache_storage``),
``capacity_bytes`` (int, 0), ``fsync`` (bool, false), ``checksum`` (bool, true: write and check
the CRC), ``page_size``, ``model_fingerprint``.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

from mem_cache_storage import _memory
from mem_cache_storage.backend import PageStorageBackend, checksum
from mem_cache_storage.pages import PageFormat, PageRanges

__all__ = ["DEFAULT_STORAGE_DIR", "FILE_SUFFIX", "HiCacheFile"]

DEFAULT_STORAGE_DIR = "/tmp/mem_cache_storage"
FILE_SUFFIX = ".kvp"
_TMP_PREFIX = ".tmp-"
_HDR = struct.Struct("<4sHHQQI")
_MAGIC = b"MCSP"
_VERSION = 1
_STALE_TMP_S = 600.0
_LOW_WATER = 0.9


class HiCacheFile(PageStorageBackend):
    """One file per page (see the module docstring)."""

    backend_name = "file"

    def __init__(
        self, storage_config: object | None = None, kwargs: object | None = None, /,
        **options: Any,
    ) -> None:
        super().__init__(storage_config, kwargs, **options)
        opts = self.options
        root = (opts.get("storage_dir") or opts.get("file_path")
                or os.environ.get("MEM_CACHE_STORAGE_DIR") or DEFAULT_STORAGE_DIR)
        self.storage_dir = Path(root)
        capacity = int(opts.get("capacity_bytes", 0) or 0)
        if capacity < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity}")
        self.capacity_bytes = capacity
        self.fsync = bool(opts.get("fsync", False))
        self.verify_checksum = bool(opts.get("checksum", True))
        self.storage_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] = OrderedDict()  # storage key -> file bytes (LRU)
        self._usage = 0
        self._rescan(remove_stale_tmp=True)

    # ----------------------------------------------------------------- paths
    def _path(self, skey: str) -> Path:
        return self.storage_dir / f"{skey}{FILE_SUFFIX}"

    def page_path(self, key: str) -> Path:
        """The file that holds caller key ``key`` (for tools and tests)."""
        return self._path(self.storage_key(key))

    @property
    def usage_bytes(self) -> int:
        """This process's estimate of the bytes in the directory."""
        with self._lock:
            return self._usage

    # ---------------------------------------------------------------- writes
    def _header(self, skey: str, fmt: PageFormat, crc: int) -> bytes:
        key = skey.encode()
        return _HDR.pack(_MAGIC, _VERSION, len(key), fmt.format_id, fmt.nbytes, crc) + key

    def _write_one(self, skey: str, page: PageRanges, fmt: PageFormat) -> int:
        crc = checksum(page) if self.verify_checksum else 0
        header = self._header(skey, fmt, crc)
        tmp = self.storage_dir / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb", buffering=0) as f:
                f.write(header)
                for ptr, n in page:
                    mv = _memory.view(ptr, n)
                    written = 0
                    while written < n:
                        step = f.write(mv[written:])
                        if not step:
                            raise OSError(f"short write to {tmp}")
                        written += step
                if self.fsync:
                    os.fsync(f.fileno())
            os.replace(tmp, self._path(skey))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return len(header) + fmt.nbytes

    def _put_pages(self, keys: list[str], pages: list[PageRanges], fmt: PageFormat) -> list[bool]:
        out: list[bool] = []
        grown = False
        for skey, page in zip(keys, pages):
            try:
                size = self._write_one(skey, page, fmt)
            except OSError:
                self.stats.add(errors=1)
                out.append(False)
                continue
            with self._lock:
                self._usage += size - self._index.pop(skey, 0)
                self._index[skey] = size
                grown = grown or (0 < self.capacity_bytes < self._usage)
            out.append(True)
        if grown:
            self._evict()
        return out

    # ----------------------------------------------------------------- reads
    def _read_one(self, skey: str, page: PageRanges, fmt: PageFormat) -> bool:
        path = self._path(skey)
        try:
            f = open(path, "rb", buffering=0)  # noqa: SIM115 (closed below)
        except FileNotFoundError:
            return False
        with f:
            key = skey.encode()
            head = f.read(_HDR.size + len(key))
            if len(head) != _HDR.size + len(key):
                self.stats.add(rejected=1)
                return False
            magic, version, key_len, fid, nbytes, crc = _HDR.unpack_from(head)
            if (magic != _MAGIC or version != _VERSION or key_len != len(key)
                    or head[_HDR.size:] != key or fid != fmt.format_id or nbytes != fmt.nbytes
                    or os.fstat(f.fileno()).st_size != len(head) + nbytes):
                self.stats.add(rejected=1)
                return False
            for ptr, n in page:
                mv = _memory.view(ptr, n)
                got = 0
                while got < n:
                    r = f.readinto(mv[got:])
                    if not r:
                        self.stats.add(rejected=1)
                        return False
                    got += r
        if self.verify_checksum and checksum(page) != crc:
            self.stats.add(rejected=1)
            return False
        with contextlib.suppress(OSError):
            os.utime(path)  # LRU: a hit refreshes the page
        with self._lock:
            if skey in self._index:
                self._index.move_to_end(skey)
        return True

    def _get_pages(self, keys: list[str], pages: list[PageRanges], fmt: PageFormat) -> list[bool]:
        out: list[bool] = []
        for skey, page in zip(keys, pages):
            try:
                out.append(self._read_one(skey, page, fmt))
            except OSError:
                self.stats.add(errors=1)
                out.append(False)
        return out

    def _exist_pages(self, keys: list[str]) -> list[bool]:
        return [self._path(k).is_file() for k in keys]

    def _exist_prefix(self, keys: list[str]) -> int:
        for i, key in enumerate(keys):
            if not self._path(key).is_file():
                return i
        return len(keys)

    # --------------------------------------------------------- capacity / clear
    def _scan(self) -> list[tuple[float, str, int]]:
        """(mtime, storage key, bytes) of every page file."""
        found: list[tuple[float, str, int]] = []
        with os.scandir(self.storage_dir) as it:
            for entry in it:
                name = entry.name
                if not name.endswith(FILE_SUFFIX) or name.startswith("."):
                    continue
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                found.append((st.st_mtime, name[: -len(FILE_SUFFIX)], st.st_size))
        return found

    def _rescan(self, remove_stale_tmp: bool = False) -> None:
        if remove_stale_tmp:
            now = time.time()
            with os.scandir(self.storage_dir) as it:
                for entry in it:
                    if entry.name.startswith(_TMP_PREFIX):
                        try:
                            if now - entry.stat().st_mtime > _STALE_TMP_S:
                                os.unlink(entry.path)
                        except FileNotFoundError:
                            pass
        found = sorted(self._scan())
        with self._lock:
            self._index = OrderedDict((k, n) for _, k, n in found)
            self._usage = sum(n for _, _, n in found)

    def _evict(self) -> None:
        """Delete least recently used pages until the directory is at 90% of the capacity."""
        found = sorted(self._scan())
        total = sum(n for _, _, n in found)
        target = int(self.capacity_bytes * _LOW_WATER)
        evicted = 0
        for _, skey, n in found:
            if total <= target:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(skey))
            total -= n
            evicted += 1
        self.stats.add(evicted=evicted)
        self._rescan()

    def _clear(self) -> None:
        with os.scandir(self.storage_dir) as it:
            for entry in it:
                if entry.name.endswith(FILE_SUFFIX) or entry.name.startswith(_TMP_PREFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
        with self._lock:
            self._index.clear()
            self._usage = 0
