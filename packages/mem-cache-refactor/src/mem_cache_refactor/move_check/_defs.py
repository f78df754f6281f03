"""Top-level definitions of a tree and the moves between two trees."""

from __future__ import annotations

import ast
import copy
import difflib
import re
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
    "same_after_renames",
    "source_diff",
    "unchanged_new_lines",
]


@dataclass(frozen=True, slots=True)
class Definition:
    """A top-level ``class``, ``def`` (methods travel with their class) or ``constant`` (a
    module-level ``NAME = value`` / ``NAME: T = value`` with one plain target, dunders excepted).
    """

    module: str
    path: str
    name: str
    kind: str  # "class" | "function" | "constant"
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


def _constant_name(node: ast.stmt) -> str | None:
    """The name a module-level ``NAME = value`` / ``NAME: T = value`` binds (one plain target,
    not a dunder such as ``__all__``), else None."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target: ast.expr = node.targets[0]
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        target = node.target
    else:
        return None
    if not isinstance(target, ast.Name) or target.id.startswith("__"):
        return None
    return target.id


def _definitions_in(source: str, module: str, path: str) -> dict[str, Definition]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    lines = source.splitlines()
    found: dict[str, Definition] = {}
    for node in tree.body:
        constant = _constant_name(node)
        if constant is not None:
            end = node.end_lineno or node.lineno
            text = textwrap.dedent("\n".join(lines[node.lineno - 1 : end])) + "\n"
            found[constant] = Definition(
                module, path, constant, "constant", node.lineno, end, ast.dump(node), text
            )
            continue
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


#: least source similarity (after the renames found so far) for a renamed move
RENAME_MIN_SIMILARITY = 0.75


def _renamed_source(d: Definition, renames: dict[str, str], own: str) -> str:
    """``d``'s source with its own name replaced by a placeholder and every identifier of
    ``renames`` replaced by its new name."""
    words = {**renames, d.name: own}
    pattern = re.compile(r"\b(" + "|".join(re.escape(w) for w in sorted(words, key=len,
                                                                        reverse=True)) + r")\b")
    return pattern.sub(lambda m: words[m.group(1)], d.source)


def _rename_moves(
    left: list[Definition], appeared: list[Definition], used_old: set[int], used_new: set[int],
    pairs: list[tuple[Definition, Definition]],
) -> None:
    """Pair what is left over by renamed moves: a definition that left a module and one of the
    same kind that appeared under another name whose source matches once both names (and the
    renames already found) are aligned. Exact matches pair first, round after round (each
    found rename can align the next ones, e.g. constants built from renamed constants), then
    the most similar ones above :data:`RENAME_MIN_SIMILARITY`; the closer name breaks ties."""
    exact_only = True
    while True:
        renames = {o.name: n.name for o, n in pairs if o.name != n.name}
        found: list[tuple[float, float, int, int]] = []
        for i, old in enumerate(left):
            if i in used_old:
                continue
            a = _renamed_source(old, renames, "\0")
            for j, new in enumerate(appeared):
                if j in used_new or new.kind != old.kind or new.name == old.name:
                    continue
                b = _renamed_source(new, {}, "\0")
                same = 1.0 if a == b else (0.0 if exact_only else difflib.SequenceMatcher(
                    None, a, b, autojunk=False).ratio())
                if same == 1.0 or (not exact_only and same >= RENAME_MIN_SIMILARITY):
                    name = difflib.SequenceMatcher(
                        None, old.name.lower(), new.name.lower(), autojunk=False).ratio()
                    found.append((same, name, i, j))
        if not found:
            if exact_only:
                exact_only = False
                continue
            return
        found.sort(key=lambda c: (-c[0], -c[1], c[2], c[3]))
        for _, _, i, j in found:
            if i in used_old or j in used_new:
                continue
            used_old.add(i)
            used_new.add(j)
            pairs.append((left[i], appeared[j]))
        exact_only = True


def same_after_renames(
    old: Definition, new: Definition, renames: dict[str, str]
) -> tuple[str, ...] | None:
    """When ``old`` becomes ``new`` by renaming identifiers alone (``renames``: old -> new
    name, the moved definitions' own renames included), the renames it used (``"a -> b"``);
    else None. Names (``ast.Name``), definition names and import aliases are renamed;
    attributes, strings and docstrings must match as they are."""
    try:
        a, b = ast.parse(old.source), ast.parse(new.source)
    except SyntaxError:
        return None
    used: set[str] = set()

    class _Rename(ast.NodeTransformer):
        def _sub(self, name: str) -> str:
            if name in renames:
                used.add(name)
                return renames[name]
            return name

        def visit_Name(self, node: ast.Name) -> ast.Name:
            node.id = self._sub(node.id)
            return node

        def generic_visit(self, node: ast.AST) -> ast.AST:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                node.name = self._sub(node.name)
            return super().generic_visit(node)

    a = _Rename().visit(a)
    if ast.dump(a) != ast.dump(b) or not used:
        return None
    return tuple(f"{n} -> {renames[n]}" for n in sorted(used))


def find_moves(
    before: dict[str, dict[str, Definition]], after: dict[str, dict[str, Definition]]
) -> list[tuple[Definition, Definition]]:
    """Pair each definition that left a module with one of the same name that appeared elsewhere,
    then the rest by renamed moves (see :func:`_rename_moves`).

    ``before``/``after`` hold the definitions of the changed files at each ref. When a name left
    or appeared in several modules, identical bodies pair first, then the most similar sources.
    A definition renamed in place (same module, new name) counts as a move too.
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
    _rename_moves(left, appeared, used_old, used_new, pairs)
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
