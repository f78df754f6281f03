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
excepted). When the new home among the paths cannot rename its definition (``Z`` already bound
or used there), the command changes no file and exits 2, saying why: the importers would
otherwise import a name that does not exist.
Not handled: string references (``"a.b.X"``, ``importlib.import_module``), imports inside
one-line compound statements (``if x: import y``), and ``import a.b`` whose head ``a`` is also
used for other attributes after a top-level rename. Run ``ruff check --fix`` (isort) afterwards
to re-sort the import blocks.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import libcst as cst

from mem_cache_refactor._cli import OneLineParser
from mem_cache_refactor._import_style import DEFAULT_LINE_LENGTH, line_length_for
from mem_cache_refactor._rename_uses import rename_definition, rename_locals
from mem_cache_refactor._rewrite_pass import ImportRewrite, ImportScan
from mem_cache_refactor.modpath import SKIP_DIRS, SourceRoots

__all__ = ["iter_python_files", "main", "rewrite_file", "rewrite_markdown", "rewrite_source"]


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
    that is safe (see :func:`mem_cache_refactor._rename_uses._safe_local_renames`); elsewhere
    the ``as`` stays. Returns ``source`` itself when nothing refers to ``old``. With
    ``rename_uses``, in the new home itself (``module`` is the new parent) a module-level
    definition still named like ``old`` is renamed too, with its uses and its ``__all__`` entry
    (see :func:`mem_cache_refactor._rename_uses.rename_definition`).
    """
    _check_path("old", old)
    _check_path("new", new)
    if old.rpartition(".")[2] not in source:  # every reference spells the last component
        return source
    tree = cst.parse_module(source)
    scan = ImportScan(old, module, is_package)
    tree.visit(scan)
    rewriter = ImportRewrite(scan, old, new, line_length)
    result = tree.visit(rewriter)
    changed = rewriter.changed
    if changed and rename_uses and rewriter.local_renames:
        result = rename_locals(result, rewriter.local_renames)
    old_last, new_parent, new_last = old.rpartition(".")[2], *new.rpartition(".")[::2]
    if rename_uses and module == new_parent and old_last != new_last:
        renamed = rename_definition(result, old_last, new_last)
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


def _binds_at_top(module: cst.Module, name: str) -> bool:
    """``module`` defines ``name`` at its top level (``def``, ``class`` or an assignment)."""
    for stmt in module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and stmt.name.value == name:
            return True
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) \
                    else [small.target] if isinstance(small, cst.AnnAssign) else []
                if any(isinstance(t, cst.Name) and t.value == name for t in targets):
                    return True
    return False


def _refused_rename(
    files: Iterable[Path], old: str, new: str, src_roots: Sequence[Path] = ()
) -> str | None:
    """With ``--rename-uses``: why the new home among ``files`` would keep its definition of the
    old name, else None. The importers are rewritten to import the new name, so a home that
    cannot rename its own definition (the new name already bound or used there, the old one
    declared ``global`` or spelt in a string) would leave them importing a name that does not
    exist; the command checks this first and then changes nothing."""
    old_last = old.rpartition(".")[2]
    new_parent, _, new_last = new.rpartition(".")
    if old_last == new_last:
        return None
    for file in files:
        if file.suffix != ".py" or _module_of(file, src_roots) != new_parent:
            continue
        try:
            module = cst.parse_module(file.read_text(encoding="utf-8"))
        except cst.ParserSyntaxError:
            return None
        if _binds_at_top(module, old_last) and \
                rename_definition(module, old_last, new_last) is None:
            return (f"{file} defines {old_last} but cannot rename it to {new_last} (the name "
                    f"{new_last} is already bound or used there, or {old_last} is declared "
                    "global or spelt in a string): pick another name, or rename it there first")
        return None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
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
    refused = _refused_rename(files, args.old, args.new, args.src_root) if args.rename_uses \
        else None
    if refused is not None:
        print(f"rewrite_imports: nothing changed: {refused}", file=sys.stderr)
        return 2
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
