"""Command line, sections, time budget, process isolation, the table and the JSON file."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.cli import OneLineParser

__all__ = ["SECTIONS", "Section", "main"]

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_JSON = ROOT / "bench-results" / "gpu_check.json"
DEFAULT_DRY_JSON = ROOT / "bench-results" / "gpu_check.dry-run.json"
DEFAULT_BUDGET_S = 330.0


@dataclass(frozen=True, slots=True)
class Section:
    """One part of the check: ``module:function`` returning a ``SectionResult``."""

    name: str
    target: str
    share: float
    """Planned seconds on an H200 (scaled to the budget); unused time passes to later sections."""
    what: str


SECTIONS: tuple[Section, ...] = (
    Section("ops", "tools.gpu_check._ops:run_ops", 175, "every kernel op, triton vs torch"),
    Section("register", "tools.gpu_check._register:run_register", 10, "cudaHostRegister"),
    Section("host", "tools.gpu_check._host:run_host", 65, "host pool GB/s vs cudaMemcpyAsync"),
    Section("device", "tools.gpu_check._device:run_device", 20, "store/move vs device copy"),
    Section("alloc", "tools.gpu_check._alloc:run_alloc", 35, "allocation latency, CUDA graph"),
    Section("layers", "tools.gpu_check._layers:run_layers", 15, "layer events and overlap"),
)


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="gpu-check",
        description="Every GPU figure of the kernels and host pools in one run (see the module "
        "docstring of tools.gpu_check).",
    )
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, Triton interpreter")
    p.add_argument("--json", metavar="PATH", help=f"JSON output (default {DEFAULT_JSON})")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds for all")
    p.add_argument(
        "--only", metavar="A,B", help="sections to run: " + ",".join(s.name for s in SECTIONS)
    )
    iso = p.add_mutually_exclusive_group()
    iso.add_argument(
        "--isolate", dest="isolate", action="store_true", default=None,
        help="each section in its own process (default on CUDA: a sticky CUDA error stays there)",
    )  # fmt: skip
    iso.add_argument("--no-isolate", dest="isolate", action="store_false")
    p.add_argument("--ops", metavar="A,B", help="ops section: only these ops (see --list)")
    p.add_argument("--full-matrix", action="store_true", help="dry run: every op case combination")
    p.add_argument("--list", action="store_true", help="list sections and ops, run nothing")
    # internal: one section in a child process
    p.add_argument("--child", metavar="SECTION", help=argparse.SUPPRESS)
    p.add_argument("--child-out", metavar="PATH", help=argparse.SUPPRESS)
    p.add_argument("--deadline-at", type=float, help=argparse.SUPPRESS)
    p.add_argument("--section-deadline-at", type=float, help=argparse.SUPPRESS)
    return p


def _select(only: str | None) -> list[Section]:
    if not only:
        return list(SECTIONS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = {s.name: s for s in SECTIONS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(
            f"gpu-check: --only names unknown sections {unknown}; known: {list(known)}"
        )
    return [known[n] for n in names]


def _say(msg: str) -> None:
    print(f"[gpu-check] {msg}", flush=True)


def _environment(dry_run: bool) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "dry_run": dry_run,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as exc:  # triton missing or broken: the ops section will say so
        info["triton"] = f"unavailable ({type(exc).__name__})"
    if torch.cuda.is_available() and not dry_run:
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["sm_count"] = props.multi_processor_count
        info["capability"] = f"{props.major}.{props.minor}"
        info["can_use_host_pointer_for_registered_mem"] = _host_pointer_attr()
    return info


def _host_pointer_attr() -> int | None:
    """cudaDevAttrCanUseHostPointerForRegisteredMem (91) of device 0: whether a kernel may use a
    registered host buffer's host address directly (the Triton row kernels do)."""
    import ctypes
    import ctypes.util

    for name in (
        "libcudart.so.13",
        "libcudart.so.12",
        "libcudart.so",
        ctypes.util.find_library("cudart"),
    ):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        value = ctypes.c_int(-1)
        if lib.cudaDeviceGetAttribute(ctypes.byref(value), 91, 0) == 0:
            return value.value
        return None
    return None


def _context(
    args: argparse.Namespace,
    deadline: float,
    section_deadline: float,
    checkpoint: Callable[[Any], None] | None = None,
) -> Any:
    import torch

    from tools.gpu_check._core import CUDA_SIZES, DRY_SIZES, Context

    dry = bool(args.dry_run)
    return Context(
        device=torch.device("cpu" if dry else "cuda"),
        dry_run=dry,
        sizes=DRY_SIZES if dry else CUDA_SIZES,
        deadline=deadline,
        section_deadline=section_deadline,
        full_matrix=not dry or bool(args.full_matrix),
        ops=tuple(n.strip() for n in (args.ops or "").split(",") if n.strip()),
        checkpoint=checkpoint,
    )


def _resolve(target: str) -> Callable[[Any], Any]:
    import importlib

    module, func = target.split(":")
    fn: Callable[[Any], Any] = getattr(importlib.import_module(module), func)
    return fn


def _run_in_process(
    section: Section,
    args: argparse.Namespace,
    deadline: float,
    sdl: float,
    checkpoint: Callable[[Any], None] | None = None,
) -> Any:
    from tools.gpu_check._core import SectionResult

    ctx = _context(args, deadline, sdl, checkpoint)
    started = time.monotonic()
    try:
        result: SectionResult = _resolve(section.target)(ctx)
    except Exception as exc:
        result = SectionResult(section.name, status="error")
        result.notes.append("".join(traceback.format_exception(exc)).strip()[-2000:])
        _say(f"section {section.name} raised {type(exc).__name__}: {exc}")
    result.wall_s = time.monotonic() - started
    if result.status == "ok" and result.failed:
        result.status = "FAIL"
    return result


def _to_epoch(mono: float) -> float:
    return time.time() + (mono - time.monotonic())


def _from_epoch(epoch: float) -> float:
    return time.monotonic() + (epoch - time.time())


def _run_child(section: Section, args: argparse.Namespace, deadline: float, sdl: float) -> Any:
    """Run one section in a fresh interpreter; its result comes back as JSON."""
    from tools.gpu_check._core import Row, SectionResult

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        out = Path(tmp) / f"{section.name}.json"
        cmd = [
            sys.executable, "-m", "tools.gpu_check", "--child", section.name,
            "--child-out", str(out), "--deadline-at", str(_to_epoch(deadline)),
            "--section-deadline-at", str(_to_epoch(sdl)),
        ]  # fmt: skip
        if args.dry_run:
            cmd.append("--dry-run")
        if args.full_matrix:
            cmd.append("--full-matrix")
        if args.ops:
            cmd += ["--ops", args.ops]
        started = time.monotonic()
        grace = 45.0  # one case or measurement may overrun the section's deadline
        try:
            proc = subprocess.run(cmd, cwd=ROOT, timeout=max(10.0, sdl - started) + grace)
            rc: int | str = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        try:
            data = json.loads(out.read_text(encoding="utf-8")) if out.exists() else None
        except (OSError, ValueError):
            data = None
        result = SectionResult(section.name, status="error")
        if data is not None:
            result.rows = [Row(**_row_fields(r)) for r in data["rows"]]
            result.cases, result.notes = data["cases"], data["notes"]
            result.status = data["status"]
        result.wall_s = time.monotonic() - started
        if rc != 0 or data is None or data["status"] == "partial":
            # a crash or a kill: keep what the child saved, and say how it ended
            result.status = "error"
            what = "nothing saved" if data is None else f"{len(result.rows)} rows saved before"
            result.notes.append(f"child process ended with {rc} ({what})")
            result.add(Row(section.name, section.what, "-", "error", detail=f"child process: {rc}"))
        return result


def _row_fields(r: dict[str, Any]) -> dict[str, Any]:
    keys = ("section", "item", "case", "status", "value", "unit", "reference", "reference_name")
    return {k: r[k] for k in keys} | {"detail": r.get("detail", "")}


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    if unit == "s":
        return f"{x:.1f}"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def table(results: Sequence[Any]) -> str:
    """The one table: every row of every section (ratio: higher is better for the op)."""
    rows = [r for res in results for r in res.rows]
    head = ("section", "what", "case", "value", "unit", "reference", "ratio", "status", "note")
    body = [
        (
            r.section,
            r.item,
            r.case,
            _fmt(r.value, r.unit),
            r.unit,
            f"{_fmt(r.reference)} {r.reference_name}".strip() if r.reference is not None else "",
            _fmt(r.ratio) if r.ratio is not None else "",
            r.status,
            "" if r.status in ("FAIL", "error") else r.detail,
        )
        for r in rows
    ]
    widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(head)]
    widths = [min(w, 90 if i == len(head) - 1 else 60) for i, w in enumerate(widths)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c[:w].ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = [line(head), line(["-" * w for w in widths])]
    out += [line(b) for b in body]
    out.append(
        "ratio: higher is better for the measured op (its GB/s over the reference's GB/s, or "
        "the reference's time over its time)"
    )
    notes = [f"{res.name}: {n.splitlines()[-1][:400]}" for res in results for n in res.notes if n]
    if notes:
        out += ["", *notes]
    problems = [r for r in rows if r.status in ("FAIL", "error") and r.detail]
    if problems:
        out.append("")
        out += [f"{r.status}: {r.section} / {r.item} [{r.case}]: {r.detail}" for r in problems]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.dry_run:
        # the interpreter is chosen when a kernel module is first imported: set it before that
        os.environ["TRITON_INTERPRET"] = "1"
    if args.child:
        return _child_main(args)
    sections = _select(args.only)
    if args.list:
        from tools.gpu_check._ops import discover_ops

        for s in sections:
            print(f"{s.name:<10}{s.share:>5.0f} s  {s.what}")
        print("ops:", ", ".join(sorted(discover_ops())))
        return 0
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        _say(
            "no CUDA device: nothing measured (run with --dry-run to exercise this script on the "
            "CPU with the Triton interpreter)"
        )
        return 0
    t0 = time.monotonic()
    deadline = t0 + args.budget
    isolate = args.isolate if args.isolate is not None else not args.dry_run
    env = _environment(args.dry_run)
    _say(
        ("DRY RUN (CPU, Triton interpreter, tiny sizes, no timing); " if args.dry_run else "")
        + ", ".join(f"{k}={v}" for k, v in env.items() if k != "dry_run")
    )
    total_share = sum(s.share for s in sections)
    planned = 0.0
    results: list[Any] = []
    for section in sections:
        planned += section.share
        sdl = min(deadline, t0 + args.budget * planned / total_share)
        now = time.monotonic()
        if now >= deadline:
            from tools.gpu_check._core import Row, SectionResult

            res = SectionResult(section.name, status="skipped")
            res.add(Row(section.name, section.what, "-", "skipped", detail="time budget spent"))
            results.append(res)
            continue
        _say(f"section {section.name} ({section.what}): up to {sdl - now:.0f} s")
        run = _run_child if isolate else _run_in_process
        res = run(section, args, deadline, sdl)
        _say(f"section {section.name}: {res.status} in {res.wall_s:.1f} s")
        results.append(res)
    wall = time.monotonic() - t0
    failed = any(r.failed for r in results)
    incomplete = any(r.incomplete for r in results)
    code = 1 if failed else 3 if incomplete else 0
    print()
    print(table(results))
    print()
    verdict = (
        "FAILED" if failed else "INCOMPLETE (time budget)" if incomplete else "all checks passed"
    )
    _say(f"{verdict} in {wall:.1f} s (budget {args.budget:.0f} s); exit {code}")
    path = Path(args.json) if args.json else DEFAULT_DRY_JSON if args.dry_run else DEFAULT_JSON
    payload = {
        "tool": "gpu_check",
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": env,
        "budget_s": args.budget,
        "wall_s": round(wall, 3),
        "isolated": isolate,
        "exit_code": code,
        "verdict": verdict,
        "sections": {r.name: r.as_json() for r in results},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    _say(f"JSON: {path}")
    return code


def _child_main(args: argparse.Namespace) -> int:
    known = {s.name: s for s in SECTIONS}
    section = known[args.child]
    deadline = _from_epoch(args.deadline_at)
    sdl = _from_epoch(args.section_deadline_at)
    out = Path(args.child_out)

    def write(data: dict[str, Any]) -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(out)  # atomic: a crash never leaves half a file

    def checkpoint(partial: Any) -> None:
        write(partial.as_json() | {"status": "partial"})

    result = _run_in_process(section, args, deadline, sdl, checkpoint)
    write(result.as_json())
    return 0
