"""mem_cache_storage: the HiCache-compatible storage tier (L3) under the host pool (L2).

Public surface: the SGLang-compatible interface (:mod:`.base`, :mod:`.config`), page hashes
(:mod:`.keys`), several pools per page (:mod:`.pools`), pages as byte ranges, storage key naming,
backend counters, the backend bases and the in-process backend (:mod:`.backend`), the file
backend (:mod:`.file`), the registry (:mod:`.registry`) and the prefetch / write-back controller
with its counters (:mod:`.controller`). The conformance
kit for backend authors is :mod:`mem_cache_storage.testing` and the classes SGLang's factory
attaches are in :mod:`mem_cache_storage.sglang_backends` (neither is imported here).

No backend client library is imported by importing this package or any of its modules.
"""

from mem_cache_storage.backend import (
    HiCacheMemory,
    KeySpace,
    PageBatch,
    PageFormat,
    PageRanges,
    PageStorageBackend,
    PointerStorageBackend,
    StorageStats,
    checksum,
)
from mem_cache_storage.base import HiCacheStorage
from mem_cache_storage.config import (
    STORAGE_BATCH_SIZE,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)
from mem_cache_storage.controller import (
    ControllerStats,
    ExtraPool,
    LatencyRecorder,
    LatencySummary,
    PoolStats,
    PrefetchHandle,
    PrefetchResult,
    StorageController,
    WriteResult,
)
from mem_cache_storage.file import HiCacheFile
from mem_cache_storage.keys import get_hash_str, namespace_seed, page_hashes
from mem_cache_storage.pools import PoolHitPolicy, PoolName, PoolTransfer, PoolTransferResult
from mem_cache_storage.registry import StorageBackendFactory, create_backend, register_backend

__all__ = [
    "STORAGE_BATCH_SIZE",
    "ControllerStats",
    "ExtraPool",
    "HiCacheFile",
    "HiCacheMemory",
    "HiCacheStorage",
    "HiCacheStorageConfig",
    "HiCacheStorageExtraInfo",
    "KeySpace",
    "LatencyRecorder",
    "LatencySummary",
    "PageBatch",
    "PageFormat",
    "PageRanges",
    "PageStorageBackend",
    "PointerStorageBackend",
    "PoolHitPolicy",
    "PoolName",
    "PoolStats",
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
