"""move_check: verify that definitions moved between two git refs moved safely.

For every top-level class, function or module-level constant (``NAME = value``) that left one
module and appeared in another between ``REF_A`` and ``REF_B`` it reports the following. A
definition that left under one name and appeared under another (in another module or the same
one) is a *renamed* move when their sources match once the names are aligned (exactly, or at
least 75 % similar; see :func:`~mem_cache_refactor.move_check._pairing.find_moves`). A method
that left its class on its own is a move too: ``C.m`` gone from ``C`` whose definition
appeared as a module function ``m`` or as a method ``D.m`` of another (or a new) class
(identical, or at least 75 % similar and shown as an edit); a function that became a method
likewise. A ``@staticmethod`` dropped on the way to module level is no edit.

* whether the body is identical (``ast.dump``; formatting-insensitive, docstrings count), or
  identical once the renamed moves of the range are applied to its identifiers (listed), and a
  unified diff numbered with the files' lines when it is neither;
* the import sites in the tree at ``REF_B`` that still use the old path (``file:line``), at
  module level or inside functions, in every file of the tree;
* whether the old path still resolves at ``REF_B`` and to the same object (shim / re-export) or
  is gone, found by importing both paths in a fresh interpreter with the ``REF_B`` source roots
  first on ``PYTHONPATH``; when that interpreter cannot import the tree (missing dependencies),
  a static look at the old module decides whether the old path is gone;
* the share of the new definition's (unedited) lines that ``git blame -C -C -C`` attributes to
  commits before the move (commits not in ``REF_A..REF_B``);
* the import-linter contracts that ``REF_B`` breaks and ``REF_A`` kept.

Module names come from the repository's source roots
(:class:`mem_cache_refactor.modpath.SourceRoots`: ``pyproject.toml``, ``src/``, ``python/``,
``--src-root DIR``).

Nothing passes silently. It fails (exit 1) on a changed body not declared with ``--allow-edit``
(``Class``, ``Class.method`` or a dotted path), a stale import site, an old path that resolves to
a different object, an old path that is ``gone`` (accept with ``--allow-removal NAME``), a probe
``error`` (accept with ``--allow-probe-error``), a blame share under ``--min-blame`` (default
90 %), a configured import-linter that cannot run (skip deliberately with ``--no-contracts``) and
a newly broken contract. An import site of the old path is stale unless the old path is a silent
re-export (the same object without a ``DeprecationWarning``: the old path is deliberately still
public); such sites are listed but do not fail. Exit 2: usage or git error (an unknown ref is
named).
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

from mem_cache_refactor._cli import OneLineParser
from mem_cache_refactor.modpath import SourceRoots
from mem_cache_refactor.move_check._contracts import check_contracts
from mem_cache_refactor.move_check._defs import (
    Definition,
    changed_members,
    collect_definitions,
    moved_lines,
    source_diff,
    unchanged_new_lines,
)
from mem_cache_refactor.move_check._git import (
    BlameLine,
    GitError,
    blame_ranges,
    changed_py_files,
    export_tree,
    git,
    rev_list,
    rev_parse,
)
from mem_cache_refactor.move_check._pairing import (
    find_moves,
    module_aliases,
    same_after_renames,
    same_after_resolving,
    same_body,
)
from mem_cache_refactor.move_check._probe import (
    OldPath,
    probe_old_paths,
    static_old_path,
    static_reexport,
    top_level_names,
)
from mem_cache_refactor.move_check._report import (
    BLAME_MIN_CHARS,
    DEFAULT_MIN_BLAME,
    ContractReport,
    MoveReport,
    Options,
    Report,
    is_private_path,
    render_text,
)
from mem_cache_refactor.move_check._sites import find_import_sites

__all__ = [
    "DEFAULT_MIN_BLAME",
    "ContractReport",
    "MoveReport",
    "Options",
    "Report",
    "check",
    "main",
    "render_text",
]

def _min_chars(new: Definition) -> int:
    # a short definition is one short block: let blame trace it (git's default needs 40 chars)
    alnum = sum(c.isalnum() for c in new.source)
    return min(40, max(BLAME_MIN_CHARS, alnum // 2))


_BlameKey = tuple[str, int, bool]


def _blame_key(old: Definition, new: Definition) -> _BlameKey:
    """(file, threshold, ignore whitespace): a definition that changed its indentation (a
    method moved to module level, a function into a class) is traced with ``git blame -w``."""
    return new.path, _min_chars(new), old.indent != new.indent


def _blame_all(
    root: Path, ref_b: str, pairs: list[tuple[Definition, Definition]]
) -> dict[_BlameKey, dict[int, BlameLine]]:
    """One ``git blame`` per new file (and threshold) for every moved definition in it."""
    groups: dict[_BlameKey, list[tuple[int, int]]] = {}
    for old, new in pairs:
        groups.setdefault(_blame_key(old, new), []).append((new.start, new.end))
    return {
        key: {b.line: b for b in blame_ranges(root, ref_b, key[0], ranges, min_chars=key[1],
                                              ignore_whitespace=key[2])}
        for key, ranges in groups.items()
    }


def _blame(
    traced: dict[_BlameKey, dict[int, BlameLine]], old: Definition, new: Definition,
    change_commits: set[str], only: set[int],
) -> tuple[int, int, dict[str, int]]:
    by_line = traced[_blame_key(old, new)]
    lines = [by_line[n] for n in range(new.start, new.end + 1) if n in only and n in by_line]
    before = [b for b in lines if b.commit not in change_commits]
    sources = Counter(f"{b.orig_path}@{b.commit[:10]}" for b in before)
    return len(lines), len(before), dict(sorted(sources.items()))


def _names(old: Definition, new: Definition) -> set[str]:
    return {old.name, old.qualname, new.name, new.qualname}


def _removal_names(old: Definition) -> set[str]:
    """What ``--allow-removal`` may name to accept that ``old``'s path is gone: the path, the
    name, the old module; for a method also its class (``Class``, ``module.Class``: every
    method that left it)."""
    names = {old.name, old.qualname, old.module}
    if old.parent:
        names |= {old.parent, f"{old.module}.{old.parent}"}
    return names


def _edit_allowed(
    allow: set[str], old: Definition, new: Definition, members: tuple[str, ...] | None
) -> bool:
    """A whole definition (``Name`` or a dotted path) or, for a class whose methods alone
    changed, each changed method (``Class.method`` or a dotted path ending so)."""
    names = _names(old, new)
    if names & allow:
        return True
    if not members:
        return False
    return all(any(f"{n}.{m}" in allow for n in names) for m in members)


def _removal_allowed(allow: set[str], old: Definition) -> bool:
    """``--allow-removal`` names the old path (``module.Name``), its module, or ``Name``; a
    private old path (``pkg._mod.Name``, ``pkg.mod._Name``) needs no shim and is accepted."""
    if is_private_path(old.module, old.name):
        return True
    return bool(_removal_names(old) & allow)


def _old_path(
    probe: OldPath, roots_b: list[Path], old: Definition, new: Definition
) -> OldPath:
    """When the probe could not decide, a static look at the old module settles ``gone``, and
    a plain ``from new import Name`` in it is a silent re-export."""
    if probe.status != "error":
        return probe
    if static_reexport(roots_b, old.module, old.name, new.module, new.name):
        return OldPath(
            "reexport",
            f"static check: {old.module} imports {new.name} from {new.module}, the same object; "
            f"the runtime probe failed: {probe.detail}",
            None, "from-import (static)",
        )
    resolvable, detail = static_old_path(roots_b, old.module, old.name)
    if not resolvable:
        return OldPath("gone", f"{detail}; the runtime probe failed: {probe.detail}", None, None)
    return OldPath("error", f"{probe.detail} ({detail})", None, None)


def check(
    root: Path,
    ref_a: str,
    ref_b: str,
    allow_edit: list[str] | None = None,
    options: Options | None = None,
) -> Report:
    """Compare ``ref_a`` and ``ref_b`` of the repository at ``root`` (see the module docstring)."""
    opts = options or Options()
    allow = set(allow_edit or []) | set(opts.allow_edit)
    allow_removal = set(opts.allow_removal)
    commit_a, commit_b = rev_parse(root, ref_a), rev_parse(root, ref_b)
    changed = changed_py_files(root, commit_a, commit_b)
    with tempfile.TemporaryDirectory(prefix="move_check_") as tmp:
        tree_a, tree_b = Path(tmp) / "a", Path(tmp) / "b"
        files_a = export_tree(root, commit_a, tree_a)
        files_b = export_tree(root, commit_b, tree_b)
        if opts.contracts_config:
            config = Path(opts.contracts_config).read_text(encoding="utf-8")
            for tree in (tree_a, tree_b):
                (tree / ".importlinter").write_text(config, encoding="utf-8")
        extra = [str(Path(r)) if not Path(r).is_absolute() else _rel_to(Path(r), root)
                 for r in opts.src_roots]
        src_a = SourceRoots.discover(tree_a, files_a, extra)
        src_b = SourceRoots.discover(tree_b, files_b, extra)
        pairs = find_moves(
            collect_definitions(tree_a, changed, src_a),
            collect_definitions(tree_b, changed, src_b),
        )
        roots_a, roots_b = src_a.paths(tree_a), src_b.paths(tree_b)
        targets = {old.qualname for old, _ in pairs}
        sites = find_import_sites(tree_b, files_b, targets, src_b)
        probes = probe_old_paths(
            roots_b, Path(tmp),
            [(old.module, old.name, new.module, new.name) for old, new in pairs],
            python=opts.python,
            tree=tree_b,
        )
        renames = {old.short: new.short for old, new in pairs if old.short != new.short}
        change_commits = rev_list(root, commit_a, commit_b)
        traced = _blame_all(root, commit_b, pairs)
        moves: list[MoveReport] = []
        for (old, new), probe in zip(pairs, probes):
            identical = same_body(old, new)
            applied = None if identical else same_after_renames(old, new, renames)
            identical = identical or applied is not None
            resolved = None if identical else _resolved(tree_a, tree_b, src_a, old, new)
            identical = identical or resolved is not None
            members = None if identical else changed_members(old, new)
            mine = tuple(
                s for s in sites if s.target in (old.qualname, f"{old.module}.*")
            )
            # a renamed or edited definition: only the lines whose text is unchanged can trace
            only = moved_lines(old, new) if same_body(old, new) else (
                unchanged_new_lines(old, new)
            )
            total, before, sources = _blame(traced, old, new, change_commits, only)
            chars = sum(c.isalnum() for n, text in enumerate(new.source.splitlines(), new.start)
                        if n in only for c in text)
            moves.append(
                MoveReport(
                    name=old.name,
                    new_name=new.name,
                    renames=applied or (),
                    resolved=resolved or (),
                    kind=old.kind,
                    new_kind=new.kind,
                    staticmethod_dropped=identical and old.kind != new.kind and (
                        old.plain != old.dump or new.plain != new.dump),
                    blame_whitespace=old.indent != new.indent,
                    old_module=old.module,
                    new_module=new.module,
                    old_file=old.path,
                    old_lines=(old.start, old.end),
                    new_file=new.path,
                    new_lines=(new.start, new.end),
                    body_identical=identical,
                    edit_allowed=identical or _edit_allowed(allow, old, new, members),
                    changed_members=members,
                    diff="" if identical else source_diff(old, new),
                    stale_sites=mine,
                    old_path=_old_path(probe, roots_b, old, new),
                    blame_lines=total,
                    blame_before_move=before,
                    blame_sources=sources,
                    removal_allowed=_removal_allowed(allow_removal, old),
                    probe_error_allowed=opts.allow_probe_error,
                    min_blame=opts.min_blame,
                    blame_chars=chars,
                )
            )
        if not opts.contracts:
            contracts = ContractReport(False, "skipped (--no-contracts)", skipped=True)
        else:
            moved_from: dict[str, set[str]] = {}
            for old, new in pairs:
                moved_from.setdefault(new.module, set()).add(old.module)
            contracts = check_contracts(tree_a, roots_a, tree_b, roots_b, opts.python,
                                   moved_from=moved_from)
    failures = [f for m in moves for f in m.failures]
    if contracts.configured and not contracts.ran:
        failures.append(
            "import-linter is configured but could not run (see contracts above): fix the "
            "environment (--src-root, --python) or skip deliberately with --no-contracts"
        )
    failures += [f"contract broken by the change: {name}" for name in contracts.newly_broken]
    return Report(ref_a, ref_b, commit_a, commit_b, tuple(moves), contracts, tuple(failures))


def _resolved(
    tree_a: Path, tree_b: Path, roots_a: SourceRoots, old: Definition, new: Definition
) -> tuple[str, ...] | None:
    """The references into the new module that the move unqualified, when they are the only
    difference (see :func:`~mem_cache_refactor.move_check._pairing.same_after_resolving`)."""
    if old.module == new.module:
        return None
    file_a, file_b = tree_a / old.path, tree_b / new.path
    if not (file_a.is_file() and file_b.is_file()):
        return None
    aliases = module_aliases(file_a.read_text(encoding="utf-8", errors="replace"), old.module,
                             old.path.endswith("__init__.py"), new.module)
    if not aliases:
        return None
    bound = top_level_names(file_b.read_text(encoding="utf-8", errors="replace"))
    return same_after_resolving(old, new, aliases, bound)


def _rel_to(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="move-check",
        description="Check the classes/functions moved between two git refs.",
    )
    parser.add_argument("ref_a", help="the ref before the move (e.g. HEAD~1)")
    parser.add_argument("ref_b", help="the ref after the move (e.g. HEAD)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--allow-edit", action="append", default=[], metavar="NAME",
        help="accept a changed body: Class, Class.method, function, or a dotted old/new path "
             "(a declared move + edit; repeatable)",
    )
    parser.add_argument(
        "--allow-removal", action="append", default=[], metavar="NAME",
        help="accept that the old path is gone: old.module.Name, old.module (all its moved "
             "names) or Name (repeatable)",
    )
    parser.add_argument(
        "--allow-probe-error", action="store_true",
        help="accept old paths the runtime probe could not verify (and static checks kept)",
    )
    parser.add_argument(
        "--min-blame", type=float, default=DEFAULT_MIN_BLAME, metavar="PCT",
        help=f"least share (%%) of moved lines blame must trace to commits before the move "
             f"(default {DEFAULT_MIN_BLAME:g}; 0 turns the check off)",
    )
    parser.add_argument(
        "--no-contracts", action="store_true",
        help="do not run import-linter even when the repository configures it",
    )
    parser.add_argument(
        "--src-root", action="append", default=[], metavar="DIR",
        help="an import root of the repository, relative to its top (repeatable; default: "
             "found from pyproject.toml, src/, python/ and the top)",
    )
    parser.add_argument(
        "--python", default=None, metavar="EXE",
        help="interpreter for the runtime probe and lint-imports (default: this one)",
    )
    parser.add_argument(
        "--contracts-config", default=None, metavar="FILE",
        help="an import-linter configuration (.importlinter format) to check at both refs "
             "instead of the trees' own, e.g. a new contract on older commits",
    )
    parser.add_argument("--root", type=Path, default=None, help="repository (default: cwd's)")
    args = parser.parse_args(argv)
    if not 0.0 <= args.min_blame <= 100.0:
        parser.error(f"--min-blame must be within 0..100, got {args.min_blame}")
    options = Options(
        allow_edit=tuple(args.allow_edit),
        allow_removal=tuple(args.allow_removal),
        allow_probe_error=args.allow_probe_error,
        min_blame=args.min_blame,
        contracts=not args.no_contracts,
        src_roots=tuple(args.src_root),
        python=args.python,
        contracts_config=str(Path(args.contracts_config).resolve())
        if args.contracts_config else None,
    )
    try:
        start = args.root or Path.cwd()
        root = Path(git(start, "rev-parse", "--show-toplevel").strip())
        report = check(root, args.ref_a, args.ref_b, options=options)
    except GitError as exc:
        print(f"move-check: {exc}", file=sys.stderr)
        return 2
    edits = {n for m in report.moves for n in (
        m.name, m.new_name, f"{m.old_module}.{m.name}", f"{m.new_module}.{m.new_name}")}
    for name in args.allow_edit:
        if name not in edits and name.rpartition(".")[0] not in edits:
            print(f"move-check: --allow-edit {name} matches no moved definition",
                  file=sys.stderr)
    removals = {n for m in report.moves for n in (m.name, m.old_module,
                                                   f"{m.old_module}.{m.name}")}
    removals |= {n for m in report.moves if m.kind == "method" for n in (
        m.name.rpartition(".")[0], f"{m.old_module}.{m.name.rpartition('.')[0]}")}
    for name in args.allow_removal:
        if name not in removals:
            print(f"move-check: --allow-removal {name} matches no moved definition",
                  file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render_text(report), end="")
    return 0 if report.ok else 1
