"""mem_cache_storage: the HiCache-compatible storage tier (L3) under the host pool (L2).

Public surface: the SGLang-compatible interface (:mod:`.base`, :mod:`.config`), storage keys
(:mod:`.keys`), pages as byte ranges (:mod:`.pages`), several pools per page (:mod:`.pools`),
backend bases (:mod:`.backend`), the backends (:mod:`.file`, :mod:`.memory`), the registry
(:mod:`.registry`), counters
(:mod:`.stats`) and the prefetch / write-back controller (:mod:`.controller`). The conformance
kit for backend authors is :mod:`mem_cache_storage.testing` and the classes SGLang's factory
attaches are in :mod:`mem_cache_storage.sglang_backends` (neither is imported here).

No backend client library is imported by importing this package or any of its modules.
"""

from mem_cache_storage.backend import PageStorageBackend, PointerStorageBackend, checksum
from mem_cache_storage.base import HiCacheStorage
from mem_cache_storage.config import (
    STORAGE_BATCH_SIZE,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)
from mem_cache_storage.controller import (
    ControllerStats,
    PrefetchHandle,
    PrefetchResult,
    StorageController,
    WriteResult,
)
from mem_cache_storage.file import HiCacheFile
from mem_cache_storage.keys import KeySpace, get_hash_str, namespace_seed, page_hashes
from mem_cache_storage.memory import HiCacheMemory
from mem_cache_storage.pages import PageFormat, PageRanges
from mem_cache_storage.pools import PoolHitPolicy, PoolName, PoolTransfer, PoolTransferResult
from mem_cache_storage.registry import StorageBackendFactory, create_backend, register_backend
from mem_cache_storage.stats import LatencyRecorder, LatencySummary, StorageStats

__all__ = [
    "STORAGE_BATCH_SIZE",
    "ControllerStats",
    "HiCacheFile",
    "HiCacheMemory",
    "HiCacheStorage",
    "HiCacheStorageConfig",
    "HiCacheStorageExtraInfo",
    "KeySpace",
    "LatencyRecorder",
    "LatencySummary",
    "PageFormat",
    "PageRanges",
    "PageStorageBackend",
    "PointerStorageBackend",
    "PoolHitPolicy",
    "PoolName",
    "PoolTransfer",
    "PoolTransferResult",
    "PrefetchHandle",
    "PrefetchResult",
    "StorageBackendFactory",
    "StorageController",
    "StorageStats",
    "WriteResult",
    "checksum",
    "create_backend",
    "get_hash_str",
    "namespace_seed",
    "page_hashes",
    "register_backend",
]
