"""Compile every Triton kernel of mem_cache_kernels for sm_90 and print a JSON report.

Run as a script in a fresh interpreter (``python aot_compile_kernels.py``): Triton's interpreter
patches ``triton.language`` while it runs, so compiling in a process that has interpreted kernels
fails. Output: ``{case: {"ok": bool, "memory_ops": [...], "error": str}}``. No GPU is needed.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

ROW_SIG = {
    "src_ptr": "*i64", "dst_ptr": "*i64", "table_ptr": "*i64", "src_idx_ptr": "*i64",
    "dst_idx_ptr": "*i32", "n": "i32", "row_words": "i32", "HAS_SRC_IDX": "constexpr",
    "HAS_DST_IDX": "constexpr", "BLOCK_ROWS": "constexpr", "BLOCK_COLS": "constexpr",
    "PAIRS": "constexpr",
}  # fmt: skip
EXT_SIG = {
    "pre_ptr": "*i32", "seq_ptr": "*i32", "last_ptr": "*i64", "free_ptr": "*i32",
    "starts_ptr": "*i64", "out_ptr": "*i64", "bs": "i32", "PAGE_SIZE": "constexpr",
    "BLOCK": "constexpr",
}  # fmt: skip
DEC_SIG = {
    "seq_ptr": "*i64", "last_ptr": "*i64", "free_ptr": "*i64", "out_ptr": "*i64", "bs": "i32",
    "PAGE_SIZE": "constexpr", "BLOCK": "constexpr",
}  # fmt: skip
WRITE_SIG = {
    "table_ptr": "*i32", "table_stride": "i32", "rows_ptr": "*i64", "pre_ptr": "*i64",
    "seq_ptr": "*i32", "new_ptr": "*i64", "prefix_ptr": "*i64", "starts_ptr": "*i64",
    "bs": "i32", "HAS_PREFIX": "constexpr", "BLOCK": "constexpr",
}  # fmt: skip
LAST_SIG = {
    "table_ptr": "*i32", "table_stride": "i32", "rows_ptr": "*i64", "pre_ptr": "*i32",
    "out_ptr": "*i64", "bs": "i32", "BLOCK": "constexpr",
}  # fmt: skip
ALIGNED = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}


def _cases() -> dict[str, tuple[Any, dict[str, str], dict[str, Any], Any]]:
    from mem_cache_kernels._triton import alloc, req_table, rows

    cases: dict[str, tuple[Any, dict[str, str], dict[str, Any], Any]] = {}
    for src, dst in ((True, True), (False, True), (True, False)):
        consts = {"HAS_SRC_IDX": src, "HAS_DST_IDX": dst, "BLOCK_ROWS": 4, "BLOCK_COLS": 1024}
        cases[f"rows-pairs-{src}-{dst}"] = (
            rows._copy_rows_kernel,
            ROW_SIG,
            {**consts, "PAIRS": True},
            ALIGNED,
        )
    byte_sig = {**ROW_SIG, "src_ptr": "*u8", "dst_ptr": "*u8"}
    byte_consts = {"HAS_SRC_IDX": True, "HAS_DST_IDX": True, "BLOCK_ROWS": 4096, "BLOCK_COLS": 1}
    cases["rows-bytes"] = (rows._copy_rows_kernel, byte_sig, {**byte_consts, "PAIRS": False}, None)
    for ps in (1, 64):
        cases[f"alloc_extend-{ps}"] = (
            alloc._alloc_extend_kernel,
            EXT_SIG,
            {"PAGE_SIZE": ps, "BLOCK": 256},
            None,
        )
        cases[f"alloc_decode-{ps}"] = (
            alloc._alloc_decode_kernel,
            DEC_SIG,
            {"PAGE_SIZE": ps, "BLOCK": 1024},
            None,
        )
    for has in (True, False):
        cases[f"write_req_to_token-{has}"] = (
            req_table._write_req_to_token_kernel,
            WRITE_SIG,
            {"HAS_PREFIX": has, "BLOCK": 256},
            None,
        )
    cases["get_last_loc"] = (req_table._get_last_loc_kernel, LAST_SIG, {"BLOCK": 128}, None)
    return cases


def main() -> int:
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    report: dict[str, dict[str, Any]] = {}
    for name, (fn, sig, consts, attrs) in _cases().items():
        try:
            src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
            ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
            ops = sorted(set(re.findall(r"(?:ld|st)\.global[.\w]*", ptx)))
            report[name] = {"ok": True, "memory_ops": ops, "error": ""}
        except Exception as exc:  # reported, the test asserts on it
            report[name] = {"ok": False, "memory_ops": [], "error": f"{type(exc).__name__}: {exc}"}
    json.dump(report, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
