"""``HiCacheFile``: the embedded storage backend, pages in files under a directory.

**Our key scheme** (the default) stores pages in *segment files* (many pages per file, appended
by one writer each) published through one shared append-only index log; the format, the
publish protocol and the costs are in :mod:`mem_cache_storage._segments`. Guarantees:

* **Atomic publish**: a page becomes visible when its index entry is appended, after its record:
  a reader sees a complete page or nothing; a writer killed mid-batch leaves unindexed bytes (a
  miss). Writes of one key by several writers leave one complete page (the last entry wins).
  ``fsync=True`` also flushes the records and the log.
* **Verified reads**: a record is checked against its index entry (format id and byte count
  before the read, the payload's ``sum64`` checksum, :mod:`mem_cache_storage._sum64`, after it);
  a torn, truncated, misplaced or corrupted record is a miss (counted in ``rejected``), never
  wrong data.
* **Capacity** (``capacity_bytes``, 0 = unlimited): when this process's estimate of the segment
  bytes passes the capacity, it deletes the least recently used *segments* (oldest modification
  time; a hit refreshes its segment's, at most once a second) down to 90% of the capacity.
  Segments are ``segment_bytes`` long (default 256 MiB, at most an eighth of the capacity).
* **Sharing**: several processes and threads may use one directory: each backend instance appends
  to its own segments, index appends are single ``O_APPEND`` writes, and a page deleted while
  another process reads it stays readable through its open handle (POSIX).

Files of the one-file-per-page layout of earlier development versions (``{key}.kvp`` with a
``MCSP`` header) are not read (misses); ``clear()`` removes them.

**Key scheme ``sglang``** (``key_scheme="sglang"``; :mod:`mem_cache_storage._file_sglang`): pages
are stored exactly as SGLang 0.5.23's file backend stores them,
``{storage_dir}/{hash}_{model}[_{tp_rank}_{tp_size}]...bin`` holding the raw flat page (no header),
so an SGLang instance and this backend read each other's pages in one directory. Verification: the
file size must equal the page size; a side-car ``{name}.mcs`` (magic, version, byte count,
``sum64``; SGLang ignores files not ending ``.bin``), written *before* the page by this backend, is
checked when present, so a page this backend wrote that was corrupted later is a miss. A page SGLang
wrote has no side-car: only its size is checked (SGLang stores no checksum). Pages are written to a
temporary file and renamed (SGLang's readers need whole pages); the side-car is written in place (a
torn side-car is a miss).

Options (``extra_config``, the SGLang ``kwargs`` dict or keywords): ``storage_dir`` (also
``file_path`` and SGLang's ``file_storage_path``; default ``$MEM_CACHE_STORAGE_DIR`` or
``/tmp/mem_cache_storage``), ``key_scheme`` (``mem_cache`` or ``sglang``),
``capacity_bytes`` (int, 0), ``segment_bytes`` (int, our scheme), ``fsync`` (bool, false),
``checksum`` (bool, true: write and check the checksum), ``page_size``, ``model_fingerprint``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from mem_cache_storage._file_sglang import SGLangFiles
from mem_cache_storage._one_page import OnePage
from mem_cache_storage._segments import INDEX_NAME, SEGMENT_SUFFIX, SegmentStore
from mem_cache_storage.backend import (
    KeySpace,
    PageBatch,
    PageFormat,
    PageRanges,
    PageStorageBackend,
    _io_guard,
    _swallowed,
)
from mem_cache_storage.config import HiCacheStorageExtraInfo

__all__ = ["DEFAULT_STORAGE_DIR", "FILE_SUFFIX", "SGLANG_FILE_SUFFIX", "HiCacheFile"]

DEFAULT_STORAGE_DIR = "/tmp/mem_cache_storage"
#: segment files (our scheme)
FILE_SUFFIX = SEGMENT_SUFFIX
SGLANG_FILE_SUFFIX = ".bin"
SIDECAR_SUFFIX = ".mcs"
_TMP_PREFIX = ".tmp-"
_STALE_TMP_S = 600.0
_LOW_WATER = 0.9
_SEGMENT_BYTES = 256 << 20


class HiCacheFile(SGLangFiles, PageStorageBackend):
    """Pages in files under a directory (see the module docstring)."""

    backend_name = "file"
    key_schemes = ("mem_cache", "sglang")

    #: SGLang's positive-lookup metadata cache is off here: ``exists`` looks at the directory
    #: every time (the index log and the segments, or one ``stat`` per key in the ``sglang``
    #: scheme), so pages another process wrote or removed are seen at once. The attributes
    #: answer what SGLang's answer with the cache disabled.
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
        seg_default = min(_SEGMENT_BYTES, max(1, capacity // 8)) if capacity else _SEGMENT_BYTES
        segment_bytes = int(opts.get("segment_bytes", 0) or seg_default)
        if segment_bytes < 1:
            raise ValueError(f"segment_bytes must be >= 1, got {segment_bytes}")
        self.fsync = bool(opts.get("fsync", False))
        self.verify_checksum = bool(opts.get("checksum", True))
        self.storage_dir.mkdir(parents=True, exist_ok=True)
        self._dir = f"{os.fspath(self.storage_dir)}{os.sep}"
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] = OrderedDict()  # sglang scheme: key -> bytes (LRU)
        self._usage = 0
        self._tmp = f"{self._dir}{_TMP_PREFIX}{os.getpid():x}-{uuid.uuid4().hex[:12]}-"
        self._serial = itertools.count()
        self._segments: SegmentStore | None = None
        self._one_page = OnePage()
        if not self.sglang_layout:
            self._segments = SegmentStore(self._dir, segment_bytes=segment_bytes,
                                          fsync=self.fsync, verify=self.verify_checksum,
                                          count=self.stats.add)
            self._segments.touch_on_hit = capacity > 0
        self._rescan(remove_stale_tmp=True)

    # ----------------------------------------------------------------- paths
    def _path(self, skey: str) -> Path:
        return self.storage_dir / f"{skey}{self.suffix}"

    def _spath(self, skey: str) -> str:
        return f"{self._dir}{skey}{self.suffix}"

    def _sidecar(self, skey: str) -> str:
        return f"{self._dir}{skey}{SIDECAR_SUFFIX}"

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

    @property
    def verify_checksum(self) -> bool:
        """Whether pages are written with a checksum and reads check it."""
        return self._verify

    @verify_checksum.setter
    def verify_checksum(self, value: bool) -> None:
        self._verify = bool(value)
        segments: SegmentStore | None = getattr(self, "_segments", None)
        if segments is not None:
            segments.verify = self._verify

    def page_extent(self, key: str) -> tuple[Path, int, int] | None:
        """``(file, offset, bytes)`` of the stored payload of caller key ``key`` (its page
        file in the ``sglang`` scheme, a slice of a segment in ours); ``None`` when no page is
        stored (for tools and tests)."""
        skey = self.storage_key(key)
        if self._segments is None:
            path = self._path(skey)
            return (path, 0, path.stat().st_size) if path.is_file() else None
        loc = self._segments.locations([skey])[0]
        if loc is None:
            return None
        return self.storage_dir / loc.segment, loc.offset, loc.nbytes

    def page_path(self, key: str) -> Path:
        """The file that holds caller key ``key``: its page file in the ``sglang`` scheme
        (whether stored or not); in ours the segment holding it, or, when no page is stored, a
        name that does not exist (``{storage_key}.kvp``). To damage one page in tests, use
        :meth:`page_extent` (a segment holds many pages)."""
        if self._segments is not None:
            extent = self.page_extent(key)
            if extent is not None:
                return extent[0]
        return self._path(self.storage_key(key))

    @property
    def usage_bytes(self) -> int:
        """This process's estimate of the page bytes in the directory."""
        with self._lock:
            return self._usage

    # ---------------------------------------------------------------- writes
    def batch_set_v1(
        self, keys: list[str], host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """SGLang's zero-copy write (see :class:`~mem_cache_storage.backend.PageStorageBackend`);
        one page in our key scheme takes its host ranges from the memo, as
        :meth:`batch_get_v1` does (the same checks, guard, write path and counters)."""
        segments = self._segments
        if segments is None or type(keys) is not list or len(keys) != 1:
            return super().batch_set_v1(keys, host_indices, extra_info)
        skey = self.keyspace.storage_keys(keys)[0]
        pool = self.mem_pool_host
        with _io_guard(pool):
            page, fmt = self._one_page(pool, host_indices)
            try:  # as ``_put`` guards ``_put_pages``
                ok = self._put_one(segments, skey, page, fmt)
            except Exception as exc:
                _swallowed(exc, type(self).__name__, "set", self._count_error)
                ok = False
        self.stats._add_set(int(ok), int(not ok), fmt.nbytes if ok else 0)
        return [ok]

    def _put_one(self, segments: SegmentStore, skey: str, page: PageRanges,
                 fmt: PageFormat) -> bool:
        """:meth:`_put_pages` of one page in our scheme."""
        try:
            size = segments.put_one(skey, page, fmt)
        except OSError:
            self.stats.add(errors=1)
            return False
        self._grown(size)
        return True

    def _grown(self, size: int) -> None:
        """Count ``size`` more stored bytes, evicting past the capacity."""
        with self._lock:
            self._usage += size
            grown = 0 < self.capacity_bytes < self._usage
        if grown:
            self._evict()

    def _put_pages(self, keys: list[str], pages: PageBatch, fmt: PageFormat) -> list[bool]:
        if self._segments is not None:
            try:
                size = self._segments.put(keys, pages, fmt)
            except OSError:
                self.stats.add(errors=1)
                return [False] * len(keys)
            self._grown(size)
            return [True] * len(keys)
        out: list[bool] = []
        grown = False
        for skey, page in zip(keys, pages):
            try:
                size = self._write_sglang(skey, page, fmt)
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
    def batch_get_v1(
        self, keys: list[str], host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """SGLang's zero-copy read (see :class:`~mem_cache_storage.backend.PageStorageBackend`);
        one page in our key scheme takes a path with fewer layers (the same checks, guard,
        verification and counters): at 128 KiB a page's read and checksum are about 7 us and
        the layers were most of the rest. The page's host ranges are remembered per page
        (:class:`~mem_cache_storage._one_page.OnePage`; the slots are checked every call)."""
        segments = self._segments
        if segments is None or type(keys) is not list or len(keys) != 1:
            return super().batch_get_v1(keys, host_indices, extra_info)
        skey = self.keyspace.storage_keys(keys)[0]
        pool = self.mem_pool_host
        with _io_guard(pool):
            page, fmt = self._one_page(pool, host_indices)
            try:
                ok = segments.get_one(skey, page, fmt)
            except Exception as exc:  # as ``_get`` guards every hook call
                _swallowed(exc, type(self).__name__, "get", self._count_error)
                ok = False
        self.stats._add_get(int(ok), int(not ok), fmt.nbytes if ok else 0)
        return [ok]

    def _get_pages(self, keys: list[str], pages: PageBatch, fmt: PageFormat) -> list[bool]:
        if self._segments is not None:
            return self._segments.get(keys, pages, fmt)
        return self._get_sglang(keys, pages, fmt)

    def _exist_pages(self, keys: list[str]) -> list[bool]:
        if self._segments is not None:
            return self._segments.exists(keys)
        isfile, d, sfx = os.path.isfile, self._dir, self.suffix
        return [isfile(f"{d}{k}{sfx}") for k in keys]

    def _exist_prefix(self, keys: list[str]) -> int:
        if self._segments is not None:
            return self._segments.exists_prefix(keys)
        isfile, d, sfx = os.path.isfile, self._dir, self.suffix
        for i, key in enumerate(keys):
            if not isfile(f"{d}{key}{sfx}"):
                return i
        return len(keys)

    # --------------------------------------------------------- capacity / clear
    def _scan(self) -> list[tuple[float, str, int]]:
        """(mtime, storage key, bytes) of every page file (``sglang`` scheme)."""
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
        if self._segments is not None:
            usage = sum(n for _, _, n in self._segments.scan())
            with self._lock:
                self._usage = usage
            return
        found = sorted(self._scan())
        with self._lock:
            self._index = OrderedDict((k, n) for _, k, n in found)
            self._usage = sum(n for _, _, n in found)

    def _evict(self) -> None:
        """Delete least recently used pages (segments in our scheme) down to 90% of the
        capacity."""
        if self._segments is not None:
            evicted, left = self._segments.evict(self.capacity_bytes)
            self.stats.add(evicted=evicted)
            with self._lock:
                self._usage = left
            return
        found = sorted(self._scan())
        total = sum(n for _, _, n in found)
        target = int(self.capacity_bytes * _LOW_WATER)
        evicted = 0
        for _, skey, n in found:
            if total <= target:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(skey))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._sidecar(skey))
            total -= n
            evicted += 1
        self.stats.add(evicted=evicted)
        self._rescan()

    def _clear(self) -> None:
        if self._segments is not None:
            self._segments.clear()
        with os.scandir(self.storage_dir) as it:
            for entry in it:
                name = entry.name
                if (name.endswith((self.suffix, SIDECAR_SUFFIX)) or name.startswith(_TMP_PREFIX)
                        or name == INDEX_NAME):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
        with self._lock:
            self._index.clear()
            self._usage = 0

    def close(self) -> None:
        """Close the open segment and index files (idempotent; the backend reopens them when
        used again)."""
        if self._segments is not None:
            self._segments.close()
