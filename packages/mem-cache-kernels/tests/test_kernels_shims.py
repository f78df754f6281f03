"""Tests for the moved-name shim helper (mem_cache_kernels.shims.moved_names)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from mem_cache_kernels.shims import moved_names

_OLD = """
from __future__ import annotations

from typing import TYPE_CHECKING

from mem_cache_kernels.shims import moved_names

__all__: list[str] = ["kept"]

kept = 1

if TYPE_CHECKING:
    from {pkg}.new import Helper as Helper  # noqa: PLC0414
else:
    __getattr__ = moved_names(__name__, {{"Helper": "{pkg}.new", "Alias": "{pkg}.new:Helper"}})
"""


@pytest.fixture
def shim_pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    pkg = f"shimpkg_{tmp_path.name.replace('-', '_')}"
    root = tmp_path / pkg
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "new.py").write_text("class Helper:\n    pass\n")
    (root / "old.py").write_text(_OLD.format(pkg=pkg))
    monkeypatch.syspath_prepend(str(tmp_path))
    return pkg


def test_moved_name_is_same_object_with_one_warning(shim_pkg: str) -> None:
    old = importlib.import_module(f"{shim_pkg}.old")
    new = importlib.import_module(f"{shim_pkg}.new")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        obj = old.Helper
    assert obj is new.Helper
    assert len(caught) == 1
    assert caught[0].category is DeprecationWarning
    assert f"{shim_pkg}.old.Helper moved to {shim_pkg}.new.Helper" in str(caught[0].message)
    # Attributed to this file (stacklevel=2), not to shims.py.
    assert caught[0].filename == __file__


def test_each_access_warns_and_nothing_is_cached(shim_pkg: str) -> None:
    old = importlib.import_module(f"{shim_pkg}.old")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = old.Helper
        second = old.Helper
    assert first is second
    assert len(caught) == 2
    assert "Helper" not in vars(old)


def test_renamed_target_and_unknown_names(shim_pkg: str) -> None:
    old = importlib.import_module(f"{shim_pkg}.old")
    new = importlib.import_module(f"{shim_pkg}.new")
    with pytest.warns(DeprecationWarning, match=r"old\.Alias moved to .*new\.Helper"):
        assert old.Alias is new.Helper
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert old.kept == 1  # real attributes never go through the shim
        with pytest.raises(AttributeError, match="has no attribute 'Missing'"):
            _ = old.Missing


def test_from_import_warns_once_in_fresh_interpreter(shim_pkg: str, tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import warnings
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from {shim_pkg}.old import Helper
        from {shim_pkg}.new import Helper as New
        assert Helper is New
        assert [w.category for w in caught] == [DeprecationWarning], caught
        print("ok")
        """
    )
    kernels_src = Path(importlib.import_module("mem_cache_kernels").__file__ or "").parent.parent
    env_path = f"{tmp_path}:{kernels_src}"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_stacklevel_for_a_lazy_wrapper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = f"lazyshim_{tmp_path.name.replace('-', '_')}"
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / pkg / "new.py").write_text("def f() -> int:\n    return 1\n")
    (tmp_path / pkg / "old.py").write_text(
        "from typing import Any\n\n\n"
        "def __getattr__(name: str) -> Any:\n"
        "    from mem_cache_kernels.shims import moved_names\n\n"
        f"    return moved_names(__name__, {{'f': '{pkg}.new'}}, stacklevel=3)(name)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    old = importlib.import_module(f"{pkg}.old")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert old.f() == 1
    assert [w.filename for w in caught] == [__file__]


@pytest.mark.parametrize(
    ("module_name", "moved", "error"),
    [
        (3, {"A": "x"}, TypeError),
        ("", {"A": "x"}, ValueError),
        ("m", [("A", "x")], TypeError),
        ("m", {"not an id": "x"}, ValueError),
        ("m", {"A": ""}, ValueError),
        ("m", {"A": ":B"}, ValueError),
        ("m", {"A": 5}, TypeError),
    ],
)
def test_bad_arguments(module_name: object, moved: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        moved_names(module_name, moved)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("stacklevel", "error"), [(0, ValueError), (True, TypeError), (2.0, TypeError)]
)
def test_bad_stacklevel(stacklevel: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="stacklevel"):
        moved_names("m", {"A": "x"}, stacklevel=stacklevel)  # type: ignore[arg-type]


def test_shims_module_imports_no_torch_or_triton() -> None:
    code = (
        "import sys, importlib.util, importlib.machinery\n"
        "import mem_cache_kernels.shims\n"
        "bad = [m for m in ('triton', 'mem_cache_kernels._triton') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
