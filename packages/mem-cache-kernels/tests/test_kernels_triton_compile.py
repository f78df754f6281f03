"""Ahead-of-time compilation of every Triton kernel for a Hopper GPU (sm_90), without a GPU.

The interpreter tests check what the kernels compute; this checks that the compiled path accepts
them (types, constexpr branches, dynamic loops) and that the row copy gets 16-byte vector memory
instructions when its alignment hints apply. Compilation runs in a fresh interpreter
(``aot_compile_kernels.py``): Triton's interpreter patches ``triton.language`` in-process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.triton

SCRIPT = Path(__file__).with_name("aot_compile_kernels.py")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return result


def test_every_kernel_compiles(report: dict[str, dict[str, Any]]) -> None:
    failed = {name: r["error"] for name, r in report.items() if not r["ok"]}
    assert not failed
    assert len(report) == 11  # 4 row-copy variants, 4 allocation, 3 request-table


def test_row_copy_uses_16_byte_vectors_when_aligned(report: dict[str, dict[str, Any]]) -> None:
    for name in ("rows-pairs-True-True", "rows-pairs-False-True", "rows-pairs-True-False"):
        ops = set(report[name]["memory_ops"])
        assert {"ld.global.v2.b64", "st.global.v2.b64"} <= ops, (name, ops)
