"""The benchmark aggregator ``python -m tools.bench`` (``python3 tools/dev bench``).

The full ``--quick`` run of every tool takes a few seconds in-process, so it runs here for real.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from tools.bench import suite as bench


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
    broken = bench.Benchmark("broken", "tools.mooncake", "has no main()")
    monkeypatch.setattr(bench, "BENCHMARKS", (broken,))
    assert bench.main(["--out", str(tmp_path), "--no-plots"]) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["benchmarks"]["broken"]["ok"] is False
    assert "FAILED: broken" in capsys.readouterr().out


_HOST_COMBOS = (("layer_first", "kernel"), ("layer_first", "direct"), ("page_first", "kernel"),
                ("page_first_direct", "direct"))


def _write_synthetic(out: Path, *, storage: bool = False) -> None:
    kernels = {
        "transfers": [
            {"op": op, "pattern": p, "item_bytes": item, "gbps": g * (i + 1),
             "roofline_gbps": 10.0 + item / 512}
            for i, op in enumerate(("transfer_rows", "transfer_rows_all_layers", "direct_rows"))
            for p in ("runs", "pages", "tokens") for item, g in ((512, 1.0), (4096, 4.0))
        ],
        "alloc": [
            {"op": op, "backend": "torch", "batch": b, "ns_per_call": 1000.0 * b}
            for op in ("alloc_extend", "alloc_extend+hint", "alloc_decode", "alloc_decode+hint")
            for b in (1, 32)
        ],
    }
    # today's 16 host series: 4 layout/backends x 2 directions x 2 patterns, 3 page sizes
    host = {"rows": [
        {"direction": d, "layout": lay, "io_backend": io, "pattern": pat, "page_size": ps,
         "gbps": 1.0 + ps + i, "roofline_gbps": 100.0}
        for i, (lay, io) in enumerate(_HOST_COMBOS) for d in ("backup", "load")
        for pat in ("contiguous", "scattered") for ps in (1, 16, 64)
    ]}
    (out / "kernels.json").write_text(json.dumps(kernels))
    (out / "host.json").write_text(json.dumps(host))
    if storage:
        rows = [{"backend": be, "op": op, "page_size": ps, "batch": b, "gbps": 0.1 * b,
                 "memcpy_gbps": 5.0}
                for be in ("file", "mem") for op in ("set", "get") for ps in (16, 64)
                for b in (1, 32, 128)]
        (out / "storage.json").write_text(json.dumps({"rows": rows, "prefetch": []}))


def _check_panels(fig: Any, panels: int, series: int, *, reference: bool) -> None:
    """``panels`` visible axes, each with ``series`` data lines in distinct colours (and distinct
    from the reference), a black dashed memcpy reference line when ``reference``, one colour per
    series label across the figure."""
    from matplotlib.colors import to_hex

    from tools.bench.plots import MEMCPY_GID

    axes = [ax for ax in fig.get_axes() if ax.get_visible()]
    assert len(axes) == panels
    colour_of: dict[str, str] = {}
    for ax in axes:
        lines = ax.get_lines()
        refs = [ln for ln in lines if ln.get_gid() == MEMCPY_GID]
        data = [ln for ln in lines if ln.get_gid() != MEMCPY_GID]
        assert len(data) == series, ax.get_title()
        colours = [to_hex(ln.get_color()) for ln in data]
        assert len(set(colours)) == len(colours), (ax.get_title(), colours)
        for ln, c in zip(data, colours, strict=True):
            assert colour_of.setdefault(str(ln.get_label()), c) == c  # same series, same colour
        if reference:
            assert len(refs) == 1, ax.get_title()
            assert refs[0].get_linestyle() == "--"
            assert to_hex(refs[0].get_color()) not in colours
            assert len(refs[0].get_xdata()) >= 2
        else:
            assert refs == []


def test_plots_when_matplotlib_is_installed(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    _write_synthetic(tmp_path)
    written = bench.plot_results(tmp_path)
    assert [p.name for p in written] == [
        "transfer_gbps_vs_item.png", "alloc_ns_vs_batch.png", "host_gbps_vs_page_size.png"
    ]
    assert all(p.stat().st_size > 1000 for p in written)


def test_plot_panels_are_readable(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from tools.bench import plots as bench_plots

    _write_synthetic(tmp_path, storage=True)
    figs = dict(bench_plots.figures(tmp_path))
    try:
        assert list(figs) == ["transfer_gbps_vs_item.png", "alloc_ns_vs_batch.png",
                              "host_gbps_vs_page_size.png", "storage_gbps_vs_batch.png"]
        _check_panels(figs["transfer_gbps_vs_item.png"], 3, 3, reference=True)  # per pattern
        _check_panels(figs["alloc_ns_vs_batch.png"], 2, 2, reference=False)  # per op
        _check_panels(figs["host_gbps_vs_page_size.png"], 4, 4, reference=True)  # dir x pattern
        _check_panels(figs["storage_gbps_vs_batch.png"], 4, 2, reference=True)  # op x page size
        host_titles = [ax.get_title() for ax in figs["host_gbps_vs_page_size.png"].get_axes()]
        assert host_titles == ["backup / contiguous", "backup / scattered", "load / contiguous",
                               "load / scattered"]
    finally:
        for fig in figs.values():
            plt.close(fig)


def test_kernel_panels_split_by_direction_when_rows_carry_one(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from tools.bench import plots as bench_plots

    rows = [{"op": f"{d}_op", "direction": d, "pattern": p, "item_bytes": item, "gbps": 1.0,
             "roofline_gbps": 2.0} for d in ("d2h", "h2d") for p in ("runs", "tokens")
            for item in (512, 4096)]
    (tmp_path / "kernels.json").write_text(json.dumps({"transfers": rows}))
    figs = bench_plots.figures(tmp_path)
    try:
        assert [name for name, _ in figs] == ["transfer_gbps_vs_item.png"]
        _check_panels(figs[0][1], 4, 1, reference=True)
    finally:
        for _, fig in figs:
            plt.close(fig)


def test_malformed_or_missing_inputs_skip_their_figure(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    (tmp_path / "kernels.json").write_text("[not json")
    (tmp_path / "host.json").write_text(json.dumps({"rows": [{"direction": "backup"}]}))
    assert bench.plot_results(tmp_path) == []
    assert not list(tmp_path.glob("*.png"))


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


def test_allocator_ratio_and_prefetch_are_plotted(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from tools.bench import plots as bench_plots

    results = [{"page_size": ps, "total_ratio": 0.4, "median_total_ratio": 0.6,
                "ops": {op: {"ours": {"mean_us": 2.0}, "baseline": {"mean_us": 4.0 + i}}
                        for i, op in enumerate(("alloc_extend", "alloc_decode", "free"))}}
               for ps in (1, 16, 64)]
    (tmp_path / "allocator.json").write_text(json.dumps({"results": results}))
    prefetch = [{"backend": be, "page_size": ps, "pages": 32, "gbps": 0.1 * ps,
                 "memcpy_gbps": 20.0} for be in ("file", "memory", "mooncake") for ps in (16, 64)]
    (tmp_path / "storage.json").write_text(json.dumps({"rows": [], "prefetch": prefetch}))
    figs = dict(bench_plots.figures(tmp_path))
    try:
        assert list(figs) == ["storage_prefetch_gbps.png", "allocator_vs_baseline.png"]
        _check_panels(figs["storage_prefetch_gbps.png"], 1, 3, reference=True)
        alloc = figs["allocator_vs_baseline.png"]
        whole, per_op = alloc.get_axes()[:2]
        assert whole.get_title().startswith("whole trace")
        [target] = [ln for ln in whole.get_lines() if ln.get_gid() == bench_plots.MEMCPY_GID]
        assert set(target.get_ydata()) == {0.5}
        assert sorted(str(ln.get_label()) for ln in per_op.get_lines()) == \
            ["alloc_decode", "alloc_extend", "free"]
        free = next(ln for ln in per_op.get_lines() if ln.get_label() == "free")
        assert list(free.get_ydata()) == [2.0 / 6.0] * 3  # ours mean / baseline mean
        alloc.canvas.draw()
        for ax in alloc.get_axes()[:2]:  # plain tick labels, no mathtext like 2x10^1
            labels = [t.get_text() for t in ax.get_yticklabels() + ax.get_xticklabels()]
            assert labels and not [t for t in labels if "$" in t or "times" in t], labels
    finally:
        for fig in figs.values():
            plt.close(fig)


def test_many_series_keep_distinct_styles() -> None:
    mpl = pytest.importorskip("matplotlib")
    from matplotlib.colors import to_hex

    from tools.bench import plots as bench_plots

    styles = bench_plots._styles(mpl, 24)
    keys = [(to_hex(c), ls, m) for c, ls, m in styles]
    assert len(set(keys)) == 24
    assert len({to_hex(c) for c, _, _ in styles}) == 10  # tab10 only: no light/dark pairs
    for i in range(24):  # a repeated colour never repeats its line style
        for j in range(i + 1, 24):
            if keys[i][0] == keys[j][0]:
                assert keys[i][1] != keys[j][1]
