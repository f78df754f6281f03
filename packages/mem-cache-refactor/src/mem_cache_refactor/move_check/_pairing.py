"""The moves between two trees: which definition that left a module is which one that appeared
(same name, renamed, a method that left its class), and whether two versions are the same once
``@staticmethod``, renames or references into the new module are accounted for."""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Callable

from mem_cache_refactor.modpath import resolve_relative
from mem_cache_refactor.move_check._defs import Definition, clean_docstrings

__all__ = [
    "find_moves",
    "module_aliases",
    "same_after_renames",
    "same_after_resolving",
    "same_body",
]


def _similarity(a: Definition, b: Definition) -> float:
    return difflib.SequenceMatcher(None, a.source, b.source, autojunk=False).ratio()


#: least source similarity (after the renames found so far) for a renamed move
RENAME_MIN_SIMILARITY = 0.75

#: least source similarity of two constants of one name, for them to be one constant (moved and
#: edited): a constant is its value alone, so unrelated ones that share a name (a tuple of names
#: in one module, a dotted path in another) are no move
CONSTANT_MIN_SIMILARITY = 0.75


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
    :data:`RENAME_MIN_SIMILARITY` (constants excepted: a renamed constant pairs only when its
    value is the same); the closer name breaks ties."""
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
                if not exact_only and old.kind == "constant":
                    continue  # renamed and edited, a constant is another one (`_V = 1`, `_D = 512`)
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
        clean_docstrings(tree)
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
    clean_docstrings(a)
    clean_docstrings(b)
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
    or appeared in several modules, identical bodies pair first, then the most similar sources
    (two constants of one name only when :data:`CONSTANT_MIN_SIMILARITY` alike).
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
            if old.name == new.name and _kinds_pair(old, new):
                same = old.dump == new.dump
                ratio = 1.0 if same else _similarity(old, new)
                if same or old.kind != "constant" or ratio >= CONSTANT_MIN_SIMILARITY:
                    candidates.append((same, ratio, i, j))
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


def _kinds_pair(old: Definition, new: Definition) -> bool:
    """Whether two definitions of one name can be one definition moved: the same kind, or a
    function and a method. A class or a function never pairs with a constant: ``X = mod.X``
    where a class ``X`` was is an alias of a definition that moved out of view (e.g. into a
    tests folder), not its new body."""
    return old.kind == new.kind or (old.kind in _CALLABLE and new.kind in _CALLABLE)


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
