"""The reports of move-check: per-move verdicts, contracts, the text rendering."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from mem_cache_refactor.move_check._chains import EagerResult
from mem_cache_refactor.move_check._probe import OldPath
from mem_cache_refactor.move_check._sites import ImportSite

__all__ = [
    "BLAME_MIN_CHARS",
    "DEFAULT_MIN_BLAME",
    "ContractReport",
    "MoveReport",
    "Options",
    "Report",
    "is_private_path",
    "render_text",
]

#: default --min-blame: the share (%) of a moved definition's lines blame must trace back
DEFAULT_MIN_BLAME = 90.0

#: the fewest alphanumeric characters ``git blame -C<n>`` is asked to match (``n``); moved text
#: with fewer (``_HEAD_DIM = 2``) cannot be traced by git at all
BLAME_MIN_CHARS = 10


def is_private_path(module: str, name: str) -> bool:
    """A path no user may import: a ``_x`` component in the module or a ``_X`` name (dunder
    names excepted), or anything in a pytest module (``test_x``, ``x_test``, ``conftest``:
    pytest collects it, nothing imports it, so a renamed test needs no shim). Its removal needs
    no shim; the private-modules convention forbids importing it from outside its package."""
    parts = [*module.split("."), *name.split(".")]
    last = module.rpartition(".")[2]
    if last == "conftest" or last.startswith("test_") or last.endswith("_test"):
        return True
    return any(p.startswith("_") and not p.startswith("__") for p in parts)


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
    #: an import-linter configuration used at both refs instead of the trees' own (a contract
    #: checked on commits that predate it)
    contracts_config: str | None = None


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
    #: the name at the new home ("" or ``name``: not renamed)
    new_name: str = ""
    #: identifier renames ("old -> new") that make the bodies identical (a renamed move)
    renames: tuple[str, ...] = ()
    #: the kind at the new home ("" or ``kind``: the same; a method can become a function)
    new_kind: str = ""
    #: a static method became a module function: identical but for ``@staticmethod``
    staticmethod_dropped: bool = False
    #: blame ran with ``-w`` (the move changed the indentation)
    blame_whitespace: bool = False
    #: references into the new module that the move unqualified ("alias.f -> f"), the only
    #: difference of an otherwise identical body
    resolved: tuple[str, ...] = ()
    #: the alphanumeric characters of the lines blame traces (None: not counted); under
    #: :data:`BLAME_MIN_CHARS` git cannot follow them, so the blame check does not apply
    blame_chars: int | None = None

    @property
    def blame_too_short(self) -> bool:
        """The moved text is too short for git to trace (see :data:`BLAME_MIN_CHARS`)."""
        return self.blame_chars is not None and self.blame_chars < BLAME_MIN_CHARS

    @property
    def target(self) -> str:
        """The name at the new home."""
        return self.new_name or self.name

    @property
    def blame_share(self) -> float:
        return self.blame_before_move / self.blame_lines if self.blame_lines else 0.0

    @property
    def renamed(self) -> bool:
        """A renamed move whose body is identical once the renames are applied."""
        return self.body_identical and bool(self.renames)

    @property
    def blame_ok(self) -> bool:
        if self.blame_lines == 0 and (self.renamed or self.edit_allowed):
            return True  # every line renamed or (declared) edited: nothing unedited to trace
        if self.blame_too_short:
            return True  # under git's copy threshold: blame cannot trace it, whatever the history
        return 100.0 * self.blame_share + 1e-9 >= self.min_blame

    @property
    def sites_are_stale(self) -> bool:
        """Old-path import sites fail unless the old path is a deliberate, silent re-export."""
        return self.old_path.status != "reexport"

    @property
    def failures(self) -> list[str]:
        out: list[str] = []
        where = f"{self.old_module}.{self.name} -> {self.new_module}.{self.target}"
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
    #: the eager_forbidden contracts, decided by comparing their chains at both refs
    eager: tuple[EagerResult, ...] = ()


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


def _indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(prefix + line if line else line for line in text.rstrip("\n").splitlines())


def _render_eager(results: tuple[EagerResult, ...], ref_a: str) -> list[str]:
    out: list[str] = []
    for r in results:
        out.append(f"  eager chains of {r.name!r}: {len(r.new)} new, {len(r.existing)} "
                   f"existing (already at {ref_a})")
        out.extend(f"    CANNOT CHECK: {e}" for e in r.errors)
        for chain in r.new:
            out.append(f"    NEW: {chain['source']} imports {chain['forbidden']} at import time:")
            out.append(f"        {chain['summary']}")
            out.extend(f"      {file}:{line}: {text}" if line else f"      {file}: {text}"
                       for file, line, text in chain["hops"])
        for chain in r.existing:
            out.append(f"    existing: {chain['summary']}")
    return out


def _now(m: MoveReport) -> str:
    """What the definition is at its new home, where that differs: a rename, or a method that
    became a function or a method of another class."""
    kind = m.new_kind or m.kind
    if kind != m.kind or m.kind == "method":
        if kind == m.kind and m.target == m.name:
            return ""
        return f" (now {kind} {m.target})"
    return f" (renamed {m.target})" if m.target != m.name else ""


def render_text(report: Report) -> str:
    """Human-readable report."""
    out = [
        f"move-check {report.ref_a}..{report.ref_b} "
        f"({report.commit_a[:10]}..{report.commit_b[:10]}): {len(report.moves)} move(s)"
    ]
    if not report.moves:
        out.append("  no class, function, constant or method moved between modules or classes")
    for m in report.moves:
        verdict = "FAIL" if m.failures else "ok"
        out.append("")
        out.append(f"[{verdict}] {m.kind} {m.name}: {m.old_module} -> {m.new_module}{_now(m)}")
        out.append(f"  from: {m.old_file}:{m.old_lines[0]}-{m.old_lines[1]}")
        out.append(f"  to:   {m.new_file}:{m.new_lines[0]}-{m.new_lines[1]}")
        dropped = "; @staticmethod dropped" if m.staticmethod_dropped else ""
        if m.body_identical and m.resolved:
            out.append("  body: identical once the references into its new module are "
                       f"unqualified (ast.dump{dropped}; {', '.join(m.resolved)})")
        elif m.body_identical and m.renames:
            out.append(f"  body: identical after renames (ast.dump; {', '.join(m.renames)})")
        elif m.body_identical:
            out.append(f"  body: identical (ast.dump{dropped})")
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
            why = "private path" if is_private_path(m.old_module, m.name) else "--allow-removal"
            line += f" [removal accepted: {why}]"
        elif p.status == "error" and m.probe_error_allowed:
            line += " [accepted: --allow-probe-error]"
        out[-1] = line
        if p.warning:
            out.append(f"    warning: {p.warning}")
        scope = "" if m.body_identical and not (m.renames or m.resolved) else " unedited"
        if m.blame_lines == 0 and m.renamed:
            out.append(
                "  git blame -C -C -C: no line left unedited by the renames (not applicable)"
            )
        elif m.blame_lines == 0 and m.edit_allowed:
            out.append("  git blame -C -C -C: no line left unedited (not applicable)")
        elif m.blame_too_short:
            out.append(
                f"  git blame -C -C -C: not applicable ({m.blame_chars} alphanumeric characters "
                f"to trace, under the {BLAME_MIN_CHARS} git needs to find a copy)"
            )
        else:
            flags = "-w -C -C -C" if m.blame_whitespace else "-C -C -C"
            out.append(
                f"  git blame {flags}: {m.blame_before_move}/{m.blame_lines}{scope} lines "
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
    if c.eager:
        out.extend(_render_eager(c.eager, report.ref_a))
    out.append("")
    if report.failures:
        out.append(f"FAILED ({len(report.failures)}):")
        out.extend(f"  {f}" for f in report.failures)
    else:
        out.append("OK: every move is clean")
    return "\n".join(out) + "\n"
