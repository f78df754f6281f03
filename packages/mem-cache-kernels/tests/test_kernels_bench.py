"""Smoke test of tools/bench/kernels.py (--quick): it runs every op, prints and writes JSON."""

from __future__ import annotations

import json
from pathlib import Path

import mem_cache_kernels as mk
from tools.bench import kernels as bench_kernels


def test_bench_kernels_quick_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    assert bench_kernels.main(["--quick", "--json", str(out), "--threads", "0"]) == 0
    data = json.loads(out.read_text())
    ops = {row["op"] for row in data["transfers"]}
    transfer_ops = {op.name for op in mk.list_ops() if op.family in ("transfer", "direct")}
    assert ops == transfer_ops
    assert {row["pattern"] for row in data["transfers"]} == {"runs", "pages", "tokens"}
    assert all(row["gbps"] > 0 and row["ratio"] > 0 for row in data["transfers"])
    alloc_ops = ("alloc_extend", "alloc_extend+hint", "alloc_decode", "alloc_decode+hint")
    assert {(a["op"], a["batch"]) for a in data["alloc"]} == {
        (op, bs) for op in alloc_ops for bs in (1, 32)
    }


def test_bench_kernels_alloc_only(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    assert bench_kernels.main(["--quick", "--only", "alloc", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["transfers"] == [] and len(data["alloc"]) == 8
