"""All benchmarks behind one entry: ``python -m tools.bench`` (``python3 tools/dev bench``).

Runs every benchmark tool of the repository in this process (each exposes
``main(argv) -> int`` with ``--quick`` and ``--json PATH``), writes each one's JSON to
``<out>/<name>.json`` plus ``<out>/summary.json`` (exit status and wall time per tool), and, when
matplotlib is importable, the plots of :mod:`tools.bench.plots` (one panel per direction and
access pattern, the same-run memcpy as a dashed reference line).

Usage: ``python -m tools.bench [--quick] [--only NAME[,NAME]] [--against sglang] [--out DIR]
[--list] [--no-plots]``. ``--against sglang`` runs only :mod:`tools.bench.sglang` (ours / SGLang
0.5.23's own classes, fetching the wheel when missing); the default run includes it when the
wheel is already on disk. ``--list`` prints what would run without running anything. Exit
status: 0 when every selected tool returned 0.
"""

from __future__ import annotations

import importlib
import json
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.bench.plots import plot_results
from tools.cli import OneLineParser
from tools.simulate.logs import filtered_stderr, quiet_third_party_logs

__all__ = ["BENCHMARKS", "Benchmark", "main", "plot_results"]


@dataclass(frozen=True, slots=True)
class Benchmark:
    """One benchmark tool: ``module.main(argv) -> int`` writes its JSON to ``--json PATH``."""

    name: str
    module: str
    what: str
    default_argv: tuple[str, ...] = ()  # passed in the default run, not with --against


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("kernels", "tools.bench.kernels", "KV transfer GB/s vs memcpy, allocation kernels"),
    Benchmark("allocator", "tools.bench.allocator", "allocator trace vs SGLang-like baseline"),
    Benchmark("host", "tools.bench.host", "host pool backup/load GB/s per layout and backend"),
    Benchmark("storage", "tools.bench.storage", "L3 backends set/get vs memcpy, prefetch"),
    # in the default run only when SGLang's wheel is already on disk (--if-available)
    Benchmark("sglang", "tools.bench.sglang", "ours / SGLang 0.5.23's own classes, same run",
              ("--if-available",)),
)
AGAINST = {"sglang": "sglang"}  # --against NAME: run only that comparison, wheel required

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "bench-results"


def _select(only: str | None) -> list[Benchmark]:
    if not only:
        return list(BENCHMARKS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = {b.name: b for b in BENCHMARKS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"--only must name benchmarks among {sorted(known)}, got {unknown}")
    return [known[n] for n in names]


def _run_one(bench: Benchmark, argv: list[str]) -> int:
    """Import and run one tool; any exception or ``SystemExit`` becomes an exit status."""
    try:
        module = importlib.import_module(bench.module)
        entry: Callable[[list[str] | None], int] = module.main
        return int(entry(argv))
    except SystemExit as exc:  # argparse errors and explicit exits
        code = exc.code
        return code if isinstance(code, int) else 1
    except Exception:
        traceback.print_exc()
        return 1


def _load(path: Path) -> dict[str, Any] | None:
    try:
        with path.open(encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _run_all(selected: list[Benchmark], out: Path, quick: bool,
             tool_argv: Callable[[Benchmark], list[str]]) -> tuple[dict[str, Any], list[str]]:
    """Run every selected tool; the summary (per tool) and the names of the failed ones."""
    summary: dict[str, Any] = {"quick": quick, "benchmarks": {}}
    failed: list[str] = []
    for b in selected:
        path = out / f"{b.name}.json"
        print(f"\n=== {b.name}: {b.module} ({b.what})", flush=True)
        t0 = time.perf_counter()
        rc = _run_one(b, tool_argv(b))
        seconds = time.perf_counter() - t0
        ok = rc == 0 and _load(path) is not None
        summary["benchmarks"][b.name] = {
            "module": b.module, "exit_status": rc, "seconds": round(seconds, 3),
            "json": str(path), "ok": ok,
        }
        if not ok:
            failed.append(b.name)
    return summary, failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m tools.bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, passed to every tool")
    parser.add_argument("--only", metavar="NAMES", help="comma-separated subset of: "
                        + ", ".join(b.name for b in BENCHMARKS))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"result folder (default {DEFAULT_OUT}/)")
    parser.add_argument("--list", action="store_true", help="print what would run, run nothing")
    parser.add_argument("--no-plots", action="store_true", help="skip the matplotlib plots")
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party logs (the Mooncake client's glog lines)")
    parser.add_argument("--against", choices=sorted(AGAINST),
                        help="only the side-by-side comparison with that project's own classes "
                        "(fetches SGLang's wheel when missing)")
    args = parser.parse_args(None if argv is None else list(argv))
    try:
        selected = _select(AGAINST[args.against] if args.against else args.only)
    except ValueError as exc:
        parser.error(str(exc))
    out: Path = args.out

    def tool_argv(b: Benchmark) -> list[str]:
        return [*(["--quick"] if args.quick else []), "--json", str(out / f"{b.name}.json"),
                *(() if args.against else b.default_argv)]

    if args.list:
        for b in selected:
            cmd = ["python", "-m", b.module, *tool_argv(b)]
            print(f"{b.name:<10} {' '.join(cmd):<70} {b.what}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    quiet_third_party_logs(args.verbose)
    with filtered_stderr(args.verbose) as hidden:
        summary, failed = _run_all(selected, out, args.quick, tool_argv)
    summary["third_party_log_lines_hidden"] = hidden.dropped
    if hidden.dropped:
        print(f"{hidden.dropped} third-party log lines hidden (--verbose shows them)")
    plots = [] if args.no_plots else plot_results(out)
    summary["plots"] = [str(p) for p in plots]
    with (out / "summary.json").open("w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2)
    print(f"\nresults in {out}/: " + ", ".join(f"{b.name}.json" for b in selected)
          + ", summary.json")
    if plots:
        print("plots: " + ", ".join(p.name for p in plots))
    elif not args.no_plots:
        print("plots: skipped (matplotlib is not installed)")
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
