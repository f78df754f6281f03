"""Units of tools.move_check: path -> module names, import-site detection, move pairing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from mem_cache_refactor.modpath import SourceRoots, module_name_for_path, resolve_relative
from mem_cache_refactor.move_check._defs import collect_definitions
from mem_cache_refactor.move_check._pairing import find_moves, same_after_renames, same_body
from mem_cache_refactor.move_check._probe import probe_env, static_old_path
from mem_cache_refactor.move_check._sites import find_import_sites


@pytest.mark.parametrize(
    ("path", "module"),
    [
        ("packages/mem-cache-pool/src/mem_cache_pool/mha.py", "mem_cache_pool.mha"),
        ("packages/mem-cache-pool/src/mem_cache_pool/__init__.py", "mem_cache_pool"),
        ("pkga/sub/util.py", "pkga.sub.util"),
        ("tools/move_check/core.py", "tools.move_check.core"),
        ("packages/mem-cache-pool/tests/test_pool_mha.py", None),
        ("README.md", None),
    ],
)
def test_module_name_for_path(path: str, module: str | None) -> None:
    assert module_name_for_path(path) == module


def test_resolve_relative() -> None:
    assert resolve_relative("a.b.c", False, 1, "d") == "a.b.d"
    assert resolve_relative("a.b.c", False, 2, None) == "a"
    assert resolve_relative("a.b", True, 1, "x") == "a.b.x"
    assert resolve_relative("a.b", False, 3, "x") == ""
    assert resolve_relative(None, False, 1, "x") == ""
    assert resolve_relative("a.b", False, 0, "x.y") == "x.y"


def test_import_sites_cover_every_spelling(tmp_path: Path) -> None:
    files = {
        "p/__init__.py": "",
        "p/old.py": "",
        "p/direct.py": "from p.old import Thing\n",
        "p/aliased.py": "from p.old import Thing as T, other\n",
        "p/relative.py": "from .old import Thing\n",
        "p/star.py": "from p.old import *\n",
        "p/modattr.py": "import p.old\n\nx = p.old.Thing\ny = p.old.other\n",
        "p/modalias.py": "import p.old as o\n\n\ndef f():\n    return o.Thing()\n",
        "p/frommod.py": "from p import old\nold.Thing\n",
        "p/clean.py": "from p.new import Thing\nimport p.old\np.old.other\n",
        "p/lookalike.py": "from p.older import Thing\nThing.old\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    sites = find_import_sites(tmp_path, list(files), {"p.old.Thing"})
    found = {(s.path, s.line) for s in sites}
    assert found == {
        ("p/direct.py", 1),
        ("p/aliased.py", 1),
        ("p/relative.py", 1),
        ("p/star.py", 1),
        ("p/modattr.py", 3),
        ("p/modalias.py", 5),
        ("p/frommod.py", 2),
    }
    star = next(s for s in sites if s.path == "p/star.py")
    assert star.target == "p.old.*"
    assert next(s for s in sites if s.path == "p/modalias.py").code == "return o.Thing()"


def test_find_moves_pairs_identical_bodies_first(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    body = "def helper(x):\n    return x + 1\n"
    other = "def helper(x):\n    return x * 100 - 7\n"
    for root, files in (
        (a, {"p/one.py": body, "p/two.py": other, "p/stay.py": "def keep():\n    pass\n"}),
        (b, {"q/near.py": other.replace("100", "101"), "q/far.py": body,
             "p/stay.py": "def keep():\n    return 1\n"}),
    ):
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    changed = ["p/one.py", "p/two.py", "p/stay.py", "q/near.py", "q/far.py"]
    top = SourceRoots(("",))
    pairs = find_moves(collect_definitions(a, changed, top), collect_definitions(b, changed, top))
    assert [(o.module, n.module, o.dump == n.dump) for o, n in pairs] == [
        ("p.one", "q.far", True),
        ("p.two", "q.near", False),
    ]


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize(
    ("files", "roots", "path", "module"),
    [
        # SGLang's layout: python/pyproject.toml, packages auto-discovered in python/
        ({"python/pyproject.toml": "[project]\nname = 'e'\n", "python/e/__init__.py": "",
          "test/srt/t.py": ""}, ("python", ""), "python/e/srt/x.py", "e.srt.x"),
        # a top-level python/ folder without any project file
        ({"python/e/__init__.py": ""}, ("python", ""), "python/e/__init__.py", "e"),
        # setuptools package-dir / packages.find.where, hatch wheel packages, poetry from
        ({"pyproject.toml": "[tool.setuptools]\npackage-dir = {'' = 'lib'}\n",
          "lib/a/__init__.py": ""}, ("lib", ""), "lib/a/b.py", "a.b"),
        ({"pyproject.toml": "[tool.setuptools.packages.find]\nwhere = ['code']\n",
          "code/a/__init__.py": ""}, ("code", ""), "code/a/b.py", "a.b"),
        ({"pkgs/x/pyproject.toml": "[tool.hatch.build.targets.wheel]\npackages = ['src/x']\n",
          "pkgs/x/src/x/__init__.py": ""}, ("pkgs/x/src", ""), "pkgs/x/src/x/m.py", "x.m"),
        ({"pyproject.toml": "[tool.poetry]\npackages = [{include = 'a', from = 'srcs'}]\n",
          "srcs/a/__init__.py": ""}, ("srcs", ""), "srcs/a/m.py", "a.m"),
        # files outside every root are named from the top
        ({"python/e/__init__.py": ""}, ("python", ""), "test/srt/test_a.py", "test.srt.test_a"),
    ],
)
def test_source_roots(
    tmp_path: Path, files: dict[str, str], roots: tuple[str, ...], path: str, module: str
) -> None:
    found = SourceRoots.discover(_tree(tmp_path, files))
    assert found.roots == roots
    assert found.module_name(path) == module


def test_source_roots_from_the_command_line_come_first(tmp_path: Path) -> None:
    tree = _tree(tmp_path, {"weird/pkg/__init__.py": "", "src/other/__init__.py": ""})
    found = SourceRoots.discover(tree, extra=["weird"])
    assert found.roots == ("weird", "src", "")
    assert found.module_name("weird/pkg/mod.py") == "pkg.mod"
    assert SourceRoots.discover(tree, extra=[tree / "weird"]).roots[0] == "weird"


def test_pythonpath_is_extended_not_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/keep/me")
    env = probe_env([Path("/tree/python"), Path("/tree")])
    assert env["PYTHONPATH"].split(":") == ["/tree/python", "/tree", "/keep/me"]


def test_static_old_path(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "p/__init__.py": "",
        "p/kept.py": "from p.new import Thing\n",
        "p/dyn.py": "def __getattr__(name):\n    raise AttributeError(name)\n",
        "p/emptied.py": "import os\n\ndef other():\n    from p.new import Thing\n",
    })
    assert static_old_path([root], "p.kept", "Thing")[0] is True
    assert static_old_path([root], "p.dyn", "Thing")[0] is True
    gone, detail = static_old_path([root], "p.emptied", "Thing")
    assert gone is False and "no longer defines or imports Thing" in detail
    gone, detail = static_old_path([root], "p.removed", "Thing")
    assert gone is False and "module p.removed no longer exists" in detail


def test_find_moves_pairs_renamed_definitions_by_source_then_name(tmp_path: Path) -> None:
    """Renamed moves: a definition that left under one name pairs with one that appeared under
    another when their sources match once the names (and the renames found so far) are aligned;
    equal sources (two ``= 64`` constants) go to the closer name; an unrelated one stays out."""
    old = (
        "OLD_DIM = 64\nOLD_GROUP = 64\nOLD_BYTES = OLD_DIM // OLD_GROUP\n\n\n"
        "def old_size(n):\n    \"\"\"Bytes of n rows.\"\"\"\n    return n * OLD_BYTES\n\n\n"
        "def dropped(x):\n    return [x] * 3\n"
    )
    new = (
        "DIM = 64\nGROUP = 64\nBYTES = DIM // GROUP\n\n\n"
        "def size(n):\n    \"\"\"Bytes of n rows.\"\"\"\n    return n * BYTES\n\n\n"
        "def added(y, z):\n    return {y: z for _ in range(9)}\n"
    )
    a = _tree(tmp_path / "a", {"p/old.py": old})
    b = _tree(tmp_path / "b", {"p/new.py": new})
    top = SourceRoots(("",))
    changed = ["p/old.py", "p/new.py"]
    pairs = find_moves(collect_definitions(a, changed, top), collect_definitions(b, changed, top))
    assert [(o.name, n.name, o.kind) for o, n in pairs] == [
        ("OLD_BYTES", "BYTES", "constant"),
        ("OLD_DIM", "DIM", "constant"),
        ("OLD_GROUP", "GROUP", "constant"),
        ("old_size", "size", "function"),
    ]
    renames = {o.name: n.name for o, n in pairs}
    by_name = {o.name: (o, n) for o, n in pairs}
    assert same_after_renames(*by_name["old_size"], renames) == (
        "OLD_BYTES -> BYTES", "old_size -> size")
    edited = replace(by_name["old_size"][1], source="def size(n):\n    return n * BYTES + 1\n")
    assert same_after_renames(by_name["old_size"][0], edited, renames) is None


def test_blame_of_a_definition_with_no_unedited_line_is_not_applicable() -> None:
    """A one-line definition that was renamed, or edited with --allow-edit, has no unedited
    line for blame to trace: the blame check does not apply (it used to fail at 0 %); an
    undeclared edit still fails on its body."""
    from mem_cache_refactor.move_check._probe import OldPath
    from mem_cache_refactor.move_check._report import MoveReport

    base = MoveReport(
        name="_A", kind="constant", old_module="p.m", new_module="p.m", old_file="p/m.py",
        old_lines=(1, 1), new_file="p/m.py", new_lines=(1, 1), body_identical=False,
        edit_allowed=True, changed_members=None, diff="-_A = 1\n+_B = 2\n", stale_sites=(),
        old_path=OldPath("gone", "", None, None), blame_lines=0, blame_before_move=0,
        blame_sources={}, removal_allowed=True, new_name="_B",
    )
    assert base.failures == []
    undeclared = replace(base, edit_allowed=False)
    assert [f for f in undeclared.failures if "blame" in f] != []
    assert [f for f in undeclared.failures if "body changed" in f] != []
    renamed = replace(base, body_identical=True, edit_allowed=True, renames=("_A -> _B",))
    assert renamed.failures == []


def test_a_re_indented_docstring_is_the_same_body_another_string_is_not(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    method = ('class C:\n    @staticmethod\n    def f() -> str:\n        """One.\n\n'
              '        Two."""\n        return """x\n        y"""\n')
    function = 'def f() -> str:\n    """One.\n\n    Two."""\n    return """x\n        y"""\n'
    moved_text = function.replace('"""x\n        y"""', '"""x\n    y"""')
    top = SourceRoots(("",))
    for tree, files in ((a, {"m.py": method}), (b, {"n.py": function, "o.py": moved_text})):
        for rel, text in files.items():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_text(text)
    before = collect_definitions(a, ["m.py"], top)
    old = before["m"]["C"].methods[0]
    new = collect_definitions(b, ["n.py"], top)["n"]["f"]
    assert (old.name, old.kind, new.kind) == ("C.f", "method", "function")
    assert same_body(old, new)  # the docstring lost its indentation: no edit
    reindented = collect_definitions(b, ["o.py"], top)["o"]["f"]
    assert not same_body(old, reindented)  # a string literal's value changed
    assert find_moves(before, {"n": {"f": new}}) == [(old, new)]


def test_constants_pair_by_value_not_by_a_look_alike(tmp_path: Path) -> None:
    """Regression (move-check 2be00e7..4d0f5af of this repository): a renamed constant pairs only
    when its value is the same once the names are aligned, and two constants of one name only
    when their values are alike. Before, ``_VERSION = 1`` (a file format, removed) paired with
    ``_HEAD_DIM = 512`` of another package (80 % alike as text), a new format's ``_REC`` /
    ``_REC_MAGIC`` with the old one's ``_HDR`` / ``_MAGIC``, and a tuple of names that left one
    module with a dotted path of the same name in another; that stole the real rename
    (``_DSV4`` -> ``_DEEPSEEK_V4``), so the functions renamed with it showed as edited."""
    old_fmt = '_HDR = struct.Struct("<4sHHQQI")\n_MAGIC = b"MCSP"\n_VERSION = 1\n'
    new_fmt = '_REC = struct.Struct("<4sHHQQQ")\n_REC_MAGIC = b"MCSR"\n'
    gaps = '_DEEPSEEK_V4 = (\n' + "".join(f'    "m{i}",\n' for i in range(12)) + ")\n"
    use = ('\n\ndef test_{n}_names_the_pool():\n    owner = OWNERS[{c}]\n'
           '    assert owner is not None\n')
    before = '_DSV4 = "pkg.deepseek_v4:Allocator"\n' + use.format(n="dsv4", c="_DSV4")
    after = ('_DEEPSEEK_V4 = "pkg.deepseek_v4:Allocator"\n'
             + use.format(n="deepseek_v4", c="_DEEPSEEK_V4"))
    a = _tree(tmp_path / "a", {"p/file.py": old_fmt, "p/gaps.py": gaps, "p/t.py": before,
                               "p/lim.py": "LIMIT = 64\n"})
    b = _tree(tmp_path / "b", {"p/file.py": "", "p/gaps.py": "", "p/t.py": after,
                               "p/_segments.py": new_fmt, "p/norm.py": "_HEAD_DIM = 512\n",
                               "p/lim2.py": "LIMIT = 128\n"})
    top = SourceRoots(("",))
    changed = ["p/file.py", "p/gaps.py", "p/t.py", "p/lim.py", "p/_segments.py", "p/norm.py",
               "p/lim2.py"]
    pairs = find_moves(collect_definitions(a, changed, top), collect_definitions(b, changed, top))
    assert [(o.qualname, n.qualname) for o, n in pairs] == [
        ("p.lim.LIMIT", "p.lim2.LIMIT"),  # one name, alike values: a move with an edit
        ("p.t._DSV4", "p.t._DEEPSEEK_V4"),
        ("p.t.test_dsv4_names_the_pool", "p.t.test_deepseek_v4_names_the_pool"),
    ]
    renames = {o.short: n.short for o, n in pairs if o.short != n.short}
    old_test, new_test = pairs[2]
    assert same_after_renames(old_test, new_test, renames) == (
        "_DSV4 -> _DEEPSEEK_V4", "test_dsv4_names_the_pool -> test_deepseek_v4_names_the_pool")


def test_a_class_or_function_never_pairs_with_a_constant_alias(tmp_path: Path) -> None:
    """Regression (this repository's move of ``mem_cache_allocator._reference`` into the
    allocator's tests folder, which move-check does not read): the class and the functions that
    left paired with the alias assignments of the same names in the benchmark that loads them
    (``ReferenceAllocator = _reference.ReferenceAllocator``) and failed as "body changed"."""
    a = _tree(tmp_path / "a", {"p/_ref.py": "class Ref:\n    x = 1\n\n\ndef naive(n):\n"
                                            "    return n + 1\n", "p/bench.py": ""})
    b = _tree(tmp_path / "b", {"p/_ref.py": "", "p/bench.py": "Ref = _mod.Ref\n"
                                                              "naive = _mod.naive\n"})
    top = SourceRoots(("",))
    changed = ["p/_ref.py", "p/bench.py"]
    assert find_moves(collect_definitions(a, changed, top),
                      collect_definitions(b, changed, top)) == []

