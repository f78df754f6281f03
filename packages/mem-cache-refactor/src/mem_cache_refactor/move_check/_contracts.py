"""The import-linter contracts at both refs: which the change broke, which were broken before,
and lint-imports' explanation of each newly broken one (the ``eager_forbidden`` contracts are
decided in-process, by :mod:`mem_cache_refactor.move_check._chains`)."""

from __future__ import annotations

from pathlib import Path

from mem_cache_refactor.move_check._chains import check_eager_contracts
from mem_cache_refactor.move_check._probe import run_import_linter
from mem_cache_refactor.move_check._report import ContractReport

__all__ = ["check_contracts"]


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


def check_contracts(
    tree_a: Path, roots_a: list[Path], tree_b: Path, roots_b: list[Path], python: str | None,
    *, moved_from: dict[str, set[str]],
) -> ContractReport:
    """lint-imports at REF_B (and at REF_A when something is broken); the eager contracts are
    decided in-process by comparing their chains at both refs (see :mod:`._chains`)."""
    eager = tuple(check_eager_contracts(tree_a, roots_a, tree_b, roots_b, moved_from))
    eager_names = {r.name for r in eager}
    eager_newly = tuple(r.name for r in eager if r.broken_by_change)
    eager_already = tuple(r.name for r in eager if r.broken and not r.broken_by_change)
    eager_kept = tuple(r.name for r in eager if not r.broken)
    run_b = run_import_linter(tree_b, roots_b, python=python)
    if not run_b.ran:
        note = run_b.output.strip()[-2000:] or "lint-imports did not run"
        return ContractReport(False, note, configured=run_b.configured, newly_broken=eager_newly,
                              eager=eager)
    results_b = {n: k for n, k in run_b.results.items() if n not in eager_names}
    broken_b = [name for name, kept in results_b.items() if not kept]
    kept_b = tuple(name for name, kept in results_b.items() if kept) + eager_kept
    if not broken_b:
        return ContractReport(True, "lint-imports at REF_B", True, False, kept_b, eager_newly,
                              eager_already, eager=eager)
    run_a = run_import_linter(tree_a, roots_a, python=python)
    before = run_a.results if run_a.ran else {}
    newly = tuple(n for n in broken_b if before.get(n, True))
    already = tuple(n for n in broken_b if not before.get(n, True))
    return ContractReport(
        True, "lint-imports at REF_B (and REF_A)", True, False, kept_b, newly + eager_newly,
        already + eager_already, _broken_details(run_b.output, newly), eager=eager,
    )
