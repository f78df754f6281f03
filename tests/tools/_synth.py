"""Helpers for the refactor-safety tool tests: tiny synthetic git repositories."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

#: this checkout's sources: the refactor tools first, then the runtime packages (the synthetic
#: repositories' fixtures import them), then the repository. An installed copy of
#: mem-cache-refactor (another checkout's, in a scratch clone) must never be the one tested.
CHECKOUT_PATHS = (
    REPO_ROOT / "packages" / "mem-cache-refactor" / "src",
    *sorted(p for p in (REPO_ROOT / "packages").glob("*/src") if p.parent.name
            != "mem-cache-refactor"),
    REPO_ROOT,
)


def tool_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a tool subprocess: this checkout's sources first on ``PYTHONPATH``."""
    full_env = dict(os.environ)
    full_env.pop("MEM_CACHE_API_BASE", None)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(str(p) for p in CHECKOUT_PATHS)
    return full_env

IMPORTLINTER = """\
[importlinter]
root_packages =
    lowpkg
    highpkg

[importlinter:contract:layers]
name = Synthetic layering: highpkg > lowpkg
type = layers
layers =
    highpkg
    lowpkg
"""

BASE_FILES = {
    ".importlinter": IMPORTLINTER,
    "lowpkg/__init__.py": "",
    "lowpkg/core.py": '''
        """Low-level helpers."""


        def scale(x: int) -> int:
            """Double ``x``."""
            return 2 * x
    ''',
    "highpkg/__init__.py": "",
    "highpkg/models.py": '''
        """Models."""

        from lowpkg.core import scale


        class Widget:
            """A square widget."""

            def __init__(self, size: int) -> None:
                self.size = scale(size)

            def area(self) -> int:
                return self.size * self.size


        def make() -> Widget:
            return Widget(1)
    ''',
    "highpkg/use.py": '''
        from highpkg.models import Widget


        def build(n: int) -> Widget:
            return Widget(n)
    ''',
}


class SynthRepo:
    """A throw-away git repository with helpers to write files and commit."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str) -> str:
        proc = subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t", "-C", str(self.root), *args],
            capture_output=True, text=True, check=True,
        )
        return proc.stdout.strip()

    def write(self, files: dict[str, str]) -> None:
        for rel, text in files.items():
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            body = textwrap.dedent(text).lstrip("\n")
            path.write_text(body)

    def remove(self, rel: str) -> None:
        (self.root / rel).unlink()

    def commit(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD")


def run_tool(module: str, *args: str, cwd: Path | None = None,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m mem_cache_refactor.<module> args`` (a dotted ``module`` is taken as is)."""
    if "." not in module:
        module = f"mem_cache_refactor.{module}"
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd or REPO_ROOT, capture_output=True, text=True, env=tool_env(env), check=False,
    )
