"""The Mooncake Store client of :class:`~mem_cache_storage.mooncake.HiCacheMooncake`: settings,
connecting (lazily, after a reachability probe), buffer registration, back-off and reconnects.

The ``mooncake`` package is imported by :meth:`MooncakeClient.get` on the first connect, never
when this module is imported.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mem_cache_kernels.checks import check_int

__all__ = ["RPC_FAIL", "ClientSettings", "MooncakeClient", "MooncakeUnavailableError"]

_log = logging.getLogger("mem_cache_storage.mooncake")

#: the PyPI distribution and version this client code is tested with (CPU-only build)
MOONCAKE_DIST = "mooncake-transfer-engine-non-cuda"
MOONCAKE_VERSION = "0.3.13.post1"
DEFAULT_MASTER = "127.0.0.1:50051"
RPC_FAIL = -900  # Mooncake ErrorCode::RPC_FAIL: the master is unreachable
_CHUNK = 128  # pages per store call (SGLang's STORAGE_BATCH_SIZE)


class MooncakeUnavailableError(RuntimeError):
    """The Mooncake client library cannot be imported or set up (the message says why)."""


def _option(opts: Mapping[str, Any], name: str, env: str, default: str) -> str:
    value = opts.get(name)
    if value is None or value == "":
        value = os.environ.get(env) or default
    return str(value)


def reachable(address: str, timeout: float) -> bool:
    """Whether a TCP connection to ``address`` (``host:port`` or ``http://host:port/...``;
    anything else, e.g. ``P2PHANDSHAKE`` or ``etcd://...``, counts as reachable) opens within
    ``timeout`` s. The client's ``setup`` retries for about 90 s when the master is down, so a
    connect attempt probes first."""
    m = re.fullmatch(r"(?:http://)?\[?([^\]/]+?)\]?:(\d+)(?:/.*)?", address)
    if m is None:
        return True
    try:
        with socket.create_connection((m.group(1), int(m.group(2))), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """Where the store is and how to talk to it (see the ``mooncake`` module's options)."""

    master_server_address: str = DEFAULT_MASTER
    metadata_server: str = "http://127.0.0.1:8080/metadata"
    local_hostname: str = "127.0.0.1"
    protocol: str = "tcp"
    device_name: str = ""
    global_segment_size: int = 0
    local_buffer_size: int = 16 << 20
    replica_num: int = 1
    replicate_config: dict[str, Any] = field(default_factory=dict)
    connect_timeout_s: float = 1.0
    retry_backoff_s: float = 1.0
    max_backoff_s: float = 10.0
    reconnect_after: int = 3
    verbose: bool = False

    @classmethod
    def from_options(cls, opts: Mapping[str, Any]) -> ClientSettings:
        """Settings from backend options, then environment variables, then defaults."""
        master = _option(opts, "master_server_address", "MOONCAKE_MASTER", DEFAULT_MASTER)
        host = master.rsplit(":", 1)[0]
        protocol = _option(opts, "protocol", "MOONCAKE_PROTOCOL", "tcp")
        if protocol not in ("tcp", "rdma"):
            raise ValueError(f"protocol must be 'tcp' or 'rdma', got {protocol!r}")
        replica_num = opts.get("replica_num", 1)
        check_int("replica_num", replica_num, minimum=1)
        rc = opts.get("replicate_config") or {}
        if not isinstance(rc, dict):
            raise TypeError(f"replicate_config must be a dict, got {type(rc).__name__}")
        s = cls(
            master_server_address=master,
            metadata_server=_option(opts, "metadata_server", "MOONCAKE_TE_META_DATA_SERVER",
                                    f"http://{host}:8080/metadata"),
            local_hostname=_option(opts, "local_hostname", "MOONCAKE_LOCAL_HOSTNAME",
                                   "127.0.0.1"),
            protocol=protocol,
            device_name=_option(opts, "device_name", "MOONCAKE_DEVICE", ""),
            global_segment_size=int(_option(opts, "global_segment_size",
                                            "MOONCAKE_GLOBAL_SEGMENT_SIZE", "0")),
            local_buffer_size=int(_option(opts, "local_buffer_size",
                                          "MOONCAKE_LOCAL_BUFFER_SIZE", str(16 << 20))),
            replica_num=replica_num,
            replicate_config=dict(rc),
            connect_timeout_s=float(opts.get("connect_timeout_s", 1.0)),
            retry_backoff_s=float(opts.get("retry_backoff_s", 1.0)),
            max_backoff_s=float(opts.get("max_backoff_s", 10.0)),
            reconnect_after=int(opts.get("reconnect_after", 3)),
            verbose=str(_option(opts, "verbose", "MEM_CACHE_MOONCAKE_VERBOSE", "0")).lower()
            in ("1", "true", "yes", "on"),
        )
        if s.global_segment_size < 0 or s.local_buffer_size < 0:
            raise ValueError("global_segment_size and local_buffer_size must be >= 0")
        if s.reconnect_after < 1:
            raise ValueError(f"reconnect_after must be >= 1, got {s.reconnect_after}")
        return s


def quiet_client_logs(verbose: bool) -> None:
    """Keep the Mooncake client's own log lines (warnings such as "BatchPut failed ... due to
    insufficient space", info lines on every connect) off stderr unless ``verbose``: sets
    ``MC_LOG_LEVEL=ERROR`` before the client library loads, unless the environment already
    chose a level. This backend reports what those lines say through its counters
    (``set_refused``, ``set_failed``) and its own Python log."""
    if not verbose:
        os.environ.setdefault("MC_LOG_LEVEL", "ERROR")


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


def _replicate_config(settings: ClientSettings) -> Any:
    from mooncake.store import ReplicateConfig

    cfg = ReplicateConfig()
    cfg.replica_num = settings.replica_num
    for name, value in settings.replicate_config.items():
        if not hasattr(cfg, name):
            raise ValueError(f"replicate_config has no Mooncake ReplicateConfig field {name!r}")
        setattr(cfg, name, value)
    return cfg


class MooncakeClient:
    """One Mooncake client, connected on demand.

    ``buffers()`` lists the ``(ptr, nbytes)`` host regions to register on every (re)connect;
    ``on_error()`` is called for each failed store call. After a connection-level failure calls
    are refused (``RPC_FAIL`` codes, no store call) for a back-off that doubles from
    ``retry_backoff_s`` to ``max_backoff_s``; after ``reconnect_after`` failures in a row the
    client is replaced. A replaced or closed client is closed only once no call uses it.
    """

    def __init__(self, settings: ClientSettings, buffers: Callable[[], list[tuple[int, int]]],
                 on_error: Callable[[], None]) -> None:
        self.settings = settings
        self._buffers = buffers
        self._on_error = on_error
        self._lock = threading.RLock()
        self._store: Any = None
        self._registered: dict[int, int] = {}
        self._inflight: dict[int, int] = {}  # id(store) -> calls running on it
        self._retired: list[tuple[Any, dict[int, int]]] = []
        self._down_until = 0.0
        self._backoff = 0.0
        self._failures = 0
        self._closed = False
        self.replicate: Any = None
        self.connects = 0
        self.last_error = ""

    # ------------------------------------------------------------ state
    @property
    def store(self) -> Any:
        """The current ``MooncakeDistributedStore`` or ``None``."""
        return self._store

    @property
    def available(self) -> bool:
        """Not closed and not backing off after a failure."""
        return not self._closed and time.monotonic() >= self._down_until

    @property
    def registered(self) -> dict[int, int]:
        """``ptr -> nbytes`` of the buffers registered with the current client."""
        with self._lock:
            return dict(self._registered)

    def get(self) -> Any:
        """The connected client, or ``None`` while closed, down or backing off."""
        with self._lock:
            if self._closed or time.monotonic() < self._down_until:
                return None
            if self._store is not None:
                return self._store
            s = self.settings
            try:
                quiet_client_logs(s.verbose)
                store = _import_store()()
                for what, addr in (("master", s.master_server_address),
                                   ("metadata server", s.metadata_server)):
                    if not reachable(addr, s.connect_timeout_s):
                        raise MooncakeUnavailableError(f"{what} {addr} is not reachable")
                rc = store.setup(s.local_hostname, s.metadata_server, s.global_segment_size,
                                 s.local_buffer_size, s.protocol, s.device_name,
                                 s.master_server_address)
                if rc != 0:
                    raise MooncakeUnavailableError(
                        f"setup(master={s.master_server_address}, metadata={s.metadata_server}, "
                        f"protocol={s.protocol}) returned {rc}")
                self.replicate = _replicate_config(s)
            except Exception as exc:
                self._note_down(f"{type(exc).__name__}: {exc}")
                return None
            self._store = store
            self.connects += 1
            try:
                self.register_buffers()
            except Exception as exc:
                self._drop(f"{type(exc).__name__}: {exc}")
                return None
            return store

    def connect(self) -> bool:
        """Connect now (ignoring the back-off); ``True`` when connected."""
        with self._lock:
            self._down_until = 0.0
            return self.get() is not None

    def register_buffers(self) -> None:
        """Register every region ``buffers()`` lists that is not registered yet."""
        with self._lock:
            store = self._store
            if store is None:
                return
            for ptr, nbytes in self._buffers():
                if ptr in self._registered or nbytes <= 0:
                    continue
                rc = store.register_buffer(ptr, nbytes)
                if rc != 0:
                    raise MooncakeUnavailableError(f"register_buffer({nbytes} B) returned {rc}")
                self._registered[ptr] = nbytes

    # ------------------------------------------------------------ failures
    def _note_down(self, why: str) -> None:
        s = self.settings
        self._backoff = min(s.max_backoff_s,
                            self._backoff * 2 if self._backoff else s.retry_backoff_s)
        self._down_until = time.monotonic() + self._backoff
        self.last_error = why
        _log.warning("mooncake store unavailable (%s): misses for %.1fs", why, self._backoff)

    def _drop(self, why: str) -> None:
        """Retire the current client (closed once idle) and back off."""
        if self._store is not None:
            self._retired.append((self._store, self._registered))
            self._store, self._registered = None, {}
        self._note_down(why)
        self._close_idle()

    def _close_idle(self) -> None:
        keep = []
        for store, registered in self._retired:
            if self._inflight.get(id(store), 0):
                keep.append((store, registered))
                continue
            try:
                for ptr in registered:
                    store.unregister_buffer(ptr)
                store.close()
            except Exception as exc:  # it is being discarded anyway
                _log.warning("mooncake close failed: %s", exc)
        self._retired = keep

    def _failed(self, why: str) -> None:
        with self._lock:
            self._on_error()
            self._failures += 1
            if self._failures >= self.settings.reconnect_after:
                self._failures = 0
                self._drop(why)
            else:
                self._note_down(why)

    # ------------------------------------------------------------ calls
    def run(self, what: str, fn: Callable[..., Any], n: int, *args: Any) -> list[int]:
        """``fn(store, *args)``'s ``n`` codes, or ``[RPC_FAIL] * n`` when unavailable/failed."""
        with self._lock:
            store = self.get()
            if store is None:
                return [RPC_FAIL] * n
            self._inflight[id(store)] = self._inflight.get(id(store), 0) + 1
        try:
            codes = [int(c) for c in fn(store, *args)]
        except Exception as exc:
            self._failed(f"{what}: {type(exc).__name__}: {exc}")
            return [RPC_FAIL] * n
        finally:
            with self._lock:
                self._inflight[id(store)] -= 1
                if self._retired:
                    self._close_idle()
        if len(codes) != n:
            self._failed(f"{what} returned {len(codes)} results for {n} keys")
            return [RPC_FAIL] * n
        if n and all(c == RPC_FAIL for c in codes):
            self._failed(f"{what}: master unreachable (RPC_FAIL)")
        else:
            with self._lock:
                self._failures = 0
                self._backoff = 0.0
        return codes

    def with_ranges(self, ranges: list[tuple[int, int]], call: Callable[[], list[int]]
                    ) -> list[int]:
        """``call()`` with those of ``ranges`` outside the registered buffers registered for
        its duration (the copying path's tensors and staging buffers)."""
        with self._lock:
            regs = list(self._registered.items())
            extra = [(p, n) for p, n in ranges
                     if not any(b <= p and p + n <= b + size for b, size in regs)]
            store = self._store
            done: list[int] = []
            if store is not None:
                for ptr, nbytes in extra:
                    try:
                        if store.register_buffer(ptr, nbytes) == 0:
                            done.append(ptr)
                    except Exception as exc:
                        _log.warning("mooncake register_buffer failed: %s", exc)
        try:
            return call()
        finally:
            for ptr in done:
                try:
                    store.unregister_buffer(ptr)
                except Exception as exc:
                    _log.warning("mooncake unregister_buffer failed: %s", exc)

    def close(self) -> None:
        """Unregister the buffers and close the client once idle (idempotent)."""
        with self._lock:
            self._closed = True
            if self._store is not None:
                self._retired.append((self._store, self._registered))
                self._store, self._registered = None, {}
            self._close_idle()
