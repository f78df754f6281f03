"""Moved to :mod:`mem_cache_refactor.contracts` (shim for one release).

Register the contract types in ``.importlinter`` as
``eager_forbidden: mem_cache_refactor.contracts.EagerForbiddenContract``.
"""

from __future__ import annotations

from tools.move_check._shim import moved_module

__getattr__ = moved_module(__name__, "mem_cache_refactor.contracts")
