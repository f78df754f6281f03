"""Custom import-linter contract: forbid *eager* imports of modules such as ``triton``.

import-linter (via grimp) records every ``import`` statement of a file as the same kind of
graph edge, whether it runs at module import time or inside a function body. Our rule is about
import time only: ``import mem_cache_pool`` must never execute ``import triton``, while a kernel
launcher may import Triton inside the function that needs it. This contract re-parses each
importing module with :mod:`ast` and keeps only the import lines that execute when the module is
imported:

* module-level statements, including class bodies and module-level ``try``/``with``/``for``/``if``
  blocks (an ``if`` branch may run, so it counts);
* **not** function or lambda bodies (run on call, not on import);
* **not** the body of ``if TYPE_CHECKING:`` / ``if typing.TYPE_CHECKING:`` (never runs), but its
  ``else:`` branch does count.

Configuration (INI)::

    [importlinter:contract:no-eager-triton]
    name = No module imports triton at import time
    type = eager_forbidden
    source_modules =
        mem_cache_pool
    forbidden_modules =
        triton
    exempt_modules =
        mem_cache_kernels._triton

``source_modules`` are packages: every module inside them is checked. ``exempt_modules`` (and
their descendants) are skipped as importers: they are the implementation modules that are
allowed to import the forbidden module eagerly. A forbidden module also forbids its descendants.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from importlinter import Contract, ContractCheck, fields, output

__all__ = ["EagerForbiddenContract", "EagerImport", "eager_import_lines", "find_eager_imports"]


def _is_type_checking_test(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "TYPE_CHECKING"
    if isinstance(node, ast.Attribute):
        return node.attr == "TYPE_CHECKING"
    return False


def _walk_eager(nodes: Iterable[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue  # body runs on call; decorators and defaults hold no import statements
        elif isinstance(node, ast.If) and _is_type_checking_test(node.test):
            yield from _walk_eager(node.orelse)
        else:
            for child_field in ("body", "orelse", "finalbody", "handlers", "cases"):
                children = getattr(node, child_field, None)
                if not children:
                    continue
                stmts: list[ast.stmt] = []
                for child in children:
                    if isinstance(child, (ast.ExceptHandler, ast.match_case)):
                        stmts.extend(child.body)
                    elif isinstance(child, ast.stmt):
                        stmts.append(child)
                yield from _walk_eager(stmts)


def eager_import_lines(source: str) -> set[int]:
    """Return the line numbers of import statements executed when ``source`` is imported.

    A multi-line ``from x import (a, b)`` contributes every line it spans, since tools report
    either its first line or the line of the imported name.
    """
    tree = ast.parse(source)
    lines: set[int] = set()
    for node in _walk_eager(tree.body):
        end = node.end_lineno if node.end_lineno is not None else node.lineno
        lines.update(range(node.lineno, end + 1))
    return lines


def _module_file(module: str) -> Path | None:
    """Locate ``module``'s source file without importing it (or its parent packages)."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(next(iter(spec.submodule_search_locations)))
    parts = rest.split(".") if rest else []
    candidate = base.joinpath(*parts)
    if (candidate / "__init__.py").is_file():
        return candidate / "__init__.py"
    as_file = candidate.with_suffix(".py")
    return as_file if as_file.is_file() else None


def _within(module: str, roots: Iterable[str]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


@dataclass(frozen=True, slots=True)
class EagerImport:
    """One eager import of a forbidden module."""

    importer: str
    imported: str
    line_number: int
    line_contents: str


def find_eager_imports(
    graph: Any, sources: Iterable[str], forbidden: Iterable[str], exempt: Iterable[str]
) -> list[EagerImport]:
    """All eager imports from modules under ``sources`` (minus ``exempt``) of ``forbidden``."""
    sources, forbidden, exempt = list(sources), list(forbidden), list(exempt)
    found: list[EagerImport] = []
    for importer in sorted(graph.modules):
        if graph.is_module_squashed(importer) or not _within(importer, sources):
            continue
        if _within(importer, exempt):
            continue
        targets = [m for m in graph.find_modules_directly_imported_by(importer)
                   if _within(m, forbidden)]
        if not targets:
            continue
        path = _module_file(importer)
        eager = eager_import_lines(path.read_text()) if path is not None else None
        for imported in sorted(targets):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                if detail.get("is_lazy"):
                    continue
                if eager is not None and detail["line_number"] not in eager:
                    continue
                found.append(EagerImport(importer, imported, int(detail["line_number"]),
                                         str(detail["line_contents"])))
    return found


class EagerForbiddenContract(Contract):
    """Modules under ``source_modules`` must not import ``forbidden_modules`` at import time."""

    type_name = "eager_forbidden"

    source_modules = fields.ListField(subfield=fields.StringField())
    forbidden_modules = fields.ListField(subfield=fields.StringField())
    exempt_modules = fields.ListField(subfield=fields.StringField(), required=False, default=[])

    def check(self, graph: Any, verbose: bool) -> ContractCheck:
        # the base class turns the field declarations into parsed lists of strings
        options: dict[str, list[str]] = {
            name: list(getattr(self, name))
            for name in ("source_modules", "forbidden_modules", "exempt_modules")
        }
        violations = find_eager_imports(
            graph,
            options["source_modules"],
            options["forbidden_modules"],
            options["exempt_modules"],
        )
        return ContractCheck(
            kept=not violations,
            metadata={"violations": [
                (v.importer, v.imported, v.line_number, v.line_contents) for v in violations
            ]},
        )

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, imported, line, contents in check.metadata["violations"]:
            output.print_error(
                f"{importer} imports {imported} at import time (l.{line}: {contents.strip()}); "
                "move the import inside the function that needs it",
                bold=False,
            )
            output.new_line()
