"""``python -m tools.move_check REF_A REF_B [--json] [--allow-edit NAME ...] [--root PATH]``."""

from __future__ import annotations

import sys

from mem_cache_refactor.move_check.core import main

if __name__ == "__main__":
    sys.exit(main())
