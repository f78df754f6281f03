"""``tools/dev run`` (``python -m tools.simulate``): parse and check the options, run with a
progress bar, print the report (``--instances N``: the multi-instance mode,
``tools/mooncake/instances.py``)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from tools.simulate.config import SimConfig, config_from_args
from tools.simulate.logs import filtered_stderr, quiet_third_party_logs
from tools.simulate.options import (
    PROG,
    build_parser,
    check_output_path,
    check_storage_dir,
    explicit_options,
    refuse_ignored,
)
from tools.simulate.report import render_report, report_dict
from tools.simulate.simulation import run_simulation
from tools.simulate.stats import SimStats

__all__ = ["main"]


class _LazyProgress:
    """A rich progress bar that appears only once the run has taken longer than ``delay`` s."""

    def __init__(self, console: Console, enabled: bool, delay: float = 1.0) -> None:
        self._console = console
        self._enabled = enabled
        self._delay = delay
        self._t0 = time.monotonic()
        self._bar: Progress | None = None
        self._task = TaskID(0)

    def __call__(self, done: int, total: int) -> None:
        if not self._enabled:
            return
        if self._bar is None:
            if time.monotonic() - self._t0 < self._delay:
                return
            self._bar = Progress(
                TextColumn("simulating"), BarColumn(), MofNCompleteColumn(),
                TextColumn("requests"), TimeElapsedColumn(),
                console=self._console, transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("requests", total=total)
        self._bar.update(self._task, completed=done)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _config(argv: Sequence[str]) -> tuple[SimConfig, str | None, bool, bool]:
    """Parse and check everything that can be checked before the run (``ValueError``)."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    cfg = config_from_args(args)
    refuse_ignored(cfg, explicit_options(parser, argv))
    if cfg.storage_dir is not None and cfg.storage == "file":
        check_storage_dir(cfg.storage_dir)
    if args.json not in (None, "-"):
        check_output_path("--json", args.json)
    return cfg, args.json, args.no_progress, args.verbose


def run_warnings(cfg: SimConfig, stats: SimStats) -> list[str]:
    """What the run did not do although an option asked for it."""
    warnings = []
    if cfg.restart_at >= 0 and cfg.model != "deepseek_v4" and stats.steps <= cfg.restart_at:
        warnings.append(f"--restart-at {cfg.restart_at}: no restart happened, the run ended "
                        f"after {stats.steps:,} steps (pick a step below that)")
    return warnings


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status 0 when the run had no integrity failure and no leak, 1 otherwise, 2 for a
    bad option (one ``error:`` line, nothing run)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--instances" or a.startswith("--instances=") for a in argv):
        from tools.mooncake.instances import main as multi_instance_main

        return multi_instance_main(argv)
    try:
        cfg, json_path, no_progress, verbose = _config(argv)
    except ValueError as exc:
        return _error(str(exc))
    quiet_third_party_logs(verbose)
    to_stdout = json_path == "-"
    console = Console(stderr=to_stdout)
    if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        console.width = 120
    progress = _LazyProgress(console, enabled=not no_progress)
    with filtered_stderr(verbose) as hidden:
        try:
            stats = run_simulation(cfg, progress)
        finally:
            progress.stop()
    doc = report_dict(cfg, stats)
    doc["warnings"] = run_warnings(cfg, stats)
    doc["third_party_log_lines_hidden"] = hidden.dropped
    render_report(console, cfg, stats)
    for line in doc["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {line}")
    if hidden.dropped:
        console.print(f"[dim]{hidden.dropped} third-party log lines hidden (the failures they "
                      "report are counted above); --verbose shows them[/dim]")
    if json_path:
        text = json.dumps(doc, indent=2)
        if to_stdout:
            print(text)
        else:
            with open(json_path, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
    return 0 if doc["ok"] else 1
