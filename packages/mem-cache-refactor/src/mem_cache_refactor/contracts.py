"""import-linter contract types for any repository: ``eager_forbidden``.

Register them in the repository's ``.importlinter`` (``[importlinter]`` section; the contract
types live in the ``mem-cache-refactor`` distribution, which must be installed where
``lint-imports`` runs)::

    contract_types =
        eager_forbidden: mem_cache_refactor.contracts.EagerForbiddenContract

``eager_forbidden``: importing any module under ``source_modules`` must not execute an import
of ``forbidden_modules`` (or their descendants), directly or through any chain of modules.

import-linter (via grimp) records every ``import`` statement of a file as the same kind of
graph edge, whether it runs at module import time or inside a function body. This contract is
about import time only: a kernel launcher may import a GPU library inside the function that
needs it, but importing the package must not. It re-parses each module on a path with
:mod:`ast` and follows only the import lines that execute when the module is imported:

* module-level statements, including class bodies and module-level ``try``/``with``/``for``/``if``
  blocks (an ``if`` branch may run, so it counts);
* **not** function or lambda bodies (run on call, not on import);
* **not** the body of ``if TYPE_CHECKING:`` / ``if typing.TYPE_CHECKING:`` (never runs), but its
  ``else:`` branch does count;
* importing ``a.b.c`` first runs the packages ``a`` and ``a.b``: those implicit edges count too.

The edges are followed transitively, through modules of any root package (not only the
sources), and each forbidden module reached is reported with its full chain, one ``file:line``
per hop::

    engine.alloc imports kernel_ext at import time:
      engine.alloc -> engine.alloc.sparse (l.3) -> engine.pool (l.5) -> kernel_ext (l.4)
        python/engine/alloc/__init__.py:3: from engine.alloc.sparse import SparseAllocator
        ...

A chain that is the tail of a longer reported chain is not repeated.

Configuration (INI)::

    [importlinter:contract:no-eager-kernels]
    name = No module imports the kernel extension at import time
    type = eager_forbidden
    source_modules =
        engine.mem_cache
    forbidden_modules =
        kernel_ext
    exempt_modules =
        engine.mem_cache._kernels

``source_modules`` are packages: every module inside them is an entry point; with
``as_packages = False`` only the listed modules themselves are (``import engine.alloc`` must stay
light, while ``engine.alloc.sparse`` may load the kernels when imported on its own).
``exempt_modules`` (and their descendants) are not entry points: they are the implementation
modules that may import the forbidden module eagerly (an entry point that reaches them still
counts).
"""

from __future__ import annotations

import ast
import importlib.util
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from importlinter import Contract, ContractCheck, fields, output

__all__ = [
    "EagerChain",
    "EagerForbiddenContract",
    "Hop",
    "eager_import_lines",
    "find_eager_chains",
]


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
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        if spec is not None and spec.origin and not rest and spec.origin.endswith(".py"):
            return Path(spec.origin)
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


def _display(path: Path | None) -> str:
    if path is None:
        return "?"
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


@dataclass(frozen=True, slots=True)
class Hop:
    """``importer`` runs ``imported`` at import time: line ``line_number`` of ``file``
    (0 for the implicit import of a parent package)."""

    importer: str
    imported: str
    file: str
    line_number: int
    line_contents: str


@dataclass(frozen=True, slots=True)
class EagerChain:
    """Importing ``source`` imports ``forbidden`` at import time, through ``hops``."""

    source: str
    forbidden: str
    hops: tuple[Hop, ...]

    def summary(self) -> str:
        """``a -> b (l.3) -> c (l.5)``: the line is that of the import in the previous module."""
        parts = [self.source]
        for hop in self.hops:
            where = f"l.{hop.line_number}" if hop.line_number else "parent package"
            parts.append(f"{hop.imported} ({where})")
        return " -> ".join(parts)


class _EagerGraph:
    """The import-time edges of an import-linter graph, computed on demand."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self._edges: dict[str, list[Hop]] = {}

    def edges(self, module: str) -> list[Hop]:
        if module in self._edges:
            return self._edges[module]
        graph = self.graph
        hops: list[Hop] = []
        if not graph.is_module_squashed(module):
            path = _module_file(module)
            try:
                eager = eager_import_lines(path.read_text()) if path is not None else None
            except (OSError, SyntaxError, UnicodeDecodeError):
                eager = None  # unreadable: every recorded import counts
            shown = _display(path)
            for imported in sorted(graph.find_modules_directly_imported_by(module)):
                details = sorted(
                    (d for d in graph.get_import_details(importer=module, imported=imported)
                     if not d.get("is_lazy")
                     and (eager is None or d["line_number"] in eager)),
                    key=lambda d: int(d["line_number"]),
                )
                if details:
                    first = details[0]
                    hops.append(Hop(module, imported, shown, int(first["line_number"]),
                                    str(first["line_contents"]).strip()))
            # importing a.b.c runs the packages a and a.b first
            parent = module.rpartition(".")[0]
            if parent and parent in graph.modules:
                hops.append(Hop(module, parent, shown, 0, f"(package of {module})"))
        self._edges[module] = hops
        return hops


def find_eager_chains(
    graph: Any,
    sources: Iterable[str],
    forbidden: Iterable[str],
    exempt: Iterable[str],
    *,
    as_packages: bool = True,
) -> list[EagerChain]:
    """For each module under ``sources`` (minus ``exempt``), the shortest import-time chain to
    each module under ``forbidden`` it reaches. Chains that are the tail of another, and chains
    that start by running an enclosing package that is an entry point itself, are left out."""
    sources, forbidden, exempt = list(sources), list(forbidden), list(exempt)
    eager = _EagerGraph(graph)
    chains: list[EagerChain] = []
    for source in sorted(graph.modules):
        if graph.is_module_squashed(source) or not _within(source, sources):
            continue
        if not as_packages and source not in sources:
            continue
        if _within(source, exempt) or _within(source, forbidden):
            continue
        via: dict[str, Hop | None] = {source: None}
        queue = deque([source])
        while queue:
            module = queue.popleft()
            for hop in eager.edges(module):
                if hop.imported in via:
                    continue
                if module == source and not hop.line_number and _within(
                    hop.imported, sources
                ) and not _within(hop.imported, exempt):
                    continue  # the enclosing package is an entry point of its own
                via[hop.imported] = hop
                if _within(hop.imported, forbidden):
                    continue  # reported, not followed
                queue.append(hop.imported)
        for target in sorted(m for m in via if m != source and _within(m, forbidden)):
            hops: list[Hop] = []
            node = target
            while (step := via[node]) is not None:
                hops.append(step)
                node = step.importer
            chains.append(EagerChain(source, target, tuple(reversed(hops))))
    keep: list[EagerChain] = []
    for chain in chains:
        longer = any(
            other is not chain
            and other.forbidden == chain.forbidden
            and len(other.hops) > len(chain.hops)
            and other.hops[-len(chain.hops):] == chain.hops
            for other in chains
        )
        if not longer:
            keep.append(chain)
    return keep


class EagerForbiddenContract(Contract):
    """Importing a module under ``source_modules`` must not import ``forbidden_modules`` at
    import time, directly or transitively."""

    type_name = "eager_forbidden"

    source_modules = fields.ListField(subfield=fields.StringField())
    forbidden_modules = fields.ListField(subfield=fields.StringField())
    exempt_modules = fields.ListField(subfield=fields.StringField(), required=False, default=[])
    as_packages = fields.BooleanField(required=False, default=True)

    def check(self, graph: Any, verbose: bool) -> ContractCheck:
        # the base class turns the field declarations into parsed lists of strings
        options: dict[str, list[str]] = {
            name: list(getattr(self, name))
            for name in ("source_modules", "forbidden_modules", "exempt_modules")
        }
        chains = find_eager_chains(
            graph,
            options["source_modules"],
            options["forbidden_modules"],
            options["exempt_modules"],
            as_packages=bool(self.as_packages),
        )
        return ContractCheck(
            kept=not chains,
            metadata={"chains": [
                {
                    "source": c.source,
                    "forbidden": c.forbidden,
                    "summary": c.summary(),
                    "hops": [
                        (h.file, h.line_number, h.importer, h.imported, h.line_contents)
                        for h in c.hops
                    ],
                }
                for c in chains
            ]},
        )

    def render_broken_contract(self, check: ContractCheck) -> None:
        for chain in check.metadata["chains"]:
            output.print_error(
                f"{chain['source']} imports {chain['forbidden']} at import time:", bold=True
            )
            output.indent_cursor()
            output.print_error(chain["summary"], bold=False)
            for file, line, importer, imported, contents in chain["hops"]:
                if line:
                    text = f"  {file}:{line}: {contents}"
                else:
                    text = f"  {file}: importing {importer} runs its package {imported} first"
                output.print_error(text, bold=False)
            output.new_line()
        output.print_error(
            "Fix: move the import into the function that needs it, guard it with "
            "`if TYPE_CHECKING:`, or stop re-exporting the module that pulls it in.",
            bold=False,
        )
