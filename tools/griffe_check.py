"""Moved to :mod:`mem_cache_refactor.griffe_check`
(console script ``griffe-check``).

This shim keeps ``tools.griffe_check`` importable and ``python -m tools.griffe_check`` working
for one release; see ``packages/mem-cache-refactor/README.md``.
"""

from __future__ import annotations

import sys

from tools.move_check._shim import deprecated_entry, moved_module

__getattr__ = moved_module(__name__, "mem_cache_refactor.griffe_check")

if __name__ == "__main__":
    from mem_cache_refactor.griffe_check import main

    sys.exit(deprecated_entry("tools.griffe_check", "griffe-check", main))
