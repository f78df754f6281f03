"""Ahead-of-time compilation of every Triton kernel for a Hopper GPU (sm_90), without a GPU.

The kernels are discovered, not listed: the script compiles every ``@triton.jit`` function of
``mem_cache_kernels._triton`` (see ``aot_compile_kernels.py``); one without a compile case is a
failure, so a new kernel cannot be silently left out.

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
    compiled = {case.split("-")[0] for case in report}
    # the discovery found the families we know of (a lost module would shrink this set)
    assert {
        "rows._copy_rows_kernel",
        "alloc._alloc_extend_kernel",
        "alloc._alloc_decode_kernel",
        "req_table._write_req_to_token_kernel",
        "req_table._get_last_loc_kernel",
        "deepseek_v4._pack_kernel",
        "deepseek_v4._unpack_kernel",
        "deepseek_v4._write_kernel",
        "deepseek_v4._read_kernel",
        "mamba._state_rows_kernel",
    } <= compiled


def test_discovery_covers_every_jit_function() -> None:
    """Every jit function of ``mem_cache_kernels._triton`` is a compile case or a listed helper
    (runs in this process: importing the modules is enough, nothing is compiled)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import aot_compile_kernels as aot
    finally:
        sys.path.remove(str(SCRIPT.parent))
    found = set(aot.discover())
    assert found == set(aot.VARIANTS) | aot.HELPERS


def test_row_copy_uses_16_byte_vectors_when_aligned(report: dict[str, dict[str, Any]]) -> None:
    for name in (
        "rows._copy_rows_kernel-pairs-True-True",
        "rows._copy_rows_kernel-pairs-False-True",
        "rows._copy_rows_kernel-pairs-True-False",
    ):
        ops = set(report[name]["memory_ops"])
        assert {"ld.global.v2.b64", "st.global.v2.b64"} <= ops, (name, ops)
