"""Part 1: every public op of ``mem_cache_kernels`` with ``backend="triton"``, bit-exact against
``backend="torch"`` on the same device.

Ops are discovered, not listed here: every op of ``mem_cache_kernels.list_ops()`` that takes a
keyword-only ``backend`` (the ``deepseek_v4`` family's record ops included, under their
qualified names such as ``deepseek_v4.pack_records``), plus every public function with such a
parameter in ``mem_cache_kernels`` and its public submodules that the catalogue missed. An op
without cases in :mod:`tools.gpu_check._op_cases` is a failure ("no gpu-check case"), so a new
op cannot slip past the check.

Each case builds its inputs twice from one seed (same device, same numbers), runs the op once with
each backend and compares every output buffer and return value byte for byte
(:func:`~tools.gpu_check._core.first_difference`). A mismatch names the op, the case and the
first differing index.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import time
import traceback
from collections.abc import Callable
from types import ModuleType

import mem_cache_kernels as mk
from tools.gpu_check._core import Context, Row, SectionResult, first_difference, sync
from tools.gpu_check._op_cases import CASES, Case

__all__ = ["discover_ops", "run_ops"]

_SKIP_MODULES = frozenset({"reference"})


def _public_modules() -> list[ModuleType]:
    mods: list[ModuleType] = [mk]
    for info in pkgutil.iter_modules(mk.__path__):
        if info.name.startswith("_") or info.name in _SKIP_MODULES:
            continue
        mods.append(importlib.import_module(f"{mk.__name__}.{info.name}"))
    return mods


def _takes_backend(obj: object) -> bool:
    if not callable(obj) or isinstance(obj, type):
        return False
    try:
        param = inspect.signature(obj).parameters.get("backend")
    except (TypeError, ValueError):
        return False
    return param is not None and param.kind is inspect.Parameter.KEYWORD_ONLY


def discover_ops() -> dict[str, Callable[..., object]]:
    """Qualified name (``name`` or ``submodule.name``) -> function, for every public op."""
    ops: dict[str, Callable[..., object]] = {}
    for info in mk.list_ops():
        fn = getattr(importlib.import_module(info.module), info.name)
        if _takes_backend(fn):  # ops without a backend choice have nothing to compare
            ops[info.qualname] = fn
    for mod in _public_modules():
        prefix = "" if mod is mk else mod.__name__.rsplit(".", 1)[1] + "."
        for name in getattr(mod, "__all__", ()):
            obj = getattr(mod, name, None)
            if _takes_backend(obj) and prefix + name not in ops:
                ops[prefix + name] = obj  # type: ignore[assignment]
    return ops


def _run_case(case: Case) -> tuple[str, str]:
    """(status, detail) of one case: ``ok``, ``FAIL`` (bit mismatch) or ``error``."""
    try:
        got = case.run("triton")
        sync(case.device)
        want = case.run("torch")
        sync(case.device)
    except Exception as exc:
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
        return "error", f"{type(exc).__name__}: {exc}{where}"
    if set(got) != set(want):
        return "FAIL", f"outputs differ: {sorted(got)} vs {sorted(want)}"
    for key in want:
        diff = first_difference(got[key], want[key])
        if diff is not None:
            return "FAIL", f"output {key!r}: {diff}"
    return "ok", ""


def run_ops(ctx: Context) -> SectionResult:
    """Run every case of every discovered op; one table row per op, one JSON record per case."""
    result = SectionResult("ops")
    ops = discover_ops()
    result.notes.append(f"discovered {len(ops)} ops: {', '.join(sorted(ops))}")
    if ctx.ops:
        unknown = sorted(set(ctx.ops) - set(ops))
        if unknown:
            raise ValueError(f"--ops names unknown ops {unknown}; known: {sorted(ops)}")
        ops = {name: fn for name, fn in ops.items() if name in ctx.ops}
    for name in sorted(ops):
        make = CASES.get(name)
        if make is None:
            result.add(
                Row(
                    "ops",
                    name,
                    "-",
                    "FAIL",
                    detail="no gpu-check case: add one to tools/gpu_check/_op_cases.py",
                )
            )
            continue
        counts = {"ok": 0, "FAIL": 0, "error": 0, "skipped": 0}
        started = time.monotonic()
        first_bad = ""
        for case in make(ctx):
            if ctx.out_of_time():
                counts["skipped"] += 1
                result.cases.append({"op": name, "case": case.name, "status": "skipped"})
                continue
            status, detail = _run_case(case)
            counts[status] += 1
            result.cases.append({"op": name, "case": case.name, "status": status, "detail": detail})
            if status != "ok":
                line = f"{name} [{case.name}]: {status}: {detail}"
                print(f"[gpu-check] MISMATCH {line}" if status == "FAIL" else f"[gpu-check] {line}")
                first_bad = first_bad or f"[{case.name}] {detail}"
        total = sum(counts.values())
        status = (
            "FAIL"
            if counts["FAIL"]
            else "error"
            if counts["error"]
            else "skipped"
            if counts["skipped"]
            else "ok"
        )
        summary = f"{counts['ok']}/{total} bit-exact"
        for key in ("FAIL", "error", "skipped"):
            if counts[key]:
                summary += f", {counts[key]} {key}"
        result.add(
            Row(
                "ops",
                name,
                summary,
                status,
                value=time.monotonic() - started,
                unit="s",
                detail=first_bad[:300],
            )
        )
        ctx.save(result)
    return result
