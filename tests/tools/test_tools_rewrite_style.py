"""rewrite-imports writes what needs no hand edit: no emptied or dangling import, survivors in the
statement's form, created imports merged or placed in isort order and wrapped at the
repository's line length (SGLang's shape: ``python/`` root, ``.isort.cfg`` with the black
profile, long first-party module names)."""

from __future__ import annotations

from pathlib import Path

from mem_cache_refactor.rewrite_imports import rewrite_file, rewrite_source
from tests.tools._synth import SynthRepo

OLD = "engine.srt.mem_cache.sparse_memory_pool"
NEW = "engine.srt.mem_cache.allocator.sparse"

HEADER = (
    "import torch\n\n"
    "from engine.srt.managers.schedule_batch import Req\n"
    "from engine.srt.mem_cache.allocator.swa import SWAAllocator\n"
)

COORDINATOR = HEADER + (
    f"from {OLD} import (\n"
    "    SparsePagedTokenAllocator,\n"
    "    SparseKVPool,\n"
    "    SparseTokenAllocator,\n"
    ")\n"
    "from engine.srt.mem_cache.swa_pool import SWAPool\n"
)


def _both(
    source: str, module: str = "engine.srt.managers.coordinator", line_length: int = 88
) -> str:
    for name in ("SparseTokenAllocator", "SparsePagedTokenAllocator"):
        source = rewrite_source(
            source, f"{OLD}.{name}", f"{NEW}.{name}", module=module, line_length=line_length
        )
    return source


def test_split_statement_keeps_survivor_on_one_line_and_merges_the_moved_names() -> None:
    out = _both(COORDINATOR, line_length=100)
    assert out == HEADER.replace(
        "from engine.srt.mem_cache.allocator.swa",
        f"from {NEW} import SparsePagedTokenAllocator, SparseTokenAllocator\n"
        "from engine.srt.mem_cache.allocator.swa",
    ) + (
        f"from {OLD} import SparseKVPool\n"
        "from engine.srt.mem_cache.swa_pool import SWAPool\n"
    ), out
    # nothing dangling: the result parses and has no empty parentheses
    compile(out, "<out>", "exec")
    assert "()" not in out and "(\n)" not in out


def test_created_import_is_wrapped_at_the_line_length_as_isort_writes_it() -> None:
    out = _both(COORDINATOR)  # 97 characters: over black's 88
    assert (
        f"from {NEW} import (\n"
        "    SparsePagedTokenAllocator,\n"
        "    SparseTokenAllocator,\n"
        ")\n"
        "from engine.srt.mem_cache.allocator.swa import SWAAllocator\n"
    ) in out, out


def test_the_only_name_of_a_statement_moves_into_its_sorted_place() -> None:
    source = HEADER + (
        "from engine.srt.mem_cache.base_prefix_cache import (\n"
        "    BasePrefixCache,\n"
        "    MatchResult,\n"
        ")\n"
        f"from {OLD} import (\n"
        "    SparseTokenAllocator,\n"
        ")\n"
        "\n"
        "X = 1\n"
    )
    out = rewrite_source(source, f"{OLD}.SparseTokenAllocator", f"{NEW}.SparseTokenAllocator",
                         module="engine.srt.mem_cache.chunk_cache")
    assert out == (
        "import torch\n\n"
        "from engine.srt.managers.schedule_batch import Req\n"
        f"from {NEW} import SparseTokenAllocator\n"
        "from engine.srt.mem_cache.allocator.swa import SWAAllocator\n"
        "from engine.srt.mem_cache.base_prefix_cache import (\n"
        "    BasePrefixCache,\n"
        "    MatchResult,\n"
        ")\n"
        "\n"
        "X = 1\n"
    ), out


def test_function_level_import_keeps_the_block_indentation() -> None:
    source = (
        "import unittest\n\n\n"
        "class TestSparse(unittest.TestCase):\n"
        "    @classmethod\n"
        "    def setUpClass(cls) -> None:\n"
        f"        from {OLD} import (\n"
        "            SparseKVPool,\n"
        "            SparseTokenAllocator,\n"
        "        )\n\n"
        "        cls.pool = SparseKVPool(8)\n"
    )
    out = rewrite_source(source, f"{OLD}.SparseTokenAllocator", f"{NEW}.SparseTokenAllocator",
                         module="test_sparse", line_length=77)
    assert out == source.replace(
        f"        from {OLD} import (\n"
        "            SparseKVPool,\n"
        "            SparseTokenAllocator,\n"
        "        )\n",
        f"        from {NEW} import (\n"
        "            SparseTokenAllocator,\n"
        "        )\n"
        f"        from {OLD} import SparseKVPool\n",
    ), out


def test_several_survivors_keep_one_name_per_line() -> None:
    source = (
        f"from {OLD} import (\n"
        "    SparseKVPool,\n"
        "    SparseTokenAllocator,\n"
        "    sparse_debug,\n"
        ")\n"
    )
    out = rewrite_source(source, f"{OLD}.SparseTokenAllocator", f"{NEW}.SparseTokenAllocator",
                         module="engine.x")
    assert out == (
        f"from {NEW} import SparseTokenAllocator\n"
        f"from {OLD} import (\n"
        "    SparseKVPool,\n"
        "    sparse_debug,\n"
        ")\n"
    ), out


def test_the_line_length_comes_from_the_repository_settings(tmp_path: Path) -> None:
    long_name = "SparsePagedTokenToKVPoolAllocatorForTests"
    source = f"from {OLD} import (\n    {long_name},\n    SparseKVPool,\n)\n"
    created = f"from {NEW} import {long_name}\n"
    assert 88 < len(created) - 1 <= 100
    for config, wrapped in (
        ({".isort.cfg": "[settings]\nprofile=black\nknown_first_party=engine\n"}, True),
        ({"pyproject.toml": "[tool.ruff]\nline-length = 100\n"}, False),
    ):
        repo = SynthRepo(tmp_path / next(iter(config)).strip("."))
        repo.write({**config, "python/engine/__init__.py": "",
                    "python/engine/srt/managers/coordinator.py": source})
        file = repo.root / "python/engine/srt/managers/coordinator.py"
        assert rewrite_file(file, f"{OLD}.{long_name}", f"{NEW}.{long_name}")
        text = file.read_text()
        assert (f"from {NEW} import (\n    {long_name},\n)\n" in text) is wrapped, text
        assert (created in text) is not wrapped, text
        assert f"from {OLD} import SparseKVPool\n" in text


def test_seed_pr_coordinator_was_rewritten_at_the_branch_base_then_merged() -> None:
    """SGLang #26678 wrote the same survivor two ways: parenthesised in the coordinator, one line
    in the mixin. Both come from this tool's one rule, applied where the PR branched: there the
    coordinator's statement had four names (two survivors, so one per line), and upstream's later
    commit deleted one survivor's line, which the merge carried into the PR (the refactor
    README's track record replays it on the real tree: 5 of 5 files equal)."""
    at_branch_base = HEADER + (
        f"from {OLD} import (\n"
        "    SparsePagedTokenAllocator,\n"
        "    SparseHostPool,\n"
        "    SparseKVPool,\n"
        "    SparseTokenAllocator,\n"
        ")\n"
        "from engine.srt.mem_cache.swa_pool import SWAPool\n"
    )
    rewritten = _both(at_branch_base)
    assert f"from {OLD} import (\n    SparseHostPool,\n    SparseKVPool,\n)\n" in rewritten
    # upstream's commit, replayed by the merge: the line of the name it stopped importing goes
    merged = rewritten.replace("    SparseHostPool,\n", "", 1)
    moved = f"from {NEW} import (\n    SparsePagedTokenAllocator,\n    SparseTokenAllocator,\n)\n"
    assert merged == HEADER.replace(
        "from engine.srt.mem_cache.allocator.swa", moved + "from engine.srt.mem_cache.allocator.swa"
    ) + (
        f"from {OLD} import (\n"
        "    SparseKVPool,\n"
        ")\n"
        "from engine.srt.mem_cache.swa_pool import SWAPool\n"
    ), merged
    # the same tool on the tree after upstream's commit (the mixin's shape: three names) writes
    # the single survivor on one line; the two outputs differ only in that statement
    after_upstream = _both(at_branch_base.replace("    SparseHostPool,\n", "", 1))
    assert after_upstream == merged.replace(
        f"from {OLD} import (\n    SparseKVPool,\n)\n", f"from {OLD} import SparseKVPool\n"
    ), after_upstream
