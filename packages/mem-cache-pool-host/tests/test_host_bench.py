"""Smoke test of tools/bench/host.py (--quick): runs, prints the table, writes the JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_bench_host_quick_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench.host", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "memcpy" in proc.stdout
    data = json.loads(out.read_text())
    rows = data["rows"]
    # 3 page sizes x 4 layout/backend combos x 2 patterns x 2 directions
    assert len(rows) == 48
    assert {r["layout"] for r in rows} == {"layer_first", "page_first", "page_first_direct"}
    assert {r["page_size"] for r in rows} == {1, 16, 64}
    assert all(r["gbps"] > 0 and r["roofline_gbps"] > 0 for r in rows)
