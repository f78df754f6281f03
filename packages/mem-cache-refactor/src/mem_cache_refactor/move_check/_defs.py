"""Top-level definitions of a tree and the moves between two trees."""

from __future__ import annotations

import ast
import copy
import difflib
import inspect
import re
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from mem_cache_refactor.modpath import SourceRoots, resolve_relative

__all__ = [
    "Definition",
    "changed_members",
    "collect_definitions",
    "find_moves",
    "module_aliases",
    "moved_lines",
    "same_after_renames",
    "same_after_resolving",
    "same_body",
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


def _clean_docstrings(tree: ast.AST) -> ast.AST:
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
    _clean_docstrings(tree)
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


def _similarity(a: Definition, b: Definition) -> float:
    return difflib.SequenceMatcher(None, a.source, b.source, autojunk=False).ratio()


#: least source similarity (after the renames found so far) for a renamed move
RENAME_MIN_SIMILARITY = 0.75


def _renamed_source(d: Definition, renames: dict[str, str], own: str) -> str:
    """``d``'s source with its own name replaced by a placeholder and every identifier of
    ``renames`` replaced by its new name."""
    words = {**renames, d.short: own}
    pattern = re.compile(r"\b(" + "|".join(re.escape(w) for w in sorted(words, key=len,
                                                                        reverse=True)) + r")\b")
    return pattern.sub(lambda m: words[m.group(1)], d.source)


def _same_kind(old: Definition, new: Definition) -> bool:
    return old.kind == new.kind


def _rename_moves(
    left: list[Definition], appeared: list[Definition], used_old: set[int], used_new: set[int],
    pairs: list[tuple[Definition, Definition]], *, similar: bool = True,
    compatible: Callable[[Definition, Definition], bool] = _same_kind,
) -> None:
    """Pair what is left over by renamed moves: a definition that left a module and one of the
    same kind (``compatible``) that appeared under another name whose source matches once both
    names (and the renames already found) are aligned. Exact matches pair first, round after
    round (each found rename can align the next ones, e.g. constants built from renamed
    constants), then, when ``similar``, the most similar ones above
    :data:`RENAME_MIN_SIMILARITY`; the closer name breaks ties."""
    exact_only = True
    while True:
        renames = {o.short: n.short for o, n in pairs if o.short != n.short}
        found: list[tuple[float, float, int, int]] = []
        for i, old in enumerate(left):
            if i in used_old:
                continue
            a = _renamed_source(old, renames, "\0")
            for j, new in enumerate(appeared):
                if j in used_new or not compatible(old, new) or new.short == old.short:
                    continue
                b = _renamed_source(new, {}, "\0")
                same = 1.0 if a == b else (0.0 if exact_only else difflib.SequenceMatcher(
                    None, a, b, autojunk=False).ratio())
                if same == 1.0 or (not exact_only and same >= RENAME_MIN_SIMILARITY):
                    name = difflib.SequenceMatcher(
                        None, old.short.lower(), new.short.lower(), autojunk=False).ratio()
                    found.append((same, name, i, j))
        if not found:
            if exact_only and similar:
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


def _strip_staticmethod(tree: ast.Module) -> None:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.decorator_list = [d for d in node.decorator_list
                                   if not (isinstance(d, ast.Name) and d.id == "staticmethod")]


def module_aliases(source: str, module: str, is_package: bool, target: str) -> set[str]:
    """Local names that a module's top level binds to the module ``target`` itself:
    ``from pkg import target_last [as n]`` (absolute or relative) and ``import target as n``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            base = resolve_relative(module, is_package, node.level, node.module)
            found.update(a.asname or a.name for a in node.names
                         if base and f"{base}.{a.name}" == target)
        elif isinstance(node, ast.Import):
            found.update(a.asname for a in node.names if a.asname and a.name == target)
    return found


def same_after_resolving(
    old: Definition, new: Definition, aliases: set[str], bound: set[str]
) -> tuple[str, ...] | None:
    """When ``old`` becomes ``new`` by dropping the qualification of references into its new
    module (``kv_cache_builder.f(...)`` -> ``f(...)`` once the code lives in
    ``kv_cache_builder``): the references resolved (``"alias.f -> f"``); else None.

    ``aliases``: the old module's names for the new module (:func:`module_aliases`); ``bound``:
    the names the new module binds at its top level. A reference resolves only to a name the new
    module binds and the definition does not bind itself (a parameter or local of that name
    would shadow it)."""
    if not aliases:
        return None
    try:
        a, b = ast.parse(old.source), ast.parse(new.source)
    except SyntaxError:
        return None
    for tree in (a, b):
        _clean_docstrings(tree)
    if old.kind != new.kind:
        _strip_staticmethod(a)
        _strip_staticmethod(b)
    local = {n.id for n in ast.walk(a) if isinstance(n, ast.Name) and
             isinstance(n.ctx, ast.Store)} | {x.arg for x in ast.walk(a) if isinstance(x, ast.arg)}
    used: set[str] = set()

    class _Resolve(ast.NodeTransformer):
        def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
            if isinstance(node.value, ast.Name) and node.value.id in aliases and \
                    node.attr in bound and node.attr not in local:
                used.add(f"{node.value.id}.{node.attr} -> {node.attr}")
                return ast.copy_location(ast.Name(id=node.attr, ctx=node.ctx), node)
            return self.generic_visit(node)

    a = _Resolve().visit(a)
    if not used or ast.dump(a) != ast.dump(b):
        return None
    return tuple(sorted(used))


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
    _clean_docstrings(a)
    _clean_docstrings(b)
    if old.kind != new.kind:  # a static method that became a module function, or back
        _strip_staticmethod(a)
        _strip_staticmethod(b)
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
    pairs += _method_moves(before, after, pairs,
                           [d for i, d in enumerate(left) if i not in used_old],
                           [d for j, d in enumerate(appeared) if j not in used_new])
    pairs.sort(key=lambda p: (p[0].module, p[0].name))
    return pairs


#: least source similarity of a method that left its class and a same-named function or method
#: that appeared elsewhere, for them to be one definition (moved and edited)
METHOD_MIN_SIMILARITY = 0.75

_CALLABLE = ("function", "method")


def _callable_pair(old: Definition, new: Definition) -> bool:
    """Method -> function, method -> method or function -> method (not function -> function:
    top-level moves are paired before)."""
    return old.kind in _CALLABLE and new.kind in _CALLABLE and "method" in (old.kind, new.kind)


def same_body(old: Definition, new: Definition) -> bool:
    """Whether ``new`` is ``old`` unedited: the same ``ast.dump``, or for a static method that
    became a module function (or back) the same once ``@staticmethod`` is dropped."""
    if old.dump == new.dump:
        return True
    return old.kind != new.kind and old.kind in _CALLABLE and new.kind in _CALLABLE and bool(
        old.plain) and old.plain == new.plain


def _counterparts(
    defs: dict[str, dict[str, Definition]], other: dict[str, dict[str, Definition]],
    moved: dict[str, Definition],
) -> list[Definition]:
    """The methods of the classes of ``defs`` that their class in ``other`` (the moved class,
    else the one of the same module and name) does not have."""
    out: list[Definition] = []
    for mod, found in defs.items():
        for d in found.values():
            if d.kind != "class":
                continue
            there = moved.get(d.qualname) or other.get(mod, {}).get(d.name)
            has = {m.short for m in there.methods} if there and there.kind == "class" else set()
            out.extend(m for m in d.methods if m.short not in has)
    return out


def _method_moves(
    before: dict[str, dict[str, Definition]], after: dict[str, dict[str, Definition]],
    pairs: list[tuple[Definition, Definition]], left_top: list[Definition],
    appeared_top: list[Definition],
) -> list[tuple[Definition, Definition]]:
    """Methods that left their class on their own: ``C.m`` of the old tree that is gone from
    ``C`` (at its new home, when ``C`` moved), paired with a module function ``m`` or a method
    ``D.m`` that appeared in the new tree, identical bodies first, then sources at least
    :data:`METHOD_MIN_SIMILARITY` alike; then renamed ones whose sources match exactly once the
    names are aligned. Module functions that became methods pair the same way."""
    forward = {o.qualname: n for o, n in pairs if o.kind == "class"}
    backward = {n.qualname: o for o, n in pairs if n.kind == "class"}
    left = _counterparts(before, after, forward)
    left += [d for d in left_top if d.kind == "function"]
    appeared = _counterparts(after, before, backward)
    appeared += [d for d in appeared_top if d.kind == "function"]
    candidates: list[tuple[bool, float, int, int]] = []
    for i, old in enumerate(left):
        for j, new in enumerate(appeared):
            if old.short != new.short or not _callable_pair(old, new):
                continue
            same = same_body(old, new)
            ratio = 1.0 if same else _similarity(old, new)
            if same or ratio >= METHOD_MIN_SIMILARITY:
                candidates.append((same, ratio, i, j))
    candidates.sort(key=lambda c: (not c[0], -c[1], c[2], c[3]))
    used_old: set[int] = set()
    used_new: set[int] = set()
    found: list[tuple[Definition, Definition]] = []
    for _, _, i, j in candidates:
        if i in used_old or j in used_new:
            continue
        used_old.add(i)
        used_new.add(j)
        found.append((left[i], appeared[j]))
    _rename_moves(left, appeared, used_old, used_new, found, similar=False,
                  compatible=_callable_pair)
    return found


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
