"""SGLang-in-the-loop tests: SGLang 0.5.23's own modules, loaded from its wheel, run over ours.

The wheel is fetched on first use into .cache/sglang/ (tools/sglang_ref). When it cannot be had
the tests *fail* with the message that says how to get it: they never skip.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import pytest

from tools.sglang_ref import WheelUnavailable, load


@pytest.fixture(scope="session")
def sglang_load() -> Callable[..., list[types.ModuleType]]:
    """``sglang_load("sglang.srt.mem_cache.radix_cache", ...)`` -> the modules, or a failure."""

    def _load(*names: str) -> list[types.ModuleType]:
        try:
            return load(*names)
        except WheelUnavailable as exc:
            pytest.fail(str(exc), pytrace=False)

    return _load
