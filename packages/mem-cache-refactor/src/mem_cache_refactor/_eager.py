"""The import-time import graph of source trees, read from the files themselves.

import-linter's graph (grimp) does not descend into folders without ``__init__.py`` under a
root package (SGLang's ``python/sglang/srt/``), and it folds every external import to its top
package (``sgl_kernel.kvcacheio`` becomes ``sgl_kernel``). The eager-import contract therefore
builds its own graph: :class:`~mem_cache_refactor._locate.Locator` finds module files on a
search path the way Python's path finder does (regular packages, modules, namespace folders,
extension modules), and
:class:`EagerIndex` parses each module reached and keeps the import statements that run when it
is imported (see :func:`eager_imports`), each resolved to the module it loads. External modules
keep their full dotted name and are leaves (never followed).
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mem_cache_refactor._locate import Locator, within
from mem_cache_refactor.modpath import resolve_relative

__all__ = [
    "EagerChain",
    "EagerIndex",
    "Hop",
    "drop_tails",
    "eager_imports",
    "find_chains",
    "path_to",
    "reached_targets",
    "shortest_tree",
]

_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


@dataclass(frozen=True, slots=True)
class Hop:
    """``importer`` runs ``imported`` at import time: line ``line_number`` of ``file``
    (0 for the implicit import of a parent package). ``guarded``: the import sits in the body
    of a ``try`` whose handlers catch ``ImportError`` (it still runs eagerly)."""

    importer: str
    imported: str
    file: str
    line_number: int
    line_contents: str
    guarded: bool = False

    def where(self) -> str:
        """``l.3``, ``l.3, guarded by try/except ImportError`` or ``parent package``."""
        if not self.line_number:
            return "parent package"
        guard = ", guarded by try/except ImportError" if self.guarded else ""
        return f"l.{self.line_number}{guard}"


@dataclass(frozen=True, slots=True)
class EagerChain:
    """Importing ``source`` imports ``forbidden`` at import time, through ``hops``."""

    source: str
    forbidden: str
    hops: tuple[Hop, ...]

    def summary(self) -> str:
        """``a -> b (l.3) -> c (l.5)``: the line is that of the import in the previous module."""
        parts = [self.source]
        parts.extend(f"{hop.imported} ({hop.where()})" for hop in self.hops)
        return " -> ".join(parts)

    def modules(self) -> tuple[str, ...]:
        """The modules of the chain, source first."""
        return (self.source, *(h.imported for h in self.hops))


def _catches_import_error(node: ast.Try) -> bool:
    for handler in node.handlers:
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        for t in types:
            name = t.id if isinstance(t, ast.Name) else (
                t.attr if isinstance(t, ast.Attribute) else "")
            if name in _IMPORT_ERRORS:
                return True
    return False


def _is_type_checking_test(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "TYPE_CHECKING"
    if isinstance(node, ast.Attribute):
        return node.attr == "TYPE_CHECKING"
    return False


def eager_imports(
    nodes: Iterable[ast.stmt], guarded: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """The import statements that run when a module whose body is ``nodes`` is imported, each
    with whether it is guarded (inside a ``try`` that catches ``ImportError``).

    Module-level statements and the bodies of classes and of ``if``/``try``/``with``/``for``/
    ``while``/``match`` blocks count; function bodies and ``if TYPE_CHECKING:`` do not (its
    ``else:`` does)."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, guarded
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue  # body runs on call; decorators and defaults hold no import statements
        elif isinstance(node, ast.If) and _is_type_checking_test(node.test):
            yield from eager_imports(node.orelse, guarded)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            body_guarded = guarded or _catches_import_error(node)  # type: ignore[arg-type]
            yield from eager_imports(node.body, body_guarded)  # type: ignore[attr-defined]
            for handler in node.handlers:  # type: ignore[attr-defined]
                yield from eager_imports(handler.body, guarded)
            yield from eager_imports(node.orelse, guarded)  # type: ignore[attr-defined]
            yield from eager_imports(node.finalbody, guarded)  # type: ignore[attr-defined]
        else:
            for child_field in ("body", "orelse", "cases"):
                children = getattr(node, child_field, None)
                if not children:
                    continue
                stmts: list[ast.stmt] = []
                for child in children:
                    if isinstance(child, ast.match_case):
                        stmts.extend(child.body)
                    elif isinstance(child, ast.stmt):
                        stmts.append(child)
                yield from eager_imports(stmts, guarded)


def _statement_text(node: ast.Import | ast.ImportFrom) -> str:
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
    if isinstance(node, ast.Import):
        return f"import {names}"
    return f"from {'.' * node.level}{node.module or ''} import {names}"


def _display(path: Path | None, base: Path | None) -> str:
    if path is None:
        return "?"
    for anchor in (base, Path.cwd()):
        if anchor is None:
            continue
        try:
            return path.resolve().relative_to(anchor.resolve()).as_posix()
        except ValueError:
            continue
    return str(path)


@dataclass
class EagerIndex:
    """The import-time edges of the modules a :class:`Locator` finds, parsed on demand.

    ``display_base``: file paths are shown relative to it (else to the working directory).
    """

    locator: Locator
    display_base: Path | None = None
    _edges: dict[str, list[Hop]] = field(default_factory=dict)
    #: (importer, module) of ``from x import y`` with an external ``x``: ``x.y`` may be a
    #: function, so the hop only counts where a forbidden module names ``x.y`` (or below it)
    _guessed: set[tuple[str, str]] = field(default_factory=set)

    def _targets(
        self, module: str, is_package: bool, node: ast.Import | ast.ImportFrom
    ) -> list[str]:
        loc = self.locator
        if isinstance(node, ast.Import):
            out: list[str] = []
            for alias in node.names:
                name = alias.name
                if loc.is_internal(name):
                    while name and loc.locate(name) is None:
                        name = name.rpartition(".")[0]
                if name:
                    out.append(name)
            return out
        base = resolve_relative(module, is_package, node.level, node.module)
        if not base:
            return []
        if not loc.is_internal(base):
            # an external module keeps its full name; `from x import y` may load x.y
            guesses = [f"{base}.{a.name}" for a in node.names if a.name != "*"]
            self._guessed.update((module, g) for g in guesses)
            return [base, *guesses]
        found = base
        while found and loc.locate(found) is None:
            found = found.rpartition(".")[0]
        if not found:
            return []
        out = []
        if found == base:
            out = [f"{base}.{a.name}" for a in node.names
                   if a.name != "*" and loc.locate(f"{base}.{a.name}") is not None]
        return out or [found]

    def edges(self, module: str) -> list[Hop]:
        """The modules ``module`` runs when it is imported (first line each), then its parent
        package (line 0). External modules have none."""
        if module in self._edges:
            return self._edges[module]
        hops: list[Hop] = []
        loc = self.locator
        located = loc.locate(module) if loc.is_internal(module) else None
        if located is not None:
            shown = _display(located.file or (located.folders[0] if located.folders else None),
                             self.display_base)
            tree: ast.Module | None = None
            if located.file is not None and located.file.suffix == ".py":
                try:
                    tree = ast.parse(located.file.read_bytes())
                except (OSError, SyntaxError, ValueError):
                    tree = None
            seen: set[str] = set()
            if tree is not None:
                for node, guarded in eager_imports(tree.body):
                    for target in self._targets(module, located.is_package, node):
                        if target in seen or target == module:
                            continue
                        seen.add(target)
                        hops.append(Hop(module, target, shown, node.lineno,
                                        _statement_text(node), guarded))
            parent = module.rpartition(".")[0]
            if parent and parent not in seen and loc.locate(parent) is not None:
                hops.append(Hop(module, parent, shown, 0, f"(package of {module})"))
        self._edges[module] = hops
        return hops

    def hops(self, module: str, forbidden: Sequence[str]) -> list[Hop]:
        """:meth:`edges` minus the guessed submodules no forbidden module names."""
        return [
            h for h in self.edges(module)
            if (module, h.imported) not in self._guessed
            or any(within(f, [h.imported]) for f in forbidden)
        ]

    def entry_points(
        self, sources: Iterable[str], exempt: Iterable[str], forbidden: Iterable[str],
        as_packages: bool,
    ) -> list[str]:
        """The modules checked: the sources (and, with ``as_packages``, every module below
        them), minus the exempt and the forbidden ones."""
        exempt, forbidden = list(exempt), list(forbidden)
        found: dict[str, None] = {}
        for source in sources:
            names = self.locator.submodules(source) if as_packages else (
                [source] if self.locator.locate(source) is not None else [])
            for name in names:
                if not within(name, exempt) and not within(name, forbidden):
                    found[name] = None
        return sorted(found)


def shortest_tree(
    index: EagerIndex, source: str, sources: list[str], exempt: list[str], forbidden: list[str]
) -> dict[str, Hop | None]:
    """Breadth-first predecessors from ``source`` (forbidden modules are reached, not
    followed; a leading implicit import of an enclosing entry-point package is skipped)."""
    via: dict[str, Hop | None] = {source: None}
    queue = deque([source])
    while queue:
        module = queue.popleft()
        for hop in index.hops(module, forbidden):
            if hop.imported in via:
                continue
            if module == source and not hop.line_number and within(hop.imported, sources) \
                    and not within(hop.imported, exempt):
                continue  # the enclosing package is an entry point of its own
            via[hop.imported] = hop
            if within(hop.imported, forbidden):
                continue
            queue.append(hop.imported)
    return via


def path_to(via: dict[str, Hop | None], node: str) -> list[Hop]:
    hops: list[Hop] = []
    while (step := via[node]) is not None:
        hops.append(step)
        node = step.importer
    return list(reversed(hops))


def reached_targets(via: dict[str, Hop | None], source: str, forbidden: list[str]) -> list[str]:
    """The forbidden modules reached; ``x.y`` is dropped when ``x`` was reached by the same
    statement (``from x import y`` names both)."""
    reached = sorted(m for m in via if m != source and within(m, forbidden))
    keep: list[str] = []
    for target in reached:
        hop = via[target]
        covered = any(
            other != target and target.startswith(other + ".")
            and (o := via[other]) is not None and hop is not None
            and (o.importer, o.line_number) == (hop.importer, hop.line_number)
            for other in reached
        )
        if not covered:
            keep.append(target)
    return keep


def drop_tails(chains: list[EagerChain]) -> list[EagerChain]:
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


def find_chains(
    index: EagerIndex,
    sources: Iterable[str],
    forbidden: Iterable[str],
    exempt: Iterable[str] = (),
    *,
    as_packages: bool = True,
) -> list[EagerChain]:
    """For each entry point (see :meth:`EagerIndex.entry_points`), the shortest import-time
    chain to each forbidden module it reaches; chains that are the tail of another are left
    out."""
    sources, forbidden, exempt = list(sources), list(forbidden), list(exempt)
    chains: list[EagerChain] = []
    for source in index.entry_points(sources, exempt, forbidden, as_packages):
        via = shortest_tree(index, source, sources, exempt, forbidden)
        for target in reached_targets(via, source, forbidden):
            chains.append(EagerChain(source, target, tuple(path_to(via, target))))
    return drop_tails(chains)
