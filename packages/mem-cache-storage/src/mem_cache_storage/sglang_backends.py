"""The classes SGLang's storage factory attaches: our backends as subclasses of SGLang's
``HiCacheStorage``.

SGLang 0.5.23's ``StorageBackendFactory`` accepts a ``dynamic`` backend only when
``issubclass(cls, sglang.srt.mem_cache.hicache_storage.HiCacheStorage)``. This module answers
``HiCacheFile``, ``HiCacheMemory`` and ``HiCacheMooncake`` as ``type(name, (ours, SGLang's
HiCacheStorage), {})``: every method is ours (ours come first in the MRO, including the hooks
SGLang's controllers call: ``register_mem_pool_host``, ``register_mem_host_pool_v2``,
``on_host_pools_registered``, the v1 and v2 batch calls), SGLang's base only makes the
``issubclass`` check pass.

SGLang is imported when a class is first asked for (PEP 562 ``__getattr__``), never when this
module is imported, so importing it is as cheap as importing the package. The classes are built
once and cached.

From SGLang (``--hicache-storage-backend dynamic``)::

    --hicache-storage-backend-extra-config '{"backend_name": "mem_cache_file",
      "module_path": "mem_cache_storage.sglang_backends", "class_name": "HiCacheFile",
      "interface_v1": 1, "file_storage_path": "/mnt/kv", "key_scheme": "sglang"}'
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

__all__ = ["BACKENDS", "sglang_backend_class"]

#: name answered here -> (our module, our class)
BACKENDS: dict[str, tuple[str, str]] = {
    "HiCacheFile": ("mem_cache_storage.file", "HiCacheFile"),
    "HiCacheMemory": ("mem_cache_storage.backend", "HiCacheMemory"),
    "HiCacheMooncake": ("mem_cache_storage.mooncake", "HiCacheMooncake"),
}
_SGLANG_BASE = ("sglang.srt.mem_cache.hicache_storage", "HiCacheStorage")
_built: dict[str, type[Any]] = {}
_lock = threading.Lock()


def sglang_backend_class(name: str) -> type[Any]:
    """Our backend ``name`` (a key of :data:`BACKENDS`) as a subclass of SGLang's
    ``HiCacheStorage`` (imports SGLang; ``ImportError`` when it is not installed)."""
    if name not in BACKENDS:
        raise ValueError(f"name must be one of {sorted(BACKENDS)}, got {name!r}")
    with _lock:
        cls = _built.get(name)
        if cls is None:
            module_path, class_name = BACKENDS[name]
            ours = getattr(importlib.import_module(module_path), class_name)
            base = getattr(importlib.import_module(_SGLANG_BASE[0]), _SGLANG_BASE[1])
            cls = type(name, (ours, base), {
                "__module__": __name__,
                "__doc__": f"{ours.__doc__}\n\n(As an SGLang ``HiCacheStorage``: "
                           f"see :mod:`{__name__}`.)",
            })
            _built[name] = cls
        return cls


def __getattr__(name: str) -> Any:
    if name in BACKENDS:
        return sglang_backend_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
