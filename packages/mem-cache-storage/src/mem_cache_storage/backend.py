"""Bases for storage backends: :class:`PageStorageBackend` (pages as byte ranges) and
:class:`PointerStorageBackend` (clients with ``batch_put_from`` / ``batch_get_into`` /
``batch_is_exist`` over ``(keys, ptrs, sizes)``, like Mooncake Store).

:class:`PageStorageBackend` implements the whole SGLang-facing :class:`HiCacheStorage` API once:
caller keys become storage keys (:class:`~mem_cache_storage.keys.KeySpace`), tensors and host
pool pages become byte ranges (:mod:`mem_cache_storage.pages`), counters are kept, and a failing
backend call (an exception, a malformed or short result) becomes a miss / failed set instead of
an exception in the engine. A subclass implements four hooks on *storage* keys:

* ``_put_pages(keys, pages, fmt) -> list[bool]``: store each page (its ranges, in order);
* ``_get_pages(keys, pages, fmt) -> list[bool]``: fill each page's ranges; ``True`` only when
  the stored page has format ``fmt`` and verified intact;
* ``_exist_pages(keys) -> list[bool]``;
* ``_clear()``.

Constructor (every backend): ``Backend(storage_config=None, kwargs=None, /, **options)``. That is
exactly what SGLang's ``dynamic`` loader calls (``backend_class(storage_config, kwargs)``) and
what its built-in form for pool-aware backends calls (``backend_class(storage_config,
mem_pool_host)``): the second positional argument may be an options dict or a host pool.
Options are ``storage_config.extra_config`` updated by that dict and then by ``**options``.
Common options: ``page_size`` (needed for keys until a host pool is registered),
``model_fingerprint`` and ``key_scheme`` (``mem_cache``, the default, or ``sglang`` where the
backend supports it: see :mod:`mem_cache_storage.keys`).

**Page bytes under the ``sglang`` scheme.** SGLang stores a page as its host pool's *flat* page
(``get_data_page(i, flat=True)``). For the ``page_first`` and ``page_first_direct`` layouts the
ranges ``get_page_buffer_meta`` reports, in order, are exactly those bytes (K page then V page for
MHA, one range for MLA), so the zero-copy path moves them directly; for any other layout the page
goes through the pool's ``get_data_page`` / ``set_from_flat_data_page`` (one copy).

**Several pools per page (v2).** ``batch_exists_v2`` / ``batch_get_v2`` / ``batch_set_v2`` move
the pages of every pool registered with ``register_mem_host_pool_v2`` (the KV pool falls back to
``register_mem_pool_host``'s); a pool's page of caller key ``k`` is stored under ``{k}.{pool}``
(:func:`~mem_cache_storage.pools.pool_key`), in the pool's native page format, with the same
verification as a KV page.
"""

from __future__ import annotations

import logging
import struct
import threading
import zlib
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from mem_cache_kernels.checks import check_int
from mem_cache_storage import _memory
from mem_cache_storage.base import HiCacheStorage
from mem_cache_storage.config import HiCacheStorageConfig, HiCacheStorageExtraInfo
from mem_cache_storage.keys import KEY_SCHEMES, KeySpace, check_keys
from mem_cache_storage.pages import PageFormat, PageRanges, host_page_ranges, tensor_page_ranges
from mem_cache_storage.pools import PoolHitPolicy, PoolTransferResult, pool_key
from mem_cache_storage.stats import StorageStats

__all__ = ["PageStorageBackend", "PointerStorageBackend", "checksum"]

_log = logging.getLogger(__name__)


def checksum(page: PageRanges) -> int:
    """CRC-32 over a page's ranges, in order."""
    crc = 0
    for ptr, nbytes in page:
        crc = zlib.crc32(_memory.view(ptr, nbytes), crc)
    return crc


def _io_guard(pool: Any) -> AbstractContextManager[Any]:
    """The host pool's ``io_guard()`` (ours: keeps its memory mapped while the copy runs, even
    if the engine closes the pool meanwhile); a no-op for pools without one (SGLang's)."""
    guard = getattr(pool, "io_guard", None)
    return guard() if callable(guard) else nullcontext()


def _is_pool(obj: object) -> bool:
    return hasattr(obj, "get_page_buffer_meta") and hasattr(obj, "page_size")


#: host layouts whose zero-copy page ranges, in order, are the flat page's bytes
FLAT_NATIVE_LAYOUTS = ("page_first", "page_first_direct")


def _name(pool_name: object) -> str:
    return str(getattr(pool_name, "value", pool_name))


class PageStorageBackend(HiCacheStorage):
    """Base of byte-range backends (see the module docstring)."""

    backend_name = "page"
    #: key schemes this backend can store pages under
    key_schemes: tuple[str, ...] = ("mem_cache",)
    #: naming of the ``sglang`` key scheme (see :class:`~mem_cache_storage.keys.KeySpace`)
    sglang_flavor = "file"

    def __init__(
        self, storage_config: object | None = None, kwargs: object | None = None, /,
        **options: Any,
    ) -> None:
        self.storage_config = HiCacheStorageConfig.from_any(storage_config)
        opts: dict[str, Any] = self.storage_config.extra
        pool: Any = None
        if isinstance(kwargs, Mapping):
            opts.update(kwargs)
        elif kwargs is not None:
            if not _is_pool(kwargs):
                raise TypeError(
                    "kwargs (the second argument) must be an options dict or a host pool, got "
                    f"{type(kwargs).__name__}"
                )
            pool = kwargs
        opts.update(options)
        self.options = opts
        scheme = str(opts.get("key_scheme", "mem_cache"))
        if scheme not in KEY_SCHEMES:
            raise ValueError(f"key_scheme must be one of {KEY_SCHEMES}, got {scheme!r}")
        if scheme not in self.key_schemes:
            raise ValueError(
                f"{type(self).__name__} supports key_scheme {self.key_schemes}, got {scheme!r}"
            )
        self.key_scheme = scheme
        self.stats = StorageStats()
        self._keyspace: KeySpace | None = None
        self._ks_lock = threading.Lock()
        page_size = opts.get("page_size")
        if page_size is not None:
            self._set_keyspace(int(page_size))
        if pool is not None:
            self.register_mem_pool_host(pool)

    # ------------------------------------------------------------------ keys
    def _set_keyspace(self, page_size: int) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be positive, got {page_size}")
        with self._ks_lock:
            if self._keyspace is not None and self._keyspace.page_size != page_size:
                raise ValueError(
                    f"page_size {page_size} differs from this backend's {self._keyspace.page_size}"
                )
            fingerprint = self.options.get("model_fingerprint")
            self._keyspace = KeySpace.from_config(
                self.storage_config, page_size,
                None if fingerprint is None else str(fingerprint), scheme=self.key_scheme,
                flavor=self.sglang_flavor,
            )

    @property
    def keyspace(self) -> KeySpace:
        """The key mapping (``RuntimeError`` before the page size is known)."""
        ks = self._keyspace
        if ks is None:
            raise RuntimeError(
                f"{type(self).__name__}: page size unknown: register_mem_pool_host(pool) or pass "
                "extra_config['page_size']"
            )
        return ks

    def storage_key(self, key: str) -> str:
        """The storage key of caller key ``key`` (see :mod:`mem_cache_storage.keys`)."""
        return self.keyspace.storage_key(key)

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        if not _is_pool(mem_pool_host):
            raise TypeError(
                "mem_pool_host must be a host pool (get_page_buffer_meta, page_size), got "
                f"{type(mem_pool_host).__name__}"
            )
        self._set_keyspace(int(mem_pool_host.page_size))
        super().register_mem_pool_host(mem_pool_host)

    # ------------------------------------------------------------ subclass hooks
    @abstractmethod
    def _put_pages(self, keys: list[str], pages: list[PageRanges], fmt: PageFormat) -> list[bool]:
        """Store each page under its storage key; one bool per page."""

    @abstractmethod
    def _get_pages(self, keys: list[str], pages: list[PageRanges], fmt: PageFormat) -> list[bool]:
        """Fill each page from storage; ``True`` only for an intact page of format ``fmt``."""

    @abstractmethod
    def _exist_pages(self, keys: list[str]) -> list[bool]:
        """Whether each storage key holds a page."""

    @abstractmethod
    def _clear(self) -> None:
        """Remove every page."""

    # ------------------------------------------------------------ guarded calls
    def _guard(self, what: str, result: object, n: int) -> list[bool]:
        if not isinstance(result, list) or len(result) != n:
            self.stats.add(errors=1)
            _log.warning("%s: %s returned %r for %d pages: treated as failed",
                         type(self).__name__, what, type(result).__name__, n)
            return [False] * n
        return [r is True for r in result]

    def _call(self, what: str, fn: Any, n: int, *args: Any) -> list[bool]:
        if n == 0:
            return []
        try:
            result = fn(*args)
        except Exception as exc:  # a failing backend is a miss, never an engine crash
            self.stats.add(errors=1)
            _log.warning("%s: %s failed (%s: %s): treated as a miss",
                         type(self).__name__, what, type(exc).__name__, exc)
            return [False] * n
        return self._guard(what, result, n)

    def _get(self, skeys: list[str], pages: list[PageRanges], fmt: PageFormat) -> list[bool]:
        ok = self._call("get", self._get_pages, len(skeys), skeys, pages, fmt)
        hits = sum(ok)
        self.stats.add(get_hits=hits, get_misses=len(ok) - hits, get_bytes=hits * fmt.nbytes)
        return ok

    def _put(self, skeys: list[str], pages: list[PageRanges], fmt: PageFormat) -> list[bool]:
        ok = self._call("set", self._put_pages, len(skeys), skeys, pages, fmt)
        good = sum(ok)
        self.stats.add(set_ok=good, set_failed=len(ok) - good, set_bytes=good * fmt.nbytes)
        return ok

    def _exist(self, skeys: list[str]) -> list[bool]:
        self.stats.add(exists_queries=len(skeys))
        return self._call("exists", self._exist_pages, len(skeys), skeys)

    # ------------------------------------------------------------ SGLang API
    def _target(self, target: Any) -> torch.Tensor:
        if target is None:
            pool = self.mem_pool_host
            if pool is None:
                raise ValueError("target_location is required when no host pool is registered")
            out: torch.Tensor = pool.get_dummy_flat_data_page()
            return out
        if not isinstance(target, torch.Tensor):
            raise TypeError(f"target_location must be a torch.Tensor, got {type(target).__name__}")
        return target

    def get(
        self, key: str, target_location: Any | None = None, target_sizes: Any | None = None
    ) -> torch.Tensor | None:
        target = self._target(target_location)
        page, fmt = tensor_page_ranges(target, pool=self.mem_pool_host)
        ok = self._get([self.storage_key(key)], [page], fmt)
        return target if ok[0] else None

    def batch_get(
        self, keys: list[str], target_locations: Any | None = None, target_sizes: Any | None = None
    ) -> list[torch.Tensor | None]:
        keys = check_keys(keys)
        if target_locations is None:
            target_locations = [None] * len(keys)
        if isinstance(target_locations, torch.Tensor) or not isinstance(
            target_locations, Sequence
        ):
            raise TypeError(
                "target_locations must be a list of tensors or None, got "
                f"{type(target_locations).__name__}"
            )
        if len(target_locations) != len(keys):
            raise ValueError(
                f"target_locations must have {len(keys)} entries, got {len(target_locations)}"
            )
        return [self.get(k, t) for k, t in zip(keys, target_locations)]

    def set(
        self, key: str, value: Any | None = None, target_location: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        tensor = value if value is not None else target_location
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"value must be a torch.Tensor, got {type(tensor).__name__}")
        tensor = tensor.detach().to("cpu").contiguous()
        page, fmt = tensor_page_ranges(tensor, "value", pool=self.mem_pool_host)
        return self._put([self.storage_key(key)], [page], fmt)[0]

    def batch_set(
        self, keys: list[str], values: Any | None = None, target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        keys = check_keys(keys)
        vals = values if values is not None else target_locations
        if vals is None:
            raise ValueError(f"values must have {len(keys)} entries, got None")
        if isinstance(vals, torch.Tensor) or not isinstance(vals, Sequence):
            raise TypeError(f"values must be a list of tensors, got {type(vals).__name__}")
        if len(vals) != len(keys):
            raise ValueError(f"values must have {len(keys)} entries, got {len(vals)}")
        return all([self.set(k, v) for k, v in zip(keys, vals)])

    def exists(self, key: str) -> bool:
        return self._exist([self.storage_key(key)])[0]

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        skeys = self.keyspace.storage_keys(keys)
        self.stats.add(exists_queries=len(skeys))
        if not skeys:
            return 0
        try:
            n = self._exist_prefix(skeys)
        except Exception as exc:  # a failing backend holds nothing
            self.stats.add(errors=1)
            _log.warning("%s: exists failed (%s: %s): treated as a miss",
                         type(self).__name__, type(exc).__name__, exc)
            return 0
        try:
            return check_int("_exist_prefix result", n, minimum=0, maximum=len(skeys))
        except (TypeError, ValueError):  # a malformed backend answer holds nothing
            self.stats.add(errors=1)
            return 0

    def _exist_prefix(self, keys: list[str]) -> int:
        """How many leading storage keys hold a page (default: one ``_exist_pages`` call;
        override to stop at the first miss)."""
        found = self._exist_pages(keys)
        if len(found) != len(keys):
            raise RuntimeError(f"_exist_pages returned {len(found)} results for {len(keys)}")
        return found.index(False) if False in found else len(found)

    def _host_io(self, write: bool, pool: Any, skeys: list[str],
                 host_indices: torch.Tensor) -> list[bool]:
        """Move the pages at ``host_indices`` of ``pool`` to / from storage keys ``skeys``."""
        with _io_guard(pool):
            if self.key_scheme == "mem_cache" or str(getattr(pool, "layout", "")) in (
                FLAT_NATIVE_LAYOUTS
            ):
                pages, fmt = host_page_ranges(pool, host_indices, len(skeys))
                if self.key_scheme != "mem_cache":  # SGLang's pages: the flat page's bytes
                    fmt = PageFormat("flat", fmt.dtype, (fmt.nbytes,))
                return self._put(skeys, pages, fmt) if write else self._get(skeys, pages, fmt)
            return self._host_io_flat(write, pool, skeys, host_indices)

    def _host_io_flat(self, write: bool, pool: Any, skeys: list[str],
                      host_indices: torch.Tensor) -> list[bool]:
        """The copying form of :meth:`_host_io` (a layout whose native ranges are not the flat
        page): ``get_data_page`` / ``get_dummy_flat_data_page`` + ``set_from_flat_data_page``."""
        if pool is None:
            raise RuntimeError("no host pool registered: call register_mem_pool_host(pool) first")
        ps = int(pool.page_size)
        if host_indices.numel() != len(skeys) * ps:
            raise ValueError(
                f"host_indices must be 1-D with len(keys) * page_size = {len(skeys) * ps} "
                f"slots, got shape {tuple(host_indices.shape)}"
            )
        firsts = [int(i) for i in host_indices.reshape(-1)[::ps].tolist()]
        if not firsts:
            return []
        if write:
            tensors = [pool.get_data_page(i, flat=True).contiguous() for i in firsts]
        else:
            tensors = [pool.get_dummy_flat_data_page().contiguous() for _ in firsts]
        nbytes = tensors[0].numel() * tensors[0].element_size()
        fmt = PageFormat("flat", str(tensors[0].dtype), (nbytes,))
        pages: list[PageRanges] = [((t.data_ptr(), nbytes),) for t in tensors]
        if write:
            return self._put(skeys, pages, fmt)
        ok = self._get(skeys, pages, fmt)
        for i, good, t in zip(firsts, ok, tensors):
            if good:
                pool.set_from_flat_data_page(i, t)
        return ok

    def batch_get_v1(
        self, keys: list[str], host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        return self._host_io(False, self.mem_pool_host, self.keyspace.storage_keys(keys),
                             host_indices)

    def batch_set_v1(
        self, keys: list[str], host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        return self._host_io(True, self.mem_pool_host, self.keyspace.storage_keys(keys),
                             host_indices)

    # ------------------------------------------------------------- v2 (pools)
    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        if not _is_pool(host_pool):
            raise TypeError(
                "host_pool must be a host pool (get_page_buffer_meta, page_size), got "
                f"{type(host_pool).__name__}"
            )
        super().register_mem_host_pool_v2(host_pool, host_pool_name)

    def _pool(self, name: str) -> Any:
        pool = self.registered_pools.get(name)
        if pool is None and name == "kv":
            pool = self.mem_pool_host
        return pool

    def batch_exists_v2(
        self, keys: list[str], pool_transfers: list[Any] | None = None,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> PoolTransferResult:
        """SGLang's v2 existence query: the KV prefix of ``keys`` and, per pool of
        ``pool_transfers``, the prefix lengths its hit policy can restore (see
        :mod:`mem_cache_storage.pools`); a failing backend holds nothing."""
        keys = check_keys(keys)
        transfers = list(pool_transfers or [])
        names = [_name(t.name) for t in transfers]
        policies = [_name(getattr(t, "hit_policy", PoolHitPolicy.ALL_PAGES)) for t in transfers]
        for policy in policies:
            if policy not in (PoolHitPolicy.ALL_PAGES.value, PoolHitPolicy.TRAILING_PAGES.value):
                raise ValueError(
                    f"pool_transfers hit_policy must be 'all_pages' or 'trailing_pages', "
                    f"got {policy!r}"
                )
        ks = self.keyspace
        n = len(keys)
        skeys = ks.storage_keys(keys)
        for name in names:
            skeys += ks.storage_keys([pool_key(name, k) for k in keys])
        found = self._exist(skeys)
        kv_pages = found[:n].index(False) if False in found[:n] else n
        hit: dict[str, int] = {"kv": kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        for p, (transfer, name, policy) in enumerate(zip(transfers, names, policies)):
            if not restorable:
                break
            have = found[(p + 1) * n : (p + 2) * n]
            if policy == PoolHitPolicy.ALL_PAGES.value:
                boundary = next((i for i in range(kv_pages) if not have[i]), kv_pages)
                ok = set(range(1, boundary + 1))
            else:
                trailing = max(1, len(transfer.keys) if transfer.keys else 1)
                ok = {m for m in range(1, kv_pages + 1)
                      if all(have[max(0, m - trailing) : m])}
                boundary = max(ok, default=0)
            if boundary:
                hit[name] = boundary
            restorable = [m for m in restorable if m in ok]
        return PoolTransferResult(restorable[-1] if restorable else 0, hit, restorable)

    def _batch_io_v2(self, write: bool, transfers: list[Any]) -> dict[str, list[bool]]:
        if isinstance(transfers, (str, bytes)) or not isinstance(transfers, Sequence):
            raise TypeError(f"transfers must be a list of PoolTransfer, got "
                            f"{type(transfers).__name__}")
        out: dict[str, list[bool]] = {}
        for transfer in transfers:
            name = _name(transfer.name)
            keys = check_keys(list(transfer.keys or []), f"transfers[{name}].keys")
            pool = self._pool(name)
            indices = transfer.host_indices
            ps = int(getattr(pool, "page_size", 0) or 0)
            if pool is None or indices is None or indices.numel() != len(keys) * ps:
                _log.warning("%s: v2 %s of pool %r: no such pool or %s host slots for %d pages",
                             type(self).__name__, "set" if write else "get", name,
                             None if indices is None else indices.numel(), len(keys))
                out[name] = [False] * len(keys)
                continue
            skeys = self.keyspace.storage_keys([pool_key(name, k) for k in keys])
            out[name] = self._host_io(write, pool, skeys, indices)
        return out

    def batch_get_v2(
        self, transfers: list[Any], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> dict[str, list[bool]]:
        """Read every transfer's pages into its pool (``registered_pools[transfer.name]``); a
        pool that is not registered or slots that are not ``len(keys)`` pages give all
        ``False``; a page that fails verification is ``False`` (its slots hold undefined bytes)."""
        return self._batch_io_v2(False, transfers)

    def batch_set_v2(
        self, transfers: list[Any], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> dict[str, list[bool]]:
        """Write every transfer's pages from its pool; one bool per key per pool."""
        return self._batch_io_v2(True, transfers)

    def clear(self) -> None:
        self._clear()

    def get_stats(self) -> StorageStats:
        """A snapshot of this backend's counters."""
        return self.stats.snapshot()

    def close(self) -> None:
        """Release client resources (nothing by default; idempotent)."""


_META = struct.Struct("<4sQQI")  # magic, format id, payload bytes, crc32
_META_MAGIC = b"MCSm"


class PointerStorageBackend(PageStorageBackend):
    """Base for clients that move ``(keys, ptrs, sizes)`` batches (zero copy, e.g. RDMA).

    Each page is stored as one object per range, ``{storage_key}.{i}``, plus a small metadata
    object ``{storage_key}.m`` (format id, byte count, CRC-32 of the data unless
    ``options["checksum"]`` is false) written *after* the data objects; reading checks the
    metadata first and the CRC after, so a page of another format or a partial/corrupted page is
    a miss. Subclasses implement, on object keys:

    * ``_batch_put_from(keys, ptrs, sizes) -> list[bool]``
    * ``_batch_get_into(keys, ptrs, sizes) -> list[bool]`` (``False`` when absent or when the
      stored object's size differs from ``sizes[i]``)
    * ``_batch_is_exist(keys) -> list[bool]``
    * ``_clear()``
    """

    backend_name = "pointer"

    def __init__(
        self, storage_config: object | None = None, kwargs: object | None = None, /,
        **options: Any,
    ) -> None:
        super().__init__(storage_config, kwargs, **options)
        self.verify_checksum = bool(self.options.get("checksum", True))

    @abstractmethod
    def _batch_put_from(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[bool]:
        """Store ``sizes[i]`` bytes at ``ptrs[i]`` under ``keys[i]``."""

    @abstractmethod
    def _batch_get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[bool]:
        """Copy the object under ``keys[i]`` (exactly ``sizes[i]`` bytes) to ``ptrs[i]``."""

    @abstractmethod
    def _batch_is_exist(self, keys: list[str]) -> list[bool]:
        """Whether each object key exists."""

    def _meta(self, page: PageRanges, fmt: PageFormat) -> bytes:
        crc = checksum(page) if self.verify_checksum else 0
        return _META.pack(_META_MAGIC, fmt.format_id, fmt.nbytes, crc)

    def _put_pages(self, keys: list[str], pages: list[PageRanges], fmt: PageFormat) -> list[bool]:
        okeys: list[str] = []
        ptrs: list[int] = []
        sizes: list[int] = []
        for key, page in zip(keys, pages):
            for i, (ptr, n) in enumerate(page):
                okeys.append(f"{key}.{i}")
                ptrs.append(ptr)
                sizes.append(n)
        data_ok = self._batch_put_from(okeys, ptrs, sizes)
        if len(data_ok) != len(okeys):
            raise RuntimeError(f"_batch_put_from returned {len(data_ok)} results for {len(okeys)}")
        per = len(fmt.sizes)
        page_ok = [all(data_ok[p * per : (p + 1) * per]) for p in range(len(keys))]
        metas = [torch.frombuffer(bytearray(self._meta(pg, fmt)), dtype=torch.uint8)
                 for pg, ok in zip(pages, page_ok) if ok]
        mkeys = [f"{k}.m" for k, ok in zip(keys, page_ok) if ok]
        meta_ok = self._batch_put_from(
            mkeys, [m.data_ptr() for m in metas], [_META.size] * len(metas)
        ) if mkeys else []
        if len(meta_ok) != len(mkeys):
            raise RuntimeError(f"_batch_put_from returned {len(meta_ok)} results for {len(mkeys)}")
        it = iter(meta_ok)
        return [bool(next(it)) if ok else False for ok in page_ok]

    def _get_pages(self, keys: list[str], pages: list[PageRanges], fmt: PageFormat) -> list[bool]:
        n = len(keys)
        bufs = [torch.zeros(_META.size, dtype=torch.uint8) for _ in range(n)]
        meta_ok = self._batch_get_into(
            [f"{k}.m" for k in keys], [b.data_ptr() for b in bufs], [_META.size] * n
        )
        if len(meta_ok) != n:
            raise RuntimeError(f"_batch_get_into returned {len(meta_ok)} results for {n}")
        want: list[int] = []
        crcs: dict[int, int] = {}
        for p in range(n):
            if not meta_ok[p]:
                continue
            magic, fid, nbytes, crc = _META.unpack(bytes(_memory.view(bufs[p].data_ptr(),
                                                                      _META.size)))
            if magic != _META_MAGIC or fid != fmt.format_id or nbytes != fmt.nbytes:
                self.stats.add(rejected=1)
                continue
            want.append(p)
            crcs[p] = crc
        okeys: list[str] = []
        ptrs: list[int] = []
        sizes: list[int] = []
        for p in want:
            for i, (ptr, nb) in enumerate(pages[p]):
                okeys.append(f"{keys[p]}.{i}")
                ptrs.append(ptr)
                sizes.append(nb)
        data_ok = self._batch_get_into(okeys, ptrs, sizes) if okeys else []
        if len(data_ok) != len(okeys):
            raise RuntimeError(f"_batch_get_into returned {len(data_ok)} results for {len(okeys)}")
        per = len(fmt.sizes)
        out = [False] * n
        for j, p in enumerate(want):
            if not all(data_ok[j * per : (j + 1) * per]):
                continue
            if self.verify_checksum and checksum(pages[p]) != crcs[p]:
                self.stats.add(rejected=1)
                continue
            out[p] = True
        return out

    def _exist_pages(self, keys: list[str]) -> list[bool]:
        return self._batch_is_exist([f"{k}.m" for k in keys])
