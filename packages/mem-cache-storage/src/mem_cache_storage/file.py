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

**Key scheme ``sglang``** (``key_scheme="sglang"``): pages are stored exactly as SGLang 0.5.23's
file backend stores them, ``{storage_dir}/{hash}_{model}[_{tp_rank}_{tp_size}]...bin`` holding
the raw flat page (no header), so an SGLang instance and this backend read each other's pages in
one directory. Verification: the file size must equal the page size; a side-car
``{name}.mcs`` (magic, byte count, CRC-32; SGLang ignores files not ending ``.bin``), written
*before* the page by this backend, is checked when present, so a page this backend wrote that was
corrupted later is a miss. A page SGLang wrote has no side-car: only its size is checked (SGLang
stores no checksum).

Options (``extra_config``, the SGLang ``kwargs`` dict or keywords): ``storage_dir`` (also
``file_path`` and SGLang's ``file_storage_path``; default ``$MEM_CACHE_STORAGE_DIR`` or
``/tmp/mem_cache_storage``), ``key_scheme`` (``mem_cache`` or ``sglang``),
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

from mem_cache_storage.backend import (
    KeySpace,
    PageBatch,
    PageFormat,
    PageRanges,
    PageStorageBackend,
    checksum,
    view,
)

__all__ = ["DEFAULT_STORAGE_DIR", "FILE_SUFFIX", "SGLANG_FILE_SUFFIX", "HiCacheFile"]

DEFAULT_STORAGE_DIR = "/tmp/mem_cache_storage"
FILE_SUFFIX = ".kvp"
SGLANG_FILE_SUFFIX = ".bin"
SIDECAR_SUFFIX = ".mcs"
_SIDE = struct.Struct("<4sHQI")  # magic, version, payload bytes, crc32
_SIDE_MAGIC = b"MCSs"
_TMP_PREFIX = ".tmp-"
_HDR = struct.Struct("<4sHHQQI")
_MAGIC = b"MCSP"
_VERSION = 1
_STALE_TMP_S = 600.0
_LOW_WATER = 0.9


class HiCacheFile(PageStorageBackend):
    """One file per page (see the module docstring)."""

    backend_name = "file"
    key_schemes = ("mem_cache", "sglang")

    #: SGLang's positive-lookup metadata cache is off here: ``exists`` looks at the directory
    #: every time (one ``stat`` per key), so pages another process wrote or removed are seen
    #: at once. The attributes answer what SGLang's answer with the cache disabled.
    enable_metadata_cache = False
    metadata_cache: Any = None
    metadata_ttl: float | None = None

    def __init__(
        self, storage_config: object | None = None, file_path: object | None = None, /,
        **options: Any,
    ) -> None:
        """``file_path``: the directory (SGLang's second parameter), or, as every backend of
        this package takes it, an options dict or a host pool (see :mod:`.backend`)."""
        if isinstance(file_path, (str, os.PathLike)):
            options.setdefault("storage_dir", os.fspath(file_path))
            file_path = None
        super().__init__(storage_config, file_path, **options)
        opts = self.options
        root = (opts.get("storage_dir") or opts.get("file_path")
                or opts.get("file_storage_path")
                or os.environ.get("MEM_CACHE_STORAGE_DIR") or DEFAULT_STORAGE_DIR)
        self.sglang_layout = self.key_scheme == "sglang"
        self.suffix = SGLANG_FILE_SUFFIX if self.sglang_layout else FILE_SUFFIX
        self.storage_dir = Path(root)
        capacity = int(opts.get("capacity_bytes", 0) or 0)
        if capacity < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity}")
        self.capacity_bytes = capacity
        self.fsync = bool(opts.get("fsync", False))
        self.verify_checksum = bool(opts.get("checksum", True))
        self.storage_dir.mkdir(parents=True, exist_ok=True)
        self._dir = f"{os.fspath(self.storage_dir)}{os.sep}"
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] = OrderedDict()  # storage key -> file bytes (LRU)
        self._usage = 0
        self._rescan(remove_stale_tmp=True)

    # ----------------------------------------------------------------- paths
    def _path(self, skey: str) -> Path:
        return self.storage_dir / f"{skey}{self.suffix}"

    def _spath(self, skey: str) -> str:
        return f"{self._dir}{skey}{self.suffix}"

    def _sidecar(self, skey: str) -> Path:
        return self.storage_dir / f"{skey}{SIDECAR_SUFFIX}"

    @property
    def file_path(self) -> str:
        """The storage directory (SGLang's name)."""
        return str(self.storage_dir)

    def _suffixes(self) -> KeySpace:
        ks = self._keyspace
        return ks if ks is not None else KeySpace.from_config(self.storage_config, 1, "",
                                                            scheme=self.key_scheme)

    @property
    def config_suffix(self) -> str:
        """What follows the page hash in this rank's storage keys (SGLang's name; for the
        ``sglang`` scheme exactly SGLang's suffix, ``_{model}[_{tp_rank}_{tp_size}]...``)."""
        return self._suffixes().suffix

    @property
    def tp_config_suffix(self) -> str:
        """The suffix with the TP rank even for MLA (Mamba states are TP-sharded)."""
        return self._suffixes().tp_suffix

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

    def _publish(self, data: bytes, final: Path) -> None:
        tmp = self.storage_dir / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb", buffering=0) as f:
                f.write(data)
                if self.fsync:
                    os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _write_one(self, skey: str, page: PageRanges, fmt: PageFormat) -> int:
        crc = checksum(page) if self.verify_checksum else 0
        if self.sglang_layout:
            # the side-car first: a page without one is only size-checked, never the reverse
            self._publish(_SIDE.pack(_SIDE_MAGIC, 1, fmt.nbytes, crc), self._sidecar(skey))
            header = b""
        else:
            header = self._header(skey, fmt, crc)
        # one open, one writev (header and every range), one rename: no Python file object
        tmp = f"{self._dir}{_TMP_PREFIX}{uuid.uuid4().hex}"
        bufs: list[Any] = [header] if header else []
        bufs += [view(ptr, n) for ptr, n in page]
        total = len(header) + fmt.nbytes
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                done = os.writev(fd, bufs)
                while done < total:  # a short write: the rest, range by range
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
        return total

    def _put_pages(self, keys: list[str], pages: PageBatch, fmt: PageFormat) -> list[bool]:
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
    def _read_sidecar(self, skey: str, nbytes: int) -> int | bool | None:
        """The CRC the side-car of ``skey`` records; ``None`` without a side-car (or with
        checksums off), ``False`` when it is damaged or names another size."""
        if not self.verify_checksum:
            return None
        try:
            raw = self._sidecar(skey).read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) != _SIDE.size:
            return False
        magic, version, n, crc = _SIDE.unpack(raw)
        if magic != _SIDE_MAGIC or version != 1 or n != nbytes:
            return False
        return int(crc)

    def _read_one(self, skey: str, page: PageRanges, fmt: PageFormat) -> bool:
        path = self._spath(skey)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            ok, crc = self._read_fd(fd, skey, page, fmt)
            if ok and crc is not None and self.verify_checksum and checksum(page) != crc:
                ok = False
            if not ok:
                self.stats.add(rejected=1)
                return False
            with contextlib.suppress(OSError):
                os.utime(fd)  # LRU: a hit refreshes the page
        finally:
            os.close(fd)
        with self._lock:
            if skey in self._index:
                self._index.move_to_end(skey)
        return True

    def _read_fd(self, fd: int, skey: str, page: PageRanges, fmt: PageFormat
                 ) -> tuple[bool, int | None]:
        """Read the page of open file ``fd`` into ``page`` with one ``preadv``, checking the
        size (and, in our scheme, the header); ``(ok, checksum to verify or None)``."""
        size = os.fstat(fd).st_size
        bufs: list[Any] = [view(ptr, n) for ptr, n in page]
        if self.sglang_layout:
            want = self._read_sidecar(skey, fmt.nbytes)
            if want is False or size != fmt.nbytes:
                return False, None
            return os.preadv(fd, bufs, 0) == fmt.nbytes, want
        key = skey.encode()
        head = bytearray(_HDR.size + len(key))
        if size != len(head) + fmt.nbytes:
            return False, None
        if os.preadv(fd, [head, *bufs], 0) != size:
            return False, None
        magic, version, key_len, fid, nbytes, crc = _HDR.unpack_from(head)
        if (magic != _MAGIC or version != _VERSION or key_len != len(key)
                or head[_HDR.size:] != key or fid != fmt.format_id or nbytes != fmt.nbytes):
            return False, None
        return True, crc

    def _get_pages(self, keys: list[str], pages: PageBatch, fmt: PageFormat) -> list[bool]:
        out: list[bool] = []
        for skey, page in zip(keys, pages):
            try:
                out.append(self._read_one(skey, page, fmt))
            except OSError:
                self.stats.add(errors=1)
                out.append(False)
        return out

    def _exist_pages(self, keys: list[str]) -> list[bool]:
        isfile, d, sfx = os.path.isfile, self._dir, self.suffix
        return [isfile(f"{d}{k}{sfx}") for k in keys]

    def _exist_prefix(self, keys: list[str]) -> int:
        isfile, d, sfx = os.path.isfile, self._dir, self.suffix
        for i, key in enumerate(keys):
            if not isfile(f"{d}{key}{sfx}"):
                return i
        return len(keys)

    # --------------------------------------------------------- capacity / clear
    def _scan(self) -> list[tuple[float, str, int]]:
        """(mtime, storage key, bytes) of every page file."""
        found: list[tuple[float, str, int]] = []
        with os.scandir(self.storage_dir) as it:
            for entry in it:
                name = entry.name
                if not name.endswith(self.suffix) or name.startswith("."):
                    continue
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                found.append((st.st_mtime, name[: -len(self.suffix)], st.st_size))
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
            if self.sglang_layout:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._sidecar(skey))
            total -= n
            evicted += 1
        self.stats.add(evicted=evicted)
        self._rescan()

    def _clear(self) -> None:
        with os.scandir(self.storage_dir) as it:
            for entry in it:
                if entry.name.endswith((self.suffix, SIDECAR_SUFFIX)) or entry.name.startswith(
                    _TMP_PREFIX
                ):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
        with self._lock:
            self._index.clear()
            self._usage = 0
