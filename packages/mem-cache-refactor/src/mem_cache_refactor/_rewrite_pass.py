"""The two libcst passes of ``rewrite-imports`` over one file.

:class:`_Scan` reads what the file binds (import aliases and plain ``import a.b``), the
attribute chains that spell the old path and how often each name is used; :class:`_Rewrite`
then rewrites the import statements and those chains, and places the imports it creates (see
:mod:`mem_cache_refactor._import_style`).
"""

from __future__ import annotations

from collections import Counter

import libcst as cst

from mem_cache_refactor._import_style import (
    DEFAULT_LINE_LENGTH,
    arrange_block,
    from_import,
    name_key,
)
from mem_cache_refactor.modpath import resolve_relative

__all__ = ["ImportRewrite", "ImportScan", "dotted_name"]


def dotted_name(node: cst.BaseExpression) -> str | None:
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


class ImportScan(cst.CSTVisitor):
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
            name = dotted_name(alias.name) or ""
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self.aliases[alias.asname.name.value] = name
            else:
                self.plain.add(name)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        base = self.base_of(node)
        if base and not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                name = dotted_name(alias.name) or ""
                local = name
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    local = alias.asname.name.value
                self.aliases[local] = f"{base}.{name}"
        return False

    def base_of(self, node: cst.ImportFrom) -> str:
        target = dotted_name(node.module) if node.module is not None else None
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
        dotted = dotted_name(node)
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


class ImportRewrite(cst.CSTTransformer):
    def __init__(
        self, scan: ImportScan, old: str, new: str, line_length: int = DEFAULT_LINE_LENGTH
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
        dotted = dotted_name(original_node)
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
            name = dotted_name(alias.name) or ""
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
            name = dotted_name(alias.name) or ""
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
