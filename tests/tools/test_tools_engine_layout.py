"""move-check on a repository in an engine's layout (``python/<pkg>/...``, its own ``tools/``).

One test per row of the scenario table of issue 14: the file split as merged, an edited method,
a forgotten module-level importer, a forgotten function-level importer in ``test/``, a re-export
that loads the kernel extension directly, and one that loads it through two more modules. The
tool runs as the installed console script from inside the repository, as an engine developer
would run it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools._engine import (
    MC,
    NEW,
    OLD,
    SPARSE,
    chunk_cache,
    engine_repo,
    line_of,
    moved_files,
    unit_test_source,
)
from tests.tools._synth import SynthRepo, tool_env

MOVE_CHECK = Path(sys.executable).parent / "move-check"
ALLOW_GONE = ("--allow-removal", OLD)


def _run(repo: SynthRepo, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(MOVE_CHECK), *args], cwd=repo.root, capture_output=True, text=True,
        timeout=300, check=False, env=tool_env(),
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc


def _scenario(tmp_path: Path, **mutations: bool) -> SynthRepo:
    repo, _ = engine_repo(tmp_path / "engine")
    repo.write(moved_files(**mutations))
    repo.commit("move the sparse allocators to allocator/sparse.py")
    return repo


def test_split_as_merged_is_clean_and_reports_the_old_path_gone(tmp_path: Path) -> None:
    repo = _scenario(tmp_path)
    proc = _run(repo, "HEAD~1", "HEAD")
    out = proc.stdout
    # module names come from the python/ source root, not from the repository top
    for name in ("SparsePagedAllocator", "SparseTokenAllocator"):
        assert f"class {name}: {OLD} -> {NEW}" in out
    assert out.count("body: identical (ast.dump)") == 2
    assert out.count("lines (100.0%) from commits before the move (ok --min-blame 90)") == 2
    assert out.count("stale import sites: none") == 2
    # the probe cannot import the tree (kernel_ext is not installed): a static look decides
    assert f"old path {OLD}.SparseTokenAllocator: gone (static check: {OLD} no longer " \
           "defines or imports SparseTokenAllocator" in out
    assert "contracts (lint-imports at REF_B): 1 kept, 0 broken" in out
    # no silent pass: a removed old path fails until it is accepted deliberately
    assert proc.returncode == 1
    assert f"accept the removal with --allow-removal {OLD}.SparseTokenAllocator" in out
    accepted = _run(repo, "HEAD~1", "HEAD", *ALLOW_GONE)
    assert accepted.returncode == 0, accepted.stdout
    assert accepted.stdout.count("[ok] class") == 2
    assert accepted.stdout.count("[removal accepted: --allow-removal]") == 2
    assert "OK: every move is clean" in accepted.stdout


def test_one_edited_line_of_a_moved_method_fails_with_a_file_numbered_diff(
    tmp_path: Path,
) -> None:
    repo = _scenario(tmp_path, edit=True)
    proc = _run(repo, "HEAD~1", "HEAD", *ALLOW_GONE)
    assert proc.returncode == 1
    out = proc.stdout
    new_line = line_of(SPARSE, "if need > len(self.free_slots):")
    assert "body: CHANGED in alloc, NOT allowed" in out
    assert "-        if need > len(self.free_slots):" in out
    assert "+        if need >= len(self.free_slots):" in out
    hunk = next(line for line in out.splitlines() if line.strip().startswith("@@"))
    # the new file's numbering: the hunk of 3 context lines starts 3 lines above the edit
    assert f"+{new_line - 3}," in hunk, hunk
    assert "body changed (declare with --allow-edit SparseTokenAllocator.alloc)" in out
    declared = _run(repo, "HEAD~1", "HEAD", *ALLOW_GONE,
                    "--allow-edit", "SparseTokenAllocator.alloc")
    assert declared.returncode == 0, declared.stdout
    assert "allowed by --allow-edit (move + edit)" in declared.stdout


def test_module_level_importer_left_on_the_old_path_fails(tmp_path: Path) -> None:
    repo = _scenario(tmp_path, keep_chunk_cache=True)
    proc = _run(repo, "HEAD~1", "HEAD", *ALLOW_GONE)
    assert proc.returncode == 1
    line = line_of(chunk_cache(OLD), f"from {OLD} import")
    site = f"{MC}/chunk_cache.py:{line}"
    assert f"{site}: still imports {OLD}.SparseTokenAllocator" in proc.stdout


def test_function_level_importer_in_a_test_folder_fails(tmp_path: Path) -> None:
    repo = _scenario(tmp_path, keep_test=True)
    proc = _run(repo, "HEAD~1", "HEAD", *ALLOW_GONE)
    assert proc.returncode == 1
    line = line_of(unit_test_source(OLD), "import SparsePagedAllocator")
    assert f"test/srt/test_sparse_alloc.py:{line}: still imports {OLD}.SparsePagedAllocator" \
        in proc.stdout


@pytest.mark.parametrize("direct", [True, False], ids=["kernel-in-new-module", "via-old-module"])
def test_reexport_that_loads_the_kernel_extension_breaks_the_contract(
    tmp_path: Path, direct: bool
) -> None:
    repo = _scenario(tmp_path, reexport=True, kernel_in_sparse=direct)
    proc = _run(repo, "HEAD~1", "HEAD", *ALLOW_GONE)
    assert proc.returncode == 1
    out = proc.stdout
    assert "BROKEN: Importing the allocators never loads the kernel extension" in out
    assert "contract broken by the change: Importing the allocators never loads" in out
    alloc = "engine.srt.mem_cache.allocator"
    if direct:
        chain = f"{alloc} -> {NEW} (l.4) -> kernel_ext (l.3)"
        hops = [f"{MC}/allocator/__init__.py:4:", f"{MC}/allocator/sparse.py:3: import kernel_ext"]
    else:
        chain = f"{alloc} -> {NEW} (l.4) -> {OLD} (l.4) -> kernel_ext.kvio (l.5)"
        hops = [
            f"{MC}/allocator/__init__.py:4: from {NEW} import",
            f"{MC}/allocator/sparse.py:4: from {OLD} import SparseKVPool",
            f"{MC}/sparse_memory_pool.py:5: import kernel_ext.kvio",
        ]
    assert chain in out, out
    for hop in hops:
        assert hop in out, out


def test_unknown_ref_is_named(tmp_path: Path) -> None:
    repo, _ = engine_repo(tmp_path / "engine")
    proc = subprocess.run([str(MOVE_CHECK), "HEAD", "feature/no-such-branch"], cwd=repo.root,
                          capture_output=True, text=True, timeout=60, check=False,
                          env=tool_env())
    assert proc.returncode == 2
    assert "unknown ref 'feature/no-such-branch'" in proc.stderr


def test_configured_import_linter_that_cannot_run_fails(tmp_path: Path) -> None:
    repo = _scenario(tmp_path)
    # a contract type nobody can import: lint-imports stops with an error
    text = (repo.root / ".importlinter").read_text()
    repo.write({".importlinter": text.replace("mem_cache_refactor.contracts", "nowhere.contracts")})
    repo.commit("break the import-linter configuration")
    proc = _run(repo, "HEAD~2", "HEAD", *ALLOW_GONE)
    assert proc.returncode == 1
    assert "contracts: NOT RUN although configured" in proc.stdout
    assert "import-linter is configured but could not run" in proc.stdout
    skipped = _run(repo, "HEAD~2", "HEAD", *ALLOW_GONE, "--no-contracts")
    assert skipped.returncode == 0, skipped.stdout
    assert "contracts: not checked (skipped (--no-contracts))" in skipped.stdout


def test_blame_share_under_the_threshold_fails(tmp_path: Path) -> None:
    repo, _ = engine_repo(tmp_path / "engine")
    # Inside the checked range the classes are first touched on every line (comments only: the
    # AST stays identical), then moved: blame traces no line to a commit before the range.
    pool = repo.root / MC / "sparse_memory_pool.py"
    text = pool.read_text()
    start = text.index("class SparseTokenAllocator")
    marked = "\n".join(f"{line}  # reviewed" if line.strip() else line
                       for line in text[start:].splitlines())
    pool.write_text(text[:start] + marked + "\n")
    repo.commit("review comments")
    files = moved_files()
    sparse = files[f"{MC}/allocator/sparse.py"]
    start = sparse.index("class SparseTokenAllocator")
    files[f"{MC}/allocator/sparse.py"] = sparse[:start] + marked + "\n"
    repo.write(files)
    repo.commit("move")
    proc = _run(repo, "HEAD~2", "HEAD", *ALLOW_GONE)
    assert proc.returncode == 1
    assert "body: identical" in proc.stdout
    assert "from commits before the move (UNDER --min-blame 90)" in proc.stdout
    assert "or lower --min-blame" in proc.stdout
    lowered = _run(repo, "HEAD~2", "HEAD", *ALLOW_GONE, "--min-blame", "0")
    assert lowered.returncode == 0, lowered.stdout


def test_relative_importer_under_the_source_root_is_found_and_rewritten(tmp_path: Path) -> None:
    repo, _ = engine_repo(tmp_path / "engine")
    files = moved_files()
    # a relative import: resolving it needs the module name without the python/ folder
    files[f"{MC}/chunk_cache.py"] = chunk_cache(OLD).replace(
        f"from {OLD} import", "from .sparse_memory_pool import"
    )
    repo.write(files)
    repo.commit("move, one relative importer left behind")
    proc = _run(repo, "HEAD~1", "HEAD", *ALLOW_GONE)
    assert proc.returncode == 1
    line = line_of(chunk_cache(OLD), f"from {OLD} import")
    assert f"{MC}/chunk_cache.py:{line}: still imports {OLD}.SparseTokenAllocator" in proc.stdout
    rewrite = subprocess.run(
        [str(MOVE_CHECK.parent / "rewrite-imports"), f"{OLD}.SparseTokenAllocator",
         f"{NEW}.SparseTokenAllocator", "python", "test"],
        cwd=repo.root, capture_output=True, text=True, timeout=120, check=False, env=tool_env(),
    )
    assert rewrite.returncode == 0, rewrite.stdout + rewrite.stderr
    assert "1 file(s) changed" in rewrite.stdout
    assert (repo.root / MC / "chunk_cache.py").read_text() == chunk_cache(NEW)
    repo.commit("rewrite the importer")
    fixed = _run(repo, "HEAD~2", "HEAD", *ALLOW_GONE)
    assert fixed.returncode == 0, fixed.stdout
