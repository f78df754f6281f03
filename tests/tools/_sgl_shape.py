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


# --- methods that leave their class (SGLang's #25602/#25604/#25607 and [4/N] #27256 shapes) ---
#
# A static method of the scheduler becomes a module function of a new
# ``mem_cache/kv_cache_builder.py``; the scheduler calls it through the module. Then the slot
# bookkeeping of the Mamba pool is extracted into a new class ``MambaSlotAllocator`` in
# ``mem_cache/allocator/mamba.py``: four methods leave ``MambaPool``, one of them edited (a return
# annotation added, and one comment line in ``free``), the pool keeps its state methods.

MANAGERS = "python/engine/srt/managers"

DRAFT_POOL = '''\
def get_draft_pool(*, worker: object, spec: object, overlap: bool) -> tuple[object, object]:
    """The draft worker's KV pool and model config, or (None, None) without a draft.
    A method docstring that moves to module level loses an indentation level."""
    if worker is None or getattr(spec, "is_ngram", False):
        return None, None
    if overlap and getattr(spec, "supports_v2", False):
        runner = getattr(worker, "draft_runner")
        return runner.kv_pool, runner.config
    return (
        getattr(worker, "kv_pool"),
        getattr(worker, "config"),
    )
'''


def _indent(text: str) -> str:
    return "".join(f"    {line}" if line.strip() else line for line in text.splitlines(True))


SCHEDULER_HEAD = '''"""Scheduler."""

from engine.srt.mem_cache.allocator import PagedAllocator
{extra}

class Scheduler:
    def __init__(self, worker: object, spec: object, overlap: bool) -> None:
        self.worker = worker
        self.spec = spec
        self.overlap = overlap
        self.allocator = PagedAllocator(64, 16)

    def register_draft(self) -> object:
        pool, _ = {call}(
            worker=self.worker, spec=self.spec, overlap=self.overlap
        )
        return pool
'''

SCHEDULER = SCHEDULER_HEAD.format(extra="", call="Scheduler.get_draft_pool") + "\n" + _indent(
    "@staticmethod\n" + DRAFT_POOL)
#: after the move: the scheduler calls the builder's function
SCHEDULER_MOVED = SCHEDULER_HEAD.format(
    extra="from engine.srt.mem_cache import kv_cache_builder\n",
    call="kv_cache_builder.get_draft_pool")
#: after the move, with the call site forgotten
SCHEDULER_STALE = SCHEDULER_HEAD.format(
    extra="from engine.srt.mem_cache import kv_cache_builder  # noqa: F401\n",
    call="Scheduler.get_draft_pool")
BUILDER = '"""Building the KV cache."""\n\n\n' + DRAFT_POOL

MAMBA_SLOT_METHODS = '''\
def alloc(self, need: int) -> list[int] | None:
    if need > len(self.free_slots):
        return None
    return self._take(need)

def _take(self, need: int) -> list[int]:
    taken = self.free_slots[:need]
    self.free_slots = self.free_slots[need:]
    return taken

def free(self, slots: list[int]) -> None:
    if not slots:
        return
    self.free_slots.extend(slots)
'''

MAMBA_POOL_HEAD = '''"""Mamba state pool."""
{extra}

class MambaPool:
    def __init__(self, size: int) -> None:
        self.size = size
        self.states = [0] * (size + 1)
{init}
    def state(self, slot: int) -> int:
        return self.states[slot]
'''

MAMBA_POOL = MAMBA_POOL_HEAD.format(
    extra="", init="        self.free_slots = list(range(1, size + 1))\n"
) + "\n" + _indent("def available_size(self):\n    return len(self.free_slots)\n\n"
                   + MAMBA_SLOT_METHODS)
MAMBA_POOL_AFTER = MAMBA_POOL_HEAD.format(extra="", init="")
MAMBA_ALLOCATOR = '''"""Slot allocator of the Mamba state pool: one slot per request."""


class MambaSlotAllocator:
    """The free list of the Mamba pool's slots (slot 0 is the padding slot)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free_slots = list(range(1, size + 1))

''' + _indent("def available_size(self) -> int:\n    return len(self.free_slots)\n\n"
              + MAMBA_SLOT_METHODS.replace("    self.free_slots.extend(slots)\n",
                                           "    self.free_slots.extend(slots)\n"
                                           "    # the slots are reused in any order\n"))


def method_files() -> dict[str, str]:
    """The base tree of :func:`files` plus the scheduler and the Mamba pool."""
    return {
        **files(),
        f"{MANAGERS}/scheduler.py": SCHEDULER,
        f"{MC}/mamba_pool.py": MAMBA_POOL,
    }


def method_repo(root: Path) -> tuple[SynthRepo, str]:
    repo = SynthRepo(root)
    repo.write(method_files())
    return repo, repo.commit("base: scheduler and Mamba pool")
