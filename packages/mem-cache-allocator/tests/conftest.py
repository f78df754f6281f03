"""The allocator tests' support modules (``_allocator_reference``, ``_hisparse_reference``) live
next to the tests, outside the shipped package: this directory goes on ``sys.path`` so the
tests import them by name (the tests here are not a package)."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
