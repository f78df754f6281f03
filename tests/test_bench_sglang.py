"""``python -m tools.bench.sglang``: ours / SGLang 0.5.23's own classes, smoke test at a tiny size.

No timing is asserted (the figures depend on the machine); what is asserted is that every
section runs both sides, checks them equal, and writes rows, JSON and the plot. Needs SGLang's
wheel (tools/sglang_ref): without it these tests fail with the how-to message, never skip.
"""

from __future__ import annotations

import json
import math
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from tools.bench import sglang as bench_sglang
from tools.bench import sglang_step as bench_sglang_step
from tools.bench import suite as bench
from tools.bench.sglang import make_row


def test_make_row_ratio_spread_and_verdicts() -> None:
    r = make_row("s", "n", [4.0, 6.0, 5.0], [10.0, 10.0, 10.0], goal=0.5)
    assert r.ratio == pytest.approx(0.5)
    assert r.ratio_min == pytest.approx(0.4)
    assert r.ratio_max == pytest.approx(0.6)
    assert r.spread == pytest.approx(0.4)
    assert r.verdict == "unsettled noise"  # the rounds fall on both sides of the goal
    assert make_row("s", "n", [2.0, 2.1], [10.0, 10.0], goal=0.5).verdict == "met"
    assert make_row("s", "n", [9.0, 9.1], [10.0, 10.0], goal=0.5).verdict == "MISS"
    one = make_row("s", "n", [1.0], [2.0])
    assert (one.spread, one.verdict, one.rounds) == (0.0, "", 1)
    with pytest.raises(ValueError, match="one value per round"):
        make_row("s", "n", [1.0], [1.0, 2.0])


def test_quick_run_writes_rows_json_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "sglang.json"
    argv = ["--quick", "--rounds", "2", "--requests", "12", "--page-sizes", "1,16",
            "--json", str(out)]
    assert bench_sglang.main(argv) == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    by = {(r["section"], r["name"]): r for r in rows}
    for ps in (1, 16):
        for sort in ("on", "off"):
            total = by[("allocator", f"ps={ps} sort={sort} TOTAL")]
            assert total["rounds"] == 2 and total["goal"] == 0.5
            assert math.isfinite(total["ratio"]) and total["ours_us"] > 0
            assert ("allocator", f"ps={ps} sort={sort} free p50") in by
    pool = [r for r in rows if r["section"] == "pool"]
    assert len(pool) == 9 and all(math.isfinite(r["ratio"]) for r in pool)
    assert {r["name"] for r in pool} >= {"set_kv_buffer decode bs=1", "set_kv_buffer decode bs=64"}
    step = [r for r in rows if r["section"] == "step"]
    assert step, "the radix-cache step section left no row"
    for r in step:  # measured, or an explicit reason (ours lacks members until they merge)
        assert r["ratio"] is not None or r["note"].startswith("not comparable yet: "), r
    methods = data["step_methods"]  # the step's per-method breakdown, from the same runs
    assert {m["page_size"] for m in methods} == {1, 16}
    assert {"req_to_token_pool.write", "allocator.alloc_extend"} <= {m["method"] for m in methods}
    assert all(m["calls_per_step"] > 0 and m["ours_us"] > 0 for m in methods)
    storage = [r for r in rows if r["section"] == "storage"]
    assert storage and all(
        r["ratio"] is not None or bench_sglang.STORAGE_HOOK in r["note"] for r in storage
    )
    assert data["machine"]["torch"] == torch.__version__
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not out.with_suffix(".png").exists()
    else:
        assert out.with_suffix(".png").stat().st_size > 0


def test_step_driver_runs_over_sglang_on_both_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    """The step machinery itself (SGLang's RadixCache + alloc_for_extend / alloc_for_decode /
    release_kv_cache, both sides checked equal every step), with SGLang's classes on both
    sides: it must run whatever our classes lack today."""
    real = bench_sglang_step._sides

    def both_sglang(sgl: types.SimpleNamespace, ps: int, cfg: Any) -> tuple[Any, Any]:
        theirs, _ = real(sgl, ps, cfg)
        again, _ = real(sgl, ps, cfg)
        return theirs, again

    monkeypatch.setattr(bench_sglang_step, "_sides", both_sglang)
    monkeypatch.setattr(bench_sglang_step, "missing_members", lambda *a: [])
    rows = bench_sglang.step_rows(True, 1, [1, 16])
    assert [r.name for r in rows] == [
        f"ps={ps} {what}" for ps in (1, 16) for what in (
            "memory layer per step", "memory layer per scheduled token",
            "inside allocator + req pool, per step")
    ]
    assert all(math.isfinite(r.ratio) and r.sglang_us > 0 for r in rows), rows
    assert rows[0].extra["steps"] > 1


def test_step_method_breakdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m tools.bench.sglang_step``: the step rows, then each method's calls per step
    and time per call on both sides (ours and SGLang's classes under SGLang's own step code);
    per method, time per step is calls per step x time per call, and the main methods of the
    allocator and the req pool that SGLang's step reaches appear."""
    out = tmp_path / "methods.json"
    assert bench_sglang_step.main(["--quick", "--rounds", "1", "--page-sizes", "16",
                                   "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    names = {r["method"] for r in rows}
    for needed in ("allocator.alloc_extend", "allocator.alloc_decode",
                   "req_to_token_pool.write", "req_to_token_pool.alloc"):
        assert needed in names, names
    for r in rows:
        assert r["page_size"] == 16 and r["calls_per_step"] > 0
        assert r["ours_us"] > 0 and r["sglang_us"] > 0
        assert math.isclose(r["ours_us_per_step"], r["ours_us"] * r["calls_per_step"])
    printed = capsys.readouterr().out
    assert "req_to_token_pool.write" in printed and "ps=16 memory layer per step" in printed


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--page-sizes", "x"],
                                  ["--page-sizes", "0"]])
def test_step_method_breakdown_rejects_bad_flags(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_sglang_step.main(argv)
    assert exc.value.code == 2
    flag = argv[0]
    assert flag in capsys.readouterr().err


def test_missing_members_names_each_member() -> None:
    missing = bench_sglang_step.missing_members(object(), object())
    assert "our object lacks member evict_to_free_tokens" in missing
    assert "our object lacks member alloc_aux_to_lengths" in missing


def test_if_available_skips_without_the_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_WHEEL_CACHE", str(tmp_path / "empty"))
    monkeypatch.delenv("SGLANG_WHEEL", raising=False)
    out = tmp_path / "sglang.json"
    assert bench_sglang.main(["--if-available", "--json", str(out)]) == 0
    assert "skipped" in json.loads(out.read_text())


def test_bench_against_sglang_selects_it_without_if_available(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["--list", "--against", "sglang", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "python -m tools.bench.sglang --json" in lines[0]
    assert "--if-available" not in lines[0]
    assert bench.main(["--list", "--out", str(tmp_path)]) == 0
    assert "tools.bench.sglang --json" in capsys.readouterr().out
