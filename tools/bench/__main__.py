"""``python -m tools.bench``: every benchmark, see :mod:`tools.bench.suite`."""

from __future__ import annotations

import sys

from tools.bench.suite import main

if __name__ == "__main__":
    sys.exit(main())
