"""Compile every Triton kernel of mem_cache_kernels for sm_90 and print a JSON report.

Kernels are *discovered*: every ``@triton.jit`` function defined in a module of
``mem_cache_kernels._triton`` is either a kernel, compiled once per entry of :data:`VARIANTS`
(constexpr values and argument types), or a device helper listed in :data:`HELPERS` (inlined into
the kernels that call it, so compiled with them). A jit function that is neither is reported as
``{"ok": false, "error": "no compile case"}``, so a new kernel without a case fails the test.

Argument types come from the kernel's own parameter list: constexpr parameters take the variant's
values; a parameter named ``*_ptr`` is a pointer (``*i64`` unless the variant says otherwise);
any other parameter is an ``i32`` scalar unless the variant says otherwise.

Run as a script in a fresh interpreter (``python aot_compile_kernels.py``): Triton's interpreter
patches ``triton.language`` while it runs, so compiling in a process that has interpreted kernels
fails. Output: ``{case: {"ok": bool, "memory_ops": [...], "error": str}}``. No GPU is needed.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import re
import sys
from typing import Any

Variant = tuple[str, dict[str, str], dict[str, Any], Any]  # (suffix, types, constexprs, attrs)

_ROW_TYPES = {"dst_idx_ptr": "*i32"}
_ALIGNED = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
_I32 = {"pre_ptr": "*i32", "seq_ptr": "*i32", "free_ptr": "*i32"}
_DEEPSEEK_V4_BYTES = {"nope_ptr": "*u8", "scales_ptr": "*u8", "rope_ptr": "*u8", "out_ptr": "*u8",
               "rec_ptr": "*u8"}  # fmt: skip
_DEEPSEEK_V4_WORDS = {"buf_ptr": "*i32", "rec_ptr": "*i32", "out_ptr": "*i32", "loc_ptr": "*i64"}


def _rows() -> list[Variant]:
    out: list[Variant] = []
    for src, dst in ((True, True), (False, True), (True, False)):
        consts = {"HAS_SRC_IDX": src, "HAS_DST_IDX": dst, "BLOCK_ROWS": 4, "BLOCK_COLS": 1024}
        out.append((f"pairs-{src}-{dst}", _ROW_TYPES, {**consts, "PAIRS": True}, _ALIGNED))
    byte_types = {**_ROW_TYPES, "src_ptr": "*u8", "dst_ptr": "*u8"}
    byte_consts = {"HAS_SRC_IDX": True, "HAS_DST_IDX": True, "BLOCK_ROWS": 4096, "BLOCK_COLS": 1}
    out.append(("bytes", byte_types, {**byte_consts, "PAIRS": False}, None))
    return out


# kernel (module.function) -> compile variants; every discovered kernel needs an entry
VARIANTS: dict[str, list[Variant]] = {
    "rows._copy_rows_kernel": _rows(),
    "alloc._alloc_extend_kernel": [
        (str(ps), _I32, {"PAGE_SIZE": ps, "BLOCK": 256}, None) for ps in (1, 64)
    ],
    "alloc._alloc_decode_kernel": [
        (str(ps), {}, {"PAGE_SIZE": ps, "BLOCK": 1024}, None) for ps in (1, 64)
    ],
    "req_table._write_req_to_token_kernel": [
        (
            str(has),
            {"table_ptr": "*i32", "seq_ptr": "*i32"},
            {"HAS_PREFIX": has, "BLOCK": 256},
            None,
        )
        for has in (True, False)
    ],
    "req_table._get_last_loc_kernel": [
        ("i32", {"table_ptr": "*i32", "pre_ptr": "*i32"}, {"BLOCK": 128}, None)
    ],
    "deepseek_v4._pack_kernel": [("u8", _DEEPSEEK_V4_BYTES, {"BLOCK": 1024}, None)],
    "deepseek_v4._unpack_kernel": [("u8", _DEEPSEEK_V4_BYTES, {"BLOCK": 1024}, None)],
    "deepseek_v4._write_kernel": [("i32", _DEEPSEEK_V4_WORDS, {"BLOCK": 256}, None)],
    "deepseek_v4._read_kernel": [("i32", _DEEPSEEK_V4_WORDS, {"BLOCK": 256}, None)],
    # Mamba state rows: int32 words when sizes, strides and base allow it, else bytes
    "mamba._state_rows_kernel": [
        (w, {"src_ptr": f"*{w}", "dst_ptr": f"*{w}"}, {"BLOCK": 1024}, None)
        for w in ("i32", "u8")
    ],
}
# device helpers (called from kernels, inlined; not launchable on their own)
HELPERS = frozenset({"deepseek_v4._row_words"})


def discover() -> dict[str, Any]:
    """``{"module.function": jit function}`` for every one of ``mem_cache_kernels._triton``."""
    from triton.runtime.jit import JITFunction

    from mem_cache_kernels import _triton

    kinds: tuple[type, ...] = (JITFunction,)
    try:  # under TRITON_INTERPRET=1 @triton.jit makes InterpretedFunction objects
        from triton.runtime.interpreter import InterpretedFunction

        kinds = (JITFunction, InterpretedFunction)
    except ImportError:  # pragma: no cover - older triton
        pass
    found: dict[str, Any] = {}
    for info in pkgutil.iter_modules(_triton.__path__):
        module = importlib.import_module(f"{_triton.__name__}.{info.name}")
        for attr, obj in vars(module).items():
            fn = getattr(obj, "fn", None)
            if isinstance(obj, kinds) and getattr(fn, "__module__", None) == module.__name__:
                found[f"{info.name}.{attr}"] = obj
    return found


def signature(fn: Any, types: dict[str, str]) -> dict[str, str]:
    sig: dict[str, str] = {}
    for p in fn.params:
        if p.is_constexpr:
            sig[p.name] = "constexpr"
        elif p.name in types:
            sig[p.name] = types[p.name]
        else:
            sig[p.name] = "*i64" if p.name.endswith("_ptr") else "i32"
    return sig


def main() -> int:
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    report: dict[str, dict[str, Any]] = {}
    for name, fn in sorted(discover().items()):
        if name in HELPERS:
            continue
        if name not in VARIANTS:
            report[name] = {"ok": False, "memory_ops": [], "error": "no compile case"}
            continue
        for suffix, types, consts, attrs in VARIANTS[name]:
            case = f"{name}-{suffix}"
            try:
                src = ASTSource(
                    fn=fn, signature=signature(fn, types), constexprs=consts, attrs=attrs
                )
                ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
                ops = sorted(set(re.findall(r"(?:ld|st)\.global[.\w]*", ptx)))
                report[case] = {"ok": True, "memory_ops": ops, "error": ""}
            except Exception as exc:  # reported, the test asserts on it
                report[case] = {
                    "ok": False,
                    "memory_ops": [],
                    "error": f"{type(exc).__name__}: {exc}",
                }
    json.dump(report, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
