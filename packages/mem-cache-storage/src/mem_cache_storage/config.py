"""``HiCacheStorageConfig`` and ``HiCacheStorageExtraInfo``: what an engine tells a storage backend.

The field names, order and meaning follow SGLang's ``hicache_storage.py`` so an engine can build
either one; every backend of this package also accepts SGLang's own config object (anything with
these attributes, see :meth:`HiCacheStorageConfig.from_any`).

Fields used by this package:

* ``tp_rank / tp_size``, ``pp_rank / pp_size``: the rank suffix of every storage key (TP is left
  out for MLA models, whose KV is replicated across TP ranks: only TP rank 0 writes);
* ``is_mla_model``: see above;
* ``model_name`` and ``extra_config["model_fingerprint"]`` (a weights/config id the engine
  passes): the key prefix, so that another model or a weights change never reads stale KV;
* ``dcp_size / dcp_rank``, ``logical_page_size``: SGLang's decode-context-parallel shard
  identity; this package has no DCP (``dcp_size`` stays 1), the fields exist so SGLang's
  backends can read them from our config and :attr:`is_storage_writer` answers as SGLang's;
* ``extra_config``: backend options (``file``: ``storage_dir``, ``capacity_bytes``, ``fsync``;
  the ``dynamic`` backend form: ``backend_name``, ``module_path``, ``class_name``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from mem_cache_kernels.checks import check_int, check_optional_int

__all__ = ["STORAGE_BATCH_SIZE", "HiCacheStorageConfig", "HiCacheStorageExtraInfo"]

#: pages per storage call (SGLang's value)
STORAGE_BATCH_SIZE = 128


def _check_rank(name: str, rank: int, size: int) -> None:
    check_int(f"{name}_size", size, minimum=1)
    check_int(f"{name}_rank", rank, minimum=0, maximum=size - 1)


@dataclass(frozen=True, slots=True)
class HiCacheStorageConfig:
    """Storage configuration of one engine rank (see the module docstring)."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    attn_cp_rank: int = 0
    attn_cp_size: int = 1
    is_mla_model: bool = False
    enable_storage_metrics: bool = False
    is_page_first_layout: bool = True
    model_name: str | None = None
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: int | None = None
    should_split_heads: bool = False
    extra_config: dict[str, Any] | None = None
    dcp_size: int = 1
    dcp_rank: int = 0
    logical_page_size: int | None = None

    def __post_init__(self) -> None:
        _check_rank("tp", self.tp_rank, self.tp_size)
        _check_rank("pp", self.pp_rank, self.pp_size)
        _check_rank("attn_cp", self.attn_cp_rank, self.attn_cp_size)
        _check_rank("dp", self.dp_rank, self.dp_size)
        check_optional_int("tp_lcm_size", self.tp_lcm_size, minimum=1)
        _check_rank("dcp", self.dcp_rank, self.dcp_size)
        check_optional_int("logical_page_size", self.logical_page_size, minimum=1)
        if self.model_name is not None and not isinstance(self.model_name, str):
            raise TypeError(f"model_name must be a str or None, got {type(self.model_name)}")
        if self.extra_config is not None and not isinstance(self.extra_config, dict):
            raise TypeError(
                f"extra_config must be a dict or None, got {type(self.extra_config).__name__}"
            )

    @property
    def is_storage_writer(self) -> bool:
        """Whether this rank writes pages: every rank of a non-MLA model; for MLA (KV replicated
        across TP ranks) the rank whose ``tp_rank`` equals its ``dcp_rank`` (rank 0 without
        decode context parallel), as in SGLang."""
        return not self.is_mla_model or self.tp_rank == self.dcp_rank

    @property
    def extra(self) -> dict[str, Any]:
        """``extra_config`` or an empty dict."""
        return dict(self.extra_config or {})

    @classmethod
    def from_any(cls, config: object | None) -> HiCacheStorageConfig:
        """This class from ``config``: ``None`` (defaults), an instance, SGLang's dataclass or
        any object with these attributes (missing ones take their defaults), or a dict."""
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        names = [f.name for f in fields(cls)]
        if isinstance(config, dict):
            unknown = sorted(set(config) - set(names))
            if unknown:
                raise ValueError(
                    f"config has unknown fields {unknown}; HiCacheStorageConfig fields: {names}"
                )
            return cls(**config)
        values = {n: getattr(config, n) for n in names if hasattr(config, n)}
        if not values:
            raise TypeError(
                "config (a backend's storage_config) must be a HiCacheStorageConfig, a dict or "
                f"an object with its fields, got {type(config).__name__}"
            )
        return cls(**values)


@dataclass(frozen=True, slots=True)
class HiCacheStorageExtraInfo:
    """Per-call extra information (SGLang's): the keys of the pages before these ones
    (``prefix_keys``) and backend-specific data."""

    prefix_keys: list[str] | None = None
    extra_info: dict[str, Any] | None = None
