"""Import sites that still reach a moved definition through its old module (static, via ast)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mem_cache_refactor.modpath import SourceRoots, resolve_relative

__all__ = ["ImportSite", "find_import_sites"]


@dataclass(frozen=True, slots=True)
class ImportSite:
    """``path:line`` uses ``target`` (``old.module.Name``) through the old module."""

    path: str
    line: int
    target: str
    code: str


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _sites_in_file(
    source: str, rel: str, targets: set[str], roots: SourceRoots
) -> list[tuple[int, str]]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    module = roots.module_name(rel)
    is_package = rel.endswith("__init__.py")
    old_modules = {t.rpartition(".")[0] for t in targets}
    hits: list[tuple[int, str]] = []
    aliases: dict[str, str] = {}  # local name -> module (import x as y; from a import b)
    plain_heads: set[str] = set()  # heads bound by `import a.b.c` (no alias)
    # a method target ``module.Class.method``: in ``module`` itself, ``Class.method`` is a site
    own = {c.name for c in tree.body if isinstance(c, ast.ClassDef)}
    for owner in old_modules:
        mod, _, cls = owner.rpartition(".")
        if mod and mod == module and cls in own:
            aliases[cls] = owner
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = resolve_relative(module, is_package, node.level, node.module)
            if not base:
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in targets or (alias.name == "*" and base in old_modules):
                    hits.append((node.lineno, full if alias.name != "*" else f"{base}.*"))
                elif full in old_modules:
                    aliases[alias.asname or alias.name] = full
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    plain_heads.add(alias.name.split(".")[0])
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        dotted = _dotted(node)
        if dotted is None:
            continue
        head, _, rest = dotted.partition(".")
        if head in aliases:
            full = f"{aliases[head]}.{rest}"
        elif head in plain_heads:
            full = dotted
        else:
            continue
        if full in targets:
            hits.append((node.lineno, full))
    return hits


def find_import_sites(
    tree: Path, rel_paths: Iterable[str], targets: set[str], roots: SourceRoots | None = None
) -> list[ImportSite]:
    """Every place in the ``.py`` files of ``tree`` that reaches one of ``targets`` (dotted
    ``old.module.Name``) through its old module: ``from old import Name [as X]``, relative
    forms, ``from old import *``, and ``old.Name`` after ``import old [as o]`` or
    ``from pkg import old``, at module level and inside functions and classes alike, in every
    file of the tree (inside a source root or not). A method target ``old.module.Class.m`` is
    reached through its class: ``Class.m`` after ``from old import Class [as C]``, in ``old``
    itself, or as ``old.Class.m``; a call through an instance (``obj.m()``) is not seen (its
    type is not known statically). ``roots`` name the files' modules (for relative imports);
    default: the tree's top and ``src`` folders."""
    roots = roots or SourceRoots(("",))
    sites: list[ImportSite] = []
    if not targets:
        return sites
    # every site spells the moved name, or (``from old import *``) the old module's last part
    needles = {t.rpartition(".")[2] for t in targets} | {
        t.rpartition(".")[0].rpartition(".")[2] for t in targets}
    for rel in sorted(rel_paths):
        if not rel.endswith(".py"):
            continue
        file = tree / rel
        if not file.is_file():
            continue
        source = file.read_text(encoding="utf-8", errors="replace")
        if not any(needle in source for needle in needles):
            continue
        lines = source.splitlines()
        for line, target in sorted(set(_sites_in_file(source, rel, targets, roots))):
            code = lines[line - 1].strip() if 0 < line <= len(lines) else ""
            sites.append(ImportSite(rel, line, target, code))
    return sites
