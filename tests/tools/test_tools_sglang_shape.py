"""The refactor tools on a tree in SGLang's shape (``tests/tools/_sgl_shape.py``): namespace
folders under the root package, a guarded module-level kernel import, an external submodule
(``kernel_ext.kvio``), and a contract that is already broken before the change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mem_cache_refactor.move_check import check
from tests.tools._sgl_shape import (
    ALLOC,
    ALLOC_INIT_REEXPORT,
    COMMON,
    MC,
    SPARSE,
    SPARSE_POOL,
    sgl_repo,
)
from tests.tools._synth import CHECKOUT_PATHS, REPO_ROOT, SynthRepo, run_tool, tool_env

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
CONTRACT = "Importing the allocators never loads the kernel library"


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def _lint(repo: SynthRepo, *, source_root: bool = True) -> subprocess.CompletedProcess[str]:
    env = tool_env({"COLUMNS": "300"})
    if source_root:
        env["PYTHONPATH"] = os.pathsep.join([str(repo.root / "python"), env["PYTHONPATH"]])
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=repo.root, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def _move_check(repo: SynthRepo, *args: str) -> subprocess.CompletedProcess[str]:
    proc = run_tool("move_check", *args, "--root", str(repo.root))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc


GUARDED_CHAIN = (
    f"{ALLOC} -> {ALLOC}.paged (l.4) -> engine.srt.utils (l.4) -> engine.srt.utils.common (l.1) "
    f"-> kernel_ext (l.{_line(COMMON, 'import kernel_ext')}, guarded by try/except ImportError)"
)
SPARSE_CHAIN = (
    f"{ALLOC} -> {ALLOC}.sparse (l.{_line(ALLOC_INIT_REEXPORT, 'allocator.sparse import')}) "
    f"-> engine.srt.mem_cache.sparse_pool (l.{_line(SPARSE, 'sparse_pool import')}) "
    f"-> kernel_ext.kvio (l.{_line(SPARSE_POOL, 'from kernel_ext.kvio')})"
)


def test_the_tools_subprocesses_import_this_checkout() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import mem_cache_refactor; print(mem_cache_refactor.__file__)"],
        cwd=REPO_ROOT, env=tool_env(), capture_output=True, text=True, timeout=60, check=True,
    )
    expected = REPO_ROOT / "packages" / "mem-cache-refactor" / "src" / "mem_cache_refactor"
    assert Path(proc.stdout.strip()) == expected / "__init__.py"
    assert CHECKOUT_PATHS[0] == expected.parent


def test_lint_imports_follows_namespace_folders_and_shows_the_guarded_import(
    tmp_path: Path,
) -> None:
    repo, _ = sgl_repo(tmp_path / "engine")
    proc = _lint(repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{CONTRACT} BROKEN" in proc.stdout
    assert GUARDED_CHAIN in proc.stdout, proc.stdout
    assert "python/engine/srt/utils/common.py:6: import kernel_ext" in proc.stdout


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"source": "engine.srt.mem_cache.alocator"},
         "Cannot check: source module engine.srt.mem_cache.alocator not found: the namespace "
         "folder (no __init__.py) engine.srt.mem_cache"),
        ({"source": "sglang.srt.mem_cache.allocator"},
         "Cannot check: source module sglang.srt.mem_cache.allocator is not inside the root "
         "packages (engine): the wrong root?"),
        ({"forbidden": "kernel_ext.kvcachio"},
         "Cannot check: forbidden module kernel_ext.kvcachio is not installed and no module of "
         "the root packages (engine) imports it"),
    ],
    ids=["misspelt-in-namespace", "wrong-root", "unknown-external"],
)
def test_a_contract_never_passes_without_checking(
    tmp_path: Path, kw: dict[str, str], message: str
) -> None:
    repo, _ = sgl_repo(tmp_path / "engine", **kw)
    proc = _lint(repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{CONTRACT} BROKEN" in proc.stdout
    assert message in " ".join(proc.stdout.split()), proc.stdout


def test_a_root_package_that_is_not_installed_is_named(tmp_path: Path) -> None:
    repo, _ = sgl_repo(tmp_path / "engine")
    proc = _lint(repo, source_root=False)
    out = " ".join(proc.stdout.split())
    assert proc.returncode != 0, out
    # import-linter itself stops first when it cannot import the root package; when it can,
    # our contract names the root package that is not on the search path
    assert "engine" in out and ("not on the search path" in out or "Could not find" in out
                                or "could not be found" in out.lower()), out


def test_an_external_submodule_can_be_forbidden(tmp_path: Path) -> None:
    repo, _ = sgl_repo(tmp_path / "engine", forbidden="kernel_ext.kvio")
    # the allocator package loads kernel_ext (guarded), but not kernel_ext.kvio
    clean = _lint(repo)
    assert clean.returncode == 0, clean.stdout
    assert f"{CONTRACT} KEPT" in clean.stdout
    repo.write({f"{MC}/allocator/__init__.py": ALLOC_INIT_REEXPORT})
    repo.commit("re-export the sparse allocators")
    proc = _lint(repo)
    assert proc.returncode == 1, proc.stdout
    assert SPARSE_CHAIN in proc.stdout, proc.stdout
    assert "python/engine/srt/mem_cache/sparse_pool.py:7: from kernel_ext.kvio import " \
           "transfer_pages" in proc.stdout


def test_move_check_fails_on_the_chain_the_change_added_where_the_contract_was_broken(
    tmp_path: Path,
) -> None:
    repo, _ = sgl_repo(tmp_path / "engine")
    # a change that adds no import: the broken contract is reported as existing, not failed
    repo.write({f"{MC}/allocator/base.py": '"""Allocator base (all strategies)."""\n\n\n'
                "class BaseAllocator:\n    def __init__(self, size: int) -> None:\n"
                "        self.size = size\n        self.free = list(range(size))\n"})
    repo.commit("docstring")
    quiet = _move_check(repo, "HEAD~1", "HEAD")
    assert quiet.returncode == 0, quiet.stdout
    assert f"already broken before: {CONTRACT}" in quiet.stdout
    assert f"eager chains of '{CONTRACT}': 0 new, 1 existing" in quiet.stdout
    assert f"existing: {GUARDED_CHAIN}" in quiet.stdout
    # the reviewer's case: the re-export adds a second route to the kernel library
    repo.write({f"{MC}/allocator/__init__.py": ALLOC_INIT_REEXPORT})
    repo.commit("re-export the sparse allocators")
    proc = _move_check(repo, "HEAD~1", "HEAD")
    out = proc.stdout
    assert proc.returncode == 1, out
    assert f"BROKEN: {CONTRACT}" in out
    assert f"contract broken by the change: {CONTRACT}" in out
    assert f"eager chains of '{CONTRACT}': 1 new, 1 existing" in out
    assert f"NEW: {ALLOC} imports kernel_ext.kvio at import time:" in out
    assert SPARSE_CHAIN in out
    for hop in (f"{MC}/allocator/__init__.py:7: from {ALLOC}.sparse import SparseAllocator",
                f"{MC}/allocator/sparse.py:4: from engine.srt.mem_cache.sparse_pool import",
                f"{MC}/sparse_pool.py:7: from kernel_ext.kvio import transfer_pages"):
        assert hop in out, out
    assert f"existing: {GUARDED_CHAIN}" in out


def test_a_split_module_keeps_its_chain_existing(tmp_path: Path) -> None:
    """Moving code into a new module that imports what the old module imported reroutes the
    chain: it is the same dependency, not a new one."""
    repo, _ = sgl_repo(tmp_path / "engine")
    paged = (repo.root / MC / "allocator/paged.py").read_text()
    helper = "\n\ndef round_up(tokens: int, page: int) -> int:\n" \
             "    return pages_needed(tokens, page) * page\n"
    repo.write({f"{MC}/allocator/paged.py": paged + helper})
    repo.commit("round_up in paged")
    repo.write({
        f"{MC}/allocator/paged.py": paged,
        f"{MC}/allocator/rounding.py": '"""Rounding."""\n\nfrom engine.srt.utils import '
                                       "pages_needed\n" + helper,
        f"{MC}/allocator/__init__.py": (repo.root / MC / "allocator/__init__.py").read_text()
        + "from engine.srt.mem_cache.allocator.rounding import round_up  # noqa: E402\n",
    })
    repo.commit("move round_up to allocator/rounding.py")
    proc = _move_check(repo, "HEAD~1", "HEAD", "--allow-removal", "round_up")
    assert "function round_up:" in proc.stdout
    assert f"eager chains of '{CONTRACT}': 0 new, 1 existing" in proc.stdout, proc.stdout
    assert proc.returncode == 0, proc.stdout


def test_the_probe_reports_the_first_real_import_error(tmp_path: Path) -> None:
    repo, _ = sgl_repo(tmp_path / "engine")
    # the root package imports a helper that needs a dependency which is not installed
    repo.write({
        "python/engine/__init__.py": "from engine.srt.utils.common import env_flag\n",
        "python/engine/srt/utils/common.py": "import orjson_not_installed\n\n" + COMMON,
    })
    repo.commit("the package needs orjson_not_installed")
    sparse = (repo.root / MC / "allocator/sparse.py").read_text()
    start = sparse.index("class SparseAllocator")
    repo.write({
        f"{MC}/allocator/sparse.py": sparse[:start].rstrip() + "\n",
        f"{MC}/allocator/sparse_paged.py": sparse[:start] + sparse[start:],
    })
    repo.commit("move the sparse allocators")
    report = check(repo.root, "HEAD~1", "HEAD")
    assert len(report.moves) == 2
    for move in report.moves:
        detail = move.old_path.detail
        assert "No module named 'orjson_not_installed'" in detail, detail
        assert "(at python/engine/srt/utils/common.py:1)" in detail, detail
        assert "KeyError" not in detail


def test_a_contract_given_on_the_command_line_checks_older_commits(tmp_path: Path) -> None:
    repo, _ = sgl_repo(tmp_path / "engine")
    config = repo.root / ".importlinter"
    outside = tmp_path / "contract.ini"
    outside.write_text(config.read_text())
    repo.remove(".importlinter")
    repo.commit("the repository has no contract")
    repo.write({f"{MC}/allocator/__init__.py": ALLOC_INIT_REEXPORT})
    repo.commit("re-export the sparse allocators")
    plain = _move_check(repo, "HEAD~1", "HEAD")
    assert plain.returncode == 0 and "contracts: not checked" in plain.stdout, plain.stdout
    proc = _move_check(repo, "HEAD~1", "HEAD", "--contracts-config", str(outside))
    assert proc.returncode == 1, proc.stdout
    assert f"eager chains of '{CONTRACT}': 1 new, 1 existing" in proc.stdout
    assert SPARSE_CHAIN in proc.stdout


def test_a_static_reexport_is_recognised_when_the_tree_cannot_be_imported(tmp_path: Path) -> None:
    """The package keeps ``from new import Name`` for its old importers (SGLang's [1/N]): the
    same object, though the probe cannot import the tree (kernel_ext is not installed)."""
    repo, _ = sgl_repo(tmp_path / "engine")
    pool = (repo.root / MC / "sparse_pool.py").read_text()
    start = pool.index("class SparsePool")
    header = pool[:start]
    repo.write({
        f"{MC}/sparse_pool.py": header.replace(
            '"""Device pool of the sparse attention."""\n',
            '"""Device pool of the sparse attention."""\n\n'
            "from engine.srt.mem_cache.pools.sparse import SparsePool  # noqa: F401\n",
        ),
        f"{MC}/pools/sparse.py": header + pool[start:],
    })
    repo.commit("move SparsePool to pools/sparse.py, re-exported")
    proc = _move_check(repo, "HEAD~1", "HEAD")
    out = proc.stdout
    assert "old path engine.srt.mem_cache.sparse_pool.SparsePool: reexport (static check: " \
           "engine.srt.mem_cache.sparse_pool imports SparsePool from " \
           "engine.srt.mem_cache.pools.sparse, the same object" in out, out
    assert "No module named 'kernel_ext'" in out
    assert "import sites of the old path (1), allowed: the old path is a silent re-export" in out
    assert proc.returncode == 0, out
