"""Runtime probes in a fresh interpreter against an exported tree: old-path resolution and
import-linter contracts."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from mem_cache_refactor.modpath import resolve_relative

__all__ = [
    "ContractRun",
    "OldPath",
    "import_linter_config",
    "probe_env",
    "probe_old_paths",
    "run_import_linter",
    "static_old_path",
    "static_reexport",
    "top_level_names",
]

# Runs in the child: for each (old module, name, new module, new name), import both and compare
# identity. A name may be dotted (``Class.method``): it is looked up attribute by attribute.
_PROBE = r"""
import importlib, json, os, sys, traceback, warnings
def attr(obj, dotted):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj
start = set(sys.modules)
CASES = json.loads(sys.argv[1])
TOPS = {m.split(".")[0] for case in CASES for m in (case[0], case[2])}
def purge():
    # a failed import leaves half-initialised packages of the tree behind: the next import would
    # fail with a secondary error (KeyError: 'pkg') instead of the real one, so drop the tree's
    # modules (only those: a compiled third-party module cannot be loaded twice)
    for key in [k for k in sys.modules if k not in start and k.split(".")[0] in TOPS]:
        del sys.modules[key]
def why(exc):
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<") and "importlib" not in f.filename]
    where = ""
    if frames:
        f = frames[-1]
        base = os.environ.get("MOVE_CHECK_TREE") or os.getcwd()
        where = f" (at {os.path.relpath(f.filename, base)}:{f.lineno})"
    return f"{type(exc).__name__}: {exc}{where}"
out = []
for old_mod, name, new_mod, new_name in CASES:
    r = {"status": "error", "detail": "", "warning": None, "mechanism": None}
    out.append(r)
    try:
        new_obj = attr(importlib.import_module(new_mod), new_name)
    except Exception as exc:
        r["detail"] = f"new path {new_mod}.{new_name} does not import: {why(exc)}"
        purge()
        continue
    try:
        mod = importlib.import_module(old_mod)
    except ModuleNotFoundError as exc:
        if exc.name and (old_mod == exc.name or old_mod.startswith(exc.name + ".")):
            r["status"], r["detail"] = "gone", f"module {old_mod} no longer exists"
        else:
            r["detail"] = f"import {old_mod}: {why(exc)}"
        purge()
        continue
    except Exception as exc:
        r["detail"] = f"import {old_mod}: {why(exc)}"
        purge()
        continue
    r["mechanism"] = "module __getattr__ (PEP 562)" if "__getattr__" in vars(mod) else (
        "module attribute" if name in vars(mod) else None)
    if "." in name:
        owner = vars(mod).get(name.rpartition(".")[0].split(".")[0])
        r["mechanism"] = "class attribute" if owner is not None else r["mechanism"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            old_obj = attr(mod, name)
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
        r["status"], r["detail"] = "different", f"{old_mod}.{name} is not {new_mod}.{new_name}"
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


def probe_env(roots: list[Path]) -> dict[str, str]:
    """The environment of a child process: ``roots`` first on ``PYTHONPATH``, then the caller's
    ``PYTHONPATH`` entries (extended, not replaced)."""
    env = dict(os.environ)
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([*(str(r) for r in roots), *kept])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # lint-imports wraps its report at the terminal width: keep each chain on one line
    columns = env.get("COLUMNS", "")
    env["COLUMNS"] = str(max(int(columns) if columns.isdigit() else 0, 240))
    env.pop("PYTHONSTARTUP", None)
    return env


def probe_old_paths(
    roots: list[Path],
    cwd: Path,
    cases: list[tuple[str, str, str]] | list[tuple[str, str, str, str]],
    timeout: float = 300.0,
    python: str | None = None,
    *,
    tree: Path | None = None,
) -> list[OldPath]:
    """Resolve each ``(old_module, name, new_module[, new_name])`` in one fresh interpreter
    (``python``, default: this one) whose ``sys.path`` starts with ``roots`` (the exported
    tree), run from ``cwd``. ``new_name`` (default ``name``) is the name at the new home.

    A failed import is reported with its own error and the ``file:line`` that raised it (shown
    relative to ``tree``); the modules it left half-initialised are dropped before the next
    case, so a later case reports the same real error, not a secondary ``KeyError``."""
    if not cases:
        return []
    full = [c if len(c) == 4 else (*c, c[1]) for c in cases]
    env = probe_env(roots)
    if tree is not None:
        env["MOVE_CHECK_TREE"] = str(tree)
    proc = subprocess.run(
        [python or sys.executable, "-c", _PROBE, json.dumps(full)],
        cwd=cwd,
        env=env,
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


def _bound_names(tree: ast.Module) -> tuple[set[str], bool]:
    """Names a module binds at import time (top level, including ``if``/``try`` blocks) and
    whether it can provide more (``from x import *`` or a module ``__getattr__``)."""
    names: set[str] = set()
    dynamic = False
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.name == "*":
                    dynamic = True
                names.add(a.asname or a.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        for child_field in ("body", "orelse", "finalbody", "handlers"):
            for child in getattr(node, child_field, None) or []:
                if isinstance(child, ast.ExceptHandler):
                    stack.extend(child.body)
                elif isinstance(child, ast.stmt) and not isinstance(
                    node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
                ):
                    stack.append(child)
    return names, dynamic or "__getattr__" in names


def top_level_names(source: str) -> set[str]:
    """The names a module's source binds at import time (see :func:`_bound_names`)."""
    try:
        return _bound_names(ast.parse(source))[0]
    except SyntaxError:
        return set()


def _class_binds(tree: ast.Module, cls: str, name: str) -> tuple[bool, str] | None:
    """For a method path ``cls.name``: whether the module's class ``cls`` still binds ``name``
    in its body (a ``def`` or an assignment); None when the module does not define ``cls`` as
    a class of its own (imported, or gone: the module-level check decides)."""
    for node in tree.body:
        if not (isinstance(node, ast.ClassDef) and node.name == cls):
            continue
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                return True, f"static check: class {cls} still defines {name}"
            targets = (item.targets if isinstance(item, ast.Assign) else
                       [item.target] if isinstance(item, ast.AnnAssign) else [])
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True, f"static check: class {cls} still binds {name}"
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    item.name == "__getattr__":
                return True, f"static check: class {cls} may provide {name} (__getattr__)"
        return False, (f"static check: class {cls} no longer defines {name} (a base class "
                       "could still provide one: that would be a different object)")
    return None


def static_old_path(roots: list[Path], module: str, name: str) -> tuple[bool, str]:
    """Static look at ``module.name`` in the source ``roots``: (still resolvable?, detail).

    Used when the runtime probe cannot import the tree: a module file that no longer exists,
    or one that no longer defines or imports ``name`` (and has no module ``__getattr__`` or
    star import), is gone. For a method (``Class.method``), a class of the module whose body
    no longer defines the method is gone too.
    """
    rel = Path(*module.split("."))
    for root in roots:
        for file in (root / rel / "__init__.py", (root / rel).with_suffix(".py")):
            if not file.is_file():
                continue
            try:
                tree = ast.parse(file.read_text(encoding="utf-8", errors="replace"))
            except SyntaxError as exc:
                return True, f"{file.name} does not parse ({exc.msg}): not verified"
            if "." in name:
                cls, _, member = name.partition(".")
                in_class = _class_binds(tree, cls, member) if "." not in member else None
                if in_class is not None:
                    return in_class
                name = cls
            names, dynamic = _bound_names(tree)
            if name in names:
                return True, f"static check: {module} still binds {name}"
            if dynamic:
                return True, f"static check: {module} may provide {name} (__getattr__ or *)"
            return False, f"static check: {module} no longer defines or imports {name}"
    return False, f"static check: module {module} no longer exists"


def static_reexport(
    roots: list[Path], module: str, name: str, new_module: str, new_name: str
) -> bool:
    """Whether the old module binds ``name`` at import time only by importing ``new_name``
    from ``new_module`` (``from new import Name``, absolute or relative): a silent re-export of
    the same object, and no module ``__getattr__`` that could warn instead."""
    if "." in name:  # a method: a class attribute is never a from-import
        return False
    rel = Path(*module.split("."))
    for root in roots:
        for file in (root / rel / "__init__.py", (root / rel).with_suffix(".py")):
            if not file.is_file():
                continue
            try:
                tree = ast.parse(file.read_text(encoding="utf-8", errors="replace"))
            except SyntaxError:
                return False
            is_package = file.name == "__init__.py"
            found = False
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                        node.name in (name, "__getattr__"):
                    return False
                if isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if any(isinstance(t, ast.Name) and t.id in (name, "__getattr__")
                           for t in targets):
                        return False
                if isinstance(node, ast.ImportFrom):
                    base = resolve_relative(module, is_package, node.level, node.module)
                    for alias in node.names:
                        if (alias.asname or alias.name) != name:
                            continue
                        if base != new_module or alias.name != new_name:
                            return False
                        found = True
            return found
    return False


def import_linter_config(tree: Path) -> str | None:
    """The import-linter configuration file of ``tree`` (``.importlinter``, ``setup.cfg`` with
    ``[importlinter]``, ``pyproject.toml`` with ``[tool.importlinter]``), or None."""
    if (tree / ".importlinter").is_file():
        return ".importlinter"
    for name, marker in (("setup.cfg", "[importlinter"), ("pyproject.toml", "[tool.importlinter")):
        file = tree / name
        if file.is_file() and marker in file.read_text(encoding="utf-8", errors="replace"):
            return name
    return None


@dataclass(frozen=True, slots=True)
class ContractRun:
    """One ``lint-imports`` run: contract name -> kept?, and the raw report.

    ``configured``: the tree has an import-linter configuration; ``ran``: lint-imports ran
    and reported on its contracts.
    """

    configured: bool
    ran: bool
    results: dict[str, bool]
    output: str


def _lint_imports(python: str | None) -> str | None:
    for exe in (python, sys.executable):
        if exe:
            beside = Path(exe).parent / "lint-imports"
            if beside.exists():
                return str(beside)
    return shutil.which("lint-imports")


def run_import_linter(
    tree: Path, roots: list[Path], timeout: float = 300.0, python: str | None = None
) -> ContractRun:
    """Run ``lint-imports --no-cache`` in ``tree`` with its own config and the tree's source
    roots first on ``PYTHONPATH`` (the caller's entries follow)."""
    config = import_linter_config(tree)
    if config is None:
        return ContractRun(False, False, {}, "no import-linter configuration in the tree")
    exe = _lint_imports(python)
    if exe is None:
        return ContractRun(True, False, {}, "lint-imports is not installed")
    proc = subprocess.run(
        [exe, "--no-cache"],
        cwd=tree,
        env=probe_env(roots),
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
    if not results or proc.returncode not in (0, 1):
        return ContractRun(True, False, {}, output)
    return ContractRun(True, True, results, output)
