"""Backend registry: ``StorageBackendFactory`` (SGLang's names) with the ``dynamic`` form.

* ``register_backend(name, module_path, class_name)``: a backend class, imported on first use
  (so registering a backend never imports its client library);
* ``create_backend(name, storage_config, mem_pool_host=None, **kwargs)``: builds the backend
  with ``backend_class(storage_config, kwargs)`` (the calling convention of SGLang's ``dynamic``
  loader, which every backend of this package accepts), then registers ``mem_pool_host``;
* ``name == "dynamic"``: the class named by ``storage_config.extra_config["module_path"]`` and
  ``["class_name"]`` (plus ``["backend_name"]`` for messages), so an outside backend plugs in
  without being registered.

Built in: ``file`` (:class:`~mem_cache_storage.file.HiCacheFile`) and ``memory``
(:class:`~mem_cache_storage.backend.HiCacheMemory`).
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import Any, ClassVar

from mem_cache_storage.base import HiCacheStorage
from mem_cache_storage.config import HiCacheStorageConfig

__all__ = ["BackendSpec", "StorageBackendFactory", "create_backend", "register_backend"]

_REQUIRED = ("get", "set", "batch_get", "batch_set", "exists", "batch_exists")
_DYNAMIC_FIELDS = ("backend_name", "module_path", "class_name")


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """Where a registered backend class lives."""

    name: str
    module_path: str
    class_name: str


def _load(spec: BackendSpec) -> type[Any]:
    try:
        module = importlib.import_module(spec.module_path)
    except ImportError as exc:
        raise ImportError(
            f"storage backend {spec.name!r}: cannot import {spec.module_path!r}: {exc}"
        ) from exc
    cls = getattr(module, spec.class_name, None)
    if not isinstance(cls, type):
        raise AttributeError(
            f"storage backend {spec.name!r}: no class {spec.class_name!r} in {spec.module_path!r}"
        )
    if not issubclass(cls, HiCacheStorage):
        missing = [m for m in _REQUIRED if not callable(getattr(cls, m, None))]
        if missing:
            raise TypeError(
                f"storage backend {spec.name!r}: {spec.module_path}.{spec.class_name} is not a "
                f"HiCacheStorage (missing {missing})"
            )
    return cls


class StorageBackendFactory:
    """Registered backends by name (see the module docstring)."""

    _registry: ClassVar[dict[str, BackendSpec]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def register_backend(cls, name: str, module_path: str, class_name: str) -> None:
        """Register (or replace) backend ``name``; nothing is imported now."""
        for arg, value in (("name", name), ("module_path", module_path),
                           ("class_name", class_name)):
            if not isinstance(value, str):
                raise TypeError(f"{arg} must be a non-empty str, got {type(value).__name__}")
            if not value:
                raise ValueError(f"{arg} must be a non-empty str, got {value!r}")
        if name == "dynamic":
            raise ValueError("'dynamic' is reserved for backends named in extra_config")
        with cls._lock:
            cls._registry[name] = BackendSpec(name, module_path, class_name)

    @classmethod
    def registered(cls) -> dict[str, BackendSpec]:
        """A copy of the registry: backend name -> :class:`BackendSpec` (thread-safe read)."""
        with cls._lock:
            return dict(cls._registry)

    @classmethod
    def backend_class(cls, backend_name: str, storage_config: object | None = None) -> type[Any]:
        """The class ``backend_name`` names (imports its module)."""
        if not isinstance(backend_name, str):
            raise TypeError(f"backend_name must be a str, got {type(backend_name).__name__}")
        if backend_name == "dynamic":
            extra = HiCacheStorageConfig.from_any(storage_config).extra
            missing = [f for f in _DYNAMIC_FIELDS if f not in extra]
            if missing:
                raise ValueError(
                    f"the 'dynamic' storage backend needs extra_config fields {missing}"
                )
            spec = BackendSpec(str(extra["backend_name"]), str(extra["module_path"]),
                               str(extra["class_name"]))
        else:
            with cls._lock:
                found = cls._registry.get(backend_name)
            if found is None:
                raise ValueError(
                    f"unknown storage backend {backend_name!r}; backend_name must be one of "
                    f"{sorted(cls.registered())} (or 'dynamic')"
                )
            spec = found
        return _load(spec)

    @classmethod
    def create_backend(
        cls, backend_name: str, storage_config: object | None = None,
        mem_pool_host: Any = None, **kwargs: Any,
    ) -> Any:
        """Build backend ``backend_name`` as ``backend_class(storage_config, kwargs)`` and
        register ``mem_pool_host`` with it (when given)."""
        backend_cls = cls.backend_class(backend_name, storage_config)
        config = storage_config if storage_config is not None else HiCacheStorageConfig()
        backend = backend_cls(config, kwargs)
        if mem_pool_host is not None:
            backend.register_mem_pool_host(mem_pool_host)
        return backend


def register_backend(name: str, module_path: str, class_name: str) -> None:
    """``StorageBackendFactory.register_backend``."""
    StorageBackendFactory.register_backend(name, module_path, class_name)


def create_backend(
    backend_name: str, storage_config: object | None = None, mem_pool_host: Any = None,
    **kwargs: Any,
) -> Any:
    """``StorageBackendFactory.create_backend``."""
    return StorageBackendFactory.create_backend(
        backend_name, storage_config, mem_pool_host, **kwargs
    )


register_backend("file", "mem_cache_storage.file", "HiCacheFile")
register_backend("memory", "mem_cache_storage.backend", "HiCacheMemory")
register_backend("mooncake", "mem_cache_storage.mooncake", "HiCacheMooncake")
