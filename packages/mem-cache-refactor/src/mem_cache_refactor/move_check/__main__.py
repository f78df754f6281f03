"""``python -m mem_cache_refactor.move_check REF_A REF_B ...``: the same as ``move-check``."""

from __future__ import annotations

import sys

from mem_cache_refactor.move_check.core import main

if __name__ == "__main__":
    sys.exit(main())
