"""Moved to :mod:`mem_cache_refactor.rewrite_imports`
(console script ``rewrite-imports``).

This shim keeps ``tools.rewrite_imports`` importable and ``python -m tools.rewrite_imports`` working
for one release; see ``packages/mem-cache-refactor/README.md``.
"""

from __future__ import annotations

import sys

from tools.move_check._shim import deprecated_entry, moved_module

__getattr__ = moved_module(__name__, "mem_cache_refactor.rewrite_imports")

if __name__ == "__main__":
    from mem_cache_refactor.rewrite_imports import main

    sys.exit(deprecated_entry("tools.rewrite_imports", "rewrite-imports", main))
