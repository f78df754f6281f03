"""mem_cache_allocator: KV slot allocators (SGLang's ``mem_cache.allocator``).

Exports the base, token and paged allocators and ``AllocatorDebugError`` (debug-mode failures:
a ``ValueError`` and an ``AssertionError``). The composite allocators live in their own modules
and are imported on first access (PEP 562), so ``import mem_cache_allocator`` imports neither the
pool families they need nor any kernel code:

* ``mem_cache_allocator.swa.SWATokenToKVPoolAllocator``
* ``mem_cache_allocator.mamba.MambaSlotAllocator``
* ``mem_cache_allocator.hisparse.HiSparseTokenToKVPoolAllocator``
* ``mem_cache_allocator.deepseek_v4_hisparse.DeepSeekV4HiSparseTokenToKVPoolAllocator``
"""

from __future__ import annotations

import importlib
from typing import Any

from mem_cache_allocator._debug import AllocatorDebugError
from mem_cache_allocator.base import BaseTokenToKVPoolAllocator
from mem_cache_allocator.paged import PagedTokenToKVPoolAllocator
from mem_cache_allocator.token import TokenToKVPoolAllocator

__all__ = [
    "AllocatorDebugError",
    "BaseTokenToKVPoolAllocator",
    "PagedTokenToKVPoolAllocator",
    "TokenToKVPoolAllocator",
]

_LAZY = {
    "SWATokenToKVPoolAllocator": "mem_cache_allocator.swa",
    "MambaSlotAllocator": "mem_cache_allocator.mamba",
    "HiSparseTokenToKVPoolAllocator": "mem_cache_allocator.hisparse",
    "DeepSeekV4HiSparseTokenToKVPoolAllocator": "mem_cache_allocator.deepseek_v4_hisparse",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mem_cache_allocator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, *_LAZY])
