"""mem_cache_pool: device KV-cache pools (L1) and the request-to-token table.

Importing this package imports torch and ``mem_cache_kernels`` (which imports no Triton code);
kernels pick their backend when called. The DeepSeek-V4 family lives in
:mod:`mem_cache_pool.deepseek_v4` and is imported on first attribute access (PEP 562), so engines
that do not use it never load it.
"""

from __future__ import annotations

import importlib
from typing import Any

from mem_cache_pool.base import (
    FP8_DTYPES,
    PADDING_SLOT,
    CpuKVCopy,
    KVBufferDesc,
    KVCache,
    KVWriteLoc,
    LayerReadyWaiter,
    storage_dtype,
    unwrap_write_loc,
)
from mem_cache_pool.dsa import DSATokenToKVPool
from mem_cache_pool.hisparse import HiSparseDSATokenToKVPool
from mem_cache_pool.hybrid import HybridLinearKVPool, HybridReqToTokenPool
from mem_cache_pool.mamba import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape, MambaPool
from mem_cache_pool.mha import MHATokenToKVPool
from mem_cache_pool.mla import MLATokenToKVPool
from mem_cache_pool.req_to_token import ReqToTokenPool
from mem_cache_pool.swa import BaseSWAKVPool, SWAKVPool

__all__ = [
    "FP8_DTYPES",
    "BaseSWAKVPool",
    "CpuKVCopy",
    "DSATokenToKVPool",
    "HiSparseDSATokenToKVPool",
    "HybridLinearKVPool",
    "HybridReqToTokenPool",
    "KVBufferDesc",
    "KVCache",
    "KVWriteLoc",
    "LayerReadyWaiter",
    "MHATokenToKVPool",
    "MLATokenToKVPool",
    "Mamba2CacheParams",
    "Mamba2StateDType",
    "Mamba2StateShape",
    "MambaPool",
    "PADDING_SLOT",
    "ReqToTokenPool",
    "SWAKVPool",
    "storage_dtype",
    "unwrap_write_loc",
]

_LAZY = {
    name: "mem_cache_pool.deepseek_v4"
    for name in (
        "CompressStatePool",
        "DeepSeekV4IndexerPool",
        "DeepSeekV4SingleKVPool",
        "DeepSeekV4TokenToKVPool",
        "HiSparseC4DevicePool",
    )
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mem_cache_pool' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, *_LAZY])
