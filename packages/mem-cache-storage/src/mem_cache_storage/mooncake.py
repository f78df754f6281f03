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
  ``model_fingerprint``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from mem_cache_storage import _memory
from mem_cache_storage.backend import PageStorageBackend, checksum
from mem_cache_storage.pages import PageFormat, PageRanges

__all__ = [
    "DEFAULT_MASTER",
    "HEADER_BYTES",
    "MOONCAKE_DIST",
    "MOONCAKE_VERSION",
    "HiCacheMooncake",
    "MooncakeUnavailableError",
]

_log = logging.getLogger(__name__)

#: the PyPI distribution this backend is tested with on CPU-only machines, and its version
MOONCAKE_DIST = "mooncake-transfer-engine-non-cuda"
MOONCAKE_VERSION = "0.3.13.post1"
DEFAULT_MASTER = "127.0.0.1:50051"
HEADER_BYTES = 64

_HDR = struct.Struct("<4sHHQQIQ")
_MAGIC = b"MCMK"
_VERSION = 1
_CHUNK = 128  # pages per store call (SGLang's STORAGE_BATCH_SIZE)
_RPC_FAIL = -900  # Mooncake ErrorCode::RPC_FAIL: the master is unreachable
_UPSERT_ATTEMPTS = 4


class MooncakeUnavailableError(RuntimeError):
    """The Mooncake client library cannot be imported or set up (the message says why)."""


def _import_store() -> Any:
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:  # the extra is missing, or a system library is
        raise MooncakeUnavailableError(
            f"cannot import mooncake.store ({exc}); install mem-cache-storage[mooncake] "
            f"({MOONCAKE_DIST}=={MOONCAKE_VERSION}) and the system libraries libibverbs1 "
            "librdmacm1 libnuma1"
        ) from exc
    return MooncakeDistributedStore


def _replicate_config(opts: dict[str, Any]) -> Any:
    from mooncake.store import ReplicateConfig

    cfg = ReplicateConfig()
    cfg.replica_num = int(opts.get("replica_num", 1))
    for name, value in dict(opts.get("replicate_config") or {}).items():
        if not hasattr(cfg, name):
            raise ValueError(f"replicate_config has no Mooncake ReplicateConfig field {name!r}")
        setattr(cfg, name, value)
    return cfg


def key_tag(storage_key: str) -> int:
    """The 64-bit tag of ``storage_key`` stored in each object's header."""
    return int.from_bytes(hashlib.sha256(storage_key.encode()).digest()[:8], "little")


def _option(opts: dict[str, Any], name: str, env: str, default: str) -> str:
    value = opts.get(name)
    if value is None or value == "":
        value = os.environ.get(env) or default
    return str(value)


def _reachable(address: str, timeout: float) -> bool:
    """Whether a TCP connection to ``address`` (``host:port`` or an ``http://host:port/...``
    URL; anything else, e.g. ``P2PHANDSHAKE`` or ``etcd://``, counts as reachable) opens within
    ``timeout`` seconds. The client's own ``setup`` retries for about 90 s when the master is
    down, so the backend probes first and backs off instead."""
    m = re.fullmatch(r"(?:http://)?\[?([^\]/]+?)\]?:(\d+)(?:/.*)?", address)
    if m is None:
        return True
    try:
        with socket.create_connection((m.group(1), int(m.group(2))), timeout=timeout):
            return True
    except OSError:
        return False


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


class HiCacheMooncake(PageStorageBackend):
    """Mooncake Store backend (see the module docstring)."""

    backend_name = "mooncake"

    def __init__(
        self, storage_config: object | None = None, kwargs: object | None = None, /,
        **options: Any,
    ) -> None:
        self._lock = threading.RLock()
        self._store: Any = None
        self._registered: dict[int, int] = {}  # ptr -> nbytes registered with the client
        self._down_until = 0.0
        self._backoff = 0.0
        self._failures = 0
        self._closed = False
        self._put_arena = _Arena()
        self._get_arena = _Arena()
        self.connects = 0
        self.last_error = ""
        super().__init__(storage_config, kwargs, **options)
        opts = self.options
        self.master_server_address = _option(
            opts, "master_server_address", "MOONCAKE_MASTER", DEFAULT_MASTER)
        host = self.master_server_address.rsplit(":", 1)[0]
        self.metadata_server = _option(
            opts, "metadata_server", "MOONCAKE_TE_META_DATA_SERVER",
            f"http://{host}:8080/metadata")
        self.local_hostname = _option(
            opts, "local_hostname", "MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1")
        self.protocol = _option(opts, "protocol", "MOONCAKE_PROTOCOL", "tcp")
        if self.protocol not in ("tcp", "rdma"):
            raise ValueError(f"protocol must be 'tcp' or 'rdma', got {self.protocol!r}")
        self.device_name = _option(opts, "device_name", "MOONCAKE_DEVICE", "")
        self.global_segment_size = int(_option(
            opts, "global_segment_size", "MOONCAKE_GLOBAL_SEGMENT_SIZE", "0"))
        self.local_buffer_size = int(_option(
            opts, "local_buffer_size", "MOONCAKE_LOCAL_BUFFER_SIZE", str(16 << 20)))
        if self.global_segment_size < 0 or self.local_buffer_size < 0:
            raise ValueError("global_segment_size and local_buffer_size must be >= 0")
        self.verify_checksum = bool(opts.get("checksum", True))
        self.retry_backoff_s = float(opts.get("retry_backoff_s", 1.0))
        self.max_backoff_s = float(opts.get("max_backoff_s", 10.0))
        self.reconnect_after = int(opts.get("reconnect_after", 3))
        self.connect_timeout_s = float(opts.get("connect_timeout_s", 1.0))
        for name in ("replica_num",):
            if name in opts and (not isinstance(opts[name], int) or opts[name] < 1):
                raise ValueError(f"{name} must be a positive int, got {opts[name]!r}")
        rc = opts.get("replicate_config")
        if rc is not None and not isinstance(rc, dict):
            raise TypeError(f"replicate_config must be a dict, got {type(rc).__name__}")
        self._rconfig: Any = None
        if opts.get("connect", True):
            self._client()  # connect now when possible; failures only start the back-off

    # ------------------------------------------------------------ connection
    def _client(self) -> Any:
        """The connected client, or ``None`` while closed, down or backing off."""
        with self._lock:
            if self._closed or time.monotonic() < self._down_until:
                return None
            if self._store is not None:
                return self._store
            try:
                store = _import_store()()
                for what, addr in (("master", self.master_server_address),
                                   ("metadata server", self.metadata_server)):
                    if not _reachable(addr, self.connect_timeout_s):
                        raise MooncakeUnavailableError(f"{what} {addr} is not reachable")
                rc = store.setup(
                    self.local_hostname, self.metadata_server, self.global_segment_size,
                    self.local_buffer_size, self.protocol, self.device_name,
                    self.master_server_address,
                )
                if rc != 0:
                    raise MooncakeUnavailableError(
                        f"setup(master={self.master_server_address}, metadata="
                        f"{self.metadata_server}, protocol={self.protocol}) returned {rc}")
                self._rconfig = _replicate_config(self.options)
            except Exception as exc:
                self._note_down(f"{type(exc).__name__}: {exc}")
                return None
            self._store = store
            self.connects += 1
            self._register_all()
            return store

    def connect(self) -> bool:
        """Connect now (ignoring the back-off); ``True`` when connected."""
        with self._lock:
            self._down_until = 0.0
            return self._client() is not None

    @property
    def connected(self) -> bool:
        return self._store is not None

    def _register(self, ptr: int, nbytes: int) -> None:
        if ptr in self._registered or nbytes <= 0 or self._store is None:
            return
        rc = self._store.register_buffer(ptr, nbytes)
        if rc != 0:
            raise MooncakeUnavailableError(f"register_buffer({nbytes} bytes) returned {rc}")
        self._registered[ptr] = nbytes

    def _register_all(self) -> None:
        self._register(self._put_arena.base, self._put_arena.buf.numel())
        self._register(self._get_arena.base, self._get_arena.buf.numel())
        pool = self.mem_pool_host
        for buf in getattr(pool, "buffers", None) or []:
            self._register(int(buf.data_ptr()), int(buf.numel() * buf.element_size()))

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        with self._lock:
            if self._store is not None:
                try:
                    self._register_all()
                except Exception as exc:
                    self._drop_client(f"{type(exc).__name__}: {exc}")

    def _note_down(self, why: str) -> None:
        self._backoff = min(self.max_backoff_s,
                            self._backoff * 2 if self._backoff else self.retry_backoff_s)
        self._down_until = time.monotonic() + self._backoff
        self.last_error = why
        _log.warning("mooncake backend unavailable (%s): misses for %.1fs", why, self._backoff)

    def _drop_client(self, why: str) -> None:
        store, self._store = self._store, None
        registered, self._registered = self._registered, {}
        if store is not None:
            try:
                for ptr in registered:
                    store.unregister_buffer(ptr)
                store.close()
            except Exception as exc:  # the client is being discarded anyway
                _log.warning("mooncake close failed: %s", exc)
        self._note_down(why)

    def _healthy(self) -> None:
        self._failures = 0
        self._backoff = 0.0

    def _failed(self, why: str) -> None:
        with self._lock:
            self.stats.add(errors=1)
            self._failures += 1
            if self._failures >= self.reconnect_after:
                self._failures = 0
                self._drop_client(why)
            else:
                self._note_down(why)

    def _run(self, what: str, fn: Callable[..., list[int]], n: int, *args: Any) -> list[int]:
        """``fn(*args)`` on the client: its codes, or ``[_RPC_FAIL] * n`` when unavailable."""
        store = self._client()
        if store is None:
            return [_RPC_FAIL] * n
        try:
            codes = [int(c) for c in fn(store, *args)]
        except Exception as exc:
            self._failed(f"{what}: {type(exc).__name__}: {exc}")
            return [_RPC_FAIL] * n
        if len(codes) != n:
            self._failed(f"{what} returned {len(codes)} results for {n} keys")
            return [_RPC_FAIL] * n
        if n and all(c == _RPC_FAIL for c in codes):
            self._failed(f"{what}: master unreachable (RPC_FAIL)")
        else:
            self._healthy()
        return codes

    def close(self) -> None:
        """Unregister the buffers and close the client (idempotent)."""
        with self._lock:
            self._closed = True
            store, self._store = self._store, None
            registered, self._registered = self._registered, {}
            if store is not None:
                for ptr in registered:
                    store.unregister_buffer(ptr)
                store.close()

    # ------------------------------------------------------------ hooks
    def _header(self, skey: str, fmt: PageFormat, page: PageRanges) -> bytes:
        crc = checksum(page) if self.verify_checksum else 0
        return _HDR.pack(_MAGIC, _VERSION, 0, fmt.format_id, fmt.nbytes, crc, key_tag(skey))

    def _exist_pages(self, keys: list[str]) -> list[bool]:
        out: list[bool] = []
        for lo in range(0, len(keys), _CHUNK):
            part = keys[lo : lo + _CHUNK]
            codes = self._run("batch_is_exist", lambda s, k: s.batch_is_exist(k), len(part), part)
            out.extend(c == 1 for c in codes)
        return out

    def _outside_pool(self, pages: list[PageRanges]) -> bool:
        """Whether a range may lie outside the registered buffers (cheap first/last check)."""
        regs = list(self._registered.items())
        for ptr, n in (pages[0][0], pages[-1][-1]) if pages and pages[0] else ():
            if not any(b <= ptr and ptr + n <= b + size for b, size in regs):
                return True
        return False

    def _unregistered(self, pages: list[PageRanges]) -> list[tuple[int, int]]:
        """Ranges outside every registered buffer (tensors of the copying path)."""
        regs = list(self._registered.items())
        out: list[tuple[int, int]] = []
        for page in pages:
            for ptr, n in page:
                if not any(b <= ptr and ptr + n <= b + size for b, size in regs):
                    out.append((ptr, n))
        return out

    def _with_ranges(self, pages: list[PageRanges], call: Callable[[], list[int]]) -> list[int]:
        """``call()`` with any unregistered range of ``pages`` registered for its duration."""
        if not self._outside_pool(pages):
            return call()
        with self._lock:
            extra = [r for r in self._unregistered(pages) if r[0] not in self._registered]
            store = self._store
            done: list[int] = []
            try:
                for ptr, n in extra:
                    if store is not None and store.register_buffer(ptr, n) == 0:
                        done.append(ptr)
            except Exception as exc:
                _log.warning("mooncake register_buffer failed: %s", exc)
        try:
            return call()
        finally:
            if store is not None:
                for ptr in done:
                    try:
                        store.unregister_buffer(ptr)
                    except Exception as exc:
                        _log.warning("mooncake unregister_buffer failed: %s", exc)

    def _put_pages(self, keys: list[str], pages: list[PageRanges], fmt: PageFormat) -> list[bool]:
        out = [False] * len(keys)
        for lo in range(0, len(keys), _CHUNK):
            ks, ps = keys[lo : lo + _CHUNK], pages[lo : lo + _CHUNK]
            headers = [self._header(k, fmt, p) for k, p in zip(ks, ps)]
            present = self._exist_pages(ks)
            res = [False] * len(ks)
            missing = [i for i, p in enumerate(present) if not p]
            if missing:  # zero copy, straight from the pages
                wrote = self._put_chunk([ks[i] for i in missing], [ps[i] for i in missing],
                                        [headers[i] for i in missing])
                for i, ok in zip(missing, wrote):
                    res[i] = ok
            there = [i for i, p in enumerate(present) if p]
            if there:  # present: identical pages are kept, others replaced (last value wins)
                stored = self._stored_headers([ks[i] for i in there], fmt)
                replace = []
                for i, hdr in zip(there, stored):
                    if self.verify_checksum and hdr == headers[i][: _HDR.size]:
                        res[i] = True
                    else:
                        replace.append(i)
                if replace:
                    wrote = self._upsert_chunk([ks[i] for i in replace],
                                               [ps[i] for i in replace],
                                               [headers[i] for i in replace], fmt)
                    for i, ok in zip(replace, wrote):
                        res[i] = ok
            out[lo : lo + len(ks)] = res
        return out

    def _put_chunk(self, keys: list[str], pages: list[PageRanges], headers: list[bytes]
                   ) -> list[bool]:
        arena = self._put_arena
        with arena.lock:
            ptrs: list[list[int]] = []
            sizes: list[list[int]] = []
            for i, (hdr, page) in enumerate(zip(headers, pages)):
                arena.write(i, hdr)
                ptrs.append([arena.ptr(i), *(p for p, _ in page)])
                sizes.append([HEADER_BYTES, *(n for _, n in page)])
            cfg = self._rconfig

            def put() -> list[int]:
                return self._run(
                    "batch_put_from_multi_buffers",
                    lambda s, k, p, z: s.batch_put_from_multi_buffers(k, p, z, cfg),
                    len(keys), keys, ptrs, sizes)

            codes = self._with_ranges(pages, put)
        return [c == 0 for c in codes]

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
        self, keys: list[str], pages: list[PageRanges], headers: list[bytes], fmt: PageFormat
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
                staging[off : off + n].copy_(torch.frombuffer(_memory.view(ptr, n),
                                                              dtype=torch.uint8))
                off += n
        cfg = self._rconfig
        ok = [False] * len(keys)
        for attempt in range(_UPSERT_ATTEMPTS):
            todo = [i for i in range(len(keys)) if not ok[i]]
            tkeys = [keys[i] for i in todo]
            ptrs = [base + i * total for i in todo]

            def upsert(k: list[str] = tkeys, p: list[int] = ptrs) -> list[int]:
                return self._run(
                    "batch_upsert_from",
                    lambda s, k, p, z: s.batch_upsert_from(k, p, z, cfg),
                    len(k), k, p, [total] * len(k))

            codes = self._with_ranges([((base, staging.numel()),)], upsert)
            for i, c in zip(todo, codes):
                ok[i] = c == 0
            # a concurrent upsert of the same key makes the loser fail: write again, so the
            # last writer's page is the one stored; a dead master is not retried
            if all(ok) or _RPC_FAIL in codes:
                break
            time.sleep(0.001 * (attempt + 1))
        return ok

    def _get_pages(self, keys: list[str], pages: list[PageRanges], fmt: PageFormat) -> list[bool]:
        out: list[bool] = []
        for lo in range(0, len(keys), _CHUNK):
            out.extend(self._get_chunk(keys[lo : lo + _CHUNK], pages[lo : lo + _CHUNK], fmt))
        return out

    def _get_chunk(self, keys: list[str], pages: list[PageRanges], fmt: PageFormat) -> list[bool]:
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
        pattern = f"^{re.escape(ks.prefix)}.*{re.escape(ks.suffix)}$"
        store = self._client()
        if store is None:
            raise MooncakeUnavailableError(f"clear: store unavailable ({self.last_error})")
        store.remove_by_regex(pattern, True)

    def remove(self, keys: list[str]) -> int:
        """Remove the pages of caller ``keys`` (even when leased); the number removed."""
        skeys = self.keyspace.storage_keys(keys)
        codes = self._run("batch_remove", lambda s, k: s.batch_remove(k, True), len(skeys), skeys)
        return sum(c == 0 for c in codes)

