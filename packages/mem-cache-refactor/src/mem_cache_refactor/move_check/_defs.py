"""Top-level definitions of a tree and the moves between two trees."""

from __future__ import annotations

import ast
import difflib
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mem_cache_refactor.modpath import module_name_for_path

__all__ = ["Definition", "collect_definitions", "find_moves", "source_diff"]


@dataclass(frozen=True, slots=True)
class Definition:
    """A top-level ``class`` or ``def`` (methods travel with their class)."""

    module: str
    path: str
    name: str
    kind: str  # "class" | "function"
    start: int  # first line, decorators included (1-based)
    end: int  # last line (inclusive)
    dump: str  # ast.dump of the node: formatting-insensitive, docstrings included
    source: str  # dedented source text of the definition

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


def _definitions_in(source: str, module: str, path: str) -> dict[str, Definition]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    lines = source.splitlines()
    found: dict[str, Definition] = {}
    for node in tree.body:
        if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        end = node.end_lineno or node.lineno
        text = textwrap.dedent("\n".join(lines[start - 1 : end])) + "\n"
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        found[node.name] = Definition(
            module, path, node.name, kind, start, end, ast.dump(node), text
        )
    return found


def collect_definitions(tree: Path, rel_paths: Iterable[str]) -> dict[str, dict[str, Definition]]:
    """``{module: {name: Definition}}`` for the ``.py`` files ``rel_paths`` present in ``tree``."""
    result: dict[str, dict[str, Definition]] = {}
    for rel in sorted(rel_paths):
        module = module_name_for_path(rel)
        file = tree / rel
        if module is None or not file.is_file():
            continue
        source = file.read_text(encoding="utf-8", errors="replace")
        result.setdefault(module, {}).update(_definitions_in(source, module, rel))
    return result


def _similarity(a: Definition, b: Definition) -> float:
    return difflib.SequenceMatcher(None, a.source, b.source, autojunk=False).ratio()


def find_moves(
    before: dict[str, dict[str, Definition]], after: dict[str, dict[str, Definition]]
) -> list[tuple[Definition, Definition]]:
    """Pair each definition that left a module with one of the same name that appeared elsewhere.

    ``before``/``after`` hold the definitions of the changed files at each ref. When a name left
    or appeared in several modules, identical bodies pair first, then the most similar sources.
    """
    left = [
        d for mod, defs in before.items() for n, d in defs.items() if n not in after.get(mod, {})
    ]
    appeared = [
        d for mod, defs in after.items() for n, d in defs.items() if n not in before.get(mod, {})
    ]
    candidates: list[tuple[bool, float, int, int]] = []
    for i, old in enumerate(left):
        for j, new in enumerate(appeared):
            if old.name == new.name:
                same = old.dump == new.dump
                candidates.append((same, 1.0 if same else _similarity(old, new), i, j))
    candidates.sort(key=lambda c: (not c[0], -c[1], c[2], c[3]))
    used_old: set[int] = set()
    used_new: set[int] = set()
    pairs: list[tuple[Definition, Definition]] = []
    for _, _, i, j in candidates:
        if i in used_old or j in used_new:
            continue
        used_old.add(i)
        used_new.add(j)
        pairs.append((left[i], appeared[j]))
    pairs.sort(key=lambda p: (p[0].module, p[0].name))
    return pairs


def source_diff(old: Definition, new: Definition) -> str:
    """Unified diff of the two definitions' source texts."""
    return "".join(
        difflib.unified_diff(
            old.source.splitlines(keepends=True),
            new.source.splitlines(keepends=True),
            fromfile=f"a/{old.path}:{old.start}",
            tofile=f"b/{new.path}:{new.start}",
        )
    )
