"""Fetch and unpack the SGLang 0.5.23 wheel (and its few import-time dependencies) once."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

VERSION = "0.5.23"
ROOT = Path(__file__).resolve().parents[2]

# SGLang's modules import these at module level on the paths we load; they are small and
# pure-Python (or ship small wheels), so the real packages are installed rather than stood in for.
# Pinned for repeatable runs; `--no-deps` keeps pip from touching torch.
IMPORT_DEPS = (
    "annotated-types==0.8.0",
    "dill==0.4.1",
    "msgspec==0.23.0",
    "orjson==3.13.0",
    "psutil==7.2.2",
    "pybase64==1.5.1",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "pyzmq==27.3.0",
    "tqdm==4.70.1",
    "typing-inspection==0.4.5",
)

HOW_TO_GET = (
    f"SGLang {VERSION}'s wheel is needed (read, never vendored): `python3 tools/dev sglang-wheel` "
    f"fetches it with `pip download --no-deps sglang=={VERSION}` into .cache/sglang/; without "
    "network, download it elsewhere and set SGLANG_WHEEL=/path/to/the.whl"
)


class WheelUnavailable(RuntimeError):
    """The wheel could not be downloaded or unpacked; the message says how to get it."""


def cache_dir() -> Path:
    """Where the wheel, its unpacked tree and its import dependencies live."""
    env = os.environ.get("SGLANG_WHEEL_CACHE")
    return Path(env) if env else ROOT / ".cache" / "sglang"


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise WheelUnavailable(f"{' '.join(cmd[2:])} failed: {' | '.join(tail)}. {HOW_TO_GET}")


def _wheel_file(base: Path) -> Path:
    given = os.environ.get("SGLANG_WHEEL")
    if given:
        path = Path(given)
        if not path.is_file():
            raise WheelUnavailable(f"SGLANG_WHEEL={given} is not a file. {HOW_TO_GET}")
        return path
    found = sorted((base / "wheel").glob(f"sglang-{VERSION}-*.whl"))
    if not found:
        (base / "wheel").mkdir(parents=True, exist_ok=True)
        _pip("download", "--no-deps", f"sglang=={VERSION}", "-d", str(base / "wheel"))
        found = sorted((base / "wheel").glob(f"sglang-{VERSION}-*.whl"))
    if not found:
        raise WheelUnavailable(f"pip download left no sglang-{VERSION} wheel. {HOW_TO_GET}")
    return found[0]


def ensure_wheel() -> Path:
    """Download (once) and unpack (once) the wheel; returns the folder that holds ``sglang/``.

    Also installs :data:`IMPORT_DEPS` into ``<cache>/deps``. Idempotent and safe to call from
    every test: the work is done when the marker files are missing. Raises
    :class:`WheelUnavailable` (a RuntimeError) with :data:`HOW_TO_GET` when it cannot.
    """
    base = cache_dir()
    tree = base / f"sglang-{VERSION}"
    if not (tree / ".complete").exists():
        wheel = _wheel_file(base)
        partial = base / f".sglang-{VERSION}.partial"
        if partial.exists():
            subprocess.run(["rm", "-rf", str(partial)], check=True)
        try:
            with zipfile.ZipFile(wheel) as zf:
                members = [n for n in zf.namelist() if n.startswith("sglang/")]
                zf.extractall(partial, members)
        except (OSError, zipfile.BadZipFile) as exc:
            raise WheelUnavailable(f"cannot unpack {wheel}: {exc}. {HOW_TO_GET}") from exc
        if tree.exists():
            subprocess.run(["rm", "-rf", str(tree)], check=True)
        partial.rename(tree)
        (tree / ".complete").write_text(wheel.name + "\n")
    deps = base / "deps"
    marker = deps / ".complete"
    want = "\n".join(IMPORT_DEPS) + "\n"
    if not marker.exists() or marker.read_text() != want:
        _pip("install", "--no-deps", "--upgrade", "--target", str(deps), *IMPORT_DEPS)
        marker.write_text(want)
    return tree


def source_root() -> Path:
    """The unpacked tree's ``sglang/`` folder (fetching it first when needed), for ``ast`` reads."""
    return ensure_wheel() / "sglang"
