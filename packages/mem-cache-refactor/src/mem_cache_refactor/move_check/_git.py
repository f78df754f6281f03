"""Thin git helpers for move_check: resolve refs, export trees, list changes, blame."""

from __future__ import annotations

import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BlameLine",
    "GitError",
    "blame",
    "changed_py_files",
    "export_tree",
    "git",
    "rev_list",
    "rev_parse",
]


class GitError(RuntimeError):
    """A git command failed; the message holds the command and its stderr."""


def git(root: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def rev_parse(root: Path, ref: str) -> str:
    """Full commit id of ``ref`` (raises GitError naming ``ref`` when it is unknown)."""
    proc = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise GitError(f"unknown ref {ref!r}: not a commit in {root}")
    return proc.stdout.strip()


def rev_list(root: Path, ref_a: str, ref_b: str) -> set[str]:
    """Commits reachable from ``ref_b`` but not from ``ref_a`` (the commits of the change)."""
    return set(git(root, "rev-list", f"{ref_a}..{ref_b}").split())


def export_tree(root: Path, ref: str, dest: Path) -> list[str]:
    """Write the tree of ``ref`` into ``dest`` (``git archive``); return its file paths."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest.parent / f"{dest.name}.tar"
    git(root, "archive", "--format=tar", "-o", str(archive), ref)
    names: list[str] = []
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.isfile() or m.isdir()]
        names = [m.name for m in members if m.isfile()]
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
            tar.extractall(dest, members=members, filter="data")
        else:  # pragma: no cover - older interpreters
            tar.extractall(dest, members=members)
    archive.unlink()
    return names


def changed_py_files(root: Path, ref_a: str, ref_b: str) -> list[str]:
    """``.py`` paths that differ between the two refs (added, deleted or modified)."""
    out = git(root, "diff", "--name-only", "--no-renames", ref_a, ref_b, "--", "*.py")
    return [line for line in out.splitlines() if line]


@dataclass(frozen=True, slots=True)
class BlameLine:
    """One final line of a blamed range: the commit and the file it was traced to."""

    line: int
    commit: str
    orig_path: str


def blame(
    root: Path, ref: str, path: str, start: int, end: int, *, min_chars: int = 40
) -> list[BlameLine]:
    """``git blame -C -C -C`` of lines ``start..end`` (1-based, inclusive) of ``path``.

    ``min_chars``: the least alphanumeric characters a moved block needs to be traced (git's
    default is 40, which misses a whole two-line function).
    """
    return blame_ranges(root, ref, path, [(start, end)], min_chars=min_chars)


def blame_ranges(
    root: Path, ref: str, path: str, ranges: list[tuple[int, int]], *, min_chars: int = 40,
    ignore_whitespace: bool = False,
) -> list[BlameLine]:
    """:func:`blame` of several line ranges of one file in one ``git blame`` run (its
    ``-C -C -C`` search costs the same for one range or many). ``ignore_whitespace`` adds
    ``-w``: a method moved to module level (or a function into a class) changed its
    indentation, and only ``-w`` lets the copy detection see the old lines."""
    spans = [arg for start, end in sorted(set(ranges)) for arg in ("-L", f"{start},{end}")]
    flags = ["-w"] if ignore_whitespace else []
    out = git(
        root, "blame", "--porcelain", *flags, "-C", "-C", f"-C{min_chars}", *spans, ref, "--",
        path,
    )
    lines: list[BlameLine] = []
    last_path: dict[str, str] = {}
    commit, final_line, path = "", 0, ""
    for raw in out.splitlines():
        if raw.startswith("\t"):  # the line's content ends one entry
            last_path[commit] = path
            lines.append(BlameLine(final_line, commit, path))
            continue
        head = raw.split(" ")
        if len(head) >= 3 and len(head[0]) == 40 and all(c in "0123456789abcdef" for c in head[0]):
            commit, final_line = head[0], int(head[2])
            path = last_path.get(commit, "")
        elif raw.startswith("filename "):
            path = raw[len("filename ") :]
    return lines
