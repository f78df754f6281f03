"""The import-time import graph of source trees, read from the files themselves.

import-linter's graph (grimp) does not descend into folders without ``__init__.py`` under a
root package (SGLang's ``python/sglang/srt/``), and it folds every external import to its top
package (``sgl_kernel.kvcacheio`` becomes ``sgl_kernel``). The eager-import contract therefore
builds its own graph: :class:`Locator` finds module files on a search path the way Python's
path finder does (regular packages, modules, namespace folders, extension modules), and
:class:`EagerIndex` parses each module reached and keeps the import statements that run when it
is imported (see :func:`eager_imports`), each resolved to the module it loads. External modules
keep their full dotted name and are leaves (never followed).
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mem_cache_refactor.modpath import SKIP_DIRS, resolve_relative

__all__ = [
    "EagerChain",
    "EagerIndex",
    "Hop",
    "Located",
    "Locator",
    "classify_chains",
    "eager_imports",
    "find_chains",
    "unresolved_modules",
    "within",
]

_EXTENSION_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)
_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def within(module: str, roots: Iterable[str]) -> bool:
    """``module`` is one of ``roots`` or inside one of them."""
    return any(module == r or module.startswith(r + ".") for r in roots)


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


@dataclass(frozen=True, slots=True)
class Located:
    """Where a module lives: its ``file`` (None for a namespace folder) and, for a package or
    namespace folder, the folders that hold its submodules."""

    module: str
    file: Path | None
    folders: tuple[Path, ...] = ()

    @property
    def is_package(self) -> bool:
        return bool(self.folders)


def _find_in(name: str, folders: Sequence[Path]) -> tuple[Path | None, tuple[Path, ...]] | None:
    """Python's path-finder rule for ``name`` in ``folders``: the first regular package or
    module wins; else every folder of that name is a portion of a namespace package."""
    portions: list[Path] = []
    for folder in folders:
        candidate = folder / name
        init = candidate / "__init__.py"
        if init.is_file():
            return init, (candidate,)
        as_file = folder / f"{name}.py"
        if as_file.is_file():
            return as_file, ()
        for suffix in _EXTENSION_SUFFIXES:
            ext = folder / f"{name}{suffix}"
            if ext.is_file():
                return ext, ()
        if candidate.is_dir():
            portions.append(candidate)
    if portions:
        return None, tuple(portions)
    return None


class Locator:
    """Finds modules on ``search_path`` without importing anything; ``root_packages`` are the
    internal packages (the others are external)."""

    def __init__(self, search_path: Iterable[str | Path], root_packages: Iterable[str]) -> None:
        self.search_path = [Path(p) if str(p) else Path.cwd() for p in search_path]
        self.root_packages = tuple(dict.fromkeys(root_packages))
        self._cache: dict[str, Located | None] = {}

    def is_internal(self, module: str) -> bool:
        return within(module, self.root_packages)

    def locate(self, module: str) -> Located | None:
        """The module's location, or None when it cannot be found."""
        if module in self._cache:
            return self._cache[module]
        parent, _, name = module.rpartition(".")
        found: Located | None = None
        if not name.isidentifier():
            pass
        elif not parent:
            hit = _find_in(name, self.search_path)
            if hit is not None:
                found = Located(module, *hit)
        else:
            outer = self.locate(parent)
            if outer is not None and outer.is_package:
                hit = _find_in(name, outer.folders)
                if hit is not None:
                    found = Located(module, *hit)
        self._cache[module] = found
        return found

    def submodules(self, module: str) -> list[str]:
        """``module`` and every module below it (namespace folders included), sorted."""
        top = self.locate(module)
        if top is None:
            return []
        found = {module}
        stack = [(module, folder) for folder in top.folders]
        while stack:
            name, folder = stack.pop()
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:
                if entry.name in SKIP_DIRS:
                    continue
                stem = entry.name
                if entry.is_dir():
                    if stem.isidentifier():
                        child = f"{name}.{stem}"
                        if self.locate(child) is not None and child not in found:
                            found.add(child)
                            stack.append((child, Path(entry.path)))
                    continue
                for suffix in (".py", *_EXTENSION_SUFFIXES):
                    if stem.endswith(suffix) and stem[: -len(suffix)].isidentifier():
                        base = stem[: -len(suffix)]
                        if base != "__init__":
                            found.add(f"{name}.{base}")
                        break
        return sorted(found)

    def explain(self, module: str) -> str:
        """Why ``module`` cannot be found (for an internal name)."""
        parts = module.split(".")
        top = parts[0]
        if self.locate(top) is None:
            where = ", ".join(str(p) for p in self.search_path[:4]) or "(empty)"
            more = " ..." if len(self.search_path) > 4 else ""
            return (f"its root package {top} is not on the search path (not installed, or the "
                    f"wrong source root: searched {where}{more})")
        for i in range(1, len(parts)):
            prefix = ".".join(parts[: i + 1])
            if self.locate(prefix) is not None:
                continue
            outer = self.locate(".".join(parts[:i]))
            assert outer is not None
            if not outer.is_package:
                return f"{outer.module} is a module ({outer.file}), not a package"
            folders = ", ".join(str(f) for f in outer.folders)
            kind = "namespace folder (no __init__.py)" if outer.file is None else "package"
            return (f"the {kind} {outer.module} ({folders}) has no {parts[i]}.py or {parts[i]}/ "
                    "(misspelt, or moved?)")
        return "not found"  # pragma: no cover - locate() and explain() agree


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


def _shortest_tree(
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


def _path_to(via: dict[str, Hop | None], node: str) -> list[Hop]:
    hops: list[Hop] = []
    while (step := via[node]) is not None:
        hops.append(step)
        node = step.importer
    return list(reversed(hops))


def _reached_targets(via: dict[str, Hop | None], source: str, forbidden: list[str]) -> list[str]:
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


def _drop_tails(chains: list[EagerChain]) -> list[EagerChain]:
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
        via = _shortest_tree(index, source, sources, exempt, forbidden)
        for target in _reached_targets(via, source, forbidden):
            chains.append(EagerChain(source, target, tuple(_path_to(via, target))))
    return _drop_tails(chains)


def _names_import_of(file: Path, module: str) -> bool:
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    top = module.split(".", maxsplit=1)[0]
    if top not in text:
        return False
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if any(within(a.name, [module]) for a in node.names):
                return True
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if within(node.module, [module]):
                return True
            if any(within(f"{node.module}.{a.name}", [module]) for a in node.names):
                return True
    return False


def _imported_anywhere(locator: Locator, module: str) -> bool:
    """Some file of the root packages imports ``module`` (or a module below it)."""
    for root in locator.root_packages:
        located = locator.locate(root)
        if located is None:
            continue
        files = [located.file] if located.file is not None else []
        for folder in located.folders:
            for dirpath, dirnames, filenames in os.walk(folder):
                dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
                files.extend(Path(dirpath, f) for f in filenames if f.endswith(".py"))
        if any(f is not None and _names_import_of(f, module) for f in files):
            return True
    return False


def unresolved_modules(
    locator: Locator, sources: Iterable[str], forbidden: Iterable[str]
) -> list[str]:
    """One message per source or forbidden module the check could not see (so a contract never
    passes without checking): a source outside the root packages or not found, an internal
    forbidden module not found, an external one neither installed nor imported anywhere."""
    errors: list[str] = []
    roots = ", ".join(locator.root_packages) or "(none)"
    for source in sources:
        if not locator.is_internal(source):
            errors.append(f"source module {source} is not inside the root packages ({roots}): "
                          "the wrong root? add its package to root_packages")
        elif locator.locate(source) is None:
            errors.append(f"source module {source} not found: {locator.explain(source)}")
    for name in forbidden:
        if locator.is_internal(name):
            if locator.locate(name) is None:
                errors.append(f"forbidden module {name} not found: {locator.explain(name)}")
        elif locator.locate(name) is None and not _imported_anywhere(locator, name):
            errors.append(f"forbidden module {name} is not installed and no module of the root "
                          f"packages ({roots}) imports it: misspelt, or the wrong root?")
    return errors


def _origins(index_a: EagerIndex, moved_from: dict[str, set[str]], module: str) -> set[str]:
    """The modules of the base tree that ``module`` stands for: itself when it exists there
    (an external module always does) and the modules its moved definitions came from."""
    found = set(moved_from.get(module, ()))
    loc = index_a.locator
    if not loc.is_internal(module) or loc.locate(module) is not None:
        found.add(module)
    return found


def classify_chains(
    index_b: EagerIndex,
    index_a: EagerIndex,
    sources: Iterable[str],
    forbidden: Iterable[str],
    exempt: Iterable[str] = (),
    *,
    as_packages: bool = True,
    moved_from: dict[str, set[str]] | None = None,
) -> tuple[list[EagerChain], list[EagerChain]]:
    """The import-time chains of the new tree (``index_b``), split into those the change added
    and those that already existed in the base tree (``index_a``): ``(new, existing)``.

    A hop is old when the base tree has it: the importer (or the module its definitions moved
    from, ``moved_from``: new module -> old modules) ran the imported module (or the module
    that one's definitions came from) at import time, or both stand for the same old module (a
    split file importing its own parts). The existing chains are the shortest ones through old
    hops only. Each hop the change added (from a module the entry point loads) that leads to a
    forbidden module through modules the entry point did not load before gives a new chain
    through it, even where the contract was already broken: so a re-export that adds a second
    route to the kernels is reported, while a new hop into a module that was loaded anyway is
    not a new chain.
    """
    sources, forbidden, exempt = list(sources), list(forbidden), list(exempt)
    moved = moved_from or {}
    old_cache: dict[tuple[str, str], bool] = {}

    def is_old(hop: Hop) -> bool:
        key = (hop.importer, hop.imported)
        if key not in old_cache:
            left = _origins(index_a, moved, hop.importer)
            right = _origins(index_a, moved, hop.imported)
            old_cache[key] = bool(left & right) or any(
                h.imported in right for mu in left for h in index_a.edges(mu)
            )
        return old_cache[key]

    def old_tree(source: str) -> dict[str, Hop | None]:
        """Breadth-first predecessors from the source through hops that are all old."""
        via: dict[str, Hop | None] = {source: None}
        queue = deque([source])
        while queue:
            module = queue.popleft()
            for hop in index_b.hops(module, forbidden):
                if hop.imported in via or not is_old(hop):
                    continue
                if module == source and not hop.line_number and within(hop.imported, sources):
                    continue
                via[hop.imported] = hop
                if not within(hop.imported, forbidden):
                    queue.append(hop.imported)
        return via

    old_trees: dict[str, dict[str, Hop | None]] = {}

    def old_reach(source: str) -> set[str]:
        """The modules the source loads through hops that are all old."""
        if source not in old_trees:
            old_trees[source] = old_tree(source)
        return set(old_trees[source])

    def old_chains(source: str) -> dict[str, list[Hop]]:
        via = old_trees.get(source) or old_tree(source)
        return {t: _path_to(via, t) for t in _reached_targets(via, source, forbidden)}

    def tails_from(start: str, blocked: set[str]) -> dict[str, list[Hop]]:
        """Shortest routes from ``start`` to each forbidden module, not through a module the
        source loaded before the change (a forbidden module itself may be reached again)."""
        if within(start, forbidden):
            return {start: []}
        via: dict[str, Hop | None] = {start: None}
        queue = deque([start])
        while queue:
            module = queue.popleft()
            for hop in index_b.hops(module, forbidden):
                target = hop.imported
                if target in via or (target in blocked and not within(target, forbidden)):
                    continue
                via[target] = hop
                if not within(target, forbidden):
                    queue.append(target)
        return {t: _path_to(via, t) for t in _reached_targets(via, start, forbidden)}

    new: dict[tuple[str, str, tuple[Hop, ...]], EagerChain] = {}
    existing: list[EagerChain] = []
    for source in index_b.entry_points(sources, exempt, forbidden, as_packages):
        via = _shortest_tree(index_b, source, sources, exempt, forbidden)
        before = old_reach(source)
        for target, old_hops in old_chains(source).items():
            existing.append(EagerChain(source, target, tuple(old_hops)))
        for module in list(via):
            if within(module, forbidden):
                continue
            for hop in index_b.hops(module, forbidden):
                if is_old(hop) or (hop.imported in before and not within(hop.imported,
                                                                            forbidden)):
                    continue  # an old hop, or a new route to a module loaded anyway
                if module == source and not hop.line_number and within(hop.imported, sources):
                    continue  # the enclosing package is an entry point of its own
                head = [*_path_to(via, module), hop]
                for target, tail in tails_from(hop.imported, before).items():
                    hops = tuple(head + tail)
                    if len({h.imported for h in hops}) < len(hops):
                        continue  # runs in a circle: the chain is found the other way round
                    new.setdefault((source, target, hops), EagerChain(source, target, hops))
    return _drop_tails(list(new.values())), _drop_tails(existing)
