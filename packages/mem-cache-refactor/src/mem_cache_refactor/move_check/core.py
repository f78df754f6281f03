"""move_check: verify that definitions moved between two git refs moved safely.

For every top-level class or function that left one module and appeared in another between
``REF_A`` and ``REF_B`` it reports:

* whether the body is identical (``ast.dump``; formatting-insensitive, docstrings count) and a
  unified diff when it is not;
* the import sites in the tree at ``REF_B`` that still use the old path (``file:line``);
* whether the old path still resolves at ``REF_B`` and to the same object (shim / re-export) or
  is gone, found by importing both paths in a fresh interpreter with the ``REF_B`` tree first on
  ``sys.path``;
* the share of the new definition's lines that ``git blame -C -C -C`` attributes to commits
  before the move (commits not in ``REF_A..REF_B``);
* the import-linter contracts that ``REF_B`` breaks and ``REF_A`` kept.

It fails (exit 1) on a changed body not declared with ``--allow-edit NAME``, a stale import site,
an old path that resolves to a different object, or a newly broken contract. An import site of
the old path is stale unless the old path is a silent re-export (the same object without a
``DeprecationWarning``: the old path is deliberately still public, e.g. a package root that
re-exports a definition moved into a submodule); such sites are listed but do not fail.
Exit 2: usage or git error.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mem_cache_refactor.modpath import import_roots
from mem_cache_refactor.move_check._defs import (
    Definition,
    collect_definitions,
    find_moves,
    source_diff,
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
from mem_cache_refactor.move_check._probe import OldPath, probe_old_paths, run_import_linter
from mem_cache_refactor.move_check._sites import ImportSite, find_import_sites

__all__ = ["ContractReport", "MoveReport", "Report", "check", "main", "render_text"]


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
    diff: str
    stale_sites: tuple[ImportSite, ...]
    old_path: OldPath
    blame_lines: int
    blame_before_move: int
    blame_sources: dict[str, int]

    @property
    def blame_share(self) -> float:
        return self.blame_before_move / self.blame_lines if self.blame_lines else 0.0

    @property
    def sites_are_stale(self) -> bool:
        """Old-path import sites fail unless the old path is a deliberate, silent re-export."""
        return self.old_path.status != "reexport"

    @property
    def failures(self) -> list[str]:
        out: list[str] = []
        where = f"{self.old_module}.{self.name} -> {self.new_module}.{self.name}"
        if not self.body_identical and not self.edit_allowed:
            out.append(f"{where}: body changed (declare with --allow-edit {self.name})")
        for s in self.stale_sites if self.sites_are_stale else ():
            out.append(f"{s.path}:{s.line}: still imports {s.target} ({where})")
        if self.old_path.status == "different":
            out.append(f"{where}: old path resolves to a different object")
        return out


@dataclass(frozen=True, slots=True)
class ContractReport:
    """import-linter at both refs: contracts broken at REF_B (new ones fail the check)."""

    ran: bool
    note: str
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
    tree_a: Path, roots_a: list[Path], tree_b: Path, roots_b: list[Path]
) -> ContractReport:
    run_b = run_import_linter(tree_b, roots_b)
    if not run_b.ran:
        return ContractReport(False, run_b.output.strip()[-2000:] or "lint-imports did not run")
    broken_b = [name for name, kept in run_b.results.items() if not kept]
    kept_b = tuple(name for name, kept in run_b.results.items() if kept)
    if not broken_b:
        return ContractReport(True, "lint-imports at REF_B", kept_b)
    run_a = run_import_linter(tree_a, roots_a)
    before = run_a.results if run_a.ran else {}
    newly = tuple(n for n in broken_b if before.get(n, True))
    already = tuple(n for n in broken_b if not before.get(n, True))
    return ContractReport(
        True, "lint-imports at REF_B (and REF_A)", kept_b, newly, already,
        _broken_details(run_b.output, newly),
    )


def _blame(
    root: Path, ref_b: str, new: Definition, change_commits: set[str]
) -> tuple[int, int, dict[str, int]]:
    lines = blame(root, ref_b, new.path, new.start, new.end)
    before = [b for b in lines if b.commit not in change_commits]
    sources = Counter(f"{b.orig_path}@{b.commit[:10]}" for b in before)
    return len(lines), len(before), dict(sorted(sources.items()))


def _allowed(allow: set[str], old: Definition, new: Definition) -> bool:
    return bool({old.name, old.qualname, new.qualname} & allow)


def check(root: Path, ref_a: str, ref_b: str, allow_edit: list[str] | None = None) -> Report:
    """Compare ``ref_a`` and ``ref_b`` of the repository at ``root`` (see the module docstring)."""
    allow = set(allow_edit or [])
    commit_a, commit_b = rev_parse(root, ref_a), rev_parse(root, ref_b)
    changed = changed_py_files(root, commit_a, commit_b)
    with tempfile.TemporaryDirectory(prefix="move_check_") as tmp:
        tree_a, tree_b = Path(tmp) / "a", Path(tmp) / "b"
        files_a = export_tree(root, commit_a, tree_a)
        files_b = export_tree(root, commit_b, tree_b)
        pairs = find_moves(
            collect_definitions(tree_a, changed), collect_definitions(tree_b, changed)
        )
        roots_a, roots_b = import_roots(tree_a, files_a), import_roots(tree_b, files_b)
        targets = {old.qualname for old, _ in pairs}
        sites = find_import_sites(tree_b, files_b, targets)
        probes = probe_old_paths(
            roots_b, Path(tmp), [(old.module, old.name, new.module) for old, new in pairs]
        )
        change_commits = rev_list(root, commit_a, commit_b)
        moves: list[MoveReport] = []
        for (old, new), probe in zip(pairs, probes):
            identical = old.dump == new.dump
            mine = tuple(
                s for s in sites if s.target in (old.qualname, f"{old.module}.*")
            )
            total, before, sources = _blame(root, commit_b, new, change_commits)
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
                    edit_allowed=_allowed(allow, old, new),
                    diff="" if identical else source_diff(old, new),
                    stale_sites=mine,
                    old_path=probe,
                    blame_lines=total,
                    blame_before_move=before,
                    blame_sources=sources,
                )
            )
        if pairs:
            contracts = _contracts(tree_a, roots_a, tree_b, roots_b)
        else:
            contracts = ContractReport(False, "no moves: contracts not checked")
    failures = [f for m in moves for f in m.failures]
    failures += [f"contract broken by the change: {name}" for name in contracts.newly_broken]
    return Report(ref_a, ref_b, commit_a, commit_b, tuple(moves), contracts, tuple(failures))


def _indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(prefix + line if line else line for line in text.rstrip("\n").splitlines())


def render_text(report: Report) -> str:
    """Human-readable report."""
    out = [
        f"move_check {report.ref_a}..{report.ref_b} "
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
            out.append(f"  body: CHANGED, {tag}")
            out.append(_indent(m.diff))
        p = m.old_path
        line = f"  old path {m.old_module}.{m.name}: {p.status} ({p.detail})"
        if p.mechanism:
            line += f" via {p.mechanism}"
        out.append(line)
        if p.warning:
            out.append(f"    warning: {p.warning}")
        out.append(
            f"  git blame -C -C -C: {m.blame_before_move}/{m.blame_lines} lines "
            f"({100.0 * m.blame_share:.1f}%) from commits before the move"
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
        out.append(f"contracts: not checked ({c.note})")
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
        prog="python -m tools.move_check",
        description="Check the classes/functions moved between two git refs.",
    )
    parser.add_argument("ref_a", help="the ref before the move (e.g. HEAD~1)")
    parser.add_argument("ref_b", help="the ref after the move (e.g. HEAD)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--allow-edit",
        action="append",
        default=[],
        metavar="NAME",
        help="accept a changed body for NAME (plain or dotted old/new name): a move + edit",
    )
    parser.add_argument("--root", type=Path, default=None, help="repository (default: cwd's)")
    args = parser.parse_args(argv)
    try:
        start = args.root or Path.cwd()
        root = Path(git(start, "rev-parse", "--show-toplevel").strip())
        report = check(root, args.ref_a, args.ref_b, args.allow_edit)
    except GitError as exc:
        print(f"move_check: {exc}", file=sys.stderr)
        return 2
    known = {n for m in report.moves for n in (
        m.name, f"{m.old_module}.{m.name}", f"{m.new_module}.{m.name}")}
    for name in args.allow_edit:
        if name not in known:
            print(f"move_check: --allow-edit {name} matches no moved definition", file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render_text(report), end="")
    return 0 if report.ok else 1
