"""Finding modules without importing them, and saying why one cannot be found.

:class:`Locator` finds module files on a search path the way Python's path finder does (regular
packages, modules, namespace folders, extension modules); :func:`unresolved_modules` names the
modules an eager-import contract could not see, so that a contract never passes without
checking.
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mem_cache_refactor.modpath import SKIP_DIRS

__all__ = ["Located", "Locator", "unresolved_modules", "within"]

_EXTENSION_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def within(module: str, roots: Iterable[str]) -> bool:
    """``module`` is one of ``roots`` or inside one of them."""
    return any(module == r or module.startswith(r + ".") for r in roots)



@dataclass(frozen=True, slots=True)
class Located:
    """Where a module lives: its ``file`` (None for a namespace folder) and, for a package or
    namespace folder, the folders that hold its submodules."""

    module: str
    file: Path | None
    folders: tuple[Path, ...] = ()

    @property
    def is_package(self) -> bool:
        return bool(self.folders)


def _find_in(name: str, folders: Sequence[Path]) -> tuple[Path | None, tuple[Path, ...]] | None:
    """Python's path-finder rule for ``name`` in ``folders``: the first regular package or
    module wins; else every folder of that name is a portion of a namespace package."""
    portions: list[Path] = []
    for folder in folders:
        candidate = folder / name
        init = candidate / "__init__.py"
        if init.is_file():
            return init, (candidate,)
        as_file = folder / f"{name}.py"
        if as_file.is_file():
            return as_file, ()
        for suffix in _EXTENSION_SUFFIXES:
            ext = folder / f"{name}{suffix}"
            if ext.is_file():
                return ext, ()
        if candidate.is_dir():
            portions.append(candidate)
    if portions:
        return None, tuple(portions)
    return None


class Locator:
    """Finds modules on ``search_path`` without importing anything; ``root_packages`` are the
    internal packages (the others are external)."""

    def __init__(self, search_path: Iterable[str | Path], root_packages: Iterable[str]) -> None:
        self.search_path = [Path(p) if str(p) else Path.cwd() for p in search_path]
        self.root_packages = tuple(dict.fromkeys(root_packages))
        self._cache: dict[str, Located | None] = {}

    def is_internal(self, module: str) -> bool:
        return within(module, self.root_packages)

    def locate(self, module: str) -> Located | None:
        """The module's location, or None when it cannot be found."""
        if module in self._cache:
            return self._cache[module]
        parent, _, name = module.rpartition(".")
        found: Located | None = None
        if not name.isidentifier():
            pass
        elif not parent:
            hit = _find_in(name, self.search_path)
            if hit is not None:
                found = Located(module, *hit)
        else:
            outer = self.locate(parent)
            if outer is not None and outer.is_package:
                hit = _find_in(name, outer.folders)
                if hit is not None:
                    found = Located(module, *hit)
        self._cache[module] = found
        return found

    def submodules(self, module: str) -> list[str]:
        """``module`` and every module below it (namespace folders included), sorted."""
        top = self.locate(module)
        if top is None:
            return []
        found = {module}
        stack = [(module, folder) for folder in top.folders]
        while stack:
            name, folder = stack.pop()
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:
                if entry.name in SKIP_DIRS:
                    continue
                stem = entry.name
                if entry.is_dir():
                    if stem.isidentifier():
                        child = f"{name}.{stem}"
                        if self.locate(child) is not None and child not in found:
                            found.add(child)
                            stack.append((child, Path(entry.path)))
                    continue
                for suffix in (".py", *_EXTENSION_SUFFIXES):
                    if stem.endswith(suffix) and stem[: -len(suffix)].isidentifier():
                        base = stem[: -len(suffix)]
                        if base != "__init__":
                            found.add(f"{name}.{base}")
                        break
        return sorted(found)

    def explain(self, module: str) -> str:
        """Why ``module`` cannot be found (for an internal name)."""
        parts = module.split(".")
        top = parts[0]
        if self.locate(top) is None:
            where = ", ".join(str(p) for p in self.search_path[:4]) or "(empty)"
            more = " ..." if len(self.search_path) > 4 else ""
            return (f"its root package {top} is not on the search path (not installed, or the "
                    f"wrong source root: searched {where}{more})")
        for i in range(1, len(parts)):
            prefix = ".".join(parts[: i + 1])
            if self.locate(prefix) is not None:
                continue
            outer = self.locate(".".join(parts[:i]))
            assert outer is not None
            if not outer.is_package:
                return f"{outer.module} is a module ({outer.file}), not a package"
            folders = ", ".join(str(f) for f in outer.folders)
            kind = "namespace folder (no __init__.py)" if outer.file is None else "package"
            return (f"the {kind} {outer.module} ({folders}) has no {parts[i]}.py or {parts[i]}/ "
                    "(misspelt, or moved?)")
        return "not found"  # pragma: no cover - locate() and explain() agree


def _names_import_of(file: Path, module: str) -> bool:
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    top = module.split(".", maxsplit=1)[0]
    if top not in text:
        return False
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if any(within(a.name, [module]) for a in node.names):
                return True
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if within(node.module, [module]):
                return True
            if any(within(f"{node.module}.{a.name}", [module]) for a in node.names):
                return True
    return False


def _imported_anywhere(locator: Locator, module: str) -> bool:
    """Some file of the root packages imports ``module`` (or a module below it)."""
    for root in locator.root_packages:
        located = locator.locate(root)
        if located is None:
            continue
        files = [located.file] if located.file is not None else []
        for folder in located.folders:
            for dirpath, dirnames, filenames in os.walk(folder):
                dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
                files.extend(Path(dirpath, f) for f in filenames if f.endswith(".py"))
        if any(f is not None and _names_import_of(f, module) for f in files):
            return True
    return False


def unresolved_modules(
    locator: Locator, sources: Iterable[str], forbidden: Iterable[str]
) -> list[str]:
    """One message per source or forbidden module the check could not see (so a contract never
    passes without checking): a source outside the root packages or not found, an internal
    forbidden module not found, an external one neither installed nor imported anywhere."""
    errors: list[str] = []
    roots = ", ".join(locator.root_packages) or "(none)"
    for source in sources:
        if not locator.is_internal(source):
            errors.append(f"source module {source} is not inside the root packages ({roots}): "
                          "the wrong root? add its package to root_packages")
        elif locator.locate(source) is None:
            errors.append(f"source module {source} not found: {locator.explain(source)}")
    for name in forbidden:
        if locator.is_internal(name):
            if locator.locate(name) is None:
                errors.append(f"forbidden module {name} not found: {locator.explain(name)}")
        elif locator.locate(name) is None and not _imported_anywhere(locator, name):
            errors.append(f"forbidden module {name} is not installed and no module of the root "
                          f"packages ({roots}) imports it: misspelt, or the wrong root?")
    return errors
