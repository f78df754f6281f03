"""A synthetic engine repository in the shape of SGLang's tree (no code from it).

What matters is the shape that broke the tools on the real tree:

* ``python/engine/__init__.py`` exists, but ``python/engine/srt/`` and ``srt/mem_cache/`` have
  no ``__init__.py``: namespace folders under the root package;
* ``srt/utils/__init__.py`` star-imports ``srt/utils/common.py``, which imports the kernel
  library at module level inside ``try:`` / bare ``except:`` (a guarded eager import);
* ``mem_cache/allocator/__init__.py`` re-exports the paged allocator, which uses ``srt.utils``:
  importing the allocator package already loads the kernel library (the contract is broken
  before any change);
* ``mem_cache/sparse_pool.py`` imports one submodule of the kernel library, ``kernel_ext.kvio``,
  under a module-level ``if``; ``mem_cache/allocator/sparse.py`` imports that pool.

The reviewer's change re-exports the sparse allocators from ``allocator/__init__.py``.
"""

from __future__ import annotations

from pathlib import Path

from tests.tools._synth import SynthRepo

MC = "python/engine/srt/mem_cache"
ALLOC = "engine.srt.mem_cache.allocator"

CONTRACT = """\
[importlinter]
root_packages =
    engine
include_external_packages = True
contract_types =
    eager_forbidden: mem_cache_refactor.contracts.EagerForbiddenContract

[importlinter:contract:allocator-light]
name = Importing the allocators never loads the kernel library
type = eager_forbidden
as_packages = False
source_modules =
    {source}
forbidden_modules =
    {forbidden}
"""

COMMON = '''"""Shared helpers."""

import os

try:
    import kernel_ext  # noqa: F401

    HAS_KERNELS = True
except:  # noqa: E722
    HAS_KERNELS = False


def env_flag(name: str) -> bool:
    return os.environ.get(name, "") == "1"


def pages_needed(tokens: int, page: int) -> int:
    return (tokens + page - 1) // page
'''

PAGED = '''"""Paged allocator."""

from engine.srt.mem_cache.allocator.base import BaseAllocator
from engine.srt.utils import pages_needed


class PagedAllocator(BaseAllocator):
    def __init__(self, size: int, page: int) -> None:
        super().__init__(size)
        self.page = page

    def pages_for(self, tokens: int) -> int:
        return pages_needed(tokens, self.page)
'''

BASE = '''"""Allocator base."""


class BaseAllocator:
    def __init__(self, size: int) -> None:
        self.size = size
        self.free = list(range(size))
'''

SPARSE_POOL = '''"""Device pool of the sparse attention."""

from engine.srt.utils import env_flag

_ON_DEVICE = not env_flag("NO_DEVICE")
if _ON_DEVICE:
    from kernel_ext.kvio import transfer_pages
else:

    def transfer_pages(*args: object) -> None:
        raise RuntimeError("no device")


class SparsePool:
    def __init__(self, size: int) -> None:
        self.size = size
        self.transfer = transfer_pages
'''

SPARSE = '''"""Sparse allocators."""

from engine.srt.mem_cache.allocator.paged import PagedAllocator
from engine.srt.mem_cache.sparse_pool import SparsePool


class SparseAllocator(PagedAllocator):
    def __init__(self, size: int, page: int, pool: SparsePool) -> None:
        super().__init__(size, page)
        self.pool = pool


class SparsePagedAllocator(SparseAllocator):
    pass
'''

ALLOC_INIT = '''"""Token allocators."""

from engine.srt.mem_cache.allocator.base import BaseAllocator
from engine.srt.mem_cache.allocator.paged import (
    PagedAllocator,
)

__all__ = ["BaseAllocator", "PagedAllocator"]
'''

ALLOC_INIT_REEXPORT = '''"""Token allocators."""

from engine.srt.mem_cache.allocator.base import BaseAllocator
from engine.srt.mem_cache.allocator.paged import (
    PagedAllocator,
)
from engine.srt.mem_cache.allocator.sparse import SparseAllocator, SparsePagedAllocator

__all__ = ["BaseAllocator", "PagedAllocator", "SparseAllocator", "SparsePagedAllocator"]
'''


def files(source: str = ALLOC, forbidden: str = "kernel_ext") -> dict[str, str]:
    """The base tree (the merge of the sparse-allocator move)."""
    return {
        ".importlinter": CONTRACT.format(source=source, forbidden=forbidden),
        "python/pyproject.toml": '[project]\nname = "engine"\nversion = "0"\n',
        "python/engine/__init__.py": "",
        "python/engine/srt/utils/__init__.py": "from engine.srt.utils.common import *\n",
        "python/engine/srt/utils/common.py": COMMON,
        f"{MC}/allocator/__init__.py": ALLOC_INIT,
        f"{MC}/allocator/base.py": BASE,
        f"{MC}/allocator/paged.py": PAGED,
        f"{MC}/allocator/sparse.py": SPARSE,
        f"{MC}/sparse_pool.py": SPARSE_POOL,
    }


def sgl_repo(root: Path, **kw: str) -> tuple[SynthRepo, str]:
    repo = SynthRepo(root)
    repo.write(files(**kw))
    return repo, repo.commit("base: sparse allocators in allocator/sparse.py")
