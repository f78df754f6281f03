"""Refactor-safety checker for moved definitions: ``python -m tools.move_check REF_A REF_B``.

See :mod:`tools.move_check.core` for what is checked and ``tools/REFACTORING.md`` for the workflow.
"""

from __future__ import annotations

from mem_cache_refactor.move_check.core import (
    ContractReport,
    MoveReport,
    Report,
    check,
    main,
    render_text,
)

__all__ = ["ContractReport", "MoveReport", "Report", "check", "main", "render_text"]
