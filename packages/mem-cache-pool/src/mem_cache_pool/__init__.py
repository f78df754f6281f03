"""mem_cache_pool: device KV-cache pools (L1) and the request-to-token table.

Importing this package imports torch and ``mem_cache_kernels`` (which imports no Triton code);
kernels pick their backend when called.
"""

from mem_cache_pool.base import (
    FP8_DTYPES,
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
    "KVBufferDesc",
    "KVCache",
    "KVWriteLoc",
    "LayerReadyWaiter",
    "MHATokenToKVPool",
    "MLATokenToKVPool",
    "ReqToTokenPool",
    "SWAKVPool",
    "storage_dtype",
    "unwrap_write_loc",
]
