"""``tools/dev``: the first-run system packages can be skipped, ``check`` reports disk use, and
``--help`` lists every command (``wheels`` included)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _dev() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("tools_dev", str(ROOT / "tools" / "dev"))
    spec = importlib.util.spec_from_loader("tools_dev", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


DEV = _dev()
_X86_64 = SimpleNamespace(machine="x86_64")


def test_no_apt_skips_the_system_packages(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(DEV, "_has_lib", lambda soname: False)
    monkeypatch.setattr(DEV.sys, "platform", "linux")
    monkeypatch.setattr(DEV.os, "uname", lambda: _X86_64)
    monkeypatch.setenv("MEM_CACHE_NO_APT", "1")

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"ran {args}")

    monkeypatch.setattr(DEV.subprocess, "run", refuse)
    DEV.ensure_system_libs()
    out = capsys.readouterr().out
    assert "MEM_CACHE_NO_APT set: not installing libibverbs1 librdmacm1 libnuma1" in out


def test_disk_report_names_each_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "big").write_bytes(b"x" * (3 << 20))
    (tmp_path / ".cache" / "piecemeal").mkdir(parents=True)
    (tmp_path / ".cache" / "piecemeal" / "t").write_bytes(b"x" * (2 << 20))
    monkeypatch.setattr(DEV, "ROOT", tmp_path)
    line = DEV.disk_report()
    assert line.startswith("disk: 0.00 GiB (.venv 3 MiB, .cache 2 MiB)"), line
    assert ".cache/piecemeal 2 MiB" in line


def test_help_lists_the_commands() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "dev"), "--help"],
                         capture_output=True, text=True, check=True).stdout
    for command in ("run", "check", "bench", "gpu-check", "docs", "wheels", "env", "shell-cmd",
                    "MEM_CACHE_NO_APT"):
        assert command in out, command


def test_wheels_refuses_unknown_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert DEV.cmd_wheels(["--bogus"]) == 2
    assert "usage: tools/dev wheels [--out DIR]" in capsys.readouterr().err
