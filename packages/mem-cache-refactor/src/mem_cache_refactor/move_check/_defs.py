"""Top-level definitions of a tree and the moves between two trees."""

from __future__ import annotations

import ast
import copy
import difflib
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mem_cache_refactor.modpath import SourceRoots

__all__ = [
    "Definition",
    "changed_members",
    "collect_definitions",
    "find_moves",
    "source_diff",
    "unchanged_new_lines",
]


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
    #: for a class: (member name, ast.dump) of each method defined in its body
    members: tuple[tuple[str, str], ...] = ()
    #: ast.dump of the definition with its methods removed (the class "frame")
    frame: str = ""

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
        members: tuple[tuple[str, str], ...] = ()
        frame = ast.dump(node)
        if isinstance(node, ast.ClassDef):
            methods = [
                m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
            members = tuple((m.name, ast.dump(m)) for m in methods)
            rest = [m for m in node.body if m not in methods]
            shell = copy.copy(node)
            shell.body = rest
            frame = ast.dump(shell) + "|" + ",".join(m.name for m in methods)
        found[node.name] = Definition(
            module, path, node.name, kind, start, end, ast.dump(node), text, members, frame
        )
    return found


def collect_definitions(
    tree: Path, rel_paths: Iterable[str], roots: SourceRoots
) -> dict[str, dict[str, Definition]]:
    """``{module: {name: Definition}}`` for the ``.py`` files ``rel_paths`` present in ``tree``
    (module names from the tree's source ``roots``)."""
    result: dict[str, dict[str, Definition]] = {}
    for rel in sorted(rel_paths):
        module = roots.module_name(rel)
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


def changed_members(old: Definition, new: Definition) -> tuple[str, ...] | None:
    """Names of the methods whose bodies differ (added or removed ones too) when only methods
    changed; None when anything else differs (the class frame, or for functions)."""
    if old.kind != "class" or new.kind != "class":
        return None
    old_m, new_m = dict(old.members), dict(new.members)
    if old.frame.split("|")[0] != new.frame.split("|")[0]:
        return None
    return tuple(sorted(n for n in set(old_m) | set(new_m) if old_m.get(n) != new_m.get(n)))


def source_diff(old: Definition, new: Definition, context: int = 3) -> str:
    """Unified diff of the two definitions, numbered with the lines of their files."""
    a = old.source.splitlines()
    b = new.source.splitlines()
    out = [f"--- a/{old.path}:{old.start}-{old.end}\n", f"+++ b/{new.path}:{new.start}-{new.end}\n"]
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        i1, i2 = group[0][1], group[-1][2]
        j1, j2 = group[0][3], group[-1][4]
        out.append(
            f"@@ -{old.start + i1},{i2 - i1} +{new.start + j1},{j2 - j1} @@\n"
        )
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                out.extend(f" {line}\n" for line in a[a1:a2])
                continue
            out.extend(f"-{line}\n" for line in a[a1:a2])
            out.extend(f"+{line}\n" for line in b[b1:b2])
    return "".join(out) if len(out) > 2 else ""


def unchanged_new_lines(old: Definition, new: Definition) -> set[int]:
    """File line numbers of ``new`` whose text equals the matching line of ``old``."""
    matcher = difflib.SequenceMatcher(
        None, old.source.splitlines(), new.source.splitlines(), autojunk=False
    )
    lines: set[int] = set()
    for tag, _, _, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            lines.update(range(new.start + j1, new.start + j2))
    return lines
