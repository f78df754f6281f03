"""The exception rule of ``mem_cache_kernels.checks``, tested for the storage tier (issue 15).

A caller's mistake raises ``TypeError`` when the argument is the wrong *kind* of thing (a bool or
a float for an int, a non-str key, a tensor or a number for a list, a list for a tensor) or an
index tensor of the wrong *dtype*, and ``ValueError`` for a wrong value (range, length, a key
outside the alphabet, an unknown name); either way the message names the argument.

Table-driven: one row per (owner, method, mistake): the config dataclass, the key helpers, every
concrete backend's SGLang calls (``get``/``set``/``batch_get``/``batch_set``/``exists``/
``batch_exists``/``batch_get_v1``/``batch_set_v1``), the registry and the
:class:`StorageController`. ``test_every_public_class_and_method_has_a_row`` fails when a class
of ``mem_cache_storage.__all__`` (or a concrete backend of a public module), one of its public
methods that take arguments, or a public function has no row and no reasoned exemption.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import mem_cache_storage
from mem_cache_storage import (
    ExtraPool,
    HiCacheFile,
    HiCacheMemory,
    HiCacheStorageConfig,
    KeySpace,
    LatencyRecorder,
    StorageBackendFactory,
    StorageController,
    create_backend,
    get_hash_str,
    namespace_seed,
    page_hashes,
    register_backend,
)
from mem_cache_storage.base import HiCacheStorage
from mem_cache_storage.mooncake import HiCacheMooncake

from .conftest import PS, make_host

T, V = TypeError, ValueError
CFG = HiCacheStorageConfig(model_name="m")
_DIRS: list[str] = []


@dataclass(frozen=True)
class Row:
    owner: str  # class name, or "" for a module-level function
    method: str  # "__init__" for the constructor
    arg: str  # the argument the message must name
    error: type[Exception]
    call: Callable[[], object]
    what: str

    @property
    def id(self) -> str:
        return f"{self.owner or 'fn'}.{self.method}:{self.arg}:{self.what}"


@pytest.fixture(autouse=True, scope="module")
def _remove_file_backend_dirs() -> Iterator[None]:
    yield
    for d in _DIRS:
        shutil.rmtree(d, ignore_errors=True)


# ----------------------------------------------------------------------------- backends
def _options(cls: type[HiCacheStorage]) -> dict[str, Any]:
    opts: dict[str, Any] = {"page_size": PS}
    if cls is HiCacheFile:
        _DIRS.append(tempfile.mkdtemp(prefix="mem-cache-error-rule-"))
        opts["storage_dir"] = _DIRS[-1]
    if cls is HiCacheMooncake:
        opts["connect"] = False  # no store: argument checks come before any store call
    return opts


BACKENDS: tuple[type[HiCacheStorage], ...] = (HiCacheMemory, HiCacheFile, HiCacheMooncake)


def _backend(cls: type[HiCacheStorage], *, pool: bool = False) -> Any:
    b = cls(CFG, _options(cls))  # type: ignore[call-arg]
    if pool:
        b.register_mem_pool_host(make_host(size=16))
    return b


def _on(cls: type[HiCacheStorage], method: str, *args: Any, pool: bool = False) -> Any:
    return lambda: getattr(_backend(cls, pool=pool), method)(*args)


def _ctor(cls: type[HiCacheStorage], config: object, kwargs: object, **opts: Any) -> Any:
    def call() -> object:
        base = _options(cls)
        if isinstance(kwargs, dict):
            return cls(config, {**base, **kwargs}, **opts)  # type: ignore[call-arg]
        return cls(config, kwargs, **opts)  # type: ignore[call-arg]

    return call


def _backend_rows(cls: type[HiCacheStorage]) -> list[Row]:
    n = cls.__name__
    t = torch.zeros(8, dtype=torch.int16)
    strided = torch.zeros(8, 2)[:, 0]
    slots = torch.arange(PS)
    rows = [
        Row(n, "__init__", "storage_config", T, _ctor(cls, 5, {}), "int"),
        Row(n, "__init__", "config", V, _ctor(cls, {"tp_rnak": 1}, {}), "unknown field"),
        Row(n, "__init__", "kwargs", T, _ctor(cls, CFG, 5), "int"),
        Row(n, "__init__", "page_size", V, _ctor(cls, CFG, {"page_size": 0}), "zero"),
        Row(n, "get", "key", T, _on(cls, "get", 1, t), "int"),
        Row(n, "get", "key", V, _on(cls, "get", "a/b", t), "alphabet"),
        Row(n, "get", "target_location", T, _on(cls, "get", "k", [0]), "list"),
        Row(n, "get", "target_location", V, _on(cls, "get", "k", strided), "strided"),
        Row(n, "set", "key", T, _on(cls, "set", None, t), "None"),
        Row(n, "set", "key", V, _on(cls, "set", "", t), "empty"),
        Row(n, "set", "value", T, _on(cls, "set", "k", [0]), "list"),
        Row(n, "set", "value", V, _on(cls, "set", "k", torch.zeros(0)), "empty"),
        Row(n, "batch_get", "keys", T, _on(cls, "batch_get", 5), "int"),
        Row(n, "batch_get", "keys", T, _on(cls, "batch_get", "k"), "str"),
        Row(n, "batch_get", "keys", T, _on(cls, "batch_get", [1], [t]), "int key"),
        Row(n, "batch_get", "keys", V, _on(cls, "batch_get", ["a/b"], [t]), "alphabet"),
        Row(n, "batch_get", "target_locations", T, _on(cls, "batch_get", ["k"], t), "tensor"),
        Row(n, "batch_get", "target_locations", V, _on(cls, "batch_get", ["k"], [t, t]),
            "length"),
        Row(n, "batch_set", "keys", T, _on(cls, "batch_set", 5, [t]), "int"),
        Row(n, "batch_set", "keys", T, _on(cls, "batch_set", [b"k"], [t]), "bytes key"),
        Row(n, "batch_set", "keys", V, _on(cls, "batch_set", ["a b"], [t]), "alphabet"),
        Row(n, "batch_set", "values", T, _on(cls, "batch_set", ["k"], t), "tensor"),
        Row(n, "batch_set", "values", T, _on(cls, "batch_set", ["k"], 5), "int"),
        Row(n, "batch_set", "values", V, _on(cls, "batch_set", ["k", "l"], [t]), "length"),
        Row(n, "batch_set", "values", V, _on(cls, "batch_set", ["k"]), "missing"),
        Row(n, "exists", "key", T, _on(cls, "exists", 1), "int"),
        Row(n, "exists", "key", V, _on(cls, "exists", "a/b"), "alphabet"),
        Row(n, "batch_exists", "keys", T, _on(cls, "batch_exists", 5), "int"),
        Row(n, "batch_exists", "keys", T, _on(cls, "batch_exists", [True]), "bool key"),
        Row(n, "batch_exists", "keys", V, _on(cls, "batch_exists", ["k", "a/b"]), "alphabet"),
        Row(n, "storage_key", "key", T, _on(cls, "storage_key", 1.0), "float"),
        Row(n, "storage_key", "key", V, _on(cls, "storage_key", "x" * 129), "too long"),
        Row(n, "register_mem_pool_host", "mem_pool_host", T,
            _on(cls, "register_mem_pool_host", object()), "object"),
    ]
    if cls is HiCacheFile:
        rows += [
            Row(n, "page_path", "key", T, _on(cls, "page_path", 1), "int"),
            Row(n, "page_path", "key", V, _on(cls, "page_path", "a/b"), "alphabet"),
            Row(n, "page_extent", "key", T, _on(cls, "page_extent", 1), "int"),
            Row(n, "page_extent", "key", V, _on(cls, "page_extent", "a/b"), "alphabet"),
        ]
    if cls is HiCacheMooncake:
        rows += [
            Row(n, "remove", "keys", T, _on(cls, "remove", "k"), "str"),
            Row(n, "remove", "keys", V, _on(cls, "remove", ["a/b"]), "alphabet"),
        ]
    from mem_cache_storage.pools import PoolTransfer

    block = [PoolTransfer("swa", slots, keys=["k"], hit_policy="block_groups")]
    rows += [
        Row(n, "__init__", "key_scheme", V, _ctor(cls, CFG, {"key_scheme": "lmcache"}),
            "unknown"),
        Row(n, "register_mem_host_pool_v2", "host_pool", T,
            _on(cls, "register_mem_host_pool_v2", object(), "swa"), "object"),
        Row(n, "batch_exists_v2", "keys", T, _on(cls, "batch_exists_v2", "k", [], pool=True),
            "str"),
        Row(n, "batch_exists_v2", "keys", V, _on(cls, "batch_exists_v2", ["a/b"], pool=True),
            "alphabet"),
        Row(n, "batch_exists_v2", "hit_policy", V,
            _on(cls, "batch_exists_v2", ["k"], block, pool=True), "block_groups"),
    ]
    for method in ("batch_get_v2", "batch_set_v2"):
        rows += [
            Row(n, method, "transfers", T, _on(cls, method, "kv", pool=True), "str"),
            Row(n, method, "keys", V,
                _on(cls, method, [PoolTransfer("kv", slots, keys=["a/b"])], pool=True),
                "alphabet"),
        ]
    for method in ("batch_get_v1", "batch_set_v1"):
        rows += [
            Row(n, method, "keys", T, _on(cls, method, "k", slots, pool=True), "str"),
            Row(n, method, "keys", V, _on(cls, method, ["a/b"], slots, pool=True), "alphabet"),
            Row(n, method, "host_indices", T, _on(cls, method, ["k"], [0, 1, 2, 3], pool=True),
                "list"),
            Row(n, method, "host_indices", T, _on(cls, method, ["k"], slots.float(), pool=True),
                "float"),
            Row(n, method, "host_indices", V, _on(cls, method, ["k"], slots[:2], pool=True),
                "length"),
            Row(n, method, "host_indices", V, _on(cls, method, ["k"], slots[None], pool=True),
                "2-D"),
        ]
    return rows


# ----------------------------------------------------------------------------- config, keys
def _cfg(**kw: Any) -> Callable[[], object]:
    return lambda: HiCacheStorageConfig(**kw)


def _ks(**kw: Any) -> Callable[[], object]:
    args: dict[str, Any] = {"model_name": "m", "model_fingerprint": "f", "page_size": 4}
    return lambda: KeySpace(**{**args, **kw})


def _config_and_key_rows() -> list[Row]:
    c, k = "HiCacheStorageConfig", "KeySpace"
    ks = KeySpace("m", "f", 4)
    return [
        Row(c, "__init__", "tp_size", T, _cfg(tp_size=True), "bool"),
        Row(c, "__init__", "tp_size", V, _cfg(tp_size=0), "zero"),
        Row(c, "__init__", "tp_rank", T, _cfg(tp_rank=0.0), "float"),
        Row(c, "__init__", "tp_rank", V, _cfg(tp_rank=1), "range"),
        Row(c, "__init__", "pp_size", T, _cfg(pp_size="2"), "str"),
        Row(c, "__init__", "pp_rank", V, _cfg(pp_rank=-1), "negative"),
        Row(c, "__init__", "attn_cp_rank", T, _cfg(attn_cp_rank=None), "None"),
        Row(c, "__init__", "attn_cp_size", V, _cfg(attn_cp_size=0), "zero"),
        Row(c, "__init__", "dp_size", T, _cfg(dp_size=1.5), "float"),
        Row(c, "__init__", "dp_rank", V, _cfg(dp_rank=2, dp_size=2), "range"),
        Row(c, "__init__", "tp_lcm_size", T, _cfg(tp_lcm_size=True), "bool"),
        Row(c, "__init__", "tp_lcm_size", V, _cfg(tp_lcm_size=0), "zero"),
        Row(c, "__init__", "model_name", T, _cfg(model_name=1), "int"),
        Row(c, "__init__", "extra_config", T, _cfg(extra_config=[("a", 1)]), "list"),
        Row(c, "from_any", "config", T, lambda: HiCacheStorageConfig.from_any(5), "int"),
        Row(c, "from_any", "config", V, lambda: HiCacheStorageConfig.from_any({"tp": 1}),
            "unknown field"),
        Row(c, "from_any", "tp_size", T, lambda: HiCacheStorageConfig.from_any({"tp_size": 1.0}),
            "float field"),
        Row(k, "__init__", "page_size", T, _ks(page_size=True), "bool"),
        Row(k, "__init__", "page_size", V, _ks(page_size=0), "zero"),
        Row(k, "__init__", "model_name", T, _ks(model_name=None), "None"),
        Row(k, "__init__", "model_fingerprint", T, _ks(model_fingerprint=1), "int"),
        Row(k, "__init__", "tp_rank", V, _ks(tp_rank=1), "range"),
        Row(k, "__init__", "cp_size", T, _ks(cp_size=2.0), "float"),
        Row(k, "from_config", "config", T, lambda: KeySpace.from_config({}, 4), "dict"),  # type: ignore[arg-type]
        Row(k, "from_config", "page_size", T, lambda: KeySpace.from_config(CFG, 4.0), "float"),  # type: ignore[arg-type]
        Row(k, "from_config", "page_size", V, lambda: KeySpace.from_config(CFG, -4), "negative"),
        Row(k, "storage_key", "key", T, lambda: ks.storage_key(b"k"), "bytes"),  # type: ignore[arg-type]
        Row(k, "storage_key", "key", V, lambda: ks.storage_key("../etc"), "alphabet"),
        Row(k, "storage_keys", "keys", T, lambda: ks.storage_keys("abc"), "str"),
        Row(k, "storage_keys", "keys", T, lambda: ks.storage_keys([1]), "int key"),  # type: ignore[list-item]
        Row(k, "storage_keys", "keys", V, lambda: ks.storage_keys(["k", ""]), "empty key"),
        Row("", "get_hash_str", "token_ids", T, lambda: get_hash_str("abc"), "str"),  # type: ignore[arg-type]
        Row("", "get_hash_str", "token_ids", T, lambda: get_hash_str([1.5]), "float list"),  # type: ignore[list-item]
        Row("", "get_hash_str", "token_ids", T, lambda: get_hash_str(torch.ones(4)), "float"),
        Row("", "get_hash_str", "token_ids", V, lambda: get_hash_str(torch.ones(2, 2).long()),
            "2-D"),
        Row("", "get_hash_str", "token_ids", V, lambda: get_hash_str([1, -1]), "negative"),
        Row("", "get_hash_str", "prior_hash", T, lambda: get_hash_str([1], 5), "int"),  # type: ignore[arg-type]
        Row("", "get_hash_str", "prior_hash", V, lambda: get_hash_str([1], "zz"), "not hex"),
        Row("", "page_hashes", "page_size", T, lambda: page_hashes([1, 2], True), "bool"),
        Row("", "page_hashes", "page_size", V, lambda: page_hashes([1, 2], 0), "zero"),
        Row("", "page_hashes", "token_ids", T, lambda: page_hashes(5, 2), "int"),  # type: ignore[arg-type]
        Row("", "page_hashes", "token_ids", V, lambda: page_hashes([2**32, 0], 2), "range"),
        Row("", "page_hashes", "cache_salt", T, lambda: page_hashes([1, 2], 2, cache_salt=5),  # type: ignore[arg-type]
            "int"),
        Row("", "namespace_seed", "extra_key", T, lambda: namespace_seed(b"lora"),  # type: ignore[arg-type]
            "bytes"),
        Row("", "namespace_seed", "cache_salt", T, lambda: namespace_seed(None, 1),  # type: ignore[arg-type]
            "int"),
        Row("", "page_hashes", "prior_hash", T, lambda: page_hashes([1, 2], 2, b"00"), "bytes"),  # type: ignore[arg-type]
        Row("", "page_hashes", "prior_hash", V, lambda: page_hashes([1, 2], 2, "0g"), "not hex"),
    ]


# ----------------------------------------------------------------------------- registry, controller
def _controller(**kw: Any) -> StorageController:
    return StorageController(HiCacheMemory(CFG), make_host(size=16), **kw)


def _new_controller(storage: object = None, host: object = None, **kw: Any) -> Any:
    def call() -> object:
        s = HiCacheMemory(CFG) if storage is None else storage
        h = make_host(size=16) if host is None else host
        return StorageController(s, h, **kw)

    return call


def _ctl(method: str, *args: Any) -> Callable[[], object]:
    def call() -> object:
        with _controller() as c:
            return getattr(c, method)(*args)

    return call


def _other_rows() -> list[Row]:
    f, s, lr = "StorageBackendFactory", "StorageController", "LatencyRecorder"
    keys = ["k0", "k1"]
    slots = torch.arange(2 * PS)
    rows = [
        Row(f, "register_backend", "name", T,
            lambda: StorageBackendFactory.register_backend(1, "m", "C"), "int"),  # type: ignore[arg-type]
        Row(f, "register_backend", "module_path", V,
            lambda: StorageBackendFactory.register_backend("x", "", "C"), "empty"),
        Row(f, "register_backend", "class_name", T,
            lambda: StorageBackendFactory.register_backend("x", "m", None), "None"),  # type: ignore[arg-type]
        Row(f, "backend_class", "backend_name", T,
            lambda: StorageBackendFactory.backend_class(None), "None"),  # type: ignore[arg-type]
        Row(f, "backend_class", "backend_name", V,
            lambda: StorageBackendFactory.backend_class("nope"), "unknown"),
        Row(f, "create_backend", "backend_name", T,
            lambda: StorageBackendFactory.create_backend(3), "int"),  # type: ignore[arg-type]
        Row(f, "create_backend", "backend_name", V,
            lambda: StorageBackendFactory.create_backend("nope"), "unknown"),
        Row("", "register_backend", "name", T, lambda: register_backend(b"x", "m", "C"), "bytes"),  # type: ignore[arg-type]
        Row("", "register_backend", "name", V, lambda: register_backend("dynamic", "m", "C"),
            "reserved"),
        Row("", "create_backend", "backend_name", T, lambda: create_backend(["file"]), "list"),  # type: ignore[arg-type]
        Row("", "create_backend", "backend_name", V, lambda: create_backend("nope"), "unknown"),
        Row(lr, "__init__", "window", T, lambda: LatencyRecorder(1.5), "float"),  # type: ignore[arg-type]
        Row(lr, "__init__", "window", V, lambda: LatencyRecorder(0), "zero"),
        Row(s, "__init__", "storage", T, _new_controller(storage=object()), "object"),
        Row(s, "__init__", "host_pool", T, _new_controller(host=object()), "object"),
        Row(s, "__init__", "write_policy", T, _new_controller(write_policy=None), "None"),
        Row(s, "__init__", "write_policy", V, _new_controller(write_policy="write_around"),
            "unknown"),
        Row(s, "__init__", "batch_pages", T, _new_controller(batch_pages=True), "bool"),
        Row(s, "__init__", "batch_pages", V, _new_controller(batch_pages=0), "zero"),
        Row(s, "__init__", "prefetch_budget_pages", T,
            _new_controller(prefetch_budget_pages=1.5), "float"),
        Row(s, "__init__", "prefetch_budget_pages", V,
            _new_controller(prefetch_budget_pages=-1), "negative"),
        Row(s, "__init__", "io_threads", T, _new_controller(io_threads="2"), "str"),
        Row(s, "__init__", "io_threads", V, _new_controller(io_threads=0), "zero"),
        Row(s, "lookup", "keys", T, _ctl("lookup", "k0"), "str"),
        Row(s, "prefetch", "keys", T, _ctl("prefetch", 5), "int"),
    ]
    for method in ("write", "write_async", "on_host_evict", "on_host_insert"):
        rows += [
            Row(s, method, "keys", T, _ctl(method, "k0k1", slots), "str"),
            Row(s, method, "host_indices", T, _ctl(method, keys, slots.tolist()), "list"),
            Row(s, method, "host_indices", T, _ctl(method, keys, slots.double()), "float"),
        ]
    rows += [  # extra pools (the v2 path)
        Row("ExtraPool", "__init__", "name", T, lambda: ExtraPool(3, make_host(size=16)), "int"),  # type: ignore[arg-type]
        Row("ExtraPool", "__init__", "name", V, lambda: ExtraPool("kv", make_host(size=16)),
            "kv"),
        Row("ExtraPool", "__init__", "host_pool", T, lambda: ExtraPool("swa", object()),
            "object"),
        Row("ExtraPool", "__init__", "hit_policy", V,
            lambda: ExtraPool("swa", make_host(size=16), "block_groups"), "block_groups"),
        Row("ExtraPool", "__init__", "trailing_pages", V,
            lambda: ExtraPool("swa", make_host(size=16), "trailing_pages", 0), "zero"),
        Row(s, "__init__", "extra_pools", T, _new_controller(extra_pools=[object()]), "object"),
        Row(s, "__init__", "extra_pools", V, _new_controller(extra_pools=[
            ExtraPool("swa", make_host(size=16)), ExtraPool("swa", make_host(size=16))]),
            "duplicate"),
        Row(s, "write", "extra_indices", V, _ctl("write", keys, slots, {"swa": slots}),
            "no extra pools"),
    ]
    rows += [  # the length check runs where the pages are written
        Row(s, "write", "host_indices", V, _ctl("write", keys, slots[:PS]), "length"),
        Row(s, "on_host_evict", "host_indices", V, _ctl("on_host_evict", keys, slots[:1]),
            "length"),
    ]
    return rows


ROWS: list[Row] = [
    *(r for cls in BACKENDS for r in _backend_rows(cls)),
    *_config_and_key_rows(),
    *_other_rows(),
]

# classes of __all__ (or backends of public modules) without rows, with the reason
EXEMPT_CLASSES: dict[str, str] = {
    "ControllerStats": "a result record built by StorageController.stats",
    "HiCacheStorageExtraInfo": "carried through untouched (SGLang's per-call extra data)",
    "LatencySummary": "a result record built by LatencyRecorder.summary",
    "PageBatch": "host pool buffer meta wrapped by host_page_ranges (the pool's own lists)",
    "PageFormat": "a page-layout record built by mem_cache_storage.backend's page helpers",
    "PoolStats": "a result record built by StorageController.stats",
    "PoolHitPolicy": "a str enum of SGLang's policy names (a value, not a call)",
    "PoolName": "a str enum of SGLang's pool names (a value, not a call)",
    "PoolTransfer": "SGLang's descriptor record; the v2 calls check what they read from it",
    "PoolTransferResult": "a result record built by batch_exists_v2",
    "PrefetchHandle": "built by StorageController.prefetch; its timeouts go to threading waits",
    "PrefetchResult": "a result record built by the controller",
    "StorageStats": "counters the backends add to (add(**deltas) is internal bookkeeping)",
    "WriteResult": "a result record built by the controller",
}
EXEMPT_METHODS: dict[tuple[str, str], str] = {
    ("LatencyRecorder", "record"): "called by the controller with perf_counter differences",
}
EXEMPT_FUNCTIONS: dict[str, str] = {
    "checksum": "runs over PageRanges built by the backend base (not caller input)",
}


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_mistake_raises_the_rule_type_naming_the_argument(row: Row) -> None:
    with pytest.raises(Exception) as info:  # the exact type is asserted below
        row.call()
    assert type(info.value) is row.error, f"{row.id}: {type(info.value).__name__}: {info.value}"
    assert row.arg in str(info.value), f"{row.id}: message does not name {row.arg}: {info.value}"


def _public_classes() -> dict[str, type]:
    """Classes of ``__all__`` plus every concrete backend of a public module."""
    out = {
        n: o for n in mem_cache_storage.__all__
        if inspect.isclass(o := getattr(mem_cache_storage, n))
    }
    for info in pkgutil.iter_modules(mem_cache_storage.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"mem_cache_storage.{info.name}")
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, HiCacheStorage):
                out.setdefault(name, obj)
    return {
        n: c for n, c in out.items()
        if not issubclass(c, BaseException) and not inspect.isabstract(c)
    }


def _methods_with_arguments(cls: type) -> list[str]:
    names = [] if cls.__init__ is object.__init__ else ["__init__"]
    for name, fn in inspect.getmembers(cls):
        if name.startswith("_") or not callable(fn) or isinstance(fn, type):
            continue
        params = [p for p in inspect.signature(fn).parameters if p not in ("self", "cls")]
        if params:
            names.append(name)
    return names


def test_every_public_class_and_method_has_a_row() -> None:
    covered = {(r.owner, r.method) for r in ROWS}
    classes = _public_classes()
    assert {c.__name__ for c in BACKENDS} <= set(classes)
    missing = [
        f"{name}.{method}"
        for name, cls in sorted(classes.items()) if name not in EXEMPT_CLASSES
        for method in _methods_with_arguments(cls)
        if (name, method) not in covered and (name, method) not in EXEMPT_METHODS
    ]
    assert not missing, f"no error-rule row (add one to ROWS or a reasoned exemption): {missing}"
    functions = [
        n for n in mem_cache_storage.__all__
        if inspect.isfunction(f := getattr(mem_cache_storage, n))
        and inspect.signature(f).parameters and n not in EXEMPT_FUNCTIONS
    ]
    assert sorted(f for f in functions if ("", f) not in covered) == []
    concrete = {n for n, c in classes.items() if issubclass(c, HiCacheStorage)}
    assert concrete == {c.__name__ for c in BACKENDS}, "a new backend joins BACKENDS"


def test_a_rejected_call_changes_no_backend_state() -> None:
    b = _backend(HiCacheMemory, pool=True)
    host = b.mem_pool_host
    slots = host.alloc(PS)
    assert b.batch_set_v1(["k"], slots) == [True]
    before = (dict(b._store), b.get_stats())
    for call in (
        lambda: b.batch_set(["j", 1], [torch.zeros(4), torch.zeros(4)]),
        lambda: b.batch_set_v1(["j"], slots.float()),
        lambda: b.batch_get(["k", "a/b"], None),
    ):
        with pytest.raises((TypeError, ValueError)):
            call()
    assert (dict(b._store), b.get_stats()) == before
