"""``HiCacheMooncake``: the L3 tier on a Mooncake Store (pages shared across engine instances).

The client library (``mooncake-transfer-engine``, or ``mooncake-transfer-engine-non-cuda`` on
machines without CUDA; extra ``mem-cache-storage[mooncake]``, tested with 0.3.13.post1) is
imported on first connect, never by importing this module.

**Objects.** One Mooncake object per page, key = the storage key
(:mod:`mem_cache_storage.keys`: model, fingerprint, page hash, rank). Its bytes are a 64-byte
header followed by the page's ranges in order::

    magic "MCMK" | version u16 | reserved u16 | format id u64 | payload bytes u64 | CRC-32 u32
    | key tag u64 (first 8 bytes of SHA-256(storage key)) | zero padding to 64 bytes

(little endian). Both directions are zero copy on the host pool: the store's multi-buffer calls
move ``[header, range 0, range 1, ...]`` straight from / into the pages ``get_page_buffer_meta``
reports, and the headers live in two small registered arenas. The host pool's buffers are
registered with the client once (on connect or on ``register_mem_pool_host``) and unregistered
on :meth:`HiCacheMooncake.close`.

**Verification.** Mooncake Store keeps no checksum of its own, so every read checks the header
(magic, version, format id, byte count, key tag) and the CRC-32 of the payload (``checksum``
option, on by default): a page of another format, a foreign object or damaged bytes is a miss
(counted in ``rejected``), never wrong data.

**Writes.** Only missing keys are written, zero copy (``batch_put_from_multi_buffers``). A key
the store already holds is read back (reads are several times faster than writes): when its
header (format, size, CRC-32 of the payload, key tag) equals the new page's, nothing is written
(chained page hashes: the normal case); otherwise the page is replaced through the store's
upsert from a staging copy, so the last value wins (with ``checksum=False`` a present key is
always replaced). A reader racing a replacement gets the old page, the new one or a miss.

**Failures.** Every failure is a miss / failed set, never an exception into the engine and never
wrong bytes: no master at connect time, a lost connection (``RPC_FAIL``), a full store
(``NO_AVAILABLE_HANDLE``), a dead holder (transfer failure). After a connection-level failure
the backend stops calling the store for ``retry_backoff_s`` (doubling up to ``max_backoff_s``),
so a dead master costs one slow call per back-off period, not one per batch; the client
reconnects by itself when the master comes back (its objects are gone after a master restart:
misses), and after ``reconnect_after`` failures in a row the backend closes the client and sets
up a new one. A store call is never abandoned while it may still write into host pages.

Options (``extra_config``, SGLang's ``kwargs`` dict or keywords; environment variable in
brackets, config wins):

* ``master_server_address`` [``MOONCAKE_MASTER``], default ``127.0.0.1:50051``;
* ``metadata_server`` [``MOONCAKE_TE_META_DATA_SERVER``], default
  ``http://<master host>:8080/metadata`` (the master's ``--enable_http_metadata_server``);
* ``local_hostname`` [``MOONCAKE_LOCAL_HOSTNAME``], default ``127.0.0.1``;
* ``protocol`` [``MOONCAKE_PROTOCOL``]: ``tcp`` (default) or ``rdma``; ``device_name``
  [``MOONCAKE_DEVICE``]: RDMA devices, e.g. ``mlx5_0,mlx5_1``;
* ``global_segment_size`` [``MOONCAKE_GLOBAL_SEGMENT_SIZE``]: bytes this process contributes to
  the store (default 0: a pure client; the data then lives in holder processes' segments);
  ``local_buffer_size`` [``MOONCAKE_LOCAL_BUFFER_SIZE``], default 16 MiB;
* ``replica_num`` (default 1) and ``replicate_config`` (a dict of Mooncake ``ReplicateConfig``
  attributes, e.g. ``{"with_hard_pin": true, "preferred_segment": "10.0.0.5:12345"}``);
* ``checksum`` (default true), ``retry_backoff_s`` (1.0), ``max_backoff_s`` (10.0),
  ``reconnect_after`` (3), ``connect_timeout_s`` (1.0: the TCP probe of the master and the
  metadata server before each connect attempt), plus the common ``page_size`` and
  ``model_fingerprint``;
* ``verbose`` [``MEM_CACHE_MOONCAKE_VERBOSE``] (default false): let the Mooncake client print its
  own log lines; by default they are kept to errors (``MC_LOG_LEVEL=ERROR``, unless set). What
  they would say is counted instead: ``get_stats().set_refused`` counts every page write the
  store refused ("BatchPut failed ... insufficient space"; a retry may still store it) and
  ``set_failed`` the pages that stayed unstored.
"""

from __future__ import annotations

import hashlib
import re
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from mem_cache_storage._mooncake_client import (
    _CHUNK,
    DEFAULT_MASTER,
    MOONCAKE_DIST,
    MOONCAKE_VERSION,
    ClientSettings,
    MooncakeClient,
    MooncakeUnavailableError,
)
from mem_cache_storage._mooncake_sglang import SGLangObjects
from mem_cache_storage.backend import (
    PageFormat,
    PageRanges,
    PageStorageBackend,
    checksum,
    view,
)

__all__ = [
    "DEFAULT_MASTER",
    "HEADER_BYTES",
    "MOONCAKE_DIST",
    "MOONCAKE_VERSION",
    "ClientSettings",
    "HiCacheMooncake",
    "MooncakeUnavailableError",
    "key_tag",
]

HEADER_BYTES = 64

_HDR = struct.Struct("<4sHHQQIQ")
_MAGIC = b"MCMK"
_VERSION = 1
_PUT_ATTEMPTS = 6


def key_tag(storage_key: str) -> int:
    """The 64-bit tag of ``storage_key`` stored in each object's header."""
    return int.from_bytes(hashlib.sha256(storage_key.encode()).digest()[:8], "little")


class _Arena:
    """A registered block of ``_CHUNK`` object headers (one per direction, with its lock)."""

    def __init__(self) -> None:
        self.buf = torch.zeros(_CHUNK * HEADER_BYTES, dtype=torch.uint8)
        self.base = int(self.buf.data_ptr())
        self.lock = threading.Lock()

    def ptr(self, i: int) -> int:
        return self.base + i * HEADER_BYTES

    def write(self, i: int, data: bytes) -> None:
        self.buf[i * HEADER_BYTES : i * HEADER_BYTES + len(data)] = torch.frombuffer(
            bytearray(data), dtype=torch.uint8
        )

    def read(self, i: int) -> bytes:
        return bytes(self.buf[i * HEADER_BYTES : i * HEADER_BYTES + _HDR.size].numpy())


class HiCacheMooncake(SGLangObjects, PageStorageBackend):
    """Mooncake Store backend (see the module docstring)."""

    backend_name = "mooncake"
    key_schemes = ("mem_cache", "sglang")
    sglang_flavor = "mooncake"

    def __init__(
        self, storage_config: object | None = None, kwargs: object | None = None, /,
        **options: Any,
    ) -> None:
        self._put_arena = _Arena()
        self._get_arena = _Arena()
        self.client: MooncakeClient | None = None
        super().__init__(storage_config, kwargs, **options)
        self.settings = ClientSettings.from_options(self.options)
        self.verify_checksum = bool(self.options.get("checksum", True))
        self.client = MooncakeClient(self.settings, self._buffers,
                                     lambda: self.stats.add(errors=1))
        if self.options.get("connect", True):
            self.client.get()  # connect now when possible; a failure only starts the back-off

    def _buffers(self) -> list[tuple[int, int]]:
        out = [(a.base, a.buf.numel()) for a in (self._put_arena, self._get_arena)]
        for buf in getattr(self.mem_pool_host, "buffers", None) or []:
            out.append((int(buf.data_ptr()), int(buf.numel() * buf.element_size())))
        return out

    @property
    def _client(self) -> MooncakeClient:
        if self.client is None:
            raise RuntimeError("HiCacheMooncake used before its constructor finished")
        return self.client

    @property
    def connected(self) -> bool:
        """Whether a client is connected now."""
        return self.client is not None and self.client.store is not None

    @property
    def last_error(self) -> str:
        """Why the store was last unavailable (empty when it never was)."""
        return self.client.last_error if self.client is not None else ""

    def connect(self) -> bool:
        """Connect now, ignoring the back-off; ``True`` when connected."""
        return self._client.connect()

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        if self.client is not None:  # registered once here (or on the next connect)
            try:
                self.client.register_buffers()
            except Exception as exc:
                self.client._failed(f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        """Unregister the buffers and close the client (idempotent)."""
        self._client.close()

    def _run(self, what: str, fn: Callable[..., Any], n: int, *args: Any) -> list[int]:
        return self._client.run(what, fn, n, *args)

    def _with_ranges(self, pages: Sequence[PageRanges], call: Callable[[], list[int]]) -> list[int]:
        """``call()`` with the ranges of ``pages`` that lie outside the registered buffers
        registered for its duration (cheap first/last check for host pool pages)."""
        regs = self._client.registered
        ends = [pages[0][0], pages[-1][-1]] if pages and pages[0] else []
        if all(any(b <= p and p + n <= b + size for b, size in regs.items()) for p, n in ends):
            return call()
        return self._client.with_ranges([r for page in pages for r in page], call)

    # ------------------------------------------------------------ hooks
    def _header(self, skey: str, fmt: PageFormat, page: PageRanges) -> bytes:
        crc = checksum(page) if self.verify_checksum else 0
        return _HDR.pack(_MAGIC, _VERSION, 0, fmt.format_id, fmt.nbytes, crc, key_tag(skey))

    def _exist_pages(self, keys: list[str]) -> list[bool]:
        if self.key_scheme == "sglang":
            return self._sgl_exist(keys)
        out: list[bool] = []
        for lo in range(0, len(keys), _CHUNK):
            part = keys[lo : lo + _CHUNK]
            codes = self._run("batch_is_exist", lambda s, k: s.batch_is_exist(k), len(part), part)
            out.extend(c == 1 for c in codes)
        return out

    def _put_pages(
        self, keys: list[str], pages: Sequence[PageRanges], fmt: PageFormat
    ) -> list[bool]:
        if self.key_scheme == "sglang":
            return self._sgl_put(keys, pages, fmt)
        out = [False] * len(keys)
        for lo in range(0, len(keys), _CHUNK):
            ks, ps = keys[lo : lo + _CHUNK], pages[lo : lo + _CHUNK]
            headers = [self._header(k, fmt, p) for k, p in zip(ks, ps)]
            todo = list(range(len(ks)))
            for attempt in range(_PUT_ATTEMPTS):
                done = self._put_once([ks[i] for i in todo], [ps[i] for i in todo],
                                      [headers[i] for i in todo], fmt)
                for i, ok in zip(todo, done):
                    out[lo + i] = ok
                todo = [i for i, ok in zip(todo, done) if not ok]
                # another writer of the same key makes a put or upsert fail: look again, so
                # the page ends up stored (ours or an identical one, last value wins); a full
                # or unreachable store is not retried
                if not todo or not self._client.available or attempt == _PUT_ATTEMPTS - 1:
                    break
                time.sleep(0.002 * (attempt + 1))
        return out

    def _put_once(self, keys: list[str], pages: Sequence[PageRanges], headers: list[bytes],
                  fmt: PageFormat) -> list[bool]:
        present = self._exist_pages(keys)
        res = [False] * len(keys)
        missing = [i for i, p in enumerate(present) if not p]
        if missing:  # zero copy, straight from the pages
            wrote = self._put_chunk([keys[i] for i in missing], [pages[i] for i in missing],
                                    [headers[i] for i in missing])
            for i, ok in zip(missing, wrote):
                res[i] = ok
        there = [i for i, p in enumerate(present) if p]
        if there:  # present: an identical page is kept, another one replaced
            stored = self._stored_headers([keys[i] for i in there], fmt)
            replace = []
            for i, hdr in zip(there, stored):
                if self.verify_checksum and hdr == headers[i][: _HDR.size]:
                    res[i] = True
                else:
                    replace.append(i)
            if replace:
                wrote = self._upsert_chunk([keys[i] for i in replace], [pages[i] for i in replace],
                                           [headers[i] for i in replace], fmt)
                for i, ok in zip(replace, wrote):
                    res[i] = ok
        return res

    def _put_chunk(self, keys: list[str], pages: Sequence[PageRanges], headers: list[bytes]
                   ) -> list[bool]:
        arena = self._put_arena
        with arena.lock:
            ptrs: list[list[int]] = []
            sizes: list[list[int]] = []
            for i, (hdr, page) in enumerate(zip(headers, pages)):
                arena.write(i, hdr)
                ptrs.append([arena.ptr(i), *(p for p, _ in page)])
                sizes.append([HEADER_BYTES, *(n for _, n in page)])
            cfg = self._client.replicate

            def put() -> list[int]:
                return self._run(
                    "batch_put_from_multi_buffers",
                    lambda s, k, p, z: s.batch_put_from_multi_buffers(k, p, z, cfg),
                    len(keys), keys, ptrs, sizes)

            codes = self._with_ranges(pages, put)
        self._count_refused(codes)
        return [c == 0 for c in codes]

    def _count_refused(self, codes: list[int]) -> None:
        refused = sum(1 for c in codes if c != 0)
        if refused:
            self.stats.add(set_refused=refused)

    def _stored_headers(self, keys: list[str], fmt: PageFormat) -> list[bytes]:
        """The headers of the objects stored under ``keys`` (``b""`` when unreadable or of
        another size); reads whole objects into a staging buffer (reads are the cheap way)."""
        total = HEADER_BYTES + fmt.nbytes
        staging = torch.zeros(len(keys) * total, dtype=torch.uint8)
        base = int(staging.data_ptr())

        def get() -> list[int]:
            return self._run(
                "batch_get_into", lambda s, k, p, z: s.batch_get_into(k, p, z), len(keys),
                keys, [base + i * total for i in range(len(keys))], [total] * len(keys))

        codes = self._with_ranges([((base, staging.numel()),)], get)
        return [bytes(staging[i * total : i * total + _HDR.size].numpy()) if c == total else b""
                for i, c in enumerate(codes)]

    def _upsert_chunk(
        self, keys: list[str], pages: Sequence[PageRanges], headers: list[bytes], fmt: PageFormat
    ) -> list[bool]:
        # upsert has no multi-buffer form: stage [header | payload] per page
        total = HEADER_BYTES + fmt.nbytes
        staging = torch.zeros(len(keys) * total, dtype=torch.uint8)
        base = int(staging.data_ptr())
        for i, (hdr, page) in enumerate(zip(headers, pages)):
            staging[i * total : i * total + len(hdr)] = torch.frombuffer(
                bytearray(hdr), dtype=torch.uint8)
            off = i * total + HEADER_BYTES
            for ptr, n in page:
                staging[off : off + n].copy_(torch.frombuffer(view(ptr, n),
                                                              dtype=torch.uint8))
                off += n
        cfg = self._client.replicate
        ptrs = [base + i * total for i in range(len(keys))]

        def upsert() -> list[int]:
            return self._run("batch_upsert_from",
                             lambda s, k, p, z: s.batch_upsert_from(k, p, z, cfg),
                             len(keys), keys, ptrs, [total] * len(keys))

        codes = self._with_ranges([((base, staging.numel()),)], upsert)
        self._count_refused(codes)
        return [c == 0 for c in codes]

    def _get_pages(
        self, keys: list[str], pages: Sequence[PageRanges], fmt: PageFormat
    ) -> list[bool]:
        if self.key_scheme == "sglang":
            return self._sgl_get(keys, pages, fmt)
        out: list[bool] = []
        for lo in range(0, len(keys), _CHUNK):
            out.extend(self._get_chunk(keys[lo : lo + _CHUNK], pages[lo : lo + _CHUNK], fmt))
        return out

    def _get_chunk(
        self, keys: list[str], pages: Sequence[PageRanges], fmt: PageFormat
    ) -> list[bool]:
        arena = self._get_arena
        want = HEADER_BYTES + fmt.nbytes
        with arena.lock:
            arena.buf.zero_()
            ptrs = [[arena.ptr(i), *(p for p, _ in page)] for i, page in enumerate(pages)]
            sizes = [[HEADER_BYTES, *(n for _, n in page)] for page in pages]

            def get() -> list[int]:
                return self._run(
                    "batch_get_into_multi_buffers",
                    lambda s, k, p, z: s.batch_get_into_multi_buffers(k, p, z),
                    len(keys), keys, ptrs, sizes)

            codes = self._with_ranges(pages, get)
            headers = [arena.read(i) for i in range(len(keys))]
        out: list[bool] = []
        for key, page, code, raw in zip(keys, pages, codes, headers):
            if code != want:
                if code > 0:  # an object of another size: foreign or another format
                    self.stats.add(rejected=1)
                out.append(False)
                continue
            magic, version, _, fid, nbytes, crc, tag = _HDR.unpack(raw)
            if (magic != _MAGIC or version != _VERSION or fid != fmt.format_id
                    or nbytes != fmt.nbytes or tag != key_tag(key)):
                self.stats.add(rejected=1)
                out.append(False)
                continue
            if self.verify_checksum and checksum(page) != crc:
                self.stats.add(rejected=1)
                out.append(False)
                continue
            out.append(True)
        return out

    def _clear(self) -> None:
        ks = self.keyspace
        if self.key_scheme == "sglang":  # this model's and rank's objects (and side-cars)
            tail = "_(k|v|mcs)"
            pattern = f"^{re.escape(ks.prefix_for_clear)}.*{re.escape(ks.suffix)}{tail}$"
            codes = self._run("remove_by_regex",
                              lambda s, p: [s.remove_by_regex(p, True)], 1, pattern)
            if codes[0] < 0:
                raise MooncakeUnavailableError(
                    f"clear: remove_by_regex returned {codes[0]} ({self.last_error})")
            return
        pattern = f"^{re.escape(ks.prefix)}.*{re.escape(ks.suffix)}$"
        codes = self._run("remove_by_regex", lambda s, p: [s.remove_by_regex(p, True)], 1,
                          pattern)
        if codes[0] < 0:
            raise MooncakeUnavailableError(
                f"clear: remove_by_regex returned {codes[0]} ({self.last_error})")

    def remove(self, keys: list[str]) -> int:
        """Remove the pages of caller ``keys`` (even when leased); the number removed."""
        skeys = self.keyspace.storage_keys(keys)
        codes = self._run("batch_remove", lambda s, k: s.batch_remove(k, True), len(skeys), skeys)
        return sum(c == 0 for c in codes)

