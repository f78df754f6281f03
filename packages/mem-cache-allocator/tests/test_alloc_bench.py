"""Smoke test of tools/bench/allocator.py (--quick): it runs, agrees slot-for-slot, writes JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.bench import allocator as bench_allocator


def test_alloc_bench_quick_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    assert bench_allocator.main(["--quick", "--json", str(out), "--page-sizes", "1,16"]) == 0
    data = json.loads(out.read_text())
    assert [r["page_size"] for r in data["results"]] == [1, 16]
    ops = data["results"][1]["ops"]
    for op in ("alloc_extend", "alloc_decode", "free_group_end", "step"):
        assert ops[op]["ours"]["calls"] > 0 and ops[op]["baseline"]["calls"] > 0
    assert data["results"][1]["total_ratio"] > 0 and "median_total_ratio" in data["results"][1]
    assert data["free_api"] == "free"
    assert "speedup" in capsys.readouterr().out


def test_alloc_bench_segments_mode_agrees_slot_for_slot(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = ["--quick", "--free-api", "segments", "--json", str(out), "--page-sizes", "16"]
    assert bench_allocator.main(argv) == 0
    assert json.loads(out.read_text())["free_api"] == "segments"


def test_alloc_bench_baseline_matches_worked_example() -> None:
    import torch

    a = bench_allocator.NaiveAllocator(64, 4)
    assert a.alloc(8) is not None
    t = torch.tensor
    out = a.alloc_extend(t([2]), t([2]), t([11]), t([11]), t([1]), 9)
    assert out is not None and out.tolist() == [2, 3, 12, 13, 14, 15, 16, 17, 18]
