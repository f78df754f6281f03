"""mem_cache_refactor.api_snapshot and .griffe_check on a synthetic repository with one package."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tools._synth import SynthRepo, run_tool

INIT = '''
    """Demo package."""

    from __future__ import annotations

    from typing import Literal, NewType

    from demo_pkg.shapes import Square

    __all__ = ["Backend", "PageId", "Square", "VERSION", "area"]

    Backend = Literal["auto", "torch"]
    PageId = NewType("PageId", int)
    VERSION = "1.0"


    def area(side: int, *, scale: float = 1.0) -> float:
        return side * side * scale
'''

SHAPES = '''
    """Shapes."""

    from __future__ import annotations

    from dataclasses import dataclass

    __all__ = ["Square"]


    @dataclass(frozen=True)
    class Square:
        side: int

        def area(self) -> int:
            return self.side * self.side

        @property
        def perimeter(self) -> int:
            return 4 * self.side

        @classmethod
        def unit(cls) -> Square:
            return cls(1)
'''


def _repo(tmp_path: Path) -> SynthRepo:
    repo = SynthRepo(tmp_path / "repo")
    repo.write({
        "packages/demo-pkg/src/demo_pkg/__init__.py": INIT,
        "packages/demo-pkg/src/demo_pkg/shapes.py": SHAPES,
        # Private modules are never imported: this one would fail the run if it were.
        "packages/demo-pkg/src/demo_pkg/_private.py": "raise RuntimeError('imported')\n",
    })
    return repo


def test_snapshot_update_check_and_drift(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    root = str(repo.root)
    missing = run_tool("api_snapshot", "check", "--root", root)
    assert missing.returncode == 1
    assert "run api-snapshot update" in missing.stdout

    assert run_tool("api_snapshot", "update", "--root", root).returncode == 0
    snap_path = repo.root / "tests/contracts/api/demo_pkg.json"
    snap = json.loads(snap_path.read_text())
    root_mod = snap["modules"]["demo_pkg"]
    assert root_mod["__all__"] == ["Backend", "PageId", "Square", "VERSION", "area"]
    names = root_mod["names"]
    assert names["area"] == {
        "kind": "function", "defined_in": "demo_pkg",
        "signature": "(side: 'int', *, scale: 'float' = 1.0) -> 'float'",
    }
    assert names["VERSION"]["value"] == "'1.0'"
    assert names["PageId"] == {"kind": "newtype", "supertype": "int"}
    assert "Literal['auto', 'torch']" in names["Backend"]["value"]
    square = names["Square"]
    assert square["defined_in"] == "demo_pkg.shapes"
    assert square["signature"] == "(side: 'int') -> None"
    assert square["members"]["perimeter"]["kind"] == "property"
    assert square["members"]["unit"]["kind"] == "classmethod"
    assert set(snap["modules"]) == {"demo_pkg", "demo_pkg.shapes"}

    ok = run_tool("api_snapshot", "check", "--root", root)
    assert ok.returncode == 0, ok.stdout
    assert "demo_pkg matches" in ok.stdout

    # A signature change is an API change: check fails with a diff and the regeneration hint.
    shapes = repo.root / "packages/demo-pkg/src/demo_pkg/shapes.py"
    shapes.write_text(shapes.read_text().replace("def area(self)", "def area(self, k: int)"))
    drift = run_tool("api_snapshot", "check", "--package", "demo-pkg", "--root", root)
    assert drift.returncode == 1
    assert "-              \"signature\": \"(self) -> 'int'\"" in drift.stdout
    assert "+              \"signature\": \"(self, k: 'int') -> 'int'\"" in drift.stdout
    assert "run api-snapshot update" in drift.stdout

    unknown = run_tool("api_snapshot", "check", "--package", "nope", "--root", root)
    assert unknown.returncode == 2


def test_griffe_check_against_base(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    base = repo.commit("base")
    root = str(repo.root)
    no_base = run_tool("griffe_check", "--root", root)
    assert no_base.returncode == 0
    assert "no base: skipped" in no_base.stdout

    init = repo.root / "packages/demo-pkg/src/demo_pkg/__init__.py"
    init.write_text(init.read_text().replace("*, scale: float = 1.0", "*, scale: float"))
    repo.commit("make scale required")
    broken = run_tool("griffe_check", "--root", root, env={"MEM_CACHE_API_BASE": base})
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "area(scale)" in broken.stdout
    assert "demo_pkg against" in broken.stdout and "BREAKING" in broken.stdout


def test_griffe_check_uses_merge_base_with_origin_main(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    base = repo.commit("base")
    root = str(repo.root)
    repo.git("update-ref", "refs/remotes/origin/main", base)
    same = run_tool("griffe_check", "--root", root)  # HEAD == merge base: nothing to do
    assert same.returncode == 0 and "no base: skipped" in same.stdout
    shapes = repo.root / "packages/demo-pkg/src/demo_pkg/shapes.py"
    shapes.write_text(shapes.read_text().replace("    side: int\n", "    side: int\n    n: int\n"))
    repo.commit("add a required field")
    broken = run_tool("griffe_check", "--root", root)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert f"against {base[:12]}" in broken.stdout


def test_members_inherited_from_private_bases_are_listed() -> None:
    """A method moved into a private mixin stays in the public class's snapshot; a public
    base's members stay with that base."""
    import types

    from mem_cache_refactor.api_snapshot import _public_members

    private = types.ModuleType("demo._mixins")
    exec(
        "class Mixin:\n"
        "    def shared(self, n: int) -> int:\n"
        "        return n\n",
        private.__dict__,
    )
    public = types.ModuleType("demo.base")
    exec("class Base:\n    def inherited(self) -> None: ...\n", public.__dict__)

    class Allocator(private.Mixin, public.Base):  # type: ignore[name-defined,misc]
        def own(self) -> None: ...

    members = _public_members(Allocator)
    assert set(members) == {"own", "shared"}
    assert members["shared"] == {"kind": "method", "signature": "(self, n: 'int') -> 'int'"}


def test_private_members_a_public_base_inherits_stay_with_that_base() -> None:
    """A subclass of a public class whose members come from a private mixin does not list them
    again: they are in the public base's snapshot."""
    import types

    from mem_cache_refactor.api_snapshot import _public_members

    private = types.ModuleType("demo._mixins")
    exec("class Mixin:\n    def shared(self, n: int) -> int:\n        return n\n",
         private.__dict__)
    public = types.ModuleType("demo.core")
    exec("class Core(Mixin):\n    def core(self) -> None: ...\n",
         {**private.__dict__, "__name__": "demo.core"}, public.__dict__)

    class Configured(public.Core):  # type: ignore[name-defined,misc]
        def own(self) -> None: ...

    assert set(_public_members(public.Core)) == {"core", "shared"}
    assert set(_public_members(Configured)) == {"own"}
