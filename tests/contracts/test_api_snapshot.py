"""The live public API of every package equals its committed snapshot (tests/contracts/api/).

On failure the message shows the diff; regenerate with ``api-snapshot update`` (``python -m
mem_cache_refactor.api_snapshot update``) and commit the JSON files together with the
API change (``packages/mem-cache-refactor/README.md``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_public_api_matches_committed_snapshots() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mem_cache_refactor.api_snapshot", "check"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(" matches ") >= 5, proc.stdout  # 4 runtime packages + refactor
