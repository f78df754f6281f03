"""The custom ``eager_forbidden`` contract reports eager imports, and only eager imports,
directly or through a chain of modules.

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
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(textwrap.dedent(body))
    (tmp_path / ".importlinter").write_text(CONFIG)
    env = dict(os.environ)
    # the fixture package from tmp_path and this checkout's contract types (not an installed copy)
    src = ROOT / "packages" / "mem-cache-refactor" / "src"
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(src), str(ROOT)])
    env["COLUMNS"] = "200"  # one chain per line
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=120,
    )


def test_module_level_import_is_reported(tmp_path: Path) -> None:
    proc = _lint(tmp_path, {"alloc.py": "import torch\nimport triton\n"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "BROKEN" in proc.stdout
    assert "fixturepkg.alloc imports triton at import time:" in proc.stdout
    assert "fixturepkg.alloc -> triton (l.2)" in proc.stdout
    assert "fixturepkg/alloc.py:2: import triton" in proc.stdout


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
    assert "fixturepkg.k -> triton (l.3, guarded by try/except ImportError)" in proc.stdout
    assert "fixturepkg/k.py:3: from triton import language as tl" in proc.stdout


def test_chain_through_two_hops_is_reported_hop_by_hop(tmp_path: Path) -> None:
    # alloc/__init__ re-exports alloc.sparse, which needs the pool module, which imports the
    # kernel library at module level: importing fixturepkg.alloc loads triton.
    files = {
        "alloc/__init__.py": "from fixturepkg.alloc.base import Base\n"
                             "from fixturepkg.alloc.sparse import Sparse\n",
        "alloc/base.py": "class Base:\n    pass\n",
        "alloc/sparse.py": '"""Sparse."""\n\nfrom fixturepkg.pool import Pool\n\n\n'
                           "class Sparse:\n    pool: Pool\n",
        "pool.py": "import os\n\nimport triton\n\n\nclass Pool:\n    pass\n",
    }
    proc = _lint(tmp_path, files)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert (
        "fixturepkg.alloc -> fixturepkg.alloc.sparse (l.2) -> fixturepkg.pool (l.3) "
        "-> triton (l.3)"
    ) in out
    assert "fixturepkg/alloc/__init__.py:2: from fixturepkg.alloc.sparse import Sparse" in out
    assert "fixturepkg/alloc/sparse.py:3: from fixturepkg.pool import Pool" in out
    assert "fixturepkg/pool.py:3: import triton" in out
    # the tails of that chain (from alloc.sparse, from pool) are not repeated
    assert out.count("imports triton at import time") == 1, out


def test_chain_through_parent_package_and_class_body(tmp_path: Path) -> None:
    files = {
        "alloc.py": "from fixturepkg.ops.copy import copy\n",
        # importing fixturepkg.ops.copy first runs the package fixturepkg.ops
        "ops/__init__.py": "from fixturepkg.kern import K\n",
        "ops/copy.py": "def copy():\n    pass\n",
        "kern.py": "class K:\n    import triton\n",  # a class body runs at import time
    }
    proc = _lint(tmp_path, files)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert (
        "fixturepkg.alloc -> fixturepkg.ops.copy (l.1) -> fixturepkg.ops (parent package) "
        "-> fixturepkg.kern (l.1) -> triton (l.2)"
    ) in out
    assert "fixturepkg/ops/copy.py: importing fixturepkg.ops.copy runs its package" in out
    assert "fixturepkg/kern.py:2: import triton" in out
    # fixturepkg.ops.copy's own chain starts with its package, reported on its own line
    assert "fixturepkg.ops.copy -> fixturepkg.ops (parent" not in out
    assert out.count("imports triton at import time") == 1, out


def test_lazy_and_type_checking_edges_are_not_followed(tmp_path: Path) -> None:
    files = {
        "alloc.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                    "    from fixturepkg.pool import Pool\n\n\ndef make():\n"
                    "    from fixturepkg.pool import Pool\n    return Pool()\n",
        "pool.py": "import triton\n\n\nclass Pool:\n    pass\n",
    }
    proc = _lint(tmp_path, {**files, "_impl.py": ""})
    # only pool itself is an eager importer; alloc reaches it lazily or for typing only
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "fixturepkg.pool -> triton (l.1)" in proc.stdout
    assert "fixturepkg.alloc" not in proc.stdout


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
