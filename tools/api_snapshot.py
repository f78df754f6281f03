"""Moved to :mod:`mem_cache_refactor.api_snapshot`
(console script ``api-snapshot``).

This shim keeps ``tools.api_snapshot`` importable and ``python -m tools.api_snapshot`` working
for one release; see ``packages/mem-cache-refactor/README.md``.
"""

from __future__ import annotations

import sys

from tools.move_check._shim import deprecated_entry, moved_module

__getattr__ = moved_module(__name__, "mem_cache_refactor.api_snapshot")

if __name__ == "__main__":
    from mem_cache_refactor.api_snapshot import main

    sys.exit(deprecated_entry("tools.api_snapshot", "api-snapshot", main))
