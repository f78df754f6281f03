"""Rewrite every import of an old dotted path to a new one (a libcst transformer, no formatter).

``rewrite-imports OLD.DOTTED NEW.DOTTED [paths...] [--check] [--rename-uses] [--src-root DIR ...]``

(``--check`` changes nothing: it lists the files that would change and exits 1 if there are any.)
A file's own module name (needed to resolve its relative imports) comes from the source roots of
its repository (:class:`mem_cache_refactor.modpath.SourceRoots`: ``pyproject.toml``, ``src/``,
``python/``, or ``--src-root DIR``).

``OLD`` is a module (``mem_cache_pool.old_mod``) or a name in a module
(``mem_cache_pool.old_mod.Helper``); so is ``NEW``. Both need at least two components. Paths are
files or directories (searched for ``*.py`` and ``*.md``, skipping hidden and
virtual-environment folders); default: the current directory. In a Markdown file only the fenced
``python`` code blocks are rewritten, each on its own (prose is not). Handled forms:

* ``from a.b import X`` / ``from a.b import X as Y`` -> ``from c.d import X [as Y]``; a
  multi-name import where only some names moved is split (the rest stay where they were);
  relative imports (``from .b import X``) are resolved from the file's module name and rewritten
  to absolute ones;
* ``import a.b`` / ``import a.b as m`` when ``a.b`` (or a submodule) itself moved;
* attribute references ``a.b.X`` (after ``import a.b``), ``m.X`` (after ``import a.b as m``) and
  ``b.X`` (after ``from a import b``): rewritten to ``c.d.X`` with an ``import c.d`` added right
  after the import that served them (or to an existing alias of ``c.d``); the old import is
  removed when nothing else uses it, so no stale import is left.

In the new home itself, an import of the moved name is dropped and ``old.X`` becomes ``X``.
A rename inside one module (``a.b.X`` -> ``a.b.Z``) keeps the binding of ``a.b`` that served
the chains (``m.X`` -> ``m.Z``). Everything else stays byte-identical (no reformatting). When
the last component changes (a rename), ``from a.b import X`` becomes ``from c.d import Z as X``
so the code below still works; with ``--rename-uses`` it becomes ``from c.d import Z`` and the
file's uses of ``X`` are renamed (scope-checked through libcst; the ``as`` stays where that is
not safe: ``X`` bound by anything else, ``Z`` already bound or used or a builtin, ``X`` spelled
in a string such as ``__all__``). This works for a renamed module as well
(``from a import b`` + ``b.X`` -> ``from a import d`` + ``d.X``). With ``--rename-uses``, the
new home's own definition of the old name (``def``, ``class`` or a module-level assignment) is
renamed as well, with its uses in that file and its ``__all__`` entry, so
``rewrite-imports a.b.X a.b.Z --rename-uses`` is a whole rename (prose such as docstrings
excepted).
Not handled: string references (``"a.b.X"``, ``importlib.import_module``), imports inside
one-line compound statements (``if x: import y``), and ``import a.b`` whose head ``a`` is also
used for other attributes after a top-level rename. Run ``ruff check --fix`` (isort) afterwards
to re-sort the import blocks.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import libcst as cst
from libcst.metadata import Assignment, GlobalScope, ImportAssignment, ScopeProvider

from mem_cache_refactor._import_style import (
    DEFAULT_LINE_LENGTH,
    arrange_block,
    from_import,
    line_length_for,
    name_key,
)
from mem_cache_refactor.modpath import SKIP_DIRS, SourceRoots, resolve_relative

__all__ = ["iter_python_files", "main", "rewrite_file", "rewrite_markdown", "rewrite_source"]



def _dotted(node: cst.BaseExpression) -> str | None:
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def _moved(path: str, old: str) -> bool:
    return path == old or path.startswith(old + ".")


def _renamed(path: str, old: str, new: str) -> str:
    return new + path[len(old) :]


def _alias_text(alias: cst.ImportAlias) -> str:
    text = cst.Module(body=[]).code_for_node(alias.name)
    if alias.asname is not None:
        text += " as " + cst.Module(body=[]).code_for_node(alias.asname.name)
    return text


def _expr(dotted: str) -> cst.Attribute | cst.Name:
    expr = cst.parse_expression(dotted)
    assert isinstance(expr, (cst.Attribute, cst.Name))
    return expr


class _Scan(cst.CSTVisitor):
    """First pass: import bindings, rewritable attribute chains, and name reference counts."""

    def __init__(self, old: str, module: str | None, is_package: bool) -> None:
        super().__init__()
        self.old, self.module, self.is_package = old, module, is_package
        self.aliases: dict[str, str] = {}  # local name -> dotted path it binds
        self.plain: set[str] = set()  # modules of `import a.b` (no alias)
        self.refs: Counter[str] = Counter()  # Name loads per identifier
        self.chain_hits: Counter[str] = Counter()  # rewritable chains per head name
        self.chains: Counter[str] = Counter()  # dotted texts of every other attribute chain
        self._attr_names: set[int] = set()

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            name = _dotted(alias.name) or ""
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self.aliases[alias.asname.name.value] = name
            else:
                self.plain.add(name)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        base = self.base_of(node)
        if base and not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                name = _dotted(alias.name) or ""
                local = name
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    local = alias.asname.name.value
                self.aliases[local] = f"{base}.{name}"
        return False

    def base_of(self, node: cst.ImportFrom) -> str:
        target = _dotted(node.module) if node.module is not None else None
        return resolve_relative(self.module, self.is_package, len(node.relative), target)

    def full_path(self, dotted: str) -> str | None:
        head, _, rest = dotted.partition(".")
        if head in self.aliases:
            return f"{self.aliases[head]}.{rest}" if rest else self.aliases[head]
        if any(p.split(".")[0] == head for p in self.plain):
            return dotted
        return None

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        self._attr_names.add(id(node.attr))
        dotted = _dotted(node)
        if dotted is not None:
            if self.full_path(dotted) == self.old:
                self.chain_hits[dotted.split(".")[0]] += 1
            else:
                self.chains[dotted] += 1
        return True

    def visit_Name(self, node: cst.Name) -> bool:
        if id(node) not in self._attr_names:
            self.refs[node.value] += 1
        return False


class _Rewrite(cst.CSTTransformer):
    def __init__(
        self, scan: _Scan, old: str, new: str, line_length: int = DEFAULT_LINE_LENGTH
    ) -> None:
        super().__init__()
        self.scan, self.old, self.new = scan, old, new
        self.line_length = line_length
        self.indents: list[str] = []
        self.default_indent = "    "
        #: the import lines this pass created (merged or moved into place per block)
        self.created: list[cst.SimpleStatementLine] = []
        self._created_small: list[cst.ImportFrom] = []
        self.new_parent, _, self.new_last = new.rpartition(".")
        self.changed = False
        # Heads whose chains we rewrite, and which of their bindings become unused.
        # A binding of the new parent itself (a rename inside one module) keeps serving them.
        self.stale_aliases = {
            h for h, n in scan.chain_hits.items()
            if h in scan.aliases and scan.refs[h] == n and scan.aliases[h] != self.new_parent
        }
        self.stale_plain = self._stale_plain()
        # How a rewritten chain spells the new module, and whether an import must be added.
        self.new_module_expr, self.need_import = self._new_module_spelling()
        self.import_added = False
        # Local names this pass had to keep with `as` after a rename: {old local: new name}.
        self.local_renames: dict[str, str] = {}

    def _stale_plain(self) -> set[str]:
        """Plain ``import a.b`` statements that only served the rewritten ``a.b.X`` chains."""
        stale: set[str] = set()
        scan = self.scan
        for mod in scan.plain:
            head = mod.split(".")[0]
            hits = scan.chain_hits[head]
            if not self.old.startswith(mod + ".") or hits == 0 or mod == self.new_parent:
                continue
            # Any other use under `mod`: a chain that is not a prefix of the rewritten ones, or a
            # prefix (such as `a.b` itself) used more often than inside the rewritten chains.
            other = any(
                _moved(c, mod) and not self.old.startswith(c + ".") for c in scan.chains
            ) or any(
                n > hits for c, n in scan.chains.items()
                if _moved(c, mod) and self.old.startswith(c + ".")
            )
            if other:
                continue
            others = [p for p in scan.plain if p != mod and p.split(".")[0] == head]
            if scan.refs[head] == hits or others:
                stale.add(mod)
        return stale

    def _new_module_spelling(self) -> tuple[str, bool]:
        if not self.scan.chain_hits or self.new_parent == self.scan.module:
            return self.new_parent, False
        for local, target in sorted(self.scan.aliases.items()):
            if target == self.new_parent and local not in self.stale_aliases:
                return local, False
        if any(_moved(p, self.old) for p in self.scan.plain):
            return self.new_parent, False  # the module import itself is rewritten
        if self.new_parent in self.scan.plain:
            return self.new_parent, False
        return self.new_parent, True

    # -- blocks: indentation, and where created imports go ----------------------------------
    def visit_Module(self, node: cst.Module) -> bool:
        self.default_indent = node.default_indent
        return True

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> bool:
        self.indents.append(node.indent if node.indent is not None else self.default_indent)
        return True

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        indent = "".join(self.indents)
        self.indents.pop()
        if not any(x is c for x in updated_node.body for c in self.created):
            return updated_node
        return updated_node.with_changes(
            body=arrange_block(updated_node.body, self.created, indent, self.line_length)
        )

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not any(x is c for x in updated_node.body for c in self.created):
            return updated_node
        return updated_node.with_changes(
            body=arrange_block(updated_node.body, self.created, "", self.line_length)
        )

    def _from(self, module: str, names: list[str], *, vertical: bool = False) -> cst.ImportFrom:
        indent = "".join(self.indents)
        return from_import(module, names, indent, 0 if vertical else self.line_length)

    # -- attribute chains -------------------------------------------------------------------
    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        dotted = _dotted(original_node)
        if dotted is None or self.scan.full_path(dotted) != self.old:
            return updated_node
        self.changed = True
        if any(_moved(p, self.old) for p in self.scan.plain) and dotted == self.old:
            spelled = self.new  # `import old` itself becomes `import new`
        elif self.new_parent == self.scan.module:
            spelled = self.new_last  # this file is the new home of the name
        else:
            spelled = f"{self.new_module_expr}.{self.new_last}"
        replacement = _expr(spelled)
        return replacement.with_changes(
            lpar=updated_node.lpar, rpar=updated_node.rpar
        )

    # -- import statements ------------------------------------------------------------------
    def _rewrite_import(self, node: cst.Import) -> tuple[list[cst.BaseSmallStatement], bool]:
        names: list[cst.ImportAlias] = []
        touched = anchor = False
        for alias in node.names:
            name = _dotted(alias.name) or ""
            local = alias.asname.name.value if alias.asname and isinstance(
                alias.asname.name, cst.Name) else None
            if _moved(name, self.old):
                names.append(alias.with_changes(name=_expr(_renamed(name, self.old, self.new))))
                touched = True
                continue
            if local is not None and local in self.scan.chain_hits:
                anchor = True
                if local in self.stale_aliases:
                    touched = True
                    continue
            if local is None and self.scan.chain_hits[name.split(".")[0]]:
                anchor = anchor or self.old.startswith(name + ".")
                if name in self.stale_plain:
                    touched = True
                    continue
            names.append(alias)
        if not touched:
            return [node], anchor
        if not names:
            return [], anchor
        names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return [node.with_changes(names=names)], anchor

    def _rewrite_from(self, node: cst.ImportFrom) -> tuple[list[cst.BaseSmallStatement], bool]:
        base = self.scan.base_of(node)
        if not base:
            return [node], False
        if _moved(base, self.old):
            module = _expr(_renamed(base, self.old, self.new))
            return [node.with_changes(module=module, relative=[])], False
        if isinstance(node.names, cst.ImportStar):
            return [node], False
        kept: list[cst.ImportAlias] = []
        moved: dict[str, list[str]] = {}
        anchor = touched = False
        for alias in node.names:
            name = _dotted(alias.name) or ""
            local = alias.asname.name.value if alias.asname and isinstance(
                alias.asname.name, cst.Name) else None
            full = f"{base}.{name}"
            if _moved(full, self.old):
                new_mod, _, new_name = _renamed(full, self.old, self.new).rpartition(".")
                bind = local or (name if new_name != name else None)
                touched = True
                if local is None and new_name != name:
                    self.local_renames[name] = new_name
                if new_mod == self.scan.module and bind in (None, new_name):
                    continue  # this file is the new home: the name is defined right here
                if new_mod == base:  # renamed in place: stays in this statement
                    asname = alias.asname if local else (
                        cst.AsName(name=cst.Name(bind)) if bind else None)
                    kept.append(alias.with_changes(name=cst.Name(new_name), asname=asname))
                    continue
                spec = f"{new_name} as {bind}" if bind else new_name
                moved.setdefault(new_mod, []).append(spec)
                continue
            if (local or name) in self.scan.chain_hits:
                anchor = True
                if (local or name) in self.stale_aliases:
                    touched = True
                    continue
            kept.append(alias)
        if not touched:
            return [node], anchor
        out: list[cst.BaseSmallStatement] = []
        if kept:
            code = cst.Module(body=[]).code_for_node(node)
            if "#" in code:  # comments inside the statement: edit it, do not re-render it
                if node.lpar is None:
                    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                out.append(node.with_changes(names=kept))
            else:
                # the surviving names keep the statement's form: one per line when they were
                # (several names), else one line when they fit
                spelled = "." * len(node.relative) + (
                    cst.Module(body=[]).code_for_node(node.module) if node.module else "")
                out.append(self._from(spelled, [_alias_text(a) for a in kept],
                                      vertical=node.lpar is not None and len(kept) > 1))
        for new_mod, specs in moved.items():
            created = self._from(new_mod, sorted(specs, key=name_key))
            self._created_small.append(created)
            out.append(created)
        return out, anchor

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel:
        if not any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in updated_node.body):
            return updated_node
        body: list[cst.BaseSmallStatement] = []
        extra: list[cst.BaseSmallStatement] = []
        changed = False
        for small in updated_node.body:
            if isinstance(small, cst.Import):
                new_small, anchor = self._rewrite_import(small)
            elif isinstance(small, cst.ImportFrom):
                new_small, anchor = self._rewrite_from(small)
            else:
                body.append(small)
                continue
            if new_small != [small]:
                changed = True
            body.extend(new_small[:1])
            extra.extend(new_small[1:])
            if anchor and self.need_import and not self.import_added:
                stmt = cst.parse_statement(f"import {self.new_parent}\n")
                assert isinstance(stmt, cst.SimpleStatementLine)
                extra.append(stmt.body[0])
                self.import_added = changed = True
        if not changed:
            return updated_node
        self.changed = True
        lines: list[cst.BaseStatement] = []
        became_created = len(body) == 1 and any(body[0] is c for c in self._created_small)
        if body:
            last = len(body) - 1
            body = [
                s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) if i == last else s
                for i, s in enumerate(body)
            ]
            line = updated_node.with_changes(body=body)
            lines.append(line)
            if became_created:
                self.created.append(line)  # the statement became the created import
        for i, small in enumerate(extra):
            line = cst.SimpleStatementLine(body=[small])
            if not lines and i == 0:
                line = line.with_changes(
                    leading_lines=updated_node.leading_lines,
                    trailing_whitespace=updated_node.trailing_whitespace,
                )
            if any(small is c for c in self._created_small):
                self.created.append(line)
            lines.append(line)
        if not lines:
            return cst.RemoveFromParent()
        return cst.FlattenSentinel(lines)


def _import_binds(node: cst.CSTNode, local: str, name: str) -> bool:
    """``node`` is a ``from ... import`` statement holding ``name as local``."""
    if not isinstance(node, cst.ImportFrom) or isinstance(node.names, cst.ImportStar):
        return False
    return any(
        a.asname is not None and isinstance(a.asname.name, cst.Name)
        and a.asname.name.value == local and _dotted(a.name) == name
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
        if target is None or _dotted(updated_node.name) != target:
            return updated_node
        return updated_node.with_changes(asname=None)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        if id(original_node) in self.names:
            return updated_node.with_changes(value=self.renames[original_node.value])
        return updated_node


def _rename_locals(module: cst.Module, renames: dict[str, str]) -> cst.Module:
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


def _rename_definition(module: cst.Module, old: str, new: str) -> cst.Module | None:
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


def _check_path(label: str, dotted: str) -> None:
    parts = dotted.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise ValueError(
            f"{label} must be a dotted path with at least two components, got {dotted!r}"
        )


def rewrite_source(
    source: str,
    old: str,
    new: str,
    module: str | None = None,
    is_package: bool = False,
    *,
    rename_uses: bool = False,
    line_length: int = DEFAULT_LINE_LENGTH,
) -> str:
    """Return ``source`` with every import of ``old`` rewritten to ``new`` (see module doc).

    The import statements it writes follow isort's black profile at ``line_length``: one line
    when it fits, else one name per line with a trailing comma; a created ``from`` import joins
    another import of its module in the same block or takes its sorted place among the imports
    around it. The surviving names of a split statement keep its form (one per line when they
    were several), a single survivor goes on one line when it fits.

    ``module`` is the dotted name of the file (for relative imports); ``is_package`` is True
    for an ``__init__.py``. ``rename_uses``: when the last component changes, an import that
    bound the old name without ``as`` imports the new name and the file's uses of the old name
    are renamed (``from a import old`` + ``old.X`` -> ``from a import new`` + ``new.X``), where
    that is safe (see :func:`_safe_local_renames`); elsewhere the ``as`` stays. Returns
    ``source`` itself when nothing refers to ``old``. With ``rename_uses``, in the new home
    itself (``module`` is the new parent) a module-level definition still named like ``old``
    is renamed too, with its uses and its ``__all__`` entry (see :func:`_rename_definition`).
    """
    _check_path("old", old)
    _check_path("new", new)
    if old.rpartition(".")[2] not in source:  # every reference spells the last component
        return source
    tree = cst.parse_module(source)
    scan = _Scan(old, module, is_package)
    tree.visit(scan)
    rewriter = _Rewrite(scan, old, new, line_length)
    result = tree.visit(rewriter)
    changed = rewriter.changed
    if changed and rename_uses and rewriter.local_renames:
        result = _rename_locals(result, rewriter.local_renames)
    old_last, new_parent, new_last = old.rpartition(".")[2], *new.rpartition(".")[::2]
    if rename_uses and module == new_parent and old_last != new_last:
        renamed = _rename_definition(result, old_last, new_last)
        if renamed is not None:
            result, changed = renamed, True
    return result.code if changed else source


_FENCE = re.compile(
    r"^(?P<open>(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?:python3?|py)\b[^\n]*\n)"
    r"(?P<body>.*?)"
    r"^(?P<close>(?P=indent)(?P=fence)[ \t]*)$",
    re.MULTILINE | re.DOTALL,
)


def rewrite_markdown(text: str, old: str, new: str, *, rename_uses: bool = False) -> str:
    """Return Markdown ``text`` with :func:`rewrite_source` applied to each fenced ``python``
    (``py``, ``python3``) code block on its own; a block that does not parse (a ``>>>``
    session, ``...`` placeholders) and all prose stay as they are."""

    def block(match: re.Match[str]) -> str:
        indent, body = match.group("indent"), match.group("body")
        lines = body.splitlines(keepends=True)
        if indent and not all(ln.startswith(indent) or not ln.strip() for ln in lines):
            return match.group(0)
        code = "".join(ln[len(indent):] if ln.startswith(indent) else ln for ln in lines)
        try:
            out = rewrite_source(code, old, new, rename_uses=rename_uses)
        except cst.ParserSyntaxError:
            return match.group(0)
        if out == code:
            return match.group(0)
        body = "".join(indent + ln if ln.strip() else ln for ln in out.splitlines(keepends=True))
        return match.group("open") + body + match.group("close")

    return _FENCE.sub(block, text)


def iter_python_files(paths: Iterable[Path], *, markdown: bool = False) -> list[Path]:
    """``.py`` files (and ``.md`` files when ``markdown``) under ``paths`` (files kept as
    given), skipping hidden/venv/build dirs."""
    found: list[Path] = []
    patterns = ("*.py", "*.md") if markdown else ("*.py",)
    for path in paths:
        if path.is_file():
            found.append(path)
            continue
        for file in sorted(f for pattern in patterns for f in path.rglob(pattern)):
            rel = file.relative_to(path).parts[:-1]
            if any(p in SKIP_DIRS or p.startswith(".") for p in rel):
                continue
            found.append(file)
    return found


def _repo_top(file: Path) -> Path | None:
    """The innermost folder above ``file`` that holds ``.git``."""
    for parent in file.resolve().parents:
        if (parent / ".git").exists():
            return parent
    return None


_ROOTS: dict[tuple[Path, tuple[str, ...]], SourceRoots] = {}


def _module_of(file: Path, src_roots: Sequence[Path] = ()) -> str | None:
    top = _repo_top(file)
    if top is None:
        return None
    key = (top, tuple(str(r) for r in src_roots))
    if key not in _ROOTS:
        _ROOTS[key] = SourceRoots.discover(top, extra=[Path(r).resolve() for r in src_roots])
    return _ROOTS[key].module_name(file.resolve().relative_to(top).as_posix())


def rewrite_file(
    file: Path,
    old: str,
    new: str,
    *,
    write: bool = True,
    src_roots: Sequence[Path] = (),
    rename_uses: bool = False,
) -> bool:
    """Rewrite ``file`` in place (only report when ``write`` is False); True when it changes.

    ``src_roots``: extra source roots of the file's repository (see ``--src-root``);
    ``rename_uses``: see :func:`rewrite_source`.
    """
    source = file.read_text(encoding="utf-8")
    if file.suffix.lower() in (".md", ".markdown"):
        result = rewrite_markdown(source, old, new, rename_uses=rename_uses)
        if result != source and write:
            file.write_text(result, encoding="utf-8")
        return result != source
    try:
        length = DEFAULT_LINE_LENGTH
        if old.rpartition(".")[2] in source:
            length = line_length_for(file, _repo_top(file))
        result = rewrite_source(
            source, old, new, module=_module_of(file, src_roots),
            is_package=file.name == "__init__.py", rename_uses=rename_uses,
            line_length=length,
        )
    except cst.ParserSyntaxError as exc:
        print(f"rewrite_imports: skipping {file}: {exc.message}", file=sys.stderr)
        return False
    if result == source:
        return False
    if write:
        file.write_text(result, encoding="utf-8")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rewrite-imports",
        description="Rewrite imports of OLD (module or module.Name) to NEW across files.",
    )
    parser.add_argument("old", help="old dotted path, e.g. mem_cache_pool.util.helper")
    parser.add_argument("new", help="new dotted path, e.g. mem_cache_pool.layout.helper")
    parser.add_argument("paths", nargs="*", type=Path, help="files/dirs (default: .)")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; list the files that still use OLD, exit 1 if any")
    parser.add_argument("--src-root", action="append", default=[], type=Path, metavar="DIR",
                        help="an import root of the repository (repeatable; default: found from "
                             "pyproject.toml, src/, python/)")
    parser.add_argument("--rename-uses", action="store_true",
                        help="on a rename, import the new name itself and rename the file's "
                             "uses of the old local name (where safe) instead of `new as old`")
    args = parser.parse_args(argv)
    try:
        _check_path("OLD", args.old)
        _check_path("NEW", args.new)
    except ValueError as exc:
        parser.error(str(exc))
    files = iter_python_files(args.paths or [Path(".")], markdown=True)
    changed = [f for f in files if rewrite_file(f, args.old, args.new, write=not args.check,
                                      src_roots=args.src_root, rename_uses=args.rename_uses)]
    verb = "would rewrite" if args.check else "rewrote"
    for f in changed:
        print(f"{verb} {f}")
    if args.check:
        print(f"rewrite_imports: {len(changed)} file(s) still import {args.old}")
        return 1 if changed else 0
    print(f"rewrite_imports: {len(changed)} file(s) changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
