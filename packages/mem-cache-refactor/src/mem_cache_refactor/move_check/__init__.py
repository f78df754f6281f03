"""Refactor-safety checker for moved definitions: ``move-check REF_A REF_B``.

See :mod:`mem_cache_refactor.move_check.core` for what is checked and the package README for
the workflow.
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
