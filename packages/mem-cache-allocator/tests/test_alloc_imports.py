"""``import mem_cache_allocator`` imports no kernel code beyond the checks module, no pool family,
no composite module."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import mem_cache_allocator


def _modules_after(code: str) -> list[str]:
    probe = (
        f"{code}\nimport sys, json\n"
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('triton', 'mem_cache_kernels', 'mem_cache_pool', "
        "'mem_cache_allocator', 'hypothesis'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


def _checks_modules() -> set[str]:
    """What ``import mem_cache_kernels.checks`` loads (the one validation layer every package
    uses; importing it runs the kernels package's ``__init__``, which never imports triton)."""
    return {m for m in _modules_after("import mem_cache_kernels.checks") if "_triton" not in m}


def test_alloc_import_is_light() -> None:
    loaded = _modules_after("import mem_cache_allocator")
    checks = _checks_modules()
    forbidden = [
        m
        for m in loaded
        if (m.split(".")[0] in ("triton", "mem_cache_kernels") and m not in checks)
        or m.split(".")[0] in ("mem_cache_pool", "hypothesis")
        or m
        in (
            "mem_cache_allocator.hisparse",
            "mem_cache_allocator.swa",
            "mem_cache_allocator.mamba",
            "mem_cache_allocator.testing",
        )
    ]
    assert forbidden == [], f"import mem_cache_allocator pulled in {forbidden}"
    assert "mem_cache_allocator.paged" in loaded and "mem_cache_allocator.token" in loaded


def test_alloc_import_composites_and_kernels_stay_lazy() -> None:
    loaded = _modules_after(
        "import torch\n"
        "from mem_cache_allocator.hisparse import HiSparseTokenToKVPoolAllocator\n"
        "from mem_cache_allocator.swa import SWATokenToKVPoolAllocator\n"
        "a = SWATokenToKVPoolAllocator(16, 16, 1, torch.float16, 'cpu', None)\n"
        "a.alloc(2)\n"
    )
    checks = _checks_modules()
    kernels = [m for m in loaded if m.split(".")[0] in ("triton", "mem_cache_kernels")]
    assert not [m for m in kernels if m not in checks]
    assert not [m for m in loaded if m.startswith("mem_cache_pool")]
    # the first paged allocation on CPU loads the kernels package, still without triton
    loaded = _modules_after(
        "import torch\n"
        "from mem_cache_allocator import PagedTokenToKVPoolAllocator\n"
        "a = PagedTokenToKVPoolAllocator(16, 4, torch.float16, 'cpu', None)\n"
        "t = torch.tensor\n"
        "a.alloc_extend(t([0]), t([0]), t([3]), t([3]), t([-1]), 3)\n"
    )
    assert "mem_cache_kernels" in loaded
    assert not [m for m in loaded if m.split(".")[0] == "triton" or "_triton" in m]


def test_alloc_lazy_attributes() -> None:
    from mem_cache_allocator.hisparse import HiSparseTokenToKVPoolAllocator
    from mem_cache_allocator.mamba import MambaSlotAllocator
    from mem_cache_allocator.swa import SWATokenToKVPoolAllocator

    assert mem_cache_allocator.SWATokenToKVPoolAllocator is SWATokenToKVPoolAllocator
    assert mem_cache_allocator.MambaSlotAllocator is MambaSlotAllocator
    assert mem_cache_allocator.HiSparseTokenToKVPoolAllocator is HiSparseTokenToKVPoolAllocator
    assert "SWATokenToKVPoolAllocator" in dir(mem_cache_allocator)
    assert set(mem_cache_allocator.__all__) == {
        "AllocatorDebugError",
        "BaseTokenToKVPoolAllocator",
        "PagedTokenToKVPoolAllocator",
        "TokenToKVPoolAllocator",
    }
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = mem_cache_allocator.Nope
