"""move-check on methods that leave their class, on a tree in SGLang's shape
(``tests/tools/_sgl_shape.py``): a static method of the scheduler that becomes a module function
of ``mem_cache/kv_cache_builder.py`` (SGLang's #25602 shape), moved with an edit (#25604), and
methods of the Mamba pool extracted into a new class (``[4/N]`` #27256)."""

from __future__ import annotations

from pathlib import Path

from mem_cache_refactor.move_check import check
from mem_cache_refactor.move_check._probe import static_old_path
from tests.tools._sgl_shape import (
    BUILDER,
    MAMBA_ALLOCATOR,
    MAMBA_POOL,
    MAMBA_POOL_AFTER,
    MANAGERS,
    MC,
    SCHEDULER,
    SCHEDULER_MOVED,
    SCHEDULER_STALE,
    method_repo,
)
from tests.tools._synth import SynthRepo, run_tool

SCHED = "engine.srt.managers.scheduler"
BUILD = "engine.srt.mem_cache.kv_cache_builder"


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def _move_check(repo: SynthRepo, *args: str) -> tuple[int, str]:
    proc = run_tool("move_check", "HEAD~1", "HEAD", *args, "--root", str(repo.root))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.returncode, proc.stdout


def test_a_static_method_that_became_a_module_function_is_a_move(tmp_path: Path) -> None:
    repo, _ = method_repo(tmp_path / "engine")
    repo.write({f"{MANAGERS}/scheduler.py": SCHEDULER_MOVED, f"{MC}/kv_cache_builder.py": BUILDER})
    repo.commit("move get_draft_pool to mem_cache.kv_cache_builder")
    code, out = _move_check(repo)
    assert code == 1, out
    assert "1 move(s)" in out
    assert (f"[FAIL] method Scheduler.get_draft_pool: {SCHED} -> {BUILD} "
            "(now function get_draft_pool)") in out, out
    start = _line(SCHEDULER, "@staticmethod")
    assert f"from: python/engine/srt/managers/scheduler.py:{start}-{start + 12}" in out
    assert f"to:   python/engine/srt/mem_cache/kv_cache_builder.py:4-{4 + 11}" in out
    assert "body: identical (ast.dump; @staticmethod dropped)" in out
    # the lines changed their indentation: blame needs -w to follow them
    assert ("git blame -w -C -C -C: 12/12 lines (100.0%) from commits before the move "
            "(ok --min-blame 90)") in out, out
    assert "stale import sites: none" in out
    assert f"old path {SCHED}.Scheduler.get_draft_pool: gone" in out
    assert f"--allow-removal {SCHED}.Scheduler.get_draft_pool" in out
    for flag in ("Scheduler.get_draft_pool", f"{SCHED}.Scheduler.get_draft_pool", "Scheduler"):
        code, out = _move_check(repo, "--allow-removal", flag)
        assert code == 0, out
        assert "[removal accepted: --allow-removal]" in out


def test_a_call_through_the_old_class_is_a_stale_site(tmp_path: Path) -> None:
    repo, _ = method_repo(tmp_path / "engine")
    user = ("from engine.srt.managers.scheduler import Scheduler as S\n\n\n"
            "def draft(worker: object) -> object:\n"
            "    return S.get_draft_pool(worker=worker, spec=None, overlap=False)\n")
    repo.write({f"{MANAGERS}/scheduler.py": SCHEDULER_STALE, f"{MC}/kv_cache_builder.py": BUILDER,
                "test/test_draft.py": user})
    repo.commit("move get_draft_pool, forgetting two callers")
    code, out = _move_check(repo, "--allow-removal", "Scheduler.get_draft_pool")
    assert code == 1, out
    call = _line(SCHEDULER_STALE, "Scheduler.get_draft_pool(")
    assert "stale import sites (2):" in out, out
    assert (f"python/engine/srt/managers/scheduler.py:{call}: pool, _ = "
            "Scheduler.get_draft_pool(") in out
    assert "test/test_draft.py:5: return S.get_draft_pool(" in out


def test_a_method_moved_with_an_edit_shows_the_edit(tmp_path: Path) -> None:
    repo, _ = method_repo(tmp_path / "engine")
    edited = BUILDER.replace('getattr(spec, "is_ngram", False)', 'getattr(spec, "ngram", False)')
    assert edited != BUILDER
    repo.write({f"{MANAGERS}/scheduler.py": SCHEDULER_MOVED, f"{MC}/kv_cache_builder.py": edited})
    repo.commit("move get_draft_pool, with an edit")
    code, out = _move_check(repo, "--allow-removal", "Scheduler")
    assert code == 1, out
    assert "body: CHANGED, NOT allowed" in out
    # numbered with the files' lines; the dropped @staticmethod is no edit and not shown
    start = _line(SCHEDULER, "def get_draft_pool(")
    assert f"@@ -{start},7 +{_line(edited, 'def get_draft_pool(')},7 @@" in out, out
    assert "-    if worker is None or getattr(spec, \"is_ngram\", False):" in out
    assert "+    if worker is None or getattr(spec, \"ngram\", False):" in out
    assert "@staticmethod" not in out
    # the unedited lines (the decorator and the edited line are not) all trace back
    assert "git blame -w -C -C -C: 11/11 unedited lines (100.0%)" in out, out
    assert "body changed (declare with --allow-edit Scheduler.get_draft_pool)" in out
    for flag in ("Scheduler.get_draft_pool", "get_draft_pool", f"{BUILD}.get_draft_pool"):
        code, out = _move_check(repo, "--allow-removal", "Scheduler", "--allow-edit", flag)
        assert code == 0, out
        assert "body: CHANGED, allowed by --allow-edit (move + edit)" in out


def test_methods_extracted_into_a_new_class_are_moves(tmp_path: Path) -> None:
    repo, base = method_repo(tmp_path / "engine")
    repo.write({f"{MC}/mamba_pool.py": MAMBA_POOL_AFTER,
                f"{MC}/allocator/mamba.py": MAMBA_ALLOCATOR})
    moved = repo.commit("extract the Mamba slot allocator into allocator/mamba.py")
    report = check(repo.root, base, moved)
    by_name = {m.name: m for m in report.moves}
    assert sorted(by_name) == ["MambaPool._take", "MambaPool.alloc", "MambaPool.available_size",
                               "MambaPool.free"], by_name
    for m in by_name.values():
        assert (m.kind, m.new_kind) == ("method", "method")
        assert m.new_module == "engine.srt.mem_cache.allocator.mamba"
        assert m.new_name == f"MambaSlotAllocator.{m.name.partition('.')[2]}"
        assert m.old_path.status == "gone", m.old_path  # the runtime probe: AttributeError
        assert not m.blame_whitespace
    for name in ("MambaPool.alloc", "MambaPool._take", "MambaPool.free"):
        m = by_name[name]
        assert m.body_identical and m.blame_share == 1.0, m
        assert m.old_lines[0] == _line(MAMBA_POOL, f"def {name.partition('.')[2]}(")
        assert m.new_lines[0] == _line(MAMBA_ALLOCATOR, f"def {name.partition('.')[2]}(")
    edited = by_name["MambaPool.available_size"]
    assert not edited.body_identical and not edited.edit_allowed
    assert "-def available_size(self):" in edited.diff
    assert "+def available_size(self) -> int:" in edited.diff
    # the private method's removal needs no flag; the public ones do
    assert by_name["MambaPool._take"].removal_allowed
    failing = sorted(f for f in report.failures if "is gone" in f)
    assert len(failing) == 3, report.failures
    code, out = _move_check(repo, "--allow-removal", "MambaPool")
    assert code == 1, out
    assert ("[ok] method MambaPool.alloc: engine.srt.mem_cache.mamba_pool -> "
            "engine.srt.mem_cache.allocator.mamba (now method MambaSlotAllocator.alloc)") in out
    assert "[removal accepted: private path]" in out
    assert "body: CHANGED, NOT allowed" in out
    code, out = _move_check(repo, "--allow-removal", "MambaPool",
                            "--allow-edit", "MambaPool.available_size")
    assert code == 0, out
    assert "4 move(s)" in out


def test_a_method_that_stays_or_is_only_deleted_is_no_move(tmp_path: Path) -> None:
    repo, _ = method_repo(tmp_path / "engine")
    # ``free`` is deleted, and an unrelated ``free`` with another body appears elsewhere
    other = ('"""Another pool."""\n\n\nclass OtherPool:\n'
             "    def free(self, pages: list[int]) -> None:\n"
             "        raise NotImplementedError(pages)\n")
    pool = MAMBA_POOL.replace("    def free(self, slots: list[int]) -> None:\n"
                              "        if not slots:\n            return\n"
                              "        self.free_slots.extend(slots)\n", "")
    assert pool != MAMBA_POOL
    repo.write({f"{MC}/mamba_pool.py": pool, f"{MC}/other_pool.py": other})
    repo.commit("drop MambaPool.free; add OtherPool")
    code, out = _move_check(repo)
    assert code == 0, out
    assert "0 move(s)" in out


def test_the_static_check_of_a_method_path(tmp_path: Path) -> None:
    (tmp_path / "pool.py").write_text(MAMBA_POOL_AFTER + "\n\nclass Alias:\n    free = print\n")
    assert static_old_path([tmp_path], "pool", "MambaPool.state")[0]
    gone, detail = static_old_path([tmp_path], "pool", "MambaPool.alloc")
    assert not gone and "class MambaPool no longer defines alloc" in detail
    assert static_old_path([tmp_path], "pool", "Alias.free") == (
        True, "static check: class Alias still binds free")
    assert not static_old_path([tmp_path], "pool", "Missing.alloc")[0]


REGISTER = '''\
def register_hicache_draft(*, cache: object, worker: object, spec: object, overlap: bool) -> bool:
    """Give the cache controller the draft pool, when there is one."""
    pool, _ = kv_cache_builder.get_draft_pool(worker=worker, spec=spec, overlap=overlap)
    if pool is None:
        return False
    controller = getattr(cache, "controller")
    controller.set_draft_pool(pool)
    return True
'''


def _register_repo(root: Path) -> SynthRepo:
    """The #25604 shape: the scheduler's static method calls the builder through its module;
    moved into the builder, the call loses the qualification."""
    repo, _ = method_repo(root)
    scheduler = SCHEDULER_MOVED + "\n" + "".join(
        f"    {line}" if line.strip() else line
        for line in ("@staticmethod\n" + REGISTER).splitlines(True))
    repo.write({f"{MANAGERS}/scheduler.py": scheduler, f"{MC}/kv_cache_builder.py": BUILDER})
    repo.commit("get_draft_pool in the builder; register_hicache_draft calls it through the module")
    return repo


def test_a_call_into_the_new_module_that_loses_its_qualification_is_no_edit(
    tmp_path: Path,
) -> None:
    repo = _register_repo(tmp_path / "engine")
    moved = REGISTER.replace("kv_cache_builder.get_draft_pool(", "get_draft_pool(")
    repo.write({f"{MANAGERS}/scheduler.py": SCHEDULER_MOVED,
                f"{MC}/kv_cache_builder.py": BUILDER + "\n\n" + moved})
    repo.commit("move register_hicache_draft to the builder")
    code, out = _move_check(repo, "--allow-removal", "Scheduler.register_hicache_draft")
    assert code == 0, out
    assert (f"[ok] method Scheduler.register_hicache_draft: {SCHED} -> {BUILD} "
            "(now function register_hicache_draft)") in out
    assert ("body: identical once the references into its new module are unqualified "
            "(ast.dump; @staticmethod dropped; kv_cache_builder.get_draft_pool -> "
            "get_draft_pool)") in out, out
    # the unqualified line has no history; the other 7 do
    assert "git blame -w -C -C -C: 7/7 unedited lines (100.0%)" in out, out


def test_a_call_unqualified_to_a_name_the_new_module_lacks_is_an_edit(tmp_path: Path) -> None:
    repo = _register_repo(tmp_path / "engine")
    # the builder defines no ``get_pool``: the bare name would not resolve there
    moved = REGISTER.replace("kv_cache_builder.get_draft_pool(", "get_pool(")
    repo.write({f"{MANAGERS}/scheduler.py": SCHEDULER_MOVED,
                f"{MC}/kv_cache_builder.py": BUILDER + "\n\n" + moved})
    repo.commit("move register_hicache_draft to the builder, calling something else")
    code, out = _move_check(repo, "--allow-removal", "Scheduler.register_hicache_draft")
    assert code == 1, out
    assert "body: CHANGED, NOT allowed" in out
    assert "+    pool, _ = get_pool(worker=worker, spec=spec, overlap=overlap)" in out
