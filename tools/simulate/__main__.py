"""``python -m tools.simulate`` (``python3 tools/dev run``): the serving-workload simulator."""

from __future__ import annotations

import sys

from tools.simulate.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
