"""A synthetic engine repository in the layout of a large inference engine: ``python/<pkg>/...``.

The stand-in mirrors the shape of a real file-split refactor (no code from any other project):
two allocator classes move unchanged from ``mem_cache/sparse_memory_pool.py`` to
``mem_cache/allocator/sparse.py``; the old module keeps the device pool, which imports a
compiled kernel extension (``kernel_ext``, not installed) at module level. Importers sit at module
level and inside functions, in the package under ``python/`` and in ``test/`` outside it; the
repository has its own ``tools/`` package and an ``.importlinter`` using our eager contract.
"""

from __future__ import annotations

from pathlib import Path

from tests.tools._synth import SynthRepo

MC = "python/engine/srt/mem_cache"
OLD = "engine.srt.mem_cache.sparse_memory_pool"
NEW = "engine.srt.mem_cache.allocator.sparse"

IMPORTLINTER = """\
[importlinter]
root_packages =
    engine
include_external_packages = True
contract_types =
    eager_forbidden: mem_cache_refactor.contracts.EagerForbiddenContract

[importlinter:contract:allocator-light]
name = Importing the allocators never loads the kernel extension
type = eager_forbidden
; the package's own import must stay light; its submodules may load kernels when imported
as_packages = False
source_modules =
    engine.srt.mem_cache.allocator
forbidden_modules =
    kernel_ext
"""

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "engine"
version = "0.0.1"

[tool.setuptools.packages.find]
exclude = ["tests*"]
"""

ALLOCATORS = '''
class SparseTokenAllocator(BaseTokenAllocator):
    """Allocates token slots for the sparse pool, one request at a time."""

    def __init__(self, size: int, pool: SparseKVPool) -> None:
        super().__init__(size)
        self.pool = pool
        self.reserved: dict[int, list[int]] = {}

    def alloc(self, need: int) -> list[int] | None:
        if need > len(self.free_slots):
            return None
        out, self.free_slots = self.free_slots[:need], self.free_slots[need:]
        return out

    def free(self, slots: list[int]) -> None:
        self.free_slots.extend(sorted(slots))


class SparsePagedAllocator(SparseTokenAllocator):
    """The paged variant: slots come in whole pages."""

    def __init__(self, size: int, page_size: int, pool: SparseKVPool) -> None:
        super().__init__(size, pool)
        self.page_size = page_size

    def alloc_pages(self, pages: int) -> list[int] | None:
        return self.alloc(pages * self.page_size)
'''

POOL = '''"""Device pools for sparse attention."""

import os

import kernel_ext.kvio

from engine.srt.mem_cache.allocator.base import BaseTokenAllocator


class SparseKVPool:
    """Holds the sparse KV buffers."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.copy = kernel_ext.kvio.copy_pages

    def debug(self) -> bool:
        return bool(os.environ.get("SPARSE_DEBUG"))

'''

POOL_AFTER = POOL.replace(
    "\nfrom engine.srt.mem_cache.allocator.base import BaseTokenAllocator\n", ""
).rstrip("\n") + "\n"

SPARSE = (
    '"""Allocators for the sparse KV pool."""\n\n'
    "from engine.srt.mem_cache.allocator.base import BaseTokenAllocator\n"
    "from engine.srt.mem_cache.sparse_memory_pool import SparseKVPool\n\n" + ALLOCATORS
)

ALLOC_INIT = '''"""Token allocators."""

from engine.srt.mem_cache.allocator.base import BaseTokenAllocator

__all__ = ["BaseTokenAllocator"]
'''

ALLOC_INIT_REEXPORT = '''"""Token allocators."""

from engine.srt.mem_cache.allocator.base import BaseTokenAllocator
from engine.srt.mem_cache.allocator.sparse import SparsePagedAllocator, SparseTokenAllocator

__all__ = ["BaseTokenAllocator", "SparsePagedAllocator", "SparseTokenAllocator"]
'''

BASE_ALLOC = '''"""Base allocator."""


class BaseTokenAllocator:
    """Hands out token slots."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free_slots = list(range(1, size + 1))

    def available_size(self) -> int:
        return len(self.free_slots)
'''


def chunk_cache(module: str) -> str:
    """The chunk cache: imports the allocator at module level, after a longer header."""
    return (
        '"""A cache without prefix sharing: every request gets fresh chunks."""\n\n'
        "from __future__ import annotations\n\n"
        "import logging\n"
        "from dataclasses import dataclass\n\n"
        "logger = logging.getLogger(__name__)\n\n\n"
        "@dataclass\n"
        "class ChunkEntry:\n"
        "    rid: int\n"
        "    slots: list[int]\n\n\n"
        "def _log(entry: ChunkEntry) -> None:\n"
        '    logger.debug("chunk %s: %d slots", entry.rid, len(entry.slots))\n\n\n'
        f"from {module} import SparseTokenAllocator  # noqa: E402\n\n\n"
        "class ChunkCache:\n"
        "    def __init__(self, allocator: SparseTokenAllocator) -> None:\n"
        "        self.allocator = allocator\n"
    )


def scheduler(module: str) -> str:
    imports = (
        "from engine.srt.mem_cache.sparse_memory_pool import SparseKVPool, SparsePagedAllocator\n"
        if module == OLD
        else "from engine.srt.mem_cache.allocator.sparse import SparsePagedAllocator\n"
        "from engine.srt.mem_cache.sparse_memory_pool import SparseKVPool\n"
    )
    return (
        '"""Scheduler."""\n\n' + imports + "\n\n"
        "def build(size: int) -> SparsePagedAllocator:\n"
        "    return SparsePagedAllocator(size, 4, SparseKVPool(size))\n"
    )


def runner(module: str) -> str:
    """Imports the module under an alias and uses the class inside a function."""
    return (
        '"""Model runner."""\n\n'
        f"import {module} as allocs\n"
        "from engine.srt.mem_cache.sparse_memory_pool import SparseKVPool\n\n\n"
        "def make_allocator(size: int) -> object:\n"
        "    return allocs.SparseTokenAllocator(size, SparseKVPool(size))\n"
    )


def unit_test_source(module: str) -> str:
    """A test that imports the allocator inside its function."""
    return (
        '"""Tests of the sparse allocators."""\n\n'
        "import unittest\n\n\n"
        "class TestSparseAlloc(unittest.TestCase):\n"
        "    def test_pages(self) -> None:\n"
        "        from engine.srt.mem_cache.sparse_memory_pool import SparseKVPool\n"
        f"        from {module} import SparsePagedAllocator\n\n"
        "        alloc = SparsePagedAllocator(16, 4, SparseKVPool(16))\n"
        "        self.assertEqual(len(alloc.alloc_pages(2) or []), 8)\n"
    )


def base_files() -> dict[str, str]:
    return {
        ".importlinter": IMPORTLINTER,
        "python/pyproject.toml": PYPROJECT,
        "python/engine/__init__.py": "",
        "python/engine/srt/__init__.py": "",
        f"{MC}/__init__.py": "",
        f"{MC}/allocator/__init__.py": ALLOC_INIT,
        f"{MC}/allocator/base.py": BASE_ALLOC,
        f"{MC}/sparse_memory_pool.py": POOL + "\n" + ALLOCATORS,
        f"{MC}/chunk_cache.py": chunk_cache(OLD),
        "python/engine/srt/managers/__init__.py": "",
        "python/engine/srt/managers/scheduler.py": scheduler(OLD),
        "python/engine/srt/model_executor/__init__.py": "",
        "python/engine/srt/model_executor/runner.py": runner(OLD),
        "test/srt/test_sparse_alloc.py": unit_test_source(OLD),
        # the repository's own tools/ package (it must not shadow ours)
        "tools/__init__.py": "",
        "tools/lint_docs.py": '"""Checks the docs."""\n',
    }


def moved_files(
    *,
    keep_chunk_cache: bool = False,
    keep_test: bool = False,
    reexport: bool = False,
    kernel_in_sparse: bool = False,
    edit: bool = False,
) -> dict[str, str]:
    """The tree after the split, with the mutations of the scenarios."""
    sparse = SPARSE
    if kernel_in_sparse:
        sparse = sparse.replace(
            "from engine.srt.mem_cache.allocator.base",
            "import kernel_ext\n\nfrom engine.srt.mem_cache.allocator.base",
        )
    if edit:
        sparse = sparse.replace("        if need > len(self.free_slots):",
                                "        if need >= len(self.free_slots):")
    return {
        f"{MC}/allocator/sparse.py": sparse,
        f"{MC}/allocator/__init__.py": ALLOC_INIT_REEXPORT if reexport else ALLOC_INIT,
        f"{MC}/sparse_memory_pool.py": POOL_AFTER,
        f"{MC}/chunk_cache.py": chunk_cache(OLD if keep_chunk_cache else NEW),
        "python/engine/srt/managers/scheduler.py": scheduler(NEW),
        "python/engine/srt/model_executor/runner.py": runner(NEW),
        "test/srt/test_sparse_alloc.py": unit_test_source(OLD if keep_test else NEW),
    }


def engine_repo(root: Path) -> tuple[SynthRepo, str]:
    """The engine repository at its base commit."""
    repo = SynthRepo(root)
    repo.write(base_files())
    return repo, repo.commit("base: sparse allocators live in sparse_memory_pool")


def line_of(text: str, needle: str) -> int:
    """1-based line of the first line of ``text`` containing ``needle``."""
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    raise ValueError(f"{needle!r} not found")
