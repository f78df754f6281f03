"""move_check: verify that definitions moved between two git refs moved safely.

For every top-level class or function that left one module and appeared in another between
``REF_A`` and ``REF_B`` it reports:

* whether the body is identical (``ast.dump``; formatting-insensitive, docstrings count) and a
  unified diff numbered with the files' lines when it is not;
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

import argparse
import json
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mem_cache_refactor.modpath import SourceRoots
from mem_cache_refactor.move_check._defs import (
    Definition,
    changed_members,
    collect_definitions,
    find_moves,
    source_diff,
    unchanged_new_lines,
)
from mem_cache_refactor.move_check._git import (
    GitError,
    blame,
    changed_py_files,
    export_tree,
    git,
    rev_list,
    rev_parse,
)
from mem_cache_refactor.move_check._probe import (
    OldPath,
    probe_old_paths,
    run_import_linter,
    static_old_path,
)
from mem_cache_refactor.move_check._sites import ImportSite, find_import_sites

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

#: default --min-blame: the share (%) of a moved definition's lines blame must trace back
DEFAULT_MIN_BLAME = 90.0


@dataclass(frozen=True, slots=True)
class Options:
    """What the caller accepts deliberately, and how to run the probes."""

    allow_edit: tuple[str, ...] = ()
    allow_removal: tuple[str, ...] = ()
    allow_probe_error: bool = False
    min_blame: float = DEFAULT_MIN_BLAME
    contracts: bool = True
    src_roots: tuple[str, ...] = ()
    python: str | None = None


@dataclass(frozen=True, slots=True)
class MoveReport:
    """One moved definition and the verdicts on it."""

    name: str
    kind: str
    old_module: str
    new_module: str
    old_file: str
    old_lines: tuple[int, int]
    new_file: str
    new_lines: tuple[int, int]
    body_identical: bool
    edit_allowed: bool
    changed_members: tuple[str, ...] | None
    diff: str
    stale_sites: tuple[ImportSite, ...]
    old_path: OldPath
    blame_lines: int
    blame_before_move: int
    blame_sources: dict[str, int]
    removal_allowed: bool = False
    probe_error_allowed: bool = False
    min_blame: float = DEFAULT_MIN_BLAME

    @property
    def blame_share(self) -> float:
        return self.blame_before_move / self.blame_lines if self.blame_lines else 0.0

    @property
    def blame_ok(self) -> bool:
        return 100.0 * self.blame_share + 1e-9 >= self.min_blame

    @property
    def sites_are_stale(self) -> bool:
        """Old-path import sites fail unless the old path is a deliberate, silent re-export."""
        return self.old_path.status != "reexport"

    @property
    def failures(self) -> list[str]:
        out: list[str] = []
        where = f"{self.old_module}.{self.name} -> {self.new_module}.{self.name}"
        if not self.body_identical and not self.edit_allowed:
            hint = ", ".join(f"{self.name}.{m}" for m in self.changed_members or ()) or self.name
            out.append(f"{where}: body changed (declare with --allow-edit {hint})")
        for s in self.stale_sites if self.sites_are_stale else ():
            out.append(f"{s.path}:{s.line}: still imports {s.target} ({where})")
        status = self.old_path.status
        if status == "different":
            out.append(f"{where}: old path resolves to a different object")
        elif status == "gone" and not self.removal_allowed:
            out.append(
                f"{where}: old path {self.old_module}.{self.name} is gone: leave a shim, or "
                f"accept the removal with --allow-removal {self.old_module}.{self.name}"
            )
        elif status == "error" and not self.probe_error_allowed:
            out.append(
                f"{where}: old path not verified (probe error): fix the probe environment "
                "(--python, --src-root) or accept with --allow-probe-error"
            )
        if not self.blame_ok:
            out.append(
                f"{where}: git blame -C -C -C traces {100.0 * self.blame_share:.1f}% of the "
                f"moved lines to commits before the move (< --min-blame {self.min_blame:g}): "
                "move the code unedited in its own commit, or lower --min-blame"
            )
        return out


@dataclass(frozen=True, slots=True)
class ContractReport:
    """import-linter at both refs: contracts broken at REF_B (new ones fail the check)."""

    ran: bool
    note: str
    configured: bool = False
    skipped: bool = False
    kept: tuple[str, ...] = ()
    newly_broken: tuple[str, ...] = ()
    already_broken: tuple[str, ...] = ()
    details: str = ""


@dataclass(frozen=True, slots=True)
class Report:
    ref_a: str
    ref_b: str
    commit_a: str
    commit_b: str
    moves: tuple[MoveReport, ...]
    contracts: ContractReport
    failures: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, object]:
        moves = []
        for m in self.moves:
            d = asdict(m)
            d["stale_sites"] = [asdict(s) for s in m.stale_sites]
            d["old_path"] = asdict(m.old_path)
            d["blame_share"] = round(m.blame_share, 4)
            d["failures"] = m.failures
            moves.append(d)
        data = {
            "ref_a": self.ref_a,
            "ref_b": self.ref_b,
            "commit_a": self.commit_a,
            "commit_b": self.commit_b,
            "ok": self.ok,
            "moves": moves,
            "contracts": asdict(self.contracts),
            "failures": list(self.failures),
        }
        result: dict[str, object] = json.loads(json.dumps(data))  # tuples become lists
        return result


def _broken_details(output: str, names: tuple[str, ...]) -> str:
    """lint-imports' explanation blocks of the contracts ``names`` (a name line, then dashes)."""
    lines = output.splitlines()
    blocks: list[str] = []
    for i, line in enumerate(lines[:-1]):
        if line.strip() in names and set(lines[i + 1].strip()) == {"-"}:
            end = i + 2
            while end < len(lines) and not (
                end + 1 < len(lines)
                and lines[end + 1].strip()
                and set(lines[end + 1].strip()) == {"-"}
                and lines[end].strip()
            ):
                end += 1
            blocks.append("\n".join(lines[i:end]).strip())
    return "\n\n".join(blocks)


def _contracts(
    tree_a: Path, roots_a: list[Path], tree_b: Path, roots_b: list[Path], python: str | None
) -> ContractReport:
    run_b = run_import_linter(tree_b, roots_b, python=python)
    if not run_b.ran:
        note = run_b.output.strip()[-2000:] or "lint-imports did not run"
        return ContractReport(False, note, configured=run_b.configured)
    broken_b = [name for name, kept in run_b.results.items() if not kept]
    kept_b = tuple(name for name, kept in run_b.results.items() if kept)
    if not broken_b:
        return ContractReport(True, "lint-imports at REF_B", True, False, kept_b)
    run_a = run_import_linter(tree_a, roots_a, python=python)
    before = run_a.results if run_a.ran else {}
    newly = tuple(n for n in broken_b if before.get(n, True))
    already = tuple(n for n in broken_b if not before.get(n, True))
    return ContractReport(
        True, "lint-imports at REF_B (and REF_A)", True, False, kept_b, newly, already,
        _broken_details(run_b.output, newly),
    )


def _blame(
    root: Path, ref_b: str, new: Definition, change_commits: set[str], only: set[int]
) -> tuple[int, int, dict[str, int]]:
    # a short definition is one short block: let blame trace it (git's default needs 40 chars)
    alnum = sum(c.isalnum() for c in new.source)
    min_chars = min(40, max(10, alnum // 2))
    traced = blame(root, ref_b, new.path, new.start, new.end, min_chars=min_chars)
    lines = [b for b in traced if b.line in only]
    before = [b for b in lines if b.commit not in change_commits]
    sources = Counter(f"{b.orig_path}@{b.commit[:10]}" for b in before)
    return len(lines), len(before), dict(sorted(sources.items()))


def _names(old: Definition, new: Definition) -> set[str]:
    return {old.name, old.qualname, new.qualname}


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
    """``--allow-removal`` names the old path (``module.Name``), its module, or ``Name``."""
    return bool({old.name, old.qualname, old.module} & allow)


def _old_path(probe: OldPath, roots_b: list[Path], old: Definition) -> OldPath:
    """When the probe could not decide, a static look at the old module settles ``gone``."""
    if probe.status != "error":
        return probe
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
            roots_b, Path(tmp), [(old.module, old.name, new.module) for old, new in pairs],
            python=opts.python,
        )
        change_commits = rev_list(root, commit_a, commit_b)
        moves: list[MoveReport] = []
        for (old, new), probe in zip(pairs, probes):
            identical = old.dump == new.dump
            members = None if identical else changed_members(old, new)
            mine = tuple(
                s for s in sites if s.target in (old.qualname, f"{old.module}.*")
            )
            only = set(range(new.start, new.end + 1)) if identical else unchanged_new_lines(
                old, new
            )
            total, before, sources = _blame(root, commit_b, new, change_commits, only)
            moves.append(
                MoveReport(
                    name=old.name,
                    kind=old.kind,
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
                    old_path=_old_path(probe, roots_b, old),
                    blame_lines=total,
                    blame_before_move=before,
                    blame_sources=sources,
                    removal_allowed=_removal_allowed(allow_removal, old),
                    probe_error_allowed=opts.allow_probe_error,
                    min_blame=opts.min_blame,
                )
            )
        if not opts.contracts:
            contracts = ContractReport(False, "skipped (--no-contracts)", skipped=True)
        else:
            contracts = _contracts(tree_a, roots_a, tree_b, roots_b, opts.python)
    failures = [f for m in moves for f in m.failures]
    if contracts.configured and not contracts.ran:
        failures.append(
            "import-linter is configured but could not run (see contracts above): fix the "
            "environment (--src-root, --python) or skip deliberately with --no-contracts"
        )
    failures += [f"contract broken by the change: {name}" for name in contracts.newly_broken]
    return Report(ref_a, ref_b, commit_a, commit_b, tuple(moves), contracts, tuple(failures))


def _rel_to(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def _indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(prefix + line if line else line for line in text.rstrip("\n").splitlines())


def render_text(report: Report) -> str:
    """Human-readable report."""
    out = [
        f"move-check {report.ref_a}..{report.ref_b} "
        f"({report.commit_a[:10]}..{report.commit_b[:10]}): {len(report.moves)} move(s)"
    ]
    for m in report.moves:
        verdict = "FAIL" if m.failures else "ok"
        out.append("")
        out.append(f"[{verdict}] {m.kind} {m.name}: {m.old_module} -> {m.new_module}")
        out.append(f"  from: {m.old_file}:{m.old_lines[0]}-{m.old_lines[1]}")
        out.append(f"  to:   {m.new_file}:{m.new_lines[0]}-{m.new_lines[1]}")
        if m.body_identical:
            out.append("  body: identical (ast.dump)")
        else:
            tag = "allowed by --allow-edit (move + edit)" if m.edit_allowed else "NOT allowed"
            where = f" in {', '.join(m.changed_members)}" if m.changed_members else ""
            out.append(f"  body: CHANGED{where}, {tag}")
            out.append(_indent(m.diff))
        p = m.old_path
        line = f"  old path {m.old_module}.{m.name}: {p.status} ({p.detail})"
        if p.mechanism:
            line += f" via {p.mechanism}"
        out.append(line)
        if p.status == "gone" and m.removal_allowed:
            line += " [removal accepted: --allow-removal]"
        elif p.status == "error" and m.probe_error_allowed:
            line += " [accepted: --allow-probe-error]"
        out[-1] = line
        if p.warning:
            out.append(f"    warning: {p.warning}")
        scope = "" if m.body_identical else " unedited"
        out.append(
            f"  git blame -C -C -C: {m.blame_before_move}/{m.blame_lines}{scope} lines "
            f"({100.0 * m.blame_share:.1f}%) from commits before the move "
            f"({'ok' if m.blame_ok else 'UNDER'} --min-blame {m.min_blame:g})"
        )
        for src, n in m.blame_sources.items():
            out.append(f"    {n:4d} line(s) from {src}")
        if m.stale_sites:
            if m.sites_are_stale:
                out.append(f"  stale import sites ({len(m.stale_sites)}):")
            else:
                out.append(
                    f"  import sites of the old path ({len(m.stale_sites)}), allowed: "
                    "the old path is a silent re-export"
                )
            out.extend(f"    {s.path}:{s.line}: {s.code}" for s in m.stale_sites)
        else:
            out.append("  stale import sites: none")
    c = report.contracts
    out.append("")
    if not c.ran:
        state = "NOT RUN although configured" if c.configured else "not checked"
        out.append(f"contracts: {state} ({c.note})")
    else:
        out.append(
            f"contracts ({c.note}): {len(c.kept)} kept, {len(c.newly_broken)} broken by the "
            f"change, {len(c.already_broken)} already broken at {report.ref_a}"
        )
        for name in c.newly_broken:
            out.append(f"  BROKEN: {name}")
        for name in c.already_broken:
            out.append(f"  already broken before: {name}")
        if c.details:
            out.append(_indent(c.details, "    "))
    out.append("")
    if report.failures:
        out.append(f"FAILED ({len(report.failures)}):")
        out.extend(f"  {f}" for f in report.failures)
    else:
        out.append("OK: every move is clean")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
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
    )
    try:
        start = args.root or Path.cwd()
        root = Path(git(start, "rev-parse", "--show-toplevel").strip())
        report = check(root, args.ref_a, args.ref_b, options=options)
    except GitError as exc:
        print(f"move-check: {exc}", file=sys.stderr)
        return 2
    edits = {n for m in report.moves for n in (
        m.name, f"{m.old_module}.{m.name}", f"{m.new_module}.{m.name}")}
    for name in args.allow_edit:
        if name not in edits and name.rpartition(".")[0] not in edits:
            print(f"move-check: --allow-edit {name} matches no moved definition",
                  file=sys.stderr)
    removals = {n for m in report.moves for n in (m.name, m.old_module,
                                                   f"{m.old_module}.{m.name}")}
    for name in args.allow_removal:
        if name not in removals:
            print(f"move-check: --allow-removal {name} matches no moved definition",
                  file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render_text(report), end="")
    return 0 if report.ok else 1
