"""tools.move_check and tools.rewrite_imports on synthetic git repositories."""

from __future__ import annotations

import json
import textwrap

from mem_cache_refactor.move_check import check, render_text
from tests.tools._synth import SynthRepo, run_tool

WIDGET = '''
    """Widgets."""

    from lowpkg.core import scale


    class Widget:
        """A square widget."""

        def __init__(self, size: int) -> None:
            self.size = scale(size)

        def area(self) -> int:
            return self.size * self.size
'''

# The old module after the move: an engine's PEP 562 shim (module-level __getattr__).
MODELS_SHIM = '''
    """Models."""

    from __future__ import annotations

    import importlib
    import warnings
    from typing import TYPE_CHECKING, Any

    from lowpkg.widgets import Widget as _Widget

    if TYPE_CHECKING:
        from lowpkg.widgets import Widget as Widget
    else:
        def __getattr__(name: str) -> Any:
            if name != "Widget":
                raise AttributeError(name)
            warnings.warn("moved to lowpkg.widgets.Widget", DeprecationWarning, stacklevel=2)
            return importlib.import_module("lowpkg.widgets").Widget


    def make() -> _Widget:
        return _Widget(1)
'''

USE_NEW = '''
    from lowpkg.widgets import Widget


    def build(n: int) -> Widget:
        return Widget(n)
'''


def _check(repo: SynthRepo, a: str, b: str, *extra: str) -> tuple[int, str]:
    proc = run_tool("move_check", a, b, "--root", str(repo.root), *extra)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, proc.stdout


def test_unchanged_move_between_packages_passes(synth: tuple[SynthRepo, str]) -> None:
    repo, base = synth
    repo.write({"lowpkg/widgets.py": WIDGET, "highpkg/models.py": MODELS_SHIM,
                "highpkg/use.py": USE_NEW})
    moved = repo.commit("move Widget down to lowpkg.widgets")
    result = check(repo.root, base, moved)  # in-process: one probe, two renderings
    report = result.to_json()
    text = render_text(result)
    assert result.ok, text
    assert report["ok"] is True
    [move] = report["moves"]
    assert (move["name"], move["kind"]) == ("Widget", "class")
    assert (move["old_module"], move["new_module"]) == ("highpkg.models", "lowpkg.widgets")
    assert move["body_identical"] is True and move["diff"] == ""
    assert move["stale_sites"] == []
    assert move["old_path"]["status"] == "shim"
    assert "lowpkg.widgets.Widget" in move["old_path"]["warning"]
    assert move["old_path"]["mechanism"].startswith("module __getattr__")
    # Every line of the class is traced by blame -C -C -C to the base commit.
    assert move["blame_lines"] == 8
    assert move["blame_before_move"] == 8
    assert list(move["blame_sources"]) == [f"highpkg/models.py@{base[:10]}"]
    assert report["contracts"]["ran"] is True
    assert report["contracts"]["newly_broken"] == []
    assert "Synthetic layering: highpkg > lowpkg" in report["contracts"]["kept"]
    # The text report says the same.
    assert "[ok] class Widget: highpkg.models -> lowpkg.widgets" in text
    assert "git blame -C -C -C: 8/8 lines (100.0%)" in text


def test_move_with_edited_body_fails_with_diff_unless_declared(
    synth: tuple[SynthRepo, str],
) -> None:
    repo, base = synth
    edited = WIDGET.replace("return self.size * self.size", "return self.size**2")
    models = (repo.root / "highpkg/models.py").read_text()
    start, end = models.index("class Widget"), models.index("def make")
    reexport = models[:start] + models[end:]  # the old module re-exports the moved class
    reexport = reexport.replace("lowpkg.core import scale", "lowpkg.widgets import Widget")
    repo.write({"lowpkg/widgets.py": edited, "highpkg/models.py": reexport,
                "highpkg/use.py": USE_NEW})
    moved = repo.commit("move and edit Widget")
    rc, out = _check(repo, base, moved)
    assert rc == 1
    assert "body: CHANGED in area, NOT allowed" in out
    # the diff is numbered with the files' lines (the method sits at l.12-13 in both files)
    assert "--- a/highpkg/models.py:6-13" in out and "+++ b/lowpkg/widgets.py:6-13" in out
    assert "@@ -10,4 +10,4 @@" in out
    assert "-        return self.size * self.size" in out
    assert "+        return self.size**2" in out
    assert "body changed (declare with --allow-edit Widget.area)" in out
    # blame counts the unedited lines only: all of them trace back to the base commit
    assert "7/7 unedited lines (100.0%)" in out
    assert "old path highpkg.models.Widget: reexport (same object" in out
    for allowed in ("Widget", "Widget.area", "lowpkg.widgets.Widget.area"):
        rc, out = _check(repo, base, moved, "--allow-edit", allowed)
        assert rc == 0, out
        assert "allowed by --allow-edit (move + edit)" in out
    # another method does not cover the edit
    rc, out = _check(repo, base, moved, "--allow-edit", "Widget.__init__")
    assert rc == 1 and "NOT allowed" in out


def test_missed_import_site_fails_then_rewriter_fixes_it(synth: tuple[SynthRepo, str]) -> None:
    repo, base = synth
    # highpkg/use.py keeps `from highpkg.models import Widget`; the old module re-exports nothing.
    repo.write({"lowpkg/widgets.py": WIDGET, "highpkg/models.py": '"""Models."""\n'})
    repo.write({"highpkg/extra.py": '''
        import highpkg.models as hm
        from lowpkg.core import scale


        def twice() -> object:
            return hm.Widget(scale(1))
    '''})
    moved = repo.commit("move Widget, forget the import sites")
    rc, out = _check(repo, base, moved)
    assert rc == 1
    assert "highpkg/use.py:1: still imports highpkg.models.Widget" in out
    assert "highpkg/extra.py:6: still imports highpkg.models.Widget" in out
    assert "old path highpkg.models.Widget: gone" in out

    proc = run_tool("rewrite_imports", "highpkg.models.Widget", "lowpkg.widgets.Widget",
                    str(repo.root))
    assert proc.returncode == 0, proc.stderr
    assert "2 file(s) changed" in proc.stdout
    assert (repo.root / "highpkg/use.py").read_text().startswith(
        "from lowpkg.widgets import Widget\n"
    )
    extra = (repo.root / "highpkg/extra.py").read_text()
    assert "import highpkg.models" not in extra  # no stale import left behind
    assert "import lowpkg.widgets\n" in extra and "lowpkg.widgets.Widget(scale(1))" in extra
    fixed = repo.commit("rewrite imports")
    rc, out = _check(repo, base, fixed, "--json")
    assert rc == 1, out  # no silent pass: the old path is gone
    assert any("--allow-removal highpkg.models.Widget" in f for f in json.loads(out)["failures"])
    rc, out = _check(repo, base, fixed, "--json", "--allow-removal", "highpkg.models.Widget")
    assert rc == 0, out
    report = json.loads(out)
    assert report["ok"] is True
    assert [m["stale_sites"] for m in report["moves"]] == [[]]


def test_move_that_reverses_the_layering_fails_naming_the_contract(
    synth: tuple[SynthRepo, str],
) -> None:
    repo, base = synth
    # scale moves up into highpkg, and lowpkg.core keeps a shim pointing upward.
    repo.write({
        "highpkg/scaling.py": '''
            def scale(x: int) -> int:
                """Double ``x``."""
                return 2 * x
        ''',
        "lowpkg/core.py": '''
            """Low-level helpers."""

            from typing import TYPE_CHECKING

            if TYPE_CHECKING:
                from highpkg.scaling import scale as scale
        ''',
    })
    models = (repo.root / "highpkg/models.py").read_text()
    repo.write({"highpkg/models.py": models.replace("lowpkg.core", "highpkg.scaling")})
    moved = repo.commit("move scale up")
    rc, out = _check(repo, base, moved)
    assert rc == 1
    assert "BROKEN: Synthetic layering: highpkg > lowpkg" in out
    assert "contract broken by the change: Synthetic layering: highpkg > lowpkg" in out
    assert "lowpkg.core -> highpkg.scaling" in out  # lint-imports' own explanation
    assert "old path lowpkg.core.scale: gone" in out


def test_no_moves_and_bad_refs(synth: tuple[SynthRepo, str]) -> None:
    repo, base = synth
    repo.write({"lowpkg/core.py": '"""Low-level helpers."""\n\n\ndef scale(x: int) -> int:\n'
                "    return x + x\n"})
    edited = repo.commit("edit in place")
    rc, out = _check(repo, base, edited)
    assert rc == 0
    assert "0 move(s)" in out
    assert "no class, function, constant or method moved between modules or classes" in out
    typo = run_tool("move_check", base, edited, "--root", str(repo.root),
                    "--allow-edit", "Wigdet")
    assert typo.returncode == 0
    assert "--allow-edit Wigdet matches no moved definition" in typo.stderr
    proc = run_tool("move_check", base, "no-such-ref", "--root", str(repo.root))
    assert proc.returncode == 2
    assert "no-such-ref" in proc.stderr


def test_sites_of_a_silent_reexport_are_listed_but_allowed(synth: tuple[SynthRepo, str]) -> None:
    repo, base = synth
    # Widget moves into a submodule and the old module re-exports it on purpose (no warning):
    # `from highpkg.models import Widget` in highpkg/use.py stays valid.
    models = (repo.root / "highpkg/models.py").read_text()
    start, end = models.index("class Widget"), models.index("def make")
    repo.write({
        "highpkg/widgets.py": WIDGET,
        "highpkg/models.py": models[:start].replace(
            "from lowpkg.core import scale", "from highpkg.widgets import Widget"
        ) + models[end:],
    })
    moved = repo.commit("move Widget into highpkg.widgets, re-export it")
    rc, out = _check(repo, base, moved)
    assert rc == 0, out
    assert "old path highpkg.models.Widget: reexport" in out
    assert "import sites of the old path (1), allowed" in out
    assert "highpkg/use.py:1: from highpkg.models import Widget" in out


def test_removal_of_a_private_old_path_needs_no_shim(synth: tuple[SynthRepo, str]) -> None:
    """A definition moved out of a private module (``highpkg._impl``) leaves no shim: nobody
    outside the package may import that path, so ``gone`` is accepted without a flag; the same
    move out of a public module still fails."""
    repo, _ = synth
    impl = WIDGET
    repo.write({"highpkg/_impl.py": impl, "highpkg/models.py": '''
        """Models."""

        from highpkg._impl import Widget


        def make() -> Widget:
            return Widget(1)
    ''', "highpkg/use.py": '''
        from highpkg._impl import Widget


        def build(n: int) -> Widget:
            return Widget(n)
    '''})
    private = repo.commit("Widget lives in a private module")
    repo.remove("highpkg/_impl.py")
    repo.write({"lowpkg/widgets.py": WIDGET, "highpkg/models.py": '''
        """Models."""

        from lowpkg.widgets import Widget


        def make() -> Widget:
            return Widget(1)
    ''', "highpkg/use.py": USE_NEW})
    moved = repo.commit("move Widget from highpkg._impl down to lowpkg.widgets")
    result = check(repo.root, private, moved)
    text = render_text(result)
    assert result.ok, text
    [move] = result.to_json()["moves"]
    assert move["old_path"]["status"] == "gone"
    assert "[removal accepted: private path]" in text


OLD_CORE = '''
    """Old helpers."""

    OLD_LIMIT = 4
    OLD_TWICE = OLD_LIMIT * 2


    def old_scale(x: int) -> int:
        """Scale ``x`` by twice the limit, after checking it."""
        if x < 0:
            raise ValueError(f"x must be >= 0, got {x}")
        y = x + 0
        return y * OLD_TWICE
'''

NEW_CORE = '''
    """New helpers."""

    LIMIT = 4
    TWICE = LIMIT * 2


    def scale_twice(x: int) -> int:
        """Scale ``x`` by twice the limit, after checking it."""
        if x < 0:
            raise ValueError(f"x must be >= 0, got {x}")
        y = x + 0
        return y * TWICE
'''

OLD_CORE_SHIM = '''
    """Old helpers (moved to lowpkg.new_core)."""

    import importlib
    import warnings
    from typing import Any

    _MOVED = {"OLD_LIMIT": "LIMIT", "OLD_TWICE": "TWICE", "old_scale": "scale_twice"}


    def __getattr__(name: str) -> Any:
        if name not in _MOVED:
            raise AttributeError(name)
        new = _MOVED[name]
        warnings.warn(f"moved to lowpkg.new_core.{new}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module("lowpkg.new_core"), new)
'''


def test_renamed_move_is_checked_like_any_move(synth: tuple[SynthRepo, str]) -> None:
    """A move that also renames (functions and constants) is paired, its body compared after
    the renames, its old path probed against the new name, its stale sites listed; the
    rewriter with --rename-uses then fixes the sites."""
    repo, _ = synth
    repo.write({"lowpkg/old_core.py": OLD_CORE, "highpkg/calc.py": '''
        from lowpkg import old_core
        from lowpkg.old_core import old_scale


        def run() -> int:
            return old_scale(old_core.OLD_LIMIT)
    '''})
    before = repo.commit("old helpers")
    repo.write({"lowpkg/new_core.py": NEW_CORE, "lowpkg/old_core.py": OLD_CORE_SHIM})
    moved = repo.commit("rename the helpers into lowpkg.new_core")
    result = check(repo.root, before, moved)
    text = render_text(result)
    moves = {m["name"]: m for m in result.to_json()["moves"]}
    assert set(moves) == {"OLD_LIMIT", "OLD_TWICE", "old_scale"}, text
    scale = moves["old_scale"]
    assert (scale["new_name"], scale["kind"], scale["body_identical"]) == (
        "scale_twice", "function", True)
    assert scale["renames"] == ["OLD_TWICE -> TWICE", "old_scale -> scale_twice"]
    assert scale["old_path"]["status"] == "shim"
    assert "lowpkg.new_core.scale_twice" in scale["old_path"]["warning"]
    assert "[FAIL] constant OLD_LIMIT: lowpkg.old_core -> lowpkg.new_core (renamed LIMIT)" in text
    assert "no line left unedited by the renames (not applicable)" in text
    assert "identical after renames (ast.dump; OLD_TWICE -> TWICE, old_scale -> scale_twice)" \
        in text
    assert not result.ok
    assert {(s["path"], s["target"]) for m in moves.values() for s in m["stale_sites"]} == {
        ("highpkg/calc.py", "lowpkg.old_core.old_scale"),
        ("highpkg/calc.py", "lowpkg.old_core.OLD_LIMIT"),
    }
    for old, new in (("OLD_LIMIT", "LIMIT"), ("old_scale", "scale_twice")):
        proc = run_tool("rewrite_imports", f"lowpkg.old_core.{old}", f"lowpkg.new_core.{new}",
                        str(repo.root / "highpkg"), "--rename-uses")
        assert proc.returncode == 0, proc.stderr
    calc = (repo.root / "highpkg/calc.py").read_text()
    assert "return scale_twice(lowpkg.new_core.LIMIT)" in calc
    fixed = repo.commit("callers use the new names")
    final = check(repo.root, before, fixed)
    assert final.ok, render_text(final)


# A definition long enough that one edited line leaves blame far above --min-blame: only the
# body comparison can catch the edit, and a comparison operator is the whole edit.
WINDOW = '''

    def page_window(first: int, last: int, page: int, limit: int) -> list[int]:
        """The page numbers that hold tokens ``first..last``, at most ``limit`` of them."""
        if page <= 0:
            raise ValueError(f"page must be positive, got {page}")
        if first < 0 or last < first:
            raise ValueError(f"bad range {first}..{last}")
        start = first // page
        stop = last // page
        pages = []
        current = start
        while current < stop:
            pages.append(current)
            current += 1
            if len(pages) == limit:
                break
        return pages
'''


def test_move_that_changes_one_comparison_operator_fails(synth: tuple[SynthRepo, str]) -> None:
    repo, _ = synth
    models = (repo.root / "highpkg/models.py").read_text()
    repo.write({"highpkg/models.py": models + textwrap.dedent(WINDOW)})
    repo.commit("page_window")
    edited = textwrap.dedent(WINDOW).replace("while current < stop:", "while current <= stop:")
    assert edited != textwrap.dedent(WINDOW)
    repo.write({"highpkg/models.py": models, "lowpkg/pages.py": '"""Pages."""\n' + edited})
    repo.commit("move page_window down, with an edit")
    code, out = _check(repo, "HEAD~1", "HEAD", "--allow-removal", "page_window")
    assert code == 1, out
    assert "[FAIL] function page_window: highpkg.models -> lowpkg.pages" in out
    assert "body: CHANGED, NOT allowed" in out
    assert "-    while current < stop:" in out and "+    while current <= stop:" in out
    # blame alone would pass: every unedited line traces to the commit before the move
    assert "15/15 unedited lines (100.0%) from commits before the move (ok --min-blame 90)" \
        in out, out
    assert "body changed (declare with --allow-edit page_window)" in out
    code, out = _check(repo, "HEAD~1", "HEAD", "--allow-removal", "page_window",
                       "--allow-edit", "page_window")
    assert code == 0, out


def test_a_too_short_move_and_a_renamed_test_pass(synth: tuple[SynthRepo, str]) -> None:
    """Regression (move-check 2be00e7..4d0f5af of this repository): ``_HEAD_DIM = 2`` moved
    unedited failed at blame 0 % (8 alphanumeric characters: git's copy detection cannot find
    it, whatever the history), and tests renamed in place in a pytest module failed as ``old
    path gone`` (nothing imports a test). Both are now accepted, and said why."""
    repo, _ = synth
    repo.write({"lowpkg/consts.py": '''
        """Constants."""

        _HEAD_DIM = 2
        LIMIT = 8
    ''', "tests/__init__.py": "", "tests/test_widgets.py": '''
        from lowpkg.core import scale


        def test_dsv4_scale_doubles() -> None:
            assert scale(2) == 4
    '''})
    base = repo.commit("constants and a test")
    repo.write({"lowpkg/consts.py": '''
        """Constants."""

        LIMIT = 8
    ''', "lowpkg/dims.py": '''
        """Dimensions."""

        _HEAD_DIM = 2
    ''', "tests/test_widgets.py": '''
        from lowpkg.core import scale


        def test_deepseek_v4_scale_doubles() -> None:
            assert scale(2) == 4
    '''})
    moved = repo.commit("move _HEAD_DIM, rename the test")
    result = check(repo.root, base, moved)
    text = render_text(result)
    assert result.ok, text
    moves = {m["name"]: m for m in result.to_json()["moves"]}
    assert set(moves) == {"_HEAD_DIM", "test_dsv4_scale_doubles"}
    assert moves["_HEAD_DIM"]["blame_chars"] == 8
    assert "not applicable (8 alphanumeric characters to trace" in text
    renamed = moves["test_dsv4_scale_doubles"]
    assert renamed["new_name"] == "test_deepseek_v4_scale_doubles"
    assert renamed["old_path"]["status"] == "gone" and renamed["removal_allowed"]
    assert "test_dsv4_scale_doubles: gone" in text and "[removal accepted: private path]" in text
