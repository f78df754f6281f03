"""Top-level definitions of a tree (classes, functions, constants, and the methods of
top-level classes), and how two versions of one definition differ (changed members, a numbered
diff, the lines blame should trace). Pairing the definitions of two trees into moves is
:mod:`mem_cache_refactor.move_check._pairing`'s."""

from __future__ import annotations

import ast
import copy
import difflib
import inspect
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mem_cache_refactor.modpath import SourceRoots

__all__ = [
    "Definition",
    "changed_members",
    "clean_docstrings",
    "collect_definitions",
    "moved_lines",
    "source_diff",
    "unchanged_new_lines",
]


@dataclass(frozen=True, slots=True)
class Definition:
    """A top-level ``class``, ``def`` or ``constant`` (a module-level ``NAME = value`` /
    ``NAME: T = value`` with one plain target, dunders excepted), or a ``method``: a ``def``
    directly in the body of a top-level class, named ``Class.method``. Methods travel with their
    class; one that leaves its class on its own (into a module function or another class) is a
    move of its own (see :func:`find_moves`).
    """

    module: str
    path: str
    name: str  # "Name", or "Class.method" for a method
    kind: str  # "class" | "function" | "constant" | "method"
    start: int  # first line, decorators included (1-based)
    end: int  # last line (inclusive)
    #: ast.dump of the node: formatting-insensitive, docstrings included (their indentation
    #: cleaned as :func:`inspect.cleandoc` does)
    dump: str
    source: str  # dedented source text of the definition
    #: for a class: (member name, ast.dump) of each method defined in its body
    members: tuple[tuple[str, str], ...] = ()
    #: ast.dump of the definition with its methods removed (the class "frame")
    frame: str = ""
    #: for a class: its methods, as definitions of kind "method"
    methods: tuple[Definition, ...] = ()
    #: ast.dump without a ``@staticmethod`` decorator: a static method and the module function
    #: it becomes compare equal on this
    plain: str = ""
    #: column of the ``def``/``class`` keyword (a method moved to module level is dedented)
    indent: int = 0

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"

    @property
    def short(self) -> str:
        """The name as the ``def`` spells it (``method`` for ``Class.method``)."""
        return self.name.rpartition(".")[2]

    @property
    def parent(self) -> str:
        """The class of a method, else ``""``."""
        return self.name.rpartition(".")[0]


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


def clean_docstrings(tree: ast.AST) -> ast.AST:
    """Docstrings as Python reads them (:func:`inspect.cleandoc`: common indentation removed,
    as the compiler itself does since 3.13): a method moved to module level keeps its docstring
    although every continuation line lost four spaces of indentation."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        first = node.body[0] if node.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                isinstance(first.value.value, str):
            first.value.value = inspect.cleandoc(first.value.value)
    return tree


def _definitions_in(source: str, module: str, path: str) -> dict[str, Definition]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    clean_docstrings(tree)
    lines = source.splitlines()
    found: dict[str, Definition] = {}
    for node in tree.body:
        constant = _constant_name(node)
        if constant is not None:
            end = node.end_lineno or node.lineno
            text = textwrap.dedent("\n".join(lines[node.lineno - 1 : end])) + "\n"
            dump = ast.dump(node)
            found[constant] = Definition(
                module, path, constant, "constant", node.lineno, end, dump, text, plain=dump
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
        own: tuple[Definition, ...] = ()
        if isinstance(node, ast.ClassDef):
            methods = [
                m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
            members = tuple((m.name, ast.dump(m)) for m in methods)
            rest = [m for m in node.body if m not in methods]
            shell = copy.copy(node)
            shell.body = rest
            frame = ast.dump(shell) + "|" + ",".join(m.name for m in methods)
            own = tuple(_method(m, node.name, module, path, lines) for m in methods)
        found[node.name] = Definition(
            module, path, node.name, kind, start, end, ast.dump(node), text, members, frame,
            own, _plain_dump(node), node.col_offset,
        )
    return found


def _plain_dump(node: ast.stmt) -> str:
    """``ast.dump`` of a definition without its ``@staticmethod`` decorator."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return ast.dump(node)
    kept = [d for d in node.decorator_list
            if not (isinstance(d, ast.Name) and d.id == "staticmethod")]
    if len(kept) == len(node.decorator_list):
        return ast.dump(node)
    bare = copy.copy(node)
    bare.decorator_list = kept
    return ast.dump(bare)


def _method(
    node: ast.FunctionDef | ast.AsyncFunctionDef, cls: str, module: str, path: str,
    lines: list[str],
) -> Definition:
    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    end = node.end_lineno or node.lineno
    text = textwrap.dedent("\n".join(lines[start - 1 : end])) + "\n"
    return Definition(module, path, f"{cls}.{node.name}", "method", start, end, ast.dump(node),
                      text, plain=_plain_dump(node), indent=node.col_offset)


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


def changed_members(old: Definition, new: Definition) -> tuple[str, ...] | None:
    """Names of the methods whose bodies differ (added or removed ones too) when only methods
    changed; None when anything else differs (the class frame, or for functions)."""
    if old.kind != "class" or new.kind != "class":
        return None
    old_m, new_m = dict(old.members), dict(new.members)
    if old.frame.split("|")[0] != new.frame.split("|")[0]:
        return None
    return tuple(sorted(n for n in set(old_m) | set(new_m) if old_m.get(n) != new_m.get(n)))


def _numbered(d: Definition, other: Definition) -> list[tuple[int, str]]:
    """``d``'s source lines with their file line numbers; a ``@staticmethod`` line is left out
    when the other side is of another kind (a static method that became a module function:
    dropping the decorator is part of the move, not an edit)."""
    rows = list(enumerate(d.source.splitlines(), d.start))
    if d.kind != other.kind and d.plain != d.dump:
        rows = [(n, text) for n, text in rows if text.strip() != "@staticmethod"]
    return rows


def source_diff(old: Definition, new: Definition, context: int = 3) -> str:
    """Unified diff of the two definitions, numbered with the lines of their files."""
    rows_a, rows_b = _numbered(old, new), _numbered(new, old)
    a = [text for _, text in rows_a]
    b = [text for _, text in rows_b]
    out = [f"--- a/{old.path}:{old.start}-{old.end}\n", f"+++ b/{new.path}:{new.start}-{new.end}\n"]
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)

    def first(rows: list[tuple[int, str]], i: int, start: int) -> int:
        return rows[i][0] if i < len(rows) else (rows[-1][0] + 1 if rows else start)

    for group in matcher.get_grouped_opcodes(context):
        i1, i2 = group[0][1], group[-1][2]
        j1, j2 = group[0][3], group[-1][4]
        out.append(
            f"@@ -{first(rows_a, i1, old.start)},{i2 - i1} "
            f"+{first(rows_b, j1, new.start)},{j2 - j1} @@\n"
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


def moved_lines(old: Definition, new: Definition) -> set[int]:
    """File line numbers of ``new`` that carry moved code, for blame to trace: every line but
    the blank and comment-only lines the move added (an identical AST allows those, and they
    have no history to follow)."""
    same = unchanged_new_lines(old, new)
    out: set[int] = set()
    for n, text in enumerate(new.source.splitlines(), new.start):
        bare = text.strip()
        if n in same or (bare and not bare.startswith("#")):
            out.add(n)
    return out
