"""Shim helper for the refactor tools that moved to the ``mem-cache-refactor`` distribution.

The old ``tools.*`` modules stay importable for one release: each access to a moved name emits
one ``DeprecationWarning`` naming the new module and returns the very same object, and
``python -m tools.<tool>`` still runs the tool (with a note on stderr naming the new command).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["deprecated_entry", "moved_module"]


def moved_module(old: str, new: str) -> Callable[[str], Any]:
    """A PEP 562 module ``__getattr__`` for ``old`` that forwards every public name to ``new``."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        target = importlib.import_module(new)
        try:
            value = getattr(target, name)
        except AttributeError:
            raise AttributeError(f"module {old!r} has no attribute {name!r}") from None
        warnings.warn(
            f"{old}.{name} moved to {new}.{name} (distribution mem-cache-refactor)",
            DeprecationWarning,
            stacklevel=2,
        )
        return value

    return __getattr__


def deprecated_entry(old: str, command: str, main: Callable[[list[str] | None], int]) -> int:
    """Run ``main`` for ``python -m old`` after a note that ``command`` replaces it."""
    print(
        f"note: `python -m {old}` is deprecated and will be removed after one release; "
        f"use `{command}` (pip install mem-cache-refactor)",
        file=sys.stderr,
    )
    return main(sys.argv[1:])
