"""The custom ``eager_forbidden`` contract reports eager imports and only eager imports.

Each test writes a tiny fixture package plus an ``.importlinter`` file into ``tmp_path`` and runs
the real ``lint-imports`` CLI on it, so the registration of the contract type is covered too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mem_cache_refactor.contracts import eager_import_lines
from tests.contracts._modules import ROOT

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

CONFIG = textwrap.dedent(
    """
    [importlinter]
    root_packages =
        fixturepkg
    include_external_packages = True
    contract_types =
        eager_forbidden: mem_cache_refactor.contracts.EagerForbiddenContract

    [importlinter:contract:eager]
    name = fixture: no eager triton
    type = eager_forbidden
    source_modules =
        fixturepkg
    forbidden_modules =
        triton
    exempt_modules =
        fixturepkg._impl
    """
)


def _lint(tmp_path: Path, files: dict[str, str]) -> subprocess.CompletedProcess[str]:
    pkg = tmp_path / "fixturepkg"
    pkg.mkdir()
    for name, body in {"__init__.py": "", **files}.items():
        (pkg / name).write_text(textwrap.dedent(body))
    (tmp_path / ".importlinter").write_text(CONFIG)
    env = dict(os.environ)
    # the fixture package from tmp_path, and `tools.import_contracts` from the repository
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=120,
    )


def test_module_level_import_is_reported(tmp_path: Path) -> None:
    proc = _lint(tmp_path, {"alloc.py": "import torch\nimport triton\n"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "BROKEN" in proc.stdout
    assert "fixturepkg.alloc imports triton at import time (l.2" in proc.stdout


def test_function_level_import_is_not_reported(tmp_path: Path) -> None:
    body = """
    def launch():
        import triton
        return triton
    """
    proc = _lint(tmp_path, {"alloc.py": body})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "KEPT" in proc.stdout


def test_exempt_module_and_type_checking_block_are_not_reported(tmp_path: Path) -> None:
    guarded = """
    from typing import TYPE_CHECKING
    if TYPE_CHECKING:
        import triton
    """
    proc = _lint(tmp_path, {"_impl.py": "import triton\n", "typed.py": guarded})
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_import_from_submodule_and_try_block_are_reported(tmp_path: Path) -> None:
    body = """
    try:
        from triton import language as tl
    except ImportError:
        tl = None
    """
    proc = _lint(tmp_path, {"k.py": body})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "fixturepkg.k imports triton at import time (l.3" in proc.stdout


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import a\n", {1}),
        ("def f():\n    import a\n", set()),
        ("class C:\n    import a\n", {2}),
        ("from x import (\n    a,\n    b,\n)\n", {1, 2, 3, 4}),
        ("if TYPE_CHECKING:\n    import a\nelse:\n    import b\n", {4}),
        ("import typing\nif typing.TYPE_CHECKING:\n    import a\n", {1}),
        ("with ctx():\n    import a\n", {2}),
        ("f = lambda: __import__('a')\n", set()),
    ],
)
def test_eager_import_lines(source: str, expected: set[int]) -> None:
    assert eager_import_lines(source) == expected
