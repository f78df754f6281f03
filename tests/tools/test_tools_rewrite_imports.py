"""tools.rewrite_imports: table-driven source rewrites and the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from mem_cache_refactor.rewrite_imports import rewrite_markdown, rewrite_source
from tests.tools._synth import run_tool

NAME = ("a.b.X", "c.d.X")
MODULE = ("a.b", "c.d")

CASES: list[tuple[str, tuple[str, str], str, str]] = [
    ("from-import", NAME, "from a.b import X\n", "from c.d import X\n"),
    (
        "alias and trailing comment kept",
        NAME,
        "from a.b import X as Y  # note\nprint(Y)\n",
        "from c.d import X as Y  # note\nprint(Y)\n",
    ),
    (
        "multi-name import is split",
        NAME,
        "from a.b import W, X, Z\nx = 1\n",
        "from a.b import W, Z\nfrom c.d import X\nx = 1\n",
    ),
    (
        "parenthesized multi-line import is split",
        NAME,
        "from a.b import (\n    W,\n    X,\n    Z,\n)\n",
        "from a.b import (\n    W,\n    Z,\n)\nfrom c.d import X\n",
    ),
    (
        "import module + attribute: old import dropped when unused",
        NAME,
        "import a.b\n\nv = a.b.X(1)\nw = a.b.X\n",
        "import c.d\n\nv = c.d.X(1)\nw = c.d.X\n",
    ),
    (
        "import module + attribute: old import kept when still used",
        NAME,
        "import a.b\n\nv = a.b.X(1)\nw = a.b.Other\n",
        "import a.b\nimport c.d\n\nv = c.d.X(1)\nw = a.b.Other\n",
    ),
    (
        "aliased module import",
        NAME,
        "import a.b as m\n\nv = m.X(1)\n",
        "import c.d\n\nv = c.d.X(1)\n",
    ),
    (
        "existing alias of the new module is reused",
        NAME,
        "import a.b as m\nimport c.d as n\nv = m.X(1) + m.Y\n",
        "import a.b as m\nimport c.d as n\nv = n.X(1) + m.Y\n",
    ),
    ("module bound by from-import", NAME, "from a import b\nv = b.X\n", "import c.d\nv = c.d.X\n"),
    (
        "module move: imports and attribute chains",
        MODULE,
        "import a.b\nimport a.b.q\nv = a.b.q.X\n",
        "import c.d\nimport c.d.q\nv = c.d.q.X\n",
    ),
    (
        "module move: from-import and alias",
        MODULE,
        "from a.b import X, Y\nimport a.b as m\n",
        "from c.d import X, Y\nimport c.d as m\n",
    ),
    ("relative import becomes absolute", NAME, "from .b import X\n", "from c.d import X\n"),
    (
        "inside TYPE_CHECKING",
        NAME,
        "if TYPE_CHECKING:\n    from a.b import X, Y\n",
        "if TYPE_CHECKING:\n    from a.b import Y\n    from c.d import X\n",
    ),
    ("renamed target keeps the local name", ("a.b.X", "c.d.Z"), "from a.b import X\n",
     "from c.d import Z as X\n"),
    (
        "function-local import",
        NAME,
        "def f():\n    import a.b\n    return a.b.X\n",
        "def f():\n    import c.d\n    return c.d.X\n",
    ),
    ("multi-module import line", NAME, "import os, a.b\nprint(a.b.X, os)\n",
     "import os\nimport c.d\nprint(c.d.X, os)\n"),
    # A rename inside one module: the binding of the module keeps serving the chains (it used
    # to be dropped, leaving `a.b.Z` with no import, or replaced by a full `import a.b`).
    ("rename in place: plain module import kept", ("a.b.X", "a.b.Z"),
     "import a.b\nv = a.b.X\n", "import a.b\nv = a.b.Z\n"),
    ("rename in place: module alias kept", ("a.b.X", "a.b.Z"),
     "import a.b as m\nv = m.X(m.X)\n", "import a.b as m\nv = m.Z(m.Z)\n"),
    ("rename in place: from-imported module kept", ("a.b.X", "a.b.Z"),
     "from a import b\nv = b.X\n", "from a import b\nv = b.Z\n"),
    ("rename in place inside a multi-name import: the statement keeps its order",
     ("a.b.X", "a.b.Z"), "from a.b import W, X, Y as V\nv = X\n",
     "from a.b import W, Z as X, Y as V\nv = X\n"),
]

# rename_uses=True: the new name is imported itself and the old local name's uses renamed.
RENAME_CASES: list[tuple[str, tuple[str, str], str, str]] = [
    ("from-import of a renamed name", ("a.b.X", "c.d.Z"),
     "from a.b import X\n\n\ndef f(x: X) -> X:\n    return X(X=x)\n",
     "from c.d import Z\n\n\ndef f(x: Z) -> Z:\n    return Z(X=x)\n"),
    ("module renamed: from-imported module and its chains", ("a.b", "a.d"),
     "from a import b\n\nv = b.X(b.Y)\n", "from a import d\n\nv = d.X(d.Y)\n"),
    ("module renamed inside a multi-name import", ("a.b", "a.d"),
     "from a import (\n    A,\n    b,\n)\n\nv = b.X(A)\n",
     "from a import (\n    A,\n    d,\n)\n\nv = d.X(A)\n"),
    ("user alias stays", ("a.b.X", "c.d.Z"), "from a.b import X as Y\nv = Y\n",
     "from c.d import Z as Y\nv = Y\n"),
    ("new name already used: alias kept", ("a.b.X", "c.d.Z"),
     "from a.b import X\nZ = 1\nv = X\n", "from c.d import Z as X\nZ = 1\nv = X\n"),
    ("new name is a builtin: alias kept", ("a.b.X", "c.d.open"),
     "from a.b import X\nv = X\n", "from c.d import open as X\nv = X\n"),
    ("old name also bound elsewhere: alias kept", ("a.b", "a.d"),
     "from a import b\nv = b.X\n\n\ndef f(b=1):\n    return b\n",
     "from a import d as b\nv = b.X\n\n\ndef f(b=1):\n    return b\n"),
    ("old name spelled in a string (__all__): alias kept", ("a.b.X", "c.d.Z"),
     "from a.b import X\n__all__ = ['X']\n", "from c.d import Z as X\n__all__ = ['X']\n"),
]


@pytest.mark.parametrize(("old_new", "source", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rewrite(old_new: tuple[str, str], source: str, expected: str) -> None:
    old, new = old_new
    assert rewrite_source(source, old, new, module="a.x") == expected
    assert rewrite_source(expected, old, new, module="a.x") == expected  # idempotent


@pytest.mark.parametrize(("old_new", "source", "expected"),
                         [c[1:] for c in RENAME_CASES], ids=[c[0] for c in RENAME_CASES])
def test_rewrite_rename_uses(old_new: tuple[str, str], source: str, expected: str) -> None:
    old, new = old_new
    assert rewrite_source(source, old, new, module="x.y", rename_uses=True) == expected
    assert rewrite_source(expected, old, new, module="x.y", rename_uses=True) == expected


HOME = (
    "\"\"\"Doc mentions X.\"\"\"\n\n__all__ = [\"W\", \"X\", \"Y\"]\n\nY = 2\n\n\n"
    "def X(v: int = Y) -> int:\n    return v\n\n\nclass W:\n    f = X\n\n\n"
    "def g(X: int) -> int:\n    return X\n\n\ndef h() -> int:\n    return X(1) + Y\n"
)


def test_rename_in_the_new_home_renames_the_definition() -> None:
    out = rewrite_source(HOME, "a.b.X", "a.b.Z", module="a.b", rename_uses=True)
    assert out == (
        "\"\"\"Doc mentions X.\"\"\"\n\n__all__ = [\"W\", \"Z\", \"Y\"]\n\nY = 2\n\n\n"
        "def Z(v: int = Y) -> int:\n    return v\n\n\nclass W:\n    f = Z\n\n\n"
        "def g(X: int) -> int:\n    return X\n\n\ndef h() -> int:\n    return Z(1) + Y\n"
    )  # the parameter X of g is another binding: untouched; prose is not rewritten
    assert rewrite_source(out, "a.b.X", "a.b.Z", module="a.b", rename_uses=True) == out
    const = rewrite_source(out, "a.b.Y", "a.b.V", module="a.b", rename_uses=True)
    assert "V = 2" in const and "v: int = V" in const and '"V"]' in const
    # without rename_uses, or outside the new home, the definition stays
    assert rewrite_source(HOME, "a.b.X", "a.b.Z", module="a.b") == HOME
    assert rewrite_source(HOME, "a.b.X", "a.b.Z", module="a.c", rename_uses=True) == HOME


@pytest.mark.parametrize("extra", ["Z = 0\n", "print(getattr(W, 'X'))\n",
                                   "def k():\n    global X\n"])
def test_rename_in_the_new_home_is_skipped_when_unsafe(extra: str) -> None:
    source = HOME + extra
    assert rewrite_source(source, "a.b.X", "a.b.Z", module="a.b", rename_uses=True) == source


def test_new_home_does_not_import_itself() -> None:
    source = "from a.b import W, X\nimport a.b\n\nv = a.b.X + W\n"
    out = rewrite_source(source, "a.b.X", "c.d.X", module="c.d")
    assert out == "from a.b import W\n\nv = X + W\n"


def test_unrelated_code_is_byte_identical() -> None:
    odd = (
        "import  os   # spacing kept\n"
        "from a.b import (X,\n        Other)  # trailing\n"
        "\n\n"
        "def  f( x ):\n"
        "    return   X( x ) ;  # odd\n"
        "y = a.b.X  # not an import binding of `a`: left alone\n"
    )
    out = rewrite_source(odd, "a.b.X", "c.d.X", module="a.x")
    assert out == odd.replace("from a.b import (X,\n        Other)  # trailing\n",
                              "from a.b import Other  # trailing\nfrom c.d import X\n")
    untouched = "import a.b.Xylophone\nfrom a.bc import X\nprint(a.b.Xylophone)\n"
    assert rewrite_source(untouched, "a.b.X", "c.d.X", module="a.x") == untouched


@pytest.mark.parametrize("bad", ["a", "", "a..b", "a.1b"])
def test_paths_must_be_dotted(bad: str) -> None:
    with pytest.raises(ValueError, match="at least two components"):
        rewrite_source("x = 1\n", bad, "c.d")


def test_cli_rewrites_tree_and_resolves_relative_imports(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()  # the module names are derived from the repository root
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .old import Helper, keep\n")
    (pkg / "user.py").write_text("from pkg import old\n\nh = old.Helper()\nk = old.keep\n")
    (pkg / "other.py").write_text("x = 1\n")
    hidden = tmp_path / ".venv" / "lib"
    hidden.mkdir(parents=True)
    (hidden / "dep.py").write_text("from pkg.old import Helper\n")
    dry = run_tool("rewrite_imports", "pkg.old.Helper", "pkg.new.Helper", str(tmp_path),
                   "--check")
    assert dry.returncode == 1
    assert "2 file(s) still import pkg.old.Helper" in dry.stdout
    assert (pkg / "__init__.py").read_text() == "from .old import Helper, keep\n"  # untouched
    proc = run_tool("rewrite_imports", "pkg.old.Helper", "pkg.new.Helper", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "2 file(s) changed" in proc.stdout
    assert (pkg / "__init__.py").read_text() == (
        "from .old import keep\nfrom pkg.new import Helper\n"
    )
    assert (pkg / "user.py").read_text() == (
        "from pkg import old\nimport pkg.new\n\nh = pkg.new.Helper()\nk = old.keep\n"
    )
    assert (hidden / "dep.py").read_text() == "from pkg.old import Helper\n"  # skipped folder
    clean = run_tool("rewrite_imports", "pkg.old.Helper", "pkg.new.Helper", str(tmp_path),
                     "--check")
    assert clean.returncode == 0, clean.stdout
    bad = run_tool("rewrite_imports", "pkg", "pkg.new")
    assert bad.returncode == 2
    assert "at least two components" in bad.stderr


MARKDOWN = """# Title

Prose names `a.b.X` and stays as it is.

```python
from a import b

v = b.X(1)
```

```pycon
>>> from a import b
```

- item

  ```py
  from a.b import X
  print(X)
  ```

```python
this is not python (
from a.b import X
```
"""


def test_markdown_python_blocks_are_rewritten() -> None:
    out = rewrite_markdown(MARKDOWN, "a.b.X", "a.b.Z", rename_uses=True)
    assert out == MARKDOWN.replace("v = b.X(1)", "v = b.Z(1)").replace(
        "  from a.b import X\n  print(X)\n", "  from a.b import Z\n  print(Z)\n"
    )  # prose, the pycon block and the block that does not parse are untouched
    assert rewrite_markdown(out, "a.b.X", "a.b.Z", rename_uses=True) == out


def test_cli_rewrites_markdown_files(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    doc = tmp_path / "docs" / "guide.md"
    doc.parent.mkdir()
    doc.write_text(MARKDOWN)
    proc = run_tool("rewrite_imports", "a.b.X", "a.b.Z", str(tmp_path), "--rename-uses")
    assert proc.returncode == 0, proc.stderr
    assert "1 file(s) changed" in proc.stdout
    assert "v = b.Z(1)" in doc.read_text() and "`a.b.X`" in doc.read_text()


def test_cli_changes_nothing_when_the_new_home_cannot_take_the_new_name(tmp_path: Path) -> None:
    """Regression (renaming this package's own helper ``_rewrite_pass._dotted`` to ``dotted``):
    the home binds ``dotted`` as a local elsewhere, so it refused to rename its definition, but
    the importer in another file was rewritten to ``from ... import dotted``: an ImportError.
    Now the command checks the home first and changes nothing (exit 2, the reason on stderr);
    a free name renames both files."""
    (tmp_path / ".git").mkdir()
    home = tmp_path / "pkg" / "a.py"
    user = tmp_path / "pkg" / "b.py"
    home.parent.mkdir()
    (home.parent / "__init__.py").write_text("")
    home.write_text("def _dotted(x):\n    return x\n\n\ndef use(y):\n"
                    "    dotted = _dotted(y)\n    return dotted\n")
    user.write_text("from pkg.a import _dotted\n\nprint(_dotted(1))\n")
    before = (home.read_text(), user.read_text())
    proc = run_tool("rewrite_imports", "pkg.a._dotted", "pkg.a.dotted", str(tmp_path),
                    "--rename-uses")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "nothing changed" in proc.stderr and "cannot rename it to dotted" in proc.stderr
    assert (home.read_text(), user.read_text()) == before
    proc = run_tool("rewrite_imports", "pkg.a._dotted", "pkg.a.dotted_name", str(tmp_path),
                    "--rename-uses")
    assert proc.returncode == 0, proc.stderr
    renamed = home.read_text()
    assert "def dotted_name(x):" in renamed and "dotted = dotted_name(y)" in renamed
    assert user.read_text() == "from pkg.a import dotted_name\n\nprint(dotted_name(1))\n"
