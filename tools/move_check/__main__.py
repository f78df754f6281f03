"""``python -m tools.move_check``: deprecated spelling of ``move-check`` (one more release)."""

from __future__ import annotations

import sys

from mem_cache_refactor.move_check.core import main
from tools.move_check._shim import deprecated_entry

if __name__ == "__main__":
    sys.exit(deprecated_entry("tools.move_check", "move-check", main))
