"""Moved to :mod:`mem_cache_refactor.move_check.core` (shim for one release)."""

from __future__ import annotations

from tools.move_check._shim import moved_module

__getattr__ = moved_module(__name__, "mem_cache_refactor.move_check.core")
