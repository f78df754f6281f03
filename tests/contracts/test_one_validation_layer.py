"""One validation layer: the generic argument checks live once, in ``mem_cache_kernels.checks``.

A static scan (``ast``) of every runtime package's sources enforces it:

* no ``isinstance(x, bool)`` (the int-not-bool check is ``checks.check_int`` / ``check_bool``);
* no second reader of ``MEM_CACHE_DEBUG`` (``checks.debug_enabled`` is the one);
* no module-level function that re-defines a name of ``checks.__all__`` (a second ``check_int``,
  ``describe``, ``debug_enabled``...);
* no second literal of the index dtypes ``(torch.int32, torch.int64)`` (``checks.INDEX_DTYPES``);
* every runtime package tests the exception-type rule (a ``test_*error_rule.py`` in its tests).

The scanner is tested on a source that breaks each rule, so this test can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mem_cache_kernels import checks

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = {
    "mem-cache-kernels": "mem_cache_kernels",
    "mem-cache-pool": "mem_cache_pool",
    "mem-cache-allocator": "mem_cache_allocator",
    "mem-cache-pool-host": "mem_cache_pool_host",
    "mem-cache-storage": "mem_cache_storage",
}
CHECKS_FILE = ROOT / "packages/mem-cache-kernels/src/mem_cache_kernels/checks.py"
_GENERIC = frozenset(checks.__all__)


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _is_torch_attr(node: ast.AST, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr and _is_name(node.value, "torch")


def violations(source: str, label: str) -> list[str]:
    """What in ``source`` re-implements a generic check (``label: line: what``)."""
    tree = ast.parse(source)
    docs = _docstring_nodes(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call) and _is_name(node.func, "isinstance") and len(node.args) == 2:
            kinds = node.args[1]
            elts = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
            if any(_is_name(e, "bool") for e in elts):
                found.append(f"{label}:{line}: isinstance(..., bool) (use checks.check_int)")
        elif (
            isinstance(node, ast.Constant)
            and node.value == checks.DEBUG_ENV_VAR
            and id(node) not in docs
        ):
            found.append(f"{label}:{line}: reads {checks.DEBUG_ENV_VAR} (use checks.debug_enabled)")
        elif (
            isinstance(node, ast.Tuple)
            and len(node.elts) == 2
            and _is_torch_attr(node.elts[0], "int32")
            and _is_torch_attr(node.elts[1], "int64")
        ):
            found.append(f"{label}:{line}: (torch.int32, torch.int64) (use INDEX_DTYPES)")
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name.lstrip("_") in _GENERIC:
            found.append(
                f"{label}:{stmt.lineno}: defines {stmt.name} (checks.{stmt.name.lstrip('_')} "
                f"exists)"
            )
    return found


def _sources() -> list[Path]:
    files: list[Path] = []
    for dist, pkg in RUNTIME.items():
        files += sorted((ROOT / "packages" / dist / "src" / pkg).rglob("*.py"))
    return [f for f in files if f != CHECKS_FILE]


def test_scanner_flags_each_rule() -> None:
    bad = (
        '"""MEM_CACHE_DEBUG in a docstring is fine."""\n'
        "import os, torch\n"
        "def check_int(name, v):\n"
        "    if isinstance(v, (int, bool)):\n"
        "        pass\n"
        "_IDX = (torch.int32, torch.int64)\n"
        "DEBUG = os.environ.get('MEM_CACHE_DEBUG')\n"
        "def _describe(t):\n"
        "    return str(t)\n"
    )
    found = violations(bad, "bad.py")
    assert sorted(f.split(": ", 1)[0] for f in found) == [
        "bad.py:3",
        "bad.py:4",
        "bad.py:6",
        "bad.py:7",
        "bad.py:8",
    ], found
    assert violations('"""MEM_CACHE_DEBUG=1 turns it on."""\nx = 1\n', "ok.py") == []


def test_the_checks_module_defines_what_the_scan_protects() -> None:
    assert "isinstance(value, bool)" in CHECKS_FILE.read_text()
    assert {"check_int", "debug_enabled", "describe", "check_index"} <= _GENERIC


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT / "packages")))
def test_no_generic_check_outside_the_checks_module(path: Path) -> None:
    assert violations(path.read_text(), str(path.relative_to(ROOT))) == []


@pytest.mark.parametrize("dist", sorted(RUNTIME))
def test_each_package_tests_the_exception_rule(dist: str) -> None:
    tests = sorted((ROOT / "packages" / dist / "tests").glob("test_*error_rule.py"))
    assert tests, f"{dist} has no tests/test_*error_rule.py (the exception-type rule, per package)"
    text = "\n".join(t.read_text() for t in tests)
    assert "TypeError" in text and "ValueError" in text
