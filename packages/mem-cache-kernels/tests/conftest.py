"""Fixtures for the mem_cache_kernels tests.

Triton decides between compiling and interpreting when ``@triton.jit`` *decorates* a kernel, i.e.
when a ``mem_cache_kernels._triton.<module>`` is imported (triton 3.x reads ``TRITON_INTERPRET``
through ``triton.knobs`` at decoration time; launching later does not re-read it). The
``triton_interpret`` fixture therefore sets ``TRITON_INTERPRET=1`` and drops the already imported
kernel modules, so the next ``triton_impl(...)`` call re-imports them as interpreted functions;
on teardown it restores the environment and drops them again, so code running later in the same
process (other packages' tests, GPU runs) never sees interpreted kernels.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator

import pytest
import torch

# Without a GPU, all Triton in this process runs interpreted (see tests/conftest.py at the
# repository root, which does the same for the default whole-repository run).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_PREFIX = "mem_cache_kernels._triton."


def _drop_kernel_modules() -> None:
    for name in [m for m in sys.modules if m.startswith(_PREFIX)]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def triton_interpret() -> Iterator[None]:
    """Run this module's Triton kernels in Triton's CPU interpreter."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        mp.delenv("MEM_CACHE_KERNELS_BACKEND", raising=False)
        _drop_kernel_modules()
        yield
    _drop_kernel_modules()


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
