"""Moved to :mod:`mem_cache_refactor.move_check` (console script ``move-check``).

This shim keeps ``tools.move_check`` importable and ``python -m tools.move_check`` working for one
release; see ``packages/mem-cache-refactor/README.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tools.move_check._shim import moved_module

if TYPE_CHECKING:
    from mem_cache_refactor.move_check import ContractReport as ContractReport
    from mem_cache_refactor.move_check import MoveReport as MoveReport
    from mem_cache_refactor.move_check import Report as Report
    from mem_cache_refactor.move_check import check as check
    from mem_cache_refactor.move_check import main as main
    from mem_cache_refactor.move_check import render_text as render_text
else:
    __getattr__ = moved_module(__name__, "mem_cache_refactor.move_check")
