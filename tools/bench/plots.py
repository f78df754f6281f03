"""Plots of the benchmark JSON written by :mod:`tools.bench` (``python3 tools/dev bench``).

Every figure is a grid of panels, one per access pattern (and per direction where the JSON
carries one), so no panel holds more series than a reader can tell apart:

* ``transfer_gbps_vs_item.png`` (``kernels.json``): kernel transfer GB/s against item (row)
  size, one panel per index pattern (``runs``/``pages``/``tokens``; split per direction too when
  the rows carry a ``direction``), one series per op;
* ``host_gbps_vs_page_size.png`` (``host.json``): host pool GB/s against page size, one panel per
  direction x pattern (backup/load x contiguous/scattered), one series per layout/io backend;
* ``alloc_ns_vs_batch.png`` (``kernels.json``): allocation kernel ns per call against batch size,
  one panel per op, one series per backend (``+hint`` variants included);
* ``storage_gbps_vs_batch.png`` (``storage.json``, when that benchmark ran): L3 set/get GB/s
  against pages per call, one panel per op x page size, one series per storage backend;
* ``storage_prefetch_gbps.png`` (``storage.json``'s ``prefetch`` rows): the controller's
  prefetch (lookup + reserve + background get + hand-off) GB/s against page size, one series per
  backend;
* ``allocator_vs_baseline.png`` (``allocator.json``): the headline, allocator time ours /
  SGLang-like baseline against page size (lower is better): the whole trace (sum of calls and
  per-op median x calls) against the 0.5 target, and per op (mean per call).

Each GB/s panel draws the memcpy measured in the same run as a black dashed line labelled
``memcpy`` (gid ``"memcpy"``; the allocator figure's reference is its target). A series keeps
its style in every panel of a figure: a colour of the qualitative tab10 palette, and beyond ten
series the same ten colours again with another line style and marker, so no two series of a
figure share a style and no two colours are shades of one another (tab20's pairs are not used).
Axes are logarithmic with plain tick labels (``0.5``, ``16``, ``1024``, never ``2x10^1``).
Missing or malformed inputs skip their figure; without matplotlib nothing is drawn.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MEMCPY_GID", "Panel", "figures", "plot_results"]

MEMCPY_GID = "memcpy"
"""``gid`` of the memcpy reference line in every GB/s panel."""

Points = list[tuple[float, float]]


@dataclass(slots=True)
class Panel:
    """One subplot: ``series`` label -> points, plus the optional memcpy reference points."""

    title: str
    series: dict[str, Points] = field(default_factory=dict)
    reference: Points = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Figure:
    filename: str
    title: str
    xlabel: str
    ylabel: str
    panels: tuple[Panel, ...]
    ncols: int
    reference_label: str = "memcpy (same run)"


def _load(path: Path) -> dict[str, Any] | None:
    try:
        with path.open(encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _rows(data: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    rows = (data or {}).get(key, [])
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _group(
    rows: Iterable[dict[str, Any]],
    panel_key: Callable[[dict[str, Any]], tuple[str, ...]],
    series_key: Callable[[dict[str, Any]], str],
    *,
    x: str,
    y: str,
    ref: str | None,
) -> dict[tuple[str, ...], Panel]:
    """Panels keyed by ``panel_key``; the reference is the median ``ref`` per x in that panel."""
    panels: dict[tuple[str, ...], Panel] = {}
    refs: dict[tuple[str, ...], dict[float, list[float]]] = {}
    for row in rows:
        try:
            pkey, label = panel_key(row), series_key(row)
            px, py = float(row[x]), float(row[y])
            pref = float(row[ref]) if ref is not None else None
        except (KeyError, TypeError, ValueError):
            continue  # a malformed row skips itself, not the figure
        panel = panels.setdefault(pkey, Panel(" / ".join(pkey)))
        panel.series.setdefault(label, []).append((px, py))
        if pref is not None:
            refs.setdefault(pkey, {}).setdefault(px, []).append(pref)
    for pkey, by_x in refs.items():
        panels[pkey].reference = sorted((px, _median(v)) for px, v in by_x.items())
    return panels


def _ordered(panels: dict[tuple[str, ...], Panel], order: Sequence[Sequence[str]]) -> list[Panel]:
    """Panels sorted by a known order per key position (unknown values after, alphabetically)."""

    def rank(key: tuple[str, ...]) -> tuple[tuple[int, str], ...]:
        out = []
        for i, part in enumerate(key):
            known = list(order[i]) if i < len(order) else []
            out.append((known.index(part) if part in known else len(known), part))
        return tuple(out)

    return [panels[k] for k in sorted(panels, key=rank)]


def _kernels_transfers(data: dict[str, Any] | None) -> _Figure | None:
    rows = _rows(data, "transfers")
    split = any("direction" in r for r in rows)
    panels = _group(
        rows,
        lambda r: (str(r["direction"]), str(r["pattern"])) if split else (str(r["pattern"]),),
        lambda r: str(r["op"]),
        x="item_bytes", y="gbps", ref="roofline_gbps",
    )
    patterns = ("runs", "pages", "tokens")
    order = (("d2h", "h2d"), patterns) if split else (patterns,)
    ordered = _ordered(panels, order)
    ncols = len({p.title.split(" / ")[-1] for p in ordered}) if ordered else 1
    what = "direction and index pattern" if split else "index pattern"
    return _Figure("transfer_gbps_vs_item.png", f"KV transfer kernels: GB/s per {what}",
                   "item size (bytes)", "GB/s", tuple(ordered), ncols) if ordered else None


def _kernels_alloc(data: dict[str, Any] | None) -> _Figure | None:
    panels = _group(_rows(data, "alloc"), lambda r: (str(r["op"]).split("+")[0],),
                    lambda r: f"{r['backend']}{'+hint' if '+hint' in str(r['op']) else ''}",
                    x="batch", y="ns_per_call", ref=None)
    ordered = _ordered(panels, (("alloc_extend", "alloc_decode"),))
    return _Figure("alloc_ns_vs_batch.png", "allocation kernels: ns per call",
                   "batch size (requests)", "ns per call", tuple(ordered),
                   len(ordered)) if ordered else None


def _host(data: dict[str, Any] | None) -> _Figure | None:
    panels = _group(_rows(data, "rows"), lambda r: (str(r["direction"]), str(r["pattern"])),
                    lambda r: f"{r['layout']}/{r['io_backend']}", x="page_size", y="gbps",
                    ref="roofline_gbps")
    ordered = _ordered(panels, (("backup", "load"), ("contiguous", "scattered")))
    ncols = len({p.title.split(" / ")[-1] for p in ordered}) if ordered else 1
    if not ordered:
        return None
    return _Figure("host_gbps_vs_page_size.png", "host pool transfers: GB/s per direction and "
                   "pattern", "page size (tokens)", "GB/s", tuple(ordered), ncols)


def _storage(data: dict[str, Any] | None) -> _Figure | None:
    panels = _group(_rows(data, "rows"), lambda r: (str(r["op"]), f"page size {r['page_size']}"),
                    lambda r: str(r["backend"]), x="batch", y="gbps", ref="memcpy_gbps")
    ordered = _ordered(panels, (("set", "get"),))
    ncols = len({p.title.split(" / ")[-1] for p in ordered}) if ordered else 1
    return _Figure("storage_gbps_vs_batch.png", "storage tier (L3): GB/s per op and page size",
                   "pages per call", "GB/s", tuple(ordered), ncols) if ordered else None


def _storage_prefetch(data: dict[str, Any] | None) -> _Figure | None:
    rows = _rows(data, "prefetch")
    panels = _group(rows, lambda r: (f"{r.get('pages', '?')} pages per prefetch",),
                    lambda r: str(r["backend"]), x="page_size", y="gbps", ref="memcpy_gbps")
    ordered = _ordered(panels, ())
    return _Figure("storage_prefetch_gbps.png", "storage tier (L3): controller prefetch GB/s",
                   "page size (tokens)", "GB/s", tuple(ordered), len(ordered)) \
        if ordered else None


ALLOC_TARGET = 0.5
"""The allocator's headline target: whole-trace time ours / baseline at most this."""


def _allocator(data: dict[str, Any] | None) -> _Figure | None:
    total = Panel("whole trace (target <= 0.5)")
    per_op = Panel("per op (mean per call)")
    for res in _rows(data, "results"):
        try:
            ps = float(res["page_size"])
            total.series.setdefault("sum of calls", []).append((ps, float(res["total_ratio"])))
            total.series.setdefault("per-op median x calls", []).append(
                (ps, float(res["median_total_ratio"])))
            for op, row in res["ops"].items():
                ratio = float(row["ours"]["mean_us"]) / float(row["baseline"]["mean_us"])
                per_op.series.setdefault(str(op), []).append((ps, ratio))
        except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError):
            continue
        total.reference.append((ps, ALLOC_TARGET))
    total.reference.sort()
    panels = tuple(p for p in (total, per_op) if p.series)
    if not panels:
        return None
    return _Figure("allocator_vs_baseline.png", "allocator time, ours / SGLang-like baseline "
                   "(lower is better)", "page size (tokens)", "ours / baseline", panels,
                   len(panels), reference_label=f"target {ALLOC_TARGET:g}")


_LINESTYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def _palette(mpl: Any, n: int) -> list[Any]:
    """``n`` colours from tab10, repeating after ten (``_styles`` varies the line then)."""
    colours = list(mpl.colormaps["tab10"].colors)
    return [colours[i % len(colours)] for i in range(n)]


def _styles(mpl: Any, n: int) -> list[tuple[Any, str, str]]:
    """``n`` distinct (colour, line style, marker): tab10 colours, a new line style per ten."""
    colours = _palette(mpl, n)
    return [(colours[i], _LINESTYLES[(i // 10) % len(_LINESTYLES)],
             _MARKERS[(i + i // 10) % len(_MARKERS)]) for i in range(n)]


def _plain_log_axes(ax: Any) -> None:
    """Log axes with plain tick labels at 1, 2, 5 x 10^k (no ``2x10^1`` minor labels)."""
    from matplotlib import ticker

    plain = ticker.FuncFormatter(lambda v, _pos: f"{v:g}")
    ax.xaxis.set_major_locator(ticker.LogLocator(base=2))
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(ticker.NullFormatter())


def _draw(mpl: Any, plt: Any, spec: _Figure) -> Any:
    labels = sorted({label for p in spec.panels for label in p.series})
    styles = dict(zip(labels, _styles(mpl, len(labels)), strict=True))
    nrows = -(-len(spec.panels) // spec.ncols)
    fig, axes = plt.subplots(nrows, spec.ncols, figsize=(4.6 * spec.ncols + 2.4, 3.6 * nrows),
                             sharex=True, sharey=True, squeeze=False)
    flat = [ax for row in axes for ax in row]
    handles: dict[str, Any] = {}
    reference: Any = None
    for ax, panel in zip(flat, spec.panels, strict=False):
        for label in sorted(panel.series):
            pts = sorted(panel.series[label])
            colour, linestyle, marker = styles[label]
            (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker,
                              markersize=5, linewidth=1.6, color=colour, linestyle=linestyle,
                              label=label)
            handles.setdefault(label, line)
        if panel.reference:
            (ref,) = ax.plot([p[0] for p in panel.reference], [p[1] for p in panel.reference],
                             color="black", linestyle="--", linewidth=2,
                             label=spec.reference_label, gid=MEMCPY_GID, zorder=1)
            reference = reference or ref
        ax.set_title(panel.title, fontsize="medium")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _plain_log_axes(ax)
        ax.grid(True, which="both", alpha=0.3)
    for ax in flat[len(spec.panels):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel(spec.xlabel)
    for row in axes:
        row[0].set_ylabel(spec.ylabel)
    fig.suptitle(spec.title)
    handles = {label: handles[label] for label in labels}  # legend: series sorted, memcpy last
    if reference is not None:
        handles[spec.reference_label] = reference
    fig.legend(list(handles.values()), list(handles), loc="center left",
               bbox_to_anchor=(1.0, 0.5), fontsize="small", frameon=False)
    fig.tight_layout()
    return fig


def _matplotlib() -> tuple[Any, Any] | None:
    try:  # optional dependency, imported by name so type checking does not need its stubs
        mpl = importlib.import_module("matplotlib")
        mpl.use("Agg")
        return mpl, importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return None


def figures(out: Path) -> list[tuple[str, Any]]:
    """``(filename, matplotlib Figure)`` for every figure the JSON under ``out`` supports.

    Returns ``[]`` without matplotlib. The caller owns the figures (``plt.close`` them).
    """
    libs = _matplotlib()
    if libs is None:
        return []
    mpl, plt = libs
    kernels = _load(out / "kernels.json")
    storage = _load(out / "storage.json")
    specs = (_kernels_transfers(kernels), _kernels_alloc(kernels),
             _host(_load(out / "host.json")), _storage(storage), _storage_prefetch(storage),
             _allocator(_load(out / "allocator.json")))
    return [(spec.filename, _draw(mpl, plt, spec)) for spec in specs if spec is not None]


def plot_results(out: Path) -> list[Path]:
    """Draw the figures from the JSON files under ``out``; returns the PNGs written."""
    libs = _matplotlib()
    if libs is None:
        return []
    plt = libs[1]
    written: list[Path] = []
    for name, fig in figures(out):
        target = out / name
        fig.savefig(target, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(target)
    return written
