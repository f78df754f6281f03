"""Storage backends over byte-range pages: everything a zero-copy read or write of this package
runs through, in one module (a page's format, which such a call only looks up, is
:mod:`mem_cache_storage._page_format`'s). One module on purpose: the controller's prefetch runs
through the controller, this module and three of the host pool's, and a public call reaches its
bytes through at most five of our modules (issue 29, ``tools/module_chain.py``), so what that
path runs (page lists, storage keys, counters, the guard, the backend bases and the in-process
pointer backend) stays here.

* **Pages.** A page is host memory ranges in page order (:data:`PageRanges`) plus a
  :class:`PageFormat` saying how those bytes are laid out; a batch of pages is a
  :class:`PageBatch`: SGLang's ``get_page_buffer_meta`` lists (``ptrs``, ``sizes``), ``per``
  consecutive ranges per page, kept as they come from the host pool (never regrouped):

  * the **copying path** (``get``/``set`` with a tensor, e.g. ``host_pool.get_data_page(i)``): one
    range, format ``flat`` or, when a host pool is registered, ``flat:<page_format.tag>`` (the
    host pool's flat page follows its layout, as SGLang's does, so the tag keeps a ``page_first``
    page from being read into a ``layer_first`` pool);
  * the **zero-copy path** (``batch_get_v1``/``batch_set_v1``): the ranges the host pool's
    ``get_page_buffer_meta`` returns, format ``native:<layout>`` (byte order depends on the
    layout).

  A backend stores the format's :attr:`PageFormat.format_id` with the page and treats a page
  stored in another format as a miss, so bytes are never reinterpreted across formats.
* **Storage keys** (:class:`KeySpace`): how a caller key (a page hash, see
  :mod:`mem_cache_storage.keys`) becomes the key a backend stores under.
* **Counters** (:class:`StorageStats`) and **the one failure guard** (:func:`guarded`): a failing
  backend call (an exception, a malformed or short result) is counted once, logged once and
  becomes a miss / failed set, never an exception in the engine. The controller uses the same
  guard for backends that are not ours.
* **Bases.** :class:`PageStorageBackend` (pages as byte ranges) and
  :class:`PointerStorageBackend` (clients with ``batch_put_from`` / ``batch_get_into`` /
  ``batch_is_exist`` over ``(keys, ptrs, sizes)``, like Mooncake Store), and
  :class:`HiCacheMemory`, the in-process reference pointer backend.

:class:`PageStorageBackend` implements the whole SGLang-facing :class:`HiCacheStorage` API once:
caller keys become storage keys, tensors and host pool pages become byte ranges, counters are
kept, and failures go through :func:`guarded`. A subclass implements four hooks on *storage*
keys:

* ``_put_pages(keys, pages, fmt) -> list[bool]``: store each page (its ranges, in order);
* ``_get_pages(keys, pages, fmt) -> list[bool]``: fill each page's ranges; ``True`` only when
  the stored page has format ``fmt`` and verified intact;
* ``_exist_pages(keys) -> list[bool]``;
* ``_clear()``.

``pages`` is a :class:`PageBatch` (a sequence of :data:`PageRanges`, one per key).

Constructor (every backend): ``Backend(storage_config=None, kwargs=None, /, **options)``. That is
exactly what SGLang's ``dynamic`` loader calls (``backend_class(storage_config, kwargs)``) and
what its built-in form for pool-aware backends calls (``backend_class(storage_config,
mem_pool_host)``): the second positional argument may be an options dict or a host pool.
Options are ``storage_config.extra_config`` updated by that dict and then by ``**options``.
Common options: ``page_size`` (needed for keys until a host pool is registered),
``model_fingerprint`` and ``key_scheme`` (``mem_cache``, the default, or ``sglang`` where the
backend supports it: see :class:`KeySpace`).

**Page bytes under the ``sglang`` scheme.** SGLang stores a page as its host pool's *flat* page
(``get_data_page(i, flat=True)``). For the ``page_first`` and ``page_first_direct`` layouts the
ranges ``get_page_buffer_meta`` reports, in order, are exactly those bytes (K page then V page for
MHA, one range for MLA), so the zero-copy path moves them directly; for any other layout the page
goes through the pool's ``get_data_page`` / ``set_from_flat_data_page`` (one copy).

**Several pools per page (v2)**: see :mod:`mem_cache_storage.pools` (the v2 calls are
:class:`~mem_cache_storage.pools.PoolPagesMixin`'s).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import re
import struct
import threading
import zlib
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar, overload

import torch

from mem_cache_kernels.checks import check_index, check_int
from mem_cache_storage._page_format import PageFormat, PageRanges, _page_format, tensor_page_ranges
from mem_cache_storage.base import HiCacheStorage
from mem_cache_storage.config import HiCacheStorageConfig, HiCacheStorageExtraInfo
from mem_cache_storage.pools import PoolPagesMixin

__all__ = [
    "FLAT_NATIVE_LAYOUTS",
    "KEY_SCHEMES",
    "HiCacheMemory",
    "KeySpace",
    "PageBatch",
    "PageFormat",
    "PageRanges",
    "PageStorageBackend",
    "PointerStorageBackend",
    "StorageStats",
    "check_keys",
    "checksum",
    "guarded",
    "host_page_ranges",
    "tensor_page_ranges",
    "view",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


# ----------------------------------------------------------------- raw memory
def view(ptr: int, nbytes: int) -> memoryview:
    """A writable byte view of ``nbytes`` at host address ``ptr`` (the caller owns the memory)."""
    if nbytes == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_ubyte * nbytes).from_address(ptr)).cast("B")


#: views of host ranges already seen, by ``(ptr, nbytes)``: a view is only an address and a
#: length (it owns nothing), so one made for a range serves every later call that is handed the
#: same range (callers use it only while that memory is theirs: under the pool's ``io_guard``)
_VIEWS: dict[tuple[int, int], memoryview] = {}
_VIEWS_MAX = 8192


def page_views(page: PageRanges) -> list[memoryview]:
    """:func:`view` of each range of ``page``, from a cache of the ranges seen before (a
    ``ctypes`` view costs about 1 us: a page's two views were a tenth of a one-page read)."""
    out: list[memoryview] = []
    cache = _VIEWS
    for rng in page:
        v = cache.get(rng)
        if v is None:
            if len(cache) >= _VIEWS_MAX:
                cache.clear()
            v = cache[rng] = view(*rng)
        out.append(v)
    return out


# ---------------------------------------------------------------------- pages
class PageBatch(Sequence[PageRanges]):
    """Pages as the host pool lists them: ``ptrs[i]``, ``sizes[i]`` of every range, ``per``
    consecutive ranges per page (SGLang's ``get_page_buffer_meta`` lists, not copied). Indexing
    gives one page's :data:`PageRanges` (a slice, a list of them); pointer backends use the lists
    directly."""

    __slots__ = ("per", "ptrs", "sizes")

    def __init__(self, ptrs: list[int], sizes: list[int], per: int) -> None:
        self.ptrs = ptrs
        self.sizes = sizes
        self.per = per

    @classmethod
    def of(cls, pages: Sequence[PageRanges]) -> PageBatch:
        """A batch of pages given as ranges (every page with the same number of ranges)."""
        if isinstance(pages, PageBatch):
            return pages
        per = len(pages[0]) if pages else 0
        return cls([p for page in pages for p, _ in page], [n for page in pages for _, n in page],
                   per)

    def __len__(self) -> int:
        return len(self.ptrs) // self.per if self.per else 0

    @overload
    def __getitem__(self, index: int) -> PageRanges: ...
    @overload
    def __getitem__(self, index: slice) -> list[PageRanges]: ...
    def __getitem__(self, index: int | slice) -> PageRanges | list[PageRanges]:
        per = self.per
        n = len(self.ptrs) // per if per else 0
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(n))]
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"page {index} of a batch of {n}")
        if per == 1:
            return ((self.ptrs[index], self.sizes[index]),)
        lo = index * per
        return tuple(zip(self.ptrs[lo : lo + per], self.sizes[lo : lo + per]))

    def __iter__(self) -> Iterator[PageRanges]:
        per, ptrs, sizes = self.per, self.ptrs, self.sizes
        for lo in range(0, len(ptrs) if per else 0, per or 1):
            yield tuple(zip(ptrs[lo : lo + per], sizes[lo : lo + per]))


def host_page_ranges(
    pool: Any, host_indices: torch.Tensor, num_pages: int, *, trusted: bool = False
) -> tuple[PageBatch, PageFormat]:
    """The ranges of ``num_pages`` whole pages of host slots ``host_indices`` in ``pool``
    (through its public ``get_page_buffer_meta``, SGLang's lists kept as they are), format
    ``native:<pool.layout>``. ``trusted``: the caller already checked ``host_indices`` (an
    index tensor of ``num_pages * page_size`` slots)."""
    if pool is None:
        raise RuntimeError("no host pool registered: call register_mem_pool_host(pool) first")
    page_size = int(pool.page_size)
    if not trusted:
        check_index("host_indices", host_indices)
    if not trusted and host_indices.numel() != num_pages * page_size:
        raise ValueError(
            f"host_indices must be 1-D with len(keys) * page_size = {num_pages * page_size} "
            f"slots, got shape {tuple(host_indices.shape)}"
        )
    # SGLang's host pools name the element type ``dtype``; ours also have ``store_dtype``
    dtype = str(getattr(pool, "store_dtype", getattr(pool, "dtype", "")))
    layout = str(getattr(pool, "layout", ""))
    if num_pages == 0:
        return PageBatch([], [], 0), PageFormat(f"native:{layout}", dtype, ())
    table_of = getattr(pool, "page_range_table", None)
    table = table_of() if callable(table_of) else None
    if table is not None:  # ours: the pool's trusted geometry, its page ids checked once
        pages = pool.page_ids(host_indices, trusted=trusted)  # checked there (few: one tolist)
        if len(pages) == 1:
            p = pages[0]
            ptrs = [base + p * stride for base, stride, _ in table]
        else:
            ptrs = [base + p * stride for p in pages for base, stride, _ in table]
        first = [n for _, _, n in table]
        return (PageBatch(ptrs, first * len(pages), len(table)),
                _page_format(f"native:{layout}", dtype, tuple(first)))
    ptrs, sizes = pool.get_page_buffer_meta(host_indices.to("cpu", torch.int64))
    per = len(ptrs) // num_pages
    if len(ptrs) != len(sizes) or len(ptrs) % num_pages:
        raise RuntimeError(
            f"get_page_buffer_meta returned {len(ptrs)} pointers / {len(sizes)} sizes for "
            f"{num_pages} pages"
        )
    first = list(sizes[:per])
    if list(sizes) != first * num_pages:
        raise RuntimeError("get_page_buffer_meta returned pages of different sizes")
    fmt = _page_format(f"native:{layout}", dtype, tuple(int(s) for s in first))
    return PageBatch(list(ptrs), list(sizes), per), fmt


# ----------------------------------------------------------------------- keys
#: storage key schemes: ours (default) and SGLang 0.5.23's
KEY_SCHEMES = ("mem_cache", "sglang")

_KEY = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
_SLUG = re.compile(r"[^A-Za-z0-9_\-]")


def _check_key(key: object, name: str = "key") -> str:
    if not isinstance(key, str):
        raise TypeError(f"{name} must be a str, got {type(key).__name__}")
    if not _KEY.fullmatch(key):
        raise ValueError(f"{name} must match [A-Za-z0-9_.-]{{1,128}}, got {key!r}")
    return key


def check_keys(keys: object, name: str = "keys") -> list[str]:
    """``keys`` (a sequence of caller keys, e.g. a list) as a list; ``TypeError`` for anything else
    (a single ``str`` included) or a non-``str`` key, ``ValueError`` for a key outside the
    alphabet."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise TypeError(f"{name} must be a list of str, got {type(keys).__name__}")
    out = list(keys)
    match = _KEY.fullmatch
    for i, k in enumerate(out):
        if not (isinstance(k, str) and match(k)):  # the message is built only on failure
            _check_key(k, f"{name}[{i}]")
    return out


def _key_list(keys: Iterable[str]) -> list[str]:
    """``keys`` as a list (``TypeError`` for a single ``str`` or a non-iterable; the keys
    themselves are the backend's to judge: a key it rejects is a miss / failed write)."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
        raise TypeError(f"keys must be a list of str, got {type(keys).__name__}")
    return list(keys)


def _all_keys(keys: list[Any]) -> bool:
    """Whether every entry of the list ``keys`` is a valid caller key (the test of
    :func:`check_keys` without its copy and messages: the storage key path of a list)."""
    match = _KEY.fullmatch
    return all(type(k) is str and match(k) is not None for k in keys)


@dataclass(frozen=True, slots=True)
class KeySpace:
    """Maps caller keys to storage keys for one (model, weights, page size, rank) (the key
    scheme: :mod:`mem_cache_storage.keys`)."""

    model_name: str
    model_fingerprint: str
    page_size: int
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    cp_rank: int = 0
    cp_size: int = 1
    is_mla: bool = False
    scheme: str = "mem_cache"
    #: the ``sglang`` scheme's naming: ``file`` (SGLang's HiCacheFile) or ``mooncake``
    #: (SGLang's MooncakeStore: ``{model}_{key}_{tp_rank}[_{pp_rank}]``, MLA ``{model}_{key}_``
    #: ``[{pp_rank}]``; the backend appends ``_k`` / ``_v``)
    flavor: str = "file"
    #: the first 16 hex characters of the key space's SHA-256 (see the storage key scheme)
    fingerprint: str = field(init=False, repr=False, compare=False)
    #: ``{model}.{fingerprint}.`` (the ``mem_cache`` scheme's prefix)
    prefix: str = field(init=False, repr=False, compare=False)
    #: what every storage key of this key space starts with
    prefix_for_clear: str = field(init=False, repr=False, compare=False)
    #: what follows the key in every storage key of this rank
    suffix: str = field(init=False, repr=False, compare=False)
    #: the suffix with the TP rank, MLA or not (the suffix of Mamba state keys)
    tp_suffix: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.scheme not in KEY_SCHEMES:
            raise ValueError(f"key scheme must be one of {KEY_SCHEMES}, got {self.scheme!r}")
        for name in ("model_name", "model_fingerprint"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        check_int("page_size", self.page_size, minimum=1)
        for dim in ("tp", "pp", "cp"):
            size = check_int(f"{dim}_size", getattr(self, f"{dim}_size"), minimum=1)
            check_int(f"{dim}_rank", getattr(self, f"{dim}_rank"), minimum=0, maximum=size - 1)
        text = "\0".join(("mem-cache-storage/key/v1", self.model_name, self.model_fingerprint,
                          str(self.page_size)))
        fingerprint = hashlib.sha256(text.encode()).hexdigest()[:16]
        prefix = f"{_SLUG.sub('-', self.model_name)[:48] or 'model'}.{fingerprint}."
        if self.scheme != "sglang":
            for_clear = prefix
        else:
            model = "-".join(self.model_name.split("/"))
            for_clear = f"{model}_" if self.flavor == "mooncake" and model else ""
        for name, value in (("fingerprint", fingerprint), ("prefix", prefix),
                            ("prefix_for_clear", for_clear), ("suffix", self._suffix(self.is_mla)),
                            ("tp_suffix", self._suffix(False))):
            object.__setattr__(self, name, value)

    @classmethod
    def from_config(
        cls, config: HiCacheStorageConfig, page_size: int, model_fingerprint: str | None = None,
        scheme: str | None = None, flavor: str = "file",
    ) -> KeySpace:
        """The key space of ``config`` with pages of ``page_size`` tokens; the fingerprint is
        ``model_fingerprint`` if given, else ``config.extra_config["model_fingerprint"]``."""
        if not isinstance(config, HiCacheStorageConfig):
            raise TypeError(f"config must be a HiCacheStorageConfig, got {type(config).__name__}")
        if model_fingerprint is None:
            model_fingerprint = str(config.extra.get("model_fingerprint", ""))
        return cls(
            model_name=config.model_name or "",
            model_fingerprint=model_fingerprint,
            page_size=page_size,
            tp_rank=config.tp_rank,
            tp_size=config.tp_size,
            pp_rank=config.pp_rank,
            pp_size=config.pp_size,
            cp_rank=config.attn_cp_rank,
            cp_size=config.attn_cp_size,
            is_mla=config.is_mla_model,
            scheme=str(config.extra.get("key_scheme", "mem_cache")) if scheme is None else scheme,
            flavor=flavor,
        )

    def _suffix(self, mla: bool) -> str:
        if self.scheme == "sglang" and self.flavor == "mooncake":
            pp = f"_{self.pp_rank}" if self.pp_size > 1 else ""
            return f"_{pp[1:]}" if mla else f"_{self.tp_rank}{pp}"
        if self.scheme == "sglang":
            model = "-".join(self.model_name.split("/"))
            shard = f"_{self.pp_size}_{self.pp_rank}" if self.pp_size > 1 else ""
            if self.cp_size > 1:
                shard += f"_cp{self.cp_rank}_{self.cp_size}"
            return f"_{model}{shard}" if mla else f"_{model}_{self.tp_rank}_{self.tp_size}{shard}"
        s = "" if mla else f".tp{self.tp_rank}-{self.tp_size}"
        if self.pp_size > 1:
            s += f".pp{self.pp_rank}-{self.pp_size}"
        if self.cp_size > 1:
            s += f".cp{self.cp_rank}-{self.cp_size}"
        return s

    def storage_key(self, key: str) -> str:
        """The storage key of caller key ``key`` (``ValueError`` for a key outside the
        alphabet)."""
        return self.storage_keys([_check_key(key)])[0]

    def storage_keys(self, keys: Sequence[str]) -> list[str]:
        """The storage keys of caller ``keys`` (checked with :func:`check_keys`)."""
        p, s, t = self.prefix_for_clear, self.suffix, self.tp_suffix
        if type(keys) is list and len(keys) == 1:  # a one-page call: no generator, no loop
            k = keys[0]
            if type(k) is str and _KEY.fullmatch(k) is not None:
                return [f"{p}{k}{t if k.endswith('.mamba') else s}"]
        if type(keys) is not list or not _all_keys(keys):  # anything else: the full checks
            keys = check_keys(keys)
        # a Mamba state is TP-sharded even when the model's KV is replicated
        return [f"{p}{k}{t if k.endswith('.mamba') else s}" for k in keys]


# ------------------------------------------------------------------ counters
@dataclass(slots=True)
class StorageStats:
    """Page counters of one backend (a snapshot is a copy: :meth:`snapshot`).

    ``get_*``/``set_*`` count pages of the get and set paths (both the copying and the zero-copy
    calls); ``*_bytes`` count payload bytes of successful pages; ``errors`` count backend calls
    that raised or returned a malformed result (their pages count as misses / failed sets);
    ``rejected`` count stored pages that failed verification (torn, foreign, corrupted);
    ``set_refused`` counts page writes the store refused (Mooncake's "BatchPut failed ...
    insufficient space"), every attempt, including those a retry then stored: ``set_failed``
    is what stayed unstored.
    """

    get_hits: int = 0
    get_misses: int = 0
    get_bytes: int = 0
    set_ok: int = 0
    set_failed: int = 0
    set_bytes: int = 0
    exists_queries: int = 0
    errors: int = 0
    rejected: int = 0
    evicted: int = 0
    set_refused: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def _add_get(self, hits: int, misses: int, nbytes: int) -> None:
        """``add(get_hits=..., get_misses=..., get_bytes=...)`` without the keyword loop."""
        with self._lock:
            self.get_hits += hits
            self.get_misses += misses
            self.get_bytes += nbytes

    def _add_set(self, ok: int, failed: int, nbytes: int) -> None:
        """``add(set_ok=..., set_failed=..., set_bytes=...)`` without the keyword loop."""
        with self._lock:
            self.set_ok += ok
            self.set_failed += failed
            self.set_bytes += nbytes

    def _add_exists(self, queries: int) -> None:
        with self._lock:
            self.exists_queries += queries

    def snapshot(self) -> StorageStats:
        with self._lock:
            return StorageStats(
                self.get_hits, self.get_misses, self.get_bytes, self.set_ok, self.set_failed,
                self.set_bytes, self.exists_queries, self.errors, self.rejected, self.evicted,
                self.set_refused,
            )

    def as_dict(self) -> dict[str, int]:
        s = self.snapshot()
        return {
            "get_hits": s.get_hits, "get_misses": s.get_misses, "get_bytes": s.get_bytes,
            "set_ok": s.set_ok, "set_failed": s.set_failed, "set_bytes": s.set_bytes,
            "exists_queries": s.exists_queries, "errors": s.errors, "rejected": s.rejected,
            "evicted": s.evicted, "set_refused": s.set_refused,
        }


# ------------------------------------------------------------ the failure guard
def guarded(call: Callable[[], object], answer: Callable[[Any], _T], default: _T, *,
            owner: str, what: str, count_error: Callable[[], object]) -> _T:
    """The one place a storage failure is swallowed: ``answer(call())``, or ``default`` when
    ``call`` raises or ``answer`` rejects its result (raises): then ``count_error()`` once and
    one warning naming ``owner`` and ``what``. A failing backend is a miss, never an engine
    crash."""
    try:
        return answer(call())
    except Exception as exc:
        _swallowed(exc, owner, what, count_error)
        return default


def _swallowed(exc: Exception, owner: str, what: str, count_error: Callable[[], object]) -> None:
    """What :func:`guarded` does with a failure (also for :meth:`PageStorageBackend._call`, its
    inline form on the page path): count it once, log one warning."""
    count_error()
    _log.warning("%s: %s failed (%s: %s): treated as a miss", owner, what,
                 type(exc).__name__, exc)


def bools(n: int, result: object) -> list[bool]:
    """``result`` as ``n`` bools (``True`` only for ``True``); ``ValueError`` for anything but a
    list of ``n`` (the :func:`guarded` answer of a per-page call)."""
    if not isinstance(result, list) or len(result) != n:
        what = f"{len(result)} results" if isinstance(result, list) else type(result).__name__
        raise ValueError(f"returned {what} for {n} pages")
    return [r is True for r in result]


def _prefix_of(n: int, result: object) -> int:
    return check_int("_exist_prefix result", result, minimum=0, maximum=n)


def checksum(page: PageRanges) -> int:
    """CRC-32 over a page's ranges, in order."""
    crc = 0
    for ptr, nbytes in page:
        crc = zlib.crc32(view(ptr, nbytes), crc)
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


class PageStorageBackend(PoolPagesMixin, HiCacheStorage):
    """Base of byte-range backends (see the module docstring)."""

    backend_name = "page"
    #: key schemes this backend can store pages under
    key_schemes: tuple[str, ...] = ("mem_cache",)
    #: naming of the ``sglang`` key scheme (see :class:`KeySpace`)
    sglang_flavor = "file"
    _check_keys = staticmethod(check_keys)

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
        self._count_error = partial(self.stats.add, errors=1)
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
        """The storage key of caller key ``key`` (see :class:`KeySpace`)."""
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
    def _put_pages(self, keys: list[str], pages: PageBatch, fmt: PageFormat) -> list[bool]:
        """Store each page under its storage key; one bool per page."""

    @abstractmethod
    def _get_pages(self, keys: list[str], pages: PageBatch, fmt: PageFormat) -> list[bool]:
        """Fill each page from storage; ``True`` only for an intact page of format ``fmt``."""

    @abstractmethod
    def _exist_pages(self, keys: list[str]) -> list[bool]:
        """Whether each storage key holds a page."""

    @abstractmethod
    def _clear(self) -> None:
        """Remove every page."""

    # ------------------------------------------------------------ guarded calls
    def _call(self, what: str, fn: Callable[..., object], n: int, *args: object) -> list[bool]:
        """A hook call guarded as :func:`guarded` guards, inline (no closures per call): a
        failure or a malformed result is counted in ``stats.errors``, logged once, and every
        page is a miss / failed set."""
        if n == 0:
            return []
        try:
            return bools(n, fn(*args))
        except Exception as exc:
            _swallowed(exc, type(self).__name__, what, self._count_error)
            return [False] * n

    def _get(self, skeys: list[str], pages: PageBatch, fmt: PageFormat) -> list[bool]:
        n = len(skeys)
        try:  # :meth:`_call`, inline (the page read path)
            ok = bools(n, self._get_pages(skeys, pages, fmt)) if n else []
        except Exception as exc:
            _swallowed(exc, type(self).__name__, "get", self._count_error)
            ok = [False] * n
        hits = sum(ok)
        self.stats._add_get(hits, len(ok) - hits, hits * fmt.nbytes)
        return ok

    def _put(self, skeys: list[str], pages: PageBatch, fmt: PageFormat) -> list[bool]:
        n = len(skeys)
        try:  # :meth:`_call`, inline (the page write path)
            ok = bools(n, self._put_pages(skeys, pages, fmt)) if n else []
        except Exception as exc:
            _swallowed(exc, type(self).__name__, "set", self._count_error)
            ok = [False] * n
        good = sum(ok)
        self.stats._add_set(good, len(ok) - good, good * fmt.nbytes)
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
        ok = self._get([self.storage_key(key)], PageBatch.of([page]), fmt)
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
        return self._put([self.storage_key(key)], PageBatch.of([page]), fmt)[0]

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
        self.stats._add_exists(len(skeys))
        if not skeys:
            return 0
        try:  # guarded as :func:`guarded` guards, inline
            found = self._exist_prefix(skeys)
            if type(found) is int and 0 <= found <= len(skeys):
                return found
            return _prefix_of(len(skeys), found)
        except Exception as exc:
            _swallowed(exc, type(self).__name__, "exists", self._count_error)
            return 0

    def _exist_prefix(self, keys: list[str]) -> int:
        """How many leading storage keys hold a page (default: one ``_exist_pages`` call;
        override to stop at the first miss)."""
        found = self._exist_pages(keys)
        if len(found) != len(keys):
            raise RuntimeError(f"_exist_pages returned {len(found)} results for {len(keys)}")
        return found.index(False) if False in found else len(found)

    def _host_io(self, write: bool, pool: Any, skeys: list[str],
                 host_indices: torch.Tensor, trusted: bool = False) -> list[bool]:
        """Move the pages at ``host_indices`` of ``pool`` to / from storage keys ``skeys``
        (``trusted``: ``host_indices`` already checked by the caller)."""
        with _io_guard(pool):
            if self.key_scheme == "mem_cache" or str(getattr(pool, "layout", "")) in (
                FLAT_NATIVE_LAYOUTS
            ):
                pages, fmt = host_page_ranges(pool, host_indices, len(skeys), trusted=trusted)
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
        pages = PageBatch([t.data_ptr() for t in tensors], [nbytes] * len(tensors), 1)
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

    def _trusted_host_io(self, write: bool, keys: list[str],
                        host_indices: torch.Tensor) -> list[bool]:
        """``batch_set_v1`` (``write``) / ``batch_get_v1`` for a caller that checked
        ``host_indices`` itself (a 1-D int64 tensor of ``len(keys) * page_size`` slots of the
        registered pool): the :class:`~mem_cache_storage.controller.StorageController`'s I/O
        threads, so the write and prefetch paths check the index tensor once, at the
        controller's public entry. The SGLang-named methods keep their checks for every other
        caller."""
        return self._host_io(write, self.mem_pool_host, self.keyspace.storage_keys(keys),
                             host_indices, trusted=True)

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

    @staticmethod
    def _object_keys(keys: Sequence[str], per: int) -> list[str]:
        """The data object keys of pages ``keys`` with ``per`` ranges each, in range order."""
        return [f"{k}.{i}" for k in keys for i in range(per)]

    def _put_pages(self, keys: list[str], pages: PageBatch, fmt: PageFormat) -> list[bool]:
        per = pages.per
        okeys = self._object_keys(keys, per)
        data_ok = self._batch_put_from(okeys, pages.ptrs, pages.sizes)
        if len(data_ok) != len(okeys):
            raise RuntimeError(f"_batch_put_from returned {len(data_ok)} results for {len(okeys)}")
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

    def _get_pages(self, keys: list[str], pages: PageBatch, fmt: PageFormat) -> list[bool]:
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
            magic, fid, nbytes, crc = _META.unpack(bytes(view(bufs[p].data_ptr(), _META.size)))
            if magic != _META_MAGIC or fid != fmt.format_id or nbytes != fmt.nbytes:
                self.stats.add(rejected=1)
                continue
            want.append(p)
            crcs[p] = crc
        per = pages.per
        if len(want) == n:  # every page: the batch's lists as they are
            okeys, ptrs, sizes = self._object_keys(keys, per), pages.ptrs, pages.sizes
        else:
            okeys = self._object_keys([keys[p] for p in want], per)
            ptrs = [x for p in want for x in pages.ptrs[p * per : (p + 1) * per]]
            sizes = [x for p in want for x in pages.sizes[p * per : (p + 1) * per]]
        data_ok = self._batch_get_into(okeys, ptrs, sizes) if okeys else []
        if len(data_ok) != len(okeys):
            raise RuntimeError(f"_batch_get_into returned {len(data_ok)} results for {len(okeys)}")
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


class HiCacheMemory(PointerStorageBackend):
    """Objects in a process-local ordered dict (see the module docstring)."""

    backend_name = "memory"

    def __init__(
        self, storage_config: object | None = None, kwargs: object | None = None, /,
        **options: Any,
    ) -> None:
        super().__init__(storage_config, kwargs, **options)
        store = self.options.get("store")
        if store is not None and not isinstance(store, OrderedDict):
            raise TypeError(f"store must be an OrderedDict, got {type(store).__name__}")
        self._store: OrderedDict[str, bytes] = store if store is not None else OrderedDict()
        self.capacity_bytes = int(self.options.get("capacity_bytes", 0) or 0)
        self._lock = threading.Lock()
        self._usage = sum(len(v) for v in self._store.values())

    def _batch_put_from(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[bool]:
        with self._lock:
            for key, ptr, n in zip(keys, ptrs, sizes):
                data = bytes(view(ptr, n))
                old = self._store.pop(key, None)
                self._usage += n - (len(old) if old is not None else 0)
                self._store[key] = data
            evicted = 0
            while self.capacity_bytes and self._usage > self.capacity_bytes and self._store:
                _, old = self._store.popitem(last=False)
                self._usage -= len(old)
                evicted += 1
        if evicted:
            self.stats.add(evicted=evicted)
        return [True] * len(keys)

    def _batch_get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[bool]:
        out: list[bool] = []
        with self._lock:
            for key, ptr, n in zip(keys, ptrs, sizes):
                data = self._store.get(key)
                if data is None or len(data) != n:
                    out.append(False)
                    continue
                view(ptr, n)[:] = data
                out.append(True)
        return out

    def _batch_is_exist(self, keys: list[str]) -> list[bool]:
        with self._lock:
            return [k in self._store for k in keys]

    def _clear(self) -> None:
        with self._lock:
            self._store.clear()
            self._usage = 0
