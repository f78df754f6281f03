"""``rewrite-imports --rename-uses``: after a rename, drop the ``as old`` a rewritten import
kept and rename the file's uses of the old local name, or rename the new home's own definition
(with its uses and its ``__all__`` entry), each only where libcst's scopes show it is safe.
"""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst
from libcst.metadata import Assignment, GlobalScope, ImportAssignment, ScopeProvider

from mem_cache_refactor._rewrite_pass import dotted_name

__all__ = ["rename_definition", "rename_locals"]


def _import_binds(node: cst.CSTNode, local: str, name: str) -> bool:
    """``node`` is a ``from ... import`` statement holding ``name as local``."""
    if not isinstance(node, cst.ImportFrom) or isinstance(node.names, cst.ImportStar):
        return False
    return any(
        a.asname is not None and isinstance(a.asname.name, cst.Name)
        and a.asname.name.value == local and dotted_name(a.name) == name
        for a in node.names
    )


def _safe_local_renames(
    wrapper: cst.MetadataWrapper, renames: dict[str, str]
) -> tuple[dict[str, str], set[int]]:
    """The renames ``{old local: new name}`` that can drop their ``as``, and the ids of the
    ``Name`` nodes to rename. A rename is safe when every binding of the old local name in the
    file is the rewritten import, every use of it is a plain name, the new name is neither bound
    nor used anywhere (builtins included), and no string literal or ``global``/``nonlocal``
    statement spells the old name (``__all__``, ``getattr(m, "X")``)."""
    scopes = {s for s in wrapper.resolve(ScopeProvider).values() if s is not None}
    strings: set[str] = set()
    declared: set[str] = set()
    for node in _walk(wrapper.module):
        if isinstance(node, cst.SimpleString):
            value = node.evaluated_value
            strings.add(value if isinstance(value, str) else "")
        elif isinstance(node, (cst.Global, cst.Nonlocal)):
            declared.update(item.name.value for item in node.names)
    safe: dict[str, str] = {}
    names: set[int] = set()
    for local, new_name in renames.items():
        if local in strings or local in declared or new_name in declared:
            continue
        if any(new_name in s.assignments or new_name in s.accesses for s in scopes):
            continue
        if any(new_name in s for s in scopes):  # a builtin of that name
            continue
        assignments = [a for s in scopes for a in s.assignments[local]]
        if not assignments or not all(
            isinstance(a, ImportAssignment) and _import_binds(a.node, local, new_name)
            for a in assignments
        ):
            continue
        accesses = [acc for s in scopes for acc in s.accesses[local]]
        if not all(isinstance(acc.node, cst.Name) for acc in accesses):
            continue
        safe[local] = new_name
        names.update(id(acc.node) for acc in accesses)
    return safe, names


def _walk(node: cst.CSTNode) -> Iterable[cst.CSTNode]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(current.children)


class _RenameLocals(cst.CSTTransformer):
    """Drop ``as old`` from the rewritten imports and rename the old local's uses."""

    def __init__(self, renames: dict[str, str], names: set[int]) -> None:
        super().__init__()
        self.renames, self.names = renames, names

    def leave_ImportAlias(
        self, original_node: cst.ImportAlias, updated_node: cst.ImportAlias
    ) -> cst.ImportAlias:
        asname = updated_node.asname
        if asname is None or not isinstance(asname.name, cst.Name):
            return updated_node
        target = self.renames.get(asname.name.value)
        if target is None or dotted_name(updated_node.name) != target:
            return updated_node
        return updated_node.with_changes(asname=None)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        if id(original_node) in self.names:
            return updated_node.with_changes(value=self.renames[original_node.value])
        return updated_node


def rename_locals(module: cst.Module, renames: dict[str, str]) -> cst.Module:
    wrapper = cst.MetadataWrapper(module)
    safe, names = _safe_local_renames(wrapper, renames)
    if not safe:
        return module
    return wrapper.module.visit(_RenameLocals(safe, names))


def _all_strings(module: cst.Module) -> set[int]:
    """Ids of the string items of the module-level ``__all__`` list or tuple."""
    ids: set[int] = set()
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                targets = [t.target for t in small.targets]
            elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
                targets = [small.target]
            else:
                continue
            value = small.value
            if not any(isinstance(t, cst.Name) and t.value == "__all__" for t in targets):
                continue
            if isinstance(value, (cst.List, cst.Tuple)):
                ids.update(id(e.value) for e in value.elements
                           if isinstance(e.value, cst.SimpleString))
    return ids


def rename_definition(module: cst.Module, old: str, new: str) -> cst.Module | None:
    """Rename the module-level definition ``old`` (``def``, ``class`` or assignment) of the new
    home to ``new``: its binding, every use of it in the file and its ``__all__`` entry. None
    (nothing renamed) when that is not safe: ``new`` already bound or used (or a builtin),
    ``old`` also imported, declared ``global``/``nonlocal`` or spelled in another string."""
    wrapper = cst.MetadataWrapper(module)
    scopes = {s for s in wrapper.resolve(ScopeProvider).values() if s is not None}
    top = wrapper.module
    glob = next((s for s in scopes if isinstance(s, GlobalScope)), None)
    if glob is None or old not in glob.assignments:
        return None
    if any(new in s.assignments or new in s.accesses or new in s for s in scopes):
        return None
    in_all = _all_strings(top)
    strings: set[int] = set()
    for node in _walk(top):
        if isinstance(node, (cst.Global, cst.Nonlocal)):
            if any(item.name.value in (old, new) for item in node.names):
                return None
        elif isinstance(node, cst.SimpleString) and node.evaluated_value == old:
            if id(node) not in in_all:
                return None
            strings.add(id(node))
    names: set[int] = set()
    for assignment in glob.assignments[old]:
        if not isinstance(assignment, Assignment) or isinstance(assignment, ImportAssignment):
            return None
        bound = assignment.node
        if isinstance(bound, (cst.FunctionDef, cst.ClassDef)):
            names.add(id(bound.name))
        elif isinstance(bound, cst.Name):
            names.add(id(bound))
        else:
            return None
        for ref in assignment.references:
            if not isinstance(ref.node, cst.Name):
                return None
            names.add(id(ref.node))
    return top.visit(_RenameDefinition(old, new, names, strings))


class _RenameDefinition(cst.CSTTransformer):
    def __init__(self, old: str, new: str, names: set[int], strings: set[int]) -> None:
        super().__init__()
        self.old, self.new, self.names, self.strings = old, new, names, strings

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        if id(original_node) in self.names:
            return updated_node.with_changes(value=self.new)
        return updated_node

    def leave_SimpleString(
        self, original_node: cst.SimpleString, updated_node: cst.SimpleString
    ) -> cst.SimpleString:
        if id(original_node) in self.strings:
            return updated_node.with_changes(value=updated_node.value.replace(self.old, self.new))
        return updated_node
