"""Shared facts for the contract tests: the distributions and their modules."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Dist:
    name: str
    import_name: str
    siblings: tuple[str, ...]

    @property
    def src(self) -> Path:
        return ROOT / "packages" / self.name / "src" / self.import_name


DISTS: tuple[Dist, ...] = (
    Dist("mem-cache-kernels", "mem_cache_kernels", ()),
    Dist("mem-cache-pool", "mem_cache_pool", ("mem-cache-kernels",)),
    Dist("mem-cache-allocator", "mem_cache_allocator", ("mem-cache-pool", "mem-cache-kernels")),
    Dist("mem-cache-pool-host", "mem_cache_pool_host", ("mem-cache-pool", "mem-cache-kernels")),
    Dist(
        "mem-cache-storage",
        "mem_cache_storage",
        ("mem-cache-pool-host", "mem-cache-pool", "mem-cache-kernels"),
    ),
)

#: modules whose import must never happen as a side effect of importing a package
FORBIDDEN_ON_IMPORT = ("triton", "mem_cache_kernels._triton")

#: storage backends' client libraries (optional extras): importing any module of the storage
#: package must import none of them (the backends import their client when constructed)
BACKEND_CLIENTS = ("mooncake", "redis", "valkey", "nixl", "hf3fs_fuse", "aibrix_kvcache", "eic")


def public_modules(dist: Dist) -> list[str]:
    """Dotted names of the public modules of ``dist`` (no path component starts with ``_``)."""
    names: list[str] = []
    for path in sorted(dist.src.rglob("*.py")):
        rel = path.relative_to(dist.src.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        if any(p.startswith("_") for p in parts):
            continue
        names.append(".".join(parts))
    return names

