"""Public-API snapshots: ``api-snapshot check|update [--package NAME] [--src-root DIR]``.

A package's public API is the ``__all__`` of its root module and of every public module below it
(no path component starting with ``_``; private modules are never imported, so neither is
``mem_cache_kernels._triton``). For each exported name the snapshot records its kind and
signature: functions with ``inspect.signature``; classes with their constructor signature, bases,
defining module and public members (methods, class/static methods, properties, attributes);
modules by name; data by type (plus the value for plain literals and typing constructs).

The packages are the top-level packages (folders with ``__init__.py``) of the repository's source
roots other than its top (:class:`mem_cache_refactor.modpath.SourceRoots`: ``pyproject.toml``,
``src/``, ``python/``, ``--src-root DIR``); ``--package`` picks some. Snapshots live in
``tests/contracts/api/<import_name>.json`` (``--snapshot-dir``; sorted, indented JSON) and are
committed. ``check`` compares the live API with them and prints a unified diff per package;
``update`` rewrites them. A snapshot change in a pull request is the reviewable record of an
API change. Exit status of ``check``: 0 equal, 1 differs/missing (run ``api-snapshot update``),
2 usage error.
"""

from __future__ import annotations

import difflib
import enum
import importlib
import inspect
import json
import pkgutil
import re
import subprocess
import sys
import types
import typing
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mem_cache_refactor._cli import OneLineParser
from mem_cache_refactor.modpath import SourceRoots

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["Package", "describe_package", "discover_packages", "main", "render"]

SNAPSHOT_DIR = Path("tests") / "contracts" / "api"
HINT = "run api-snapshot update (and commit the snapshot files)"
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_LITERALS = (bool, int, float, str, bytes, type(None))


@dataclass(frozen=True, slots=True)
class Package:
    """One importable package: its distribution name, import name and source root."""

    dist: str
    name: str
    src: Path


def _dist_name(root: Path, src: Path) -> str:
    """``[project] name`` of the nearest ``pyproject.toml`` at or above ``src`` (inside
    ``root``), else the folder above a ``src`` folder, else the source root's own name."""
    for folder in [src, *src.parents]:
        project = folder / "pyproject.toml"
        if project.is_file() and folder != root:
            try:
                name = tomllib.loads(project.read_text(encoding="utf-8")).get("project", {})
            except (OSError, tomllib.TOMLDecodeError):
                name = {}
            if isinstance(name, dict) and isinstance(name.get("name"), str):
                return str(name["name"])
        if folder == root:
            break
    return src.parent.name if src.name == "src" else src.name


def discover_packages(root: Path, src_roots: Sequence[str | Path] = ()) -> list[Package]:
    """The top-level packages of ``root``'s source roots (except the top itself), sorted by
    import name."""
    roots = SourceRoots.discover(root, extra=list(src_roots))
    found: dict[str, Package] = {}
    for rel in roots.roots:
        if not rel:
            continue
        src = root / rel
        for init in sorted(src.glob("*/__init__.py")):
            name = init.parent.name
            if name.isidentifier() and name not in found:
                found[name] = Package(_dist_name(root, src), name, src)
    return sorted(found.values(), key=lambda p: p.name)


def _repo_top() -> Path:
    proc = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=False)
    return Path(proc.stdout.strip()) if proc.returncode == 0 else Path.cwd()


def _clean(text: str) -> str:
    return _ADDRESS.sub("", text)


def _signature(obj: Any) -> str | None:
    try:
        return _clean(str(inspect.signature(obj)))
    except (TypeError, ValueError):
        return None


def _qualified(obj: Any) -> str:
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if qualname is None:
        return _clean(repr(obj))
    return f"{module}.{qualname}" if module and module != "builtins" else str(qualname)


def _describe_data(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "data", "type": _qualified(type(obj))}
    if isinstance(obj, _LITERALS) or (
        isinstance(obj, (tuple, frozenset)) and all(isinstance(x, _LITERALS) for x in obj)
    ):
        out["value"] = _clean(repr(sorted(obj, key=repr) if isinstance(obj, frozenset) else obj))
    elif type(obj).__module__ in ("typing", "typing_extensions", "types"):
        out["value"] = _clean(repr(obj))
    return out


def _describe_member(cls: type, name: str, raw: Any) -> dict[str, Any]:
    if isinstance(raw, staticmethod):
        return {"kind": "staticmethod", "signature": _signature(raw.__func__)}
    if isinstance(raw, classmethod):
        return {"kind": "classmethod", "signature": _signature(getattr(cls, name))}
    if isinstance(raw, property):
        fget = raw.fget
        ret = inspect.signature(fget).return_annotation if fget is not None else None
        text = None if ret in (None, inspect.Signature.empty) else _clean(str(ret))
        return {"kind": "property", "settable": raw.fset is not None, "type": text}
    if inspect.isfunction(raw):
        return {"kind": "method", "signature": _signature(raw)}
    if isinstance(raw, enum.Enum):
        return {"kind": "enum member", "value": _clean(repr(raw.value))}
    if inspect.isclass(raw):
        return {"kind": "class", "qualified": _qualified(raw)}
    return {"kind": "attribute", "type": _qualified(type(raw))}


def _is_private_class(klass: type) -> bool:
    """A class users cannot name: defined in a private module (a ``_x`` path component) or
    itself named ``_X``. Its members are part of every public subclass's API."""
    parts = [*klass.__module__.split("."), *klass.__qualname__.split(".")]
    return any(part.startswith("_") and not part.startswith("__") for part in parts)


def _public_members(cls: type) -> dict[str, Any]:
    """The class's own public members plus those it inherits from private bases (a method moved
    into a private mixin stays in the public class's snapshot; public bases have their own, and
    so do the private bases a public base inherits: listed once, with that base)."""
    members: dict[str, Any] = {}
    mro = [k for k in cls.__mro__[1:] if k is not object]
    public = [k for k in mro if not _is_private_class(k)]
    owners = [cls, *(k for k in mro if _is_private_class(k)
                     and not any(issubclass(p, k) for p in public))]
    for owner in owners:
        annotations = inspect.get_annotations(owner)
        for name in sorted(set(owner.__dict__) | set(annotations)):
            if name.startswith("_") or name in members:
                continue
            if name in owner.__dict__:
                members[name] = _describe_member(cls, name, owner.__dict__[name])
            else:  # an annotated field without a class-level value (dataclass/protocol field)
                members[name] = {"kind": "field", "type": _clean(str(annotations[name]))}
    return dict(sorted(members.items()))


def _describe(obj: Any) -> dict[str, Any]:
    if isinstance(obj, types.ModuleType):
        return {"kind": "module", "module": obj.__name__}
    if inspect.isclass(obj):
        kind = "protocol" if getattr(obj, "_is_protocol", False) else "class"
        if issubclass(obj, enum.Enum):
            kind = "enum"
        elif issubclass(obj, BaseException):
            kind = "exception"
        return {
            "kind": kind,
            "defined_in": obj.__module__,
            "bases": [_qualified(b) for b in obj.__bases__],
            "signature": _signature(obj),
            "members": _public_members(obj),
        }
    if isinstance(obj, typing.NewType):
        return {"kind": "newtype", "supertype": _qualified(obj.__supertype__)}
    if inspect.isroutine(obj):
        return {
            "kind": "function",
            "defined_in": getattr(obj, "__module__", None),
            "signature": _signature(obj),
        }
    return _describe_data(obj)


def _public_modules(package: types.ModuleType) -> list[str]:
    names = [package.__name__]
    stack = [package]
    while stack:
        pkg = stack.pop()
        for info in pkgutil.iter_modules(pkg.__path__, prefix=f"{pkg.__name__}."):
            if info.name.rsplit(".", 1)[-1].startswith("_"):
                continue
            names.append(info.name)
            if info.ispkg:
                stack.append(importlib.import_module(info.name))
    return sorted(names)


def describe_package(name: str) -> dict[str, Any]:
    """The snapshot dictionary of the importable package ``name``."""
    package = importlib.import_module(name)
    modules: dict[str, Any] = {}
    for mod_name in _public_modules(package):
        module = importlib.import_module(mod_name)
        exported = getattr(module, "__all__", None)
        if exported is None:
            modules[mod_name] = {"__all__": None}
            continue
        entries: dict[str, Any] = {}
        for export in sorted(exported):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    obj = getattr(module, export)
                except AttributeError:
                    entries[export] = {"kind": "missing"}
                    continue
            entries[export] = _describe(obj)
        modules[mod_name] = {"__all__": sorted(exported), "names": entries}
    return {"package": name, "modules": modules}


def render(snapshot: dict[str, Any]) -> str:
    """Canonical JSON text of a snapshot (sorted keys, two-space indent, final newline)."""
    return json.dumps(snapshot, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="api-snapshot",
        description="Check or update the committed public-API snapshots of the packages.",
    )
    parser.add_argument("command", choices=["check", "update"])
    parser.add_argument("--package", action="append", default=[], metavar="NAME",
                        help="only this package (import or distribution name); repeatable")
    parser.add_argument("--root", type=Path, default=None,
                        help="repository root (default: the git top of the current folder)")
    parser.add_argument("--src-root", action="append", default=[], metavar="DIR",
                        help="a source root of the repository, relative to it (repeatable)")
    parser.add_argument("--snapshot-dir", type=Path, default=SNAPSHOT_DIR, metavar="DIR",
                        help=f"where the snapshots live, relative to the root ({SNAPSHOT_DIR})")
    args = parser.parse_args(argv)
    root: Path = (args.root or _repo_top()).resolve()
    packages = discover_packages(root, args.src_root)
    if args.package:
        wanted = set(args.package)
        unknown = wanted - {p.name for p in packages} - {p.dist for p in packages}
        if unknown:
            known = ", ".join(p.name for p in packages)
            print(f"api_snapshot: unknown package(s) {sorted(unknown)}; known: {known}",
                  file=sys.stderr)
            return 2
        packages = [p for p in packages if p.name in wanted or p.dist in wanted]
    for pkg in reversed(packages):  # the tree's sources win over any installed copy
        if str(pkg.src) not in sys.path:
            sys.path.insert(0, str(pkg.src))
    out_dir = root / args.snapshot_dir
    failed: list[str] = []
    for pkg in packages:
        live = render(describe_package(pkg.name))
        path = out_dir / f"{pkg.name}.json"
        rel = path.relative_to(root)
        if args.command == "update":
            out_dir.mkdir(parents=True, exist_ok=True)
            old = path.read_text(encoding="utf-8") if path.exists() else None
            if old != live:
                path.write_text(live, encoding="utf-8")
                print(f"api_snapshot: wrote {rel}")
            else:
                print(f"api_snapshot: {rel} unchanged")
            continue
        if not path.exists():
            print(f"api_snapshot: {rel} is missing: {HINT}")
            failed.append(pkg.name)
            continue
        committed = path.read_text(encoding="utf-8")
        if committed != live:
            diff = difflib.unified_diff(
                committed.splitlines(keepends=True), live.splitlines(keepends=True),
                fromfile=f"{rel} (committed)", tofile=f"{pkg.name} (live)",
            )
            sys.stdout.writelines(diff)
            print(f"api_snapshot: the public API of {pkg.name} differs from {rel}: {HINT}")
            failed.append(pkg.name)
        else:
            print(f"api_snapshot: {pkg.name} matches {rel}")
    if args.command == "check" and not args.package and out_dir.is_dir():
        present = {p.name for p in packages}
        for stale in sorted(out_dir.glob("*.json")):
            if stale.stem not in present:
                print(f"api_snapshot: {stale.relative_to(root)} has no package: {HINT}")
                failed.append(stale.stem)
    if failed:
        print(f"api_snapshot: FAILED for {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
