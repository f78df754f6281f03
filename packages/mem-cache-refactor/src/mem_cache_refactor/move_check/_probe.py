"""Runtime probes in a fresh interpreter against an exported tree: old-path resolution and
import-linter contracts."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ContractRun", "OldPath", "probe_old_paths", "run_import_linter"]

# Runs in the child: for each (old module, name, new module), import both and compare identity.
_PROBE = r"""
import importlib, json, sys, warnings
out = []
for old_mod, name, new_mod in json.loads(sys.argv[1]):
    r = {"status": "error", "detail": "", "warning": None, "mechanism": None}
    out.append(r)
    try:
        new_obj = getattr(importlib.import_module(new_mod), name)
    except Exception as exc:
        r["detail"] = f"new path {new_mod}.{name} does not import: {type(exc).__name__}: {exc}"
        continue
    try:
        mod = importlib.import_module(old_mod)
    except ModuleNotFoundError as exc:
        if exc.name and (old_mod == exc.name or old_mod.startswith(exc.name + ".")):
            r["status"], r["detail"] = "gone", f"module {old_mod} no longer exists"
        else:
            r["detail"] = f"import {old_mod}: {type(exc).__name__}: {exc}"
        continue
    except Exception as exc:
        r["detail"] = f"import {old_mod}: {type(exc).__name__}: {exc}"
        continue
    r["mechanism"] = "module __getattr__ (PEP 562)" if "__getattr__" in vars(mod) else (
        "module attribute" if name in vars(mod) else None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            old_obj = getattr(mod, name)
        except AttributeError:
            r["status"], r["detail"] = "gone", f"{old_mod} has no attribute {name}"
            continue
        except Exception as exc:
            r["detail"] = f"{old_mod}.{name}: {type(exc).__name__}: {exc}"
            continue
    dep = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    r["warning"] = dep[0] if dep else None
    r["warnings"] = len(dep)
    if old_obj is not new_obj:
        r["status"], r["detail"] = "different", f"{old_mod}.{name} is not {new_mod}.{name}"
    elif dep:
        r["status"], r["detail"] = "shim", f"same object, {len(dep)} DeprecationWarning"
    else:
        r["status"], r["detail"] = "reexport", "same object, no DeprecationWarning"
print(json.dumps(out))
"""


@dataclass(frozen=True, slots=True)
class OldPath:
    """How ``old.module.Name`` resolves at the new ref.

    ``status``: "shim" (same object, DeprecationWarning), "reexport" (same object, silent),
    "different" (another object), "gone" (module or attribute missing), "error" (probe failed).
    """

    status: str
    detail: str
    warning: str | None
    mechanism: str | None


def _env(roots: list[Path]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(r) for r in roots)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTHONSTARTUP", None)
    return env


def probe_old_paths(
    roots: list[Path], cwd: Path, cases: list[tuple[str, str, str]], timeout: float = 300.0
) -> list[OldPath]:
    """Resolve each ``(old_module, name, new_module)`` in one fresh interpreter whose
    ``sys.path`` starts with ``roots`` (the exported tree), run from ``cwd``."""
    if not cases:
        return []
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(cases)],
        cwd=cwd,
        env=_env(roots),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        detail = f"probe interpreter failed: {proc.stderr.strip()[-2000:]}"
        return [OldPath("error", detail, None, None) for _ in cases]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    return [OldPath(r["status"], r["detail"], r["warning"], r["mechanism"]) for r in rows]


@dataclass(frozen=True, slots=True)
class ContractRun:
    """One ``lint-imports`` run: contract name -> kept?, and the raw report."""

    ran: bool
    results: dict[str, bool]
    output: str


def _lint_imports() -> str | None:
    beside = Path(sys.executable).parent / "lint-imports"
    if beside.exists():
        return str(beside)
    return shutil.which("lint-imports")


def run_import_linter(tree: Path, roots: list[Path], timeout: float = 300.0) -> ContractRun:
    """Run ``lint-imports --no-cache`` in ``tree`` with its own config (``.importlinter``,
    ``setup.cfg`` or ``pyproject.toml``) and the tree's packages first on ``sys.path``."""
    has_config = (tree / ".importlinter").is_file() or any(
        (tree / f).is_file() and "importlinter" in (tree / f).read_text(errors="replace")
        for f in ("setup.cfg", "pyproject.toml")
    )
    exe = _lint_imports()
    if not has_config:
        return ContractRun(False, {}, "no import-linter configuration in the tree")
    if exe is None:
        return ContractRun(False, {}, "lint-imports is not installed")
    proc = subprocess.run(
        [exe, "--no-cache"],
        cwd=tree,
        env=_env(roots),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = proc.stdout + proc.stderr
    results: dict[str, bool] = {}
    for line in output.splitlines():
        m = re.match(r"^(.+) (KEPT|BROKEN)$", line.rstrip())
        if m:
            results[m.group(1)] = m.group(2) == "KEPT"
    if not results:
        return ContractRun(False, {}, output)
    return ContractRun(True, results, output)
