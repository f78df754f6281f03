"""Fixtures of the bad-input suite (the session-wide interpreter switch is in tests/conftest.py)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def triton_interpret() -> Iterator[None]:
    """Run Triton kernels in the interpreter on CPU tensors (skip without triton or with a GPU,
    where the session compiles kernels instead)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    if torch.cuda.is_available():
        pytest.skip("a GPU session compiles Triton kernels; the interpreter needs CPU-only runs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        mp.delenv("MEM_CACHE_KERNELS_BACKEND", raising=False)
        yield
