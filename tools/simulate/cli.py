"""``python -m tools.simulate``: parse options, run with a progress bar, print the report."""

from __future__ import annotations

import json
import sys
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from tools.simulate.config import build_parser, config_from_args
from tools.simulate.report import render_report, report_dict
from tools.simulate.simulation import run_simulation

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


def main(argv: list[str] | None = None) -> int:
    """Exit status 0 when the run had no integrity failure and no leak, 1 otherwise."""
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    to_stdout = args.json == "-"
    console = Console(stderr=to_stdout)
    if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        console.width = 120
    progress = _LazyProgress(console, enabled=not args.no_progress)
    try:
        stats = run_simulation(cfg, progress)
    finally:
        progress.stop()
    doc = report_dict(cfg, stats)
    render_report(console, cfg, stats)
    if args.json:
        text = json.dumps(doc, indent=2)
        if to_stdout:
            print(text)
        else:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
    return 0 if doc["ok"] else 1
