"""Run ``griffe check`` for every package against the merge base: ``griffe-check``.

Packages are found as by ``api-snapshot`` (the repository's source roots; needs the ``griffe``
extra: ``pip install mem-cache-refactor[griffe]``).

Base ref, first match wins: ``--base REF``; ``$MEM_CACHE_API_BASE``; ``git merge-base HEAD
origin/main`` when ``origin/main`` exists and the merge base differs from ``HEAD``. Without a
base it prints ``no base: skipped`` and exits 0 (a fresh clone of ``main`` has nothing to compare
against). A package that did not exist at the base is skipped. Exit 1 when griffe reports a
breaking change in any package (it prints file:line and an explanation per finding; ``-f github``
annotations under GitHub Actions), 2 on a git error.

A class moved to another distribution shows up as "Public object was removed" unless its old
module keeps a shim (a PEP 562 module ``__getattr__``): keep one until the next major
release.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mem_cache_refactor._cli import OneLineParser
from mem_cache_refactor.api_snapshot import _repo_top, discover_packages

__all__ = ["find_base", "main"]



def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
    )


def find_base(root: Path, explicit: str | None = None) -> str | None:
    """The ref to compare against, or None when there is none (see the module docstring)."""
    if explicit:
        return explicit
    env = os.environ.get("MEM_CACHE_API_BASE", "").strip()
    if env:
        return env
    if _git(root, "rev-parse", "--verify", "--quiet", "origin/main^{commit}").returncode != 0:
        return None
    base = _git(root, "merge-base", "HEAD", "origin/main")
    head = _git(root, "rev-parse", "HEAD")
    if base.returncode != 0 or head.returncode != 0:
        return None
    if base.stdout.strip() == head.stdout.strip():
        return None
    return base.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="griffe-check",
        description="griffe check (API breakage) of every package against the merge base.",
    )
    parser.add_argument("--base", default=None, help="ref to compare against")
    parser.add_argument("--root", type=Path, default=None,
                        help="repository root (default: the git top of the current folder)")
    parser.add_argument(
        "--format",
        default="github" if os.environ.get("GITHUB_ACTIONS") else "oneline",
        choices=["oneline", "verbose", "markdown", "github", "azdo"],
    )
    args = parser.parse_args(argv)
    root: Path = (args.root or _repo_top()).resolve()
    base = find_base(root, args.base)
    if base is None:
        print("griffe_check: no base: skipped")
        return 0
    if _git(root, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}").returncode != 0:
        print(f"griffe_check: base {base!r} is not a commit", file=sys.stderr)
        return 2
    failed: list[str] = []
    for pkg in discover_packages(root):
        src = pkg.src.relative_to(root)
        if _git(root, "cat-file", "-e", f"{base}:{src}/{pkg.name}/__init__.py").returncode != 0:
            print(f"griffe_check: {pkg.name}: not present at {base}: skipped")
            continue
        cmd = [sys.executable, "-m", "griffe", "check", pkg.name, "-s", str(src), "-a", base,
               "-f", args.format]
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=False)
        output = (proc.stdout + proc.stderr).strip()
        status = "ok" if proc.returncode == 0 else f"BREAKING (exit {proc.returncode})"
        print(f"griffe_check: {pkg.name} against {base[:12]}: {status}")
        if output:
            print(output)
        if proc.returncode != 0:
            failed.append(pkg.name)
    if failed:
        print(f"griffe_check: FAILED for {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
