"""Fixtures for the mem_cache_kernels tests.

Triton decides between compiling and interpreting when ``@triton.jit`` *decorates* a kernel, i.e.
when a ``mem_cache_kernels._triton.<module>`` is imported (triton 3.x reads ``TRITON_INTERPRET``
through ``triton.knobs`` at decoration time; launching later does not re-read it), and the
interpreter patches ``triton.language`` process-wide. So one mode holds for the whole session: on a
machine without a GPU this conftest (and tests/conftest.py for the whole-repository run) sets
``TRITON_INTERPRET=1`` before any kernel module is imported. ``triton_interpret`` marks the test
modules that launch Triton kernels (skipped when triton is not installed).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest
import torch

# Without a GPU, all Triton in this process runs interpreted (see tests/conftest.py at the
# repository root, which does the same for the default whole-repository run).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def triton_interpret() -> Iterator[None]:
    """Run this module's Triton kernels in Triton's CPU interpreter."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        mp.delenv("MEM_CACHE_KERNELS_BACKEND", raising=False)
        yield


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
