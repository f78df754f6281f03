"""The benchmark aggregator ``python -m tools.bench`` (``python3 tools/dev bench``).

The full ``--quick`` run of every tool takes a few seconds in-process, so it runs here for real.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from tools import bench


def test_list_is_dry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results"
    assert bench.main(["--list", "--quick", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for b in bench.BENCHMARKS:
        assert f"python -m {b.module} --quick --json {out / (b.name + '.json')}" in text
    assert not out.exists()


def test_every_tool_exposes_main() -> None:
    for b in bench.BENCHMARKS:
        assert callable(importlib.import_module(b.module).main), b.module


def test_quick_runs_every_tool(tmp_path: Path) -> None:
    assert bench.main(["--quick", "--out", str(tmp_path), "--no-plots"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["quick"] is True
    assert set(summary["benchmarks"]) == {b.name for b in bench.BENCHMARKS}
    for name, entry in summary["benchmarks"].items():
        assert entry["ok"] and entry["exit_status"] == 0, name
        assert json.loads((tmp_path / f"{name}.json").read_text())
    assert summary["plots"] == []


def test_only_selects_and_rejects(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--only", "kernels,nope", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert not (tmp_path / "summary.json").exists()


def test_a_failing_tool_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a real module without main(): the aggregator must report it, not crash or pass
    broken = bench.Benchmark("broken", "tools.import_contracts", "has no main()")
    monkeypatch.setattr(bench, "BENCHMARKS", (broken,))
    assert bench.main(["--out", str(tmp_path), "--no-plots"]) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["benchmarks"]["broken"]["ok"] is False
    assert "FAILED: broken" in capsys.readouterr().out


def _write_synthetic(out: Path) -> None:
    kernels = {
        "transfers": [
            {"op": "transfer_rows", "pattern": p, "item_bytes": item, "gbps": g,
             "roofline_gbps": 10.0}
            for p in ("runs", "pages") for item, g in ((512, 1.0), (4096, 4.0))
        ],
        "alloc": [
            {"op": op, "backend": "torch", "batch": b, "ns_per_call": 1000.0 * b}
            for op in ("alloc_extend", "alloc_decode") for b in (1, 32)
        ],
    }
    host = {"rows": [
        {"direction": d, "layout": "page_first", "io_backend": "kernel", "pattern": "contiguous",
         "page_size": ps, "gbps": 1.0 + ps}
        for d in ("backup", "load") for ps in (1, 16, 64)
    ]}
    (out / "kernels.json").write_text(json.dumps(kernels))
    (out / "host.json").write_text(json.dumps(host))


def test_plots_when_matplotlib_is_installed(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    _write_synthetic(tmp_path)
    written = bench.plot_results(tmp_path)
    assert [p.name for p in written] == [
        "transfer_gbps_vs_item.png", "alloc_ns_vs_batch.png", "host_gbps_vs_page_size.png"
    ]
    assert all(p.stat().st_size > 1000 for p in written)


def test_no_plots_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def no_matplotlib(name: str, package: str | None = None) -> object:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, package)

    _write_synthetic(tmp_path)
    monkeypatch.setattr(importlib, "import_module", no_matplotlib)
    assert bench.plot_results(tmp_path) == []
    assert not list(tmp_path.glob("*.png"))
