"""The old ``tools.*`` spellings of the refactor tools keep working for one release."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from tests.tools._synth import REPO_ROOT

SHIMS = [
    ("tools.move_check", "check", "mem_cache_refactor.move_check"),
    ("tools.move_check.core", "render_text", "mem_cache_refactor.move_check.core"),
    ("tools.move_check.modpath", "SourceRoots", "mem_cache_refactor.modpath"),
    ("tools.rewrite_imports", "rewrite_source", "mem_cache_refactor.rewrite_imports"),
    ("tools.api_snapshot", "describe_package", "mem_cache_refactor.api_snapshot"),
    ("tools.import_contracts", "EagerForbiddenContract", "mem_cache_refactor.contracts"),
    ("tools.griffe_check", "find_base", "mem_cache_refactor.griffe_check"),
]


@pytest.mark.parametrize(("old", "name", "new"), SHIMS, ids=[s[0] for s in SHIMS])
def test_old_module_paths_warn_and_return_the_same_object(old: str, name: str, new: str) -> None:
    module = importlib.import_module(old)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), name)
    [warning] = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert f"{new}.{name}" in str(warning.message)
    with pytest.raises(AttributeError):
        _ = module.no_such_name


@pytest.mark.parametrize(
    ("module", "command"),
    [("tools.move_check", "move-check"), ("tools.rewrite_imports", "rewrite-imports"),
     ("tools.api_snapshot", "api-snapshot"), ("tools.griffe_check", "griffe-check")],
)
def test_python_dash_m_still_runs_the_tool(module: str, command: str) -> None:
    proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert f"usage: {command}" in proc.stdout
    assert f"use `{command}`" in proc.stderr
