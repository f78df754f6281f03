"""The loader imports SGLang's real modules and stands in only for what SGLang imports itself."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable

import pytest

from tools.sglang_ref import STUBBED_INTERNAL, stubbed_externals


def test_sglang_modules_are_the_wheels(sglang_load: Callable[..., list[types.ModuleType]]) -> None:
    (mp,) = sglang_load("sglang.srt.mem_cache.memory_pool")
    assert ".cache" in (mp.__file__ or "") or "sglang-0.5.23" in (mp.__file__ or "")
    assert hasattr(mp, "MHATokenToKVPool")
    for name in STUBBED_INTERNAL:
        assert name not in stubbed_externals()


def test_a_missing_package_is_stood_in_for_only_for_sglang(
        sglang_load: Callable[..., list[types.ModuleType]]) -> None:
    sglang_load("sglang.srt.mem_cache.allocator")
    assert "sgl_kernel" not in sys.modules or "sgl_kernel" in stubbed_externals()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("a_package_nobody_installed")


def test_names_outside_sglang_are_refused(
        sglang_load: Callable[..., list[types.ModuleType]]) -> None:
    with pytest.raises(ValueError, match=r"under 'sglang\.'"):
        sglang_load("os.path")
