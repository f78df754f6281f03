"""Map repository file paths to dotted module names (shared by move_check and rewrite_imports).

Layout rules: a file under a ``src/`` directory belongs to the import root that ``src/`` is
(``packages/mem-cache-pool/src/mem_cache_pool/mha.py`` -> ``mem_cache_pool.mha``); any other
file is named from the repository root (``pkga/util.py`` -> ``pkga.util``,
``tools/move_check/core.py`` -> ``tools.move_check.core``). Paths whose parts are not Python
identifiers (``packages/mem-cache-pool/tests/...``) have no module name.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path, PurePosixPath

__all__ = ["import_roots", "module_name_for_path", "resolve_relative"]


def module_name_for_path(rel_path: str) -> str | None:
    """Dotted module name of ``rel_path`` (POSIX, relative to the repo root), or None."""
    parts = list(PurePosixPath(rel_path).parts)
    if not parts or not parts[-1].endswith(".py"):
        return None
    if "src" in parts[:-1]:
        last_src = len(parts) - 1 - parts[::-1].index("src")
        parts = parts[last_src + 1 :]
    parts[-1] = parts[-1][: -len(".py")]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


def import_roots(tree: Path, rel_paths: Iterable[str]) -> list[Path]:
    """Directories to put on ``sys.path`` so that the modules of ``rel_paths`` import from ``tree``.

    Every ``.../src`` directory that holds one of the files, then ``tree`` itself.
    """
    roots: dict[str, None] = {}
    for rel in sorted(rel_paths):
        parts = PurePosixPath(rel).parts
        if "src" in parts[:-1]:
            last_src = len(parts) - 1 - parts[::-1].index("src")
            roots[str(PurePosixPath(*parts[: last_src + 1]))] = None
    return [*(tree / r for r in roots), tree]


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
