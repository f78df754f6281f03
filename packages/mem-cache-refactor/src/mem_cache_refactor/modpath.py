"""Import roots of a repository and the dotted module names of its files.

A repository keeps its importable code under one or more *source roots*: the folders that go on
``sys.path``. They are found, in this order of priority:

1. ``--src-root DIR`` given by the user (repeatable);
2. every ``pyproject.toml`` in the tree (outside hidden, virtual-environment and build folders):
   setuptools ``[tool.setuptools] package-dir`` (``"" = "src"``, or ``pkg = "lib/pkg"``) and
   ``[tool.setuptools.packages.find] where``; hatch ``[tool.hatch.build.targets.wheel] packages``
   (``"src/pkg"`` -> ``src``) and ``sources``; poetry ``packages = [{include, from}]``; pdm
   ``package-dir``. A project file that names none of these is auto-discovered like setuptools
   does: its ``src/`` folder when there is one, else its own folder (``python/pyproject.toml``
   -> ``python/``);
3. every ``src/`` folder, and a top-level ``python/`` folder;
4. the repository top itself, always last (``tests/``, ``tools/``, flat layouts).

A file belongs to the deepest root that holds it, and its module name never carries the root
folder (``python/engine/srt/mem_cache/allocator/__init__.py`` -> ``engine.srt.mem_cache.allocator``
).
A file only under the top whose path has a ``src`` folder is named from below its last ``src``.
Paths whose parts are not Python identifiers (``packages/mem-cache-pool/tests/...``) have no
module name.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "SKIP_DIRS",
    "SourceRoots",
    "iter_tree_files",
    "module_name_for_path",
    "resolve_relative",
]

#: folders never searched for sources or project files
SKIP_DIRS = frozenset({
    ".git", ".hg", ".svn", ".venv", "venv", ".tox", ".nox", "node_modules", "__pycache__",
    "build", "dist", ".cache", ".mypy_cache", ".ruff_cache", ".pytest_cache", "site-packages",
})


def iter_tree_files(tree: Path) -> list[str]:
    """POSIX paths (relative to ``tree``) of every file below it, skipping :data:`SKIP_DIRS`."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        rel_dir = Path(dirpath).relative_to(tree).as_posix()
        for name in sorted(filenames):
            found.append(name if rel_dir == "." else f"{rel_dir}/{name}")
    return found


def _norm(rel: str) -> str:
    """``rel`` as a normalized POSIX path relative to the top ("" for the top itself)."""
    parts = [p for p in PurePosixPath(rel.replace(os.sep, "/")).parts if p not in ("", ".")]
    out: list[str] = []
    for p in parts:
        if p == "..":
            if out:
                out.pop()
        else:
            out.append(p)
    return "/".join(out)


def _join(base: str, rel: str) -> str:
    return _norm(f"{base}/{rel}" if base else rel)


def _get(table: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(table, dict):
            return None
        table = table.get(key)
    return table


def _roots_from_pyproject(data: dict[str, Any], base: str, has_dir: Any) -> list[str]:
    """Source roots declared by one ``pyproject.toml`` whose folder is ``base``."""
    roots: list[str] = []
    package_dir = _get(data, "tool", "setuptools", "package-dir")
    if isinstance(package_dir, dict):
        for key, value in package_dir.items():
            if not isinstance(value, str):
                continue
            if key == "":
                roots.append(_join(base, value))
            elif "." not in key and PurePosixPath(value).name == key:
                roots.append(_join(base, str(PurePosixPath(value).parent)))
    where = _get(data, "tool", "setuptools", "packages", "find", "where")
    if isinstance(where, list):
        roots.extend(_join(base, w) for w in where if isinstance(w, str))
    for table in (("tool", "hatch", "build", "targets", "wheel"), ("tool", "hatch", "build")):
        packages = _get(data, *table, "packages")
        if isinstance(packages, list):
            roots.extend(
                _join(base, str(PurePosixPath(p).parent)) for p in packages if isinstance(p, str)
            )
        sources = _get(data, *table, "sources")
        if isinstance(sources, list):
            roots.extend(_join(base, s) for s in sources if isinstance(s, str))
        elif isinstance(sources, dict):
            roots.extend(
                _join(base, k) for k, v in sources.items() if isinstance(k, str) and v == ""
            )
    poetry = _get(data, "tool", "poetry", "packages")
    if isinstance(poetry, list):
        for entry in poetry:
            if isinstance(entry, dict) and isinstance(entry.get("from"), str):
                roots.append(_join(base, entry["from"]))
    pdm = _get(data, "tool", "pdm", "build", "package-dir")
    if isinstance(pdm, str):
        roots.append(_join(base, pdm))
    if roots:
        return roots
    declares_project = any(k in data for k in ("project", "build-system")) or isinstance(
        _get(data, "tool", "setuptools"), dict
    )
    if not declares_project:
        return []
    src = _join(base, "src")
    return [src] if has_dir(src) else [base]


@dataclass(frozen=True, slots=True)
class SourceRoots:
    """The import roots of a tree, relative POSIX paths in ``sys.path`` order ("" = the top)."""

    roots: tuple[str, ...]

    @classmethod
    def discover(
        cls, tree: Path, files: Iterable[str] | None = None, extra: Sequence[str | Path] = ()
    ) -> SourceRoots:
        """Find the roots of ``tree`` (see the module docstring).

        ``files``: the tree's file paths when already known (else the tree is walked);
        ``extra``: user-given roots (``--src-root``), relative to the top or absolute inside it.
        """
        tree = tree.resolve()
        all_files = [_norm(f) for f in (iter_tree_files(tree) if files is None else files)]
        dirs: set[str] = {""}
        for f in all_files:
            parent = PurePosixPath(f).parent
            while str(parent) not in ("", "."):
                dirs.add(str(parent))
                parent = parent.parent

        def has_dir(rel: str) -> bool:
            return rel in dirs

        ordered: dict[str, None] = {}
        for root in extra:
            path = Path(root)
            if path.is_absolute():
                try:
                    path = path.resolve().relative_to(tree)
                except ValueError:
                    continue  # outside this tree: the caller puts it on sys.path itself
            ordered[_norm(path.as_posix())] = None
        found: list[str] = []
        for f in sorted(all_files, key=lambda p: (p.count("/"), p)):
            if PurePosixPath(f).name != "pyproject.toml":
                continue
            if any(part in SKIP_DIRS for part in PurePosixPath(f).parts[:-1]):
                continue
            try:
                data = tomllib.loads((tree / f).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                continue
            found.extend(_roots_from_pyproject(data, _norm(str(PurePosixPath(f).parent)),
                                               has_dir))
        found.extend(d for d in ("src", "python") if has_dir(d))
        found.extend(d for d in dirs if PurePosixPath(d).name == "src")
        for root in sorted(found, key=lambda r: (-r.count("/") if r else 1, r)):
            if root and has_dir(root):
                ordered[root] = None
        ordered.pop("", None)
        return cls((*ordered, ""))

    def root_of(self, rel_path: str) -> str:
        """The deepest root that holds ``rel_path``."""
        rel = _norm(rel_path)
        best = ""
        for root in self.roots:
            if root and (rel == root or rel.startswith(root + "/")) and len(root) > len(best):
                best = root
        return best

    def module_name(self, rel_path: str) -> str | None:
        """Dotted module name of the ``.py`` file ``rel_path`` (relative to the top), or None."""
        rel = _norm(rel_path)
        root = self.root_of(rel)
        parts = list(PurePosixPath(rel).parts)
        if root:
            parts = parts[len(PurePosixPath(root).parts) :]
        elif "src" in parts[:-1]:
            last_src = len(parts) - 1 - parts[::-1].index("src")
            parts = parts[last_src + 1 :]
        return _dotted_from_parts(parts)

    def paths(self, tree: Path) -> list[Path]:
        """The roots as absolute folders of ``tree``, in ``sys.path`` order."""
        return [tree / r if r else tree for r in self.roots]


def _dotted_from_parts(parts: list[str]) -> str | None:
    if not parts or not parts[-1].endswith(".py"):
        return None
    parts = [*parts[:-1], parts[-1][: -len(".py")]]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


def module_name_for_path(rel_path: str, roots: SourceRoots | None = None) -> str | None:
    """Dotted module name of ``rel_path`` (POSIX, relative to the top), or None.

    Without ``roots`` only the top and ``src`` folders count as roots.
    """
    return (roots or SourceRoots(("",))).module_name(rel_path)


def resolve_relative(module: str | None, is_package: bool, level: int, target: str | None) -> str:
    """Absolute module named by ``from <'.' * level><target> import ...`` inside ``module``.

    Returns ``target`` unchanged when ``level`` is 0, and "" when it cannot be resolved.
    """
    if level == 0:
        return target or ""
    if module is None:
        return ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level - 1 > len(base) or (level - 1 == len(base)):
        return ""
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)
