"""Deprecated: :mod:`mem_cache_kernels.deepseek_v4` (the family has one name, ``deepseek_v4``).

Every name of this module moved there and lost its redundant ``dsv4`` prefix:
``DSV4_NOPE_DIM`` -> ``NOPE_DIM``,
``DSV4_PAGE_ALIGN`` -> ``PAGE_ALIGN``,
``DSV4_QUANT_GROUP`` -> ``QUANT_GROUP``,
``DSV4_ROPE_DIM`` -> ``ROPE_DIM``,
``DSV4_SCALE_BYTES`` -> ``SCALE_BYTES``,
``DSV4_SCALE_PART_BYTES`` -> ``SCALE_PART_BYTES``,
``DSV4_TOKEN_BYTES`` -> ``TOKEN_BYTES``,
``DSV4_UE8M0_BIAS`` -> ``UE8M0_BIAS``,
``DSV4_VALUE_BYTES`` -> ``VALUE_BYTES``,
``dequantize_dsv4_nope`` -> ``dequantize_nope``,
``dsv4_page_bytes`` -> ``page_row_bytes``,
``pack_dsv4_records`` -> ``pack_records``,
``quantize_dsv4_nope`` -> ``quantize_nope``,
``read_dsv4_records`` -> ``read_records``,
``unpack_dsv4_records`` -> ``unpack_records``,
``write_dsv4_records`` -> ``write_records``.
The old names keep working for one release: each access returns the very object of
:mod:`mem_cache_kernels.deepseek_v4` and emits one ``DeprecationWarning`` naming the new path.
Importing this module imports nothing but :mod:`mem_cache_kernels.shims` (no torch, no Triton).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mem_cache_kernels.shims import moved_names

__all__: list[str] = []

if TYPE_CHECKING:  # the static view: mypy, IDEs and import-linter see the real definitions
    from mem_cache_kernels.deepseek_v4 import NOPE_DIM as DSV4_NOPE_DIM
    from mem_cache_kernels.deepseek_v4 import PAGE_ALIGN as DSV4_PAGE_ALIGN
    from mem_cache_kernels.deepseek_v4 import QUANT_GROUP as DSV4_QUANT_GROUP
    from mem_cache_kernels.deepseek_v4 import ROPE_DIM as DSV4_ROPE_DIM
    from mem_cache_kernels.deepseek_v4 import SCALE_BYTES as DSV4_SCALE_BYTES
    from mem_cache_kernels.deepseek_v4 import SCALE_PART_BYTES as DSV4_SCALE_PART_BYTES
    from mem_cache_kernels.deepseek_v4 import TOKEN_BYTES as DSV4_TOKEN_BYTES
    from mem_cache_kernels.deepseek_v4 import UE8M0_BIAS as DSV4_UE8M0_BIAS
    from mem_cache_kernels.deepseek_v4 import VALUE_BYTES as DSV4_VALUE_BYTES
    from mem_cache_kernels.deepseek_v4 import dequantize_nope as dequantize_dsv4_nope
    from mem_cache_kernels.deepseek_v4 import pack_records as pack_dsv4_records
    from mem_cache_kernels.deepseek_v4 import page_row_bytes as dsv4_page_bytes
    from mem_cache_kernels.deepseek_v4 import quantize_nope as quantize_dsv4_nope
    from mem_cache_kernels.deepseek_v4 import read_records as read_dsv4_records
    from mem_cache_kernels.deepseek_v4 import unpack_records as unpack_dsv4_records
    from mem_cache_kernels.deepseek_v4 import write_records as write_dsv4_records

    # A renamed import is re-exported (mypy --strict, ruff) only through __all__: the old
    # names are exported for the type checkers alone, the runtime __all__ stays empty.
    __all__ += [
        "DSV4_NOPE_DIM",
        "DSV4_PAGE_ALIGN",
        "DSV4_QUANT_GROUP",
        "DSV4_ROPE_DIM",
        "DSV4_SCALE_BYTES",
        "DSV4_SCALE_PART_BYTES",
        "DSV4_TOKEN_BYTES",
        "DSV4_UE8M0_BIAS",
        "DSV4_VALUE_BYTES",
        "dequantize_dsv4_nope",
        "dsv4_page_bytes",
        "pack_dsv4_records",
        "quantize_dsv4_nope",
        "read_dsv4_records",
        "unpack_dsv4_records",
        "write_dsv4_records",
    ]
else:  # the runtime view: PEP 562 forwarding with a DeprecationWarning
    __getattr__ = moved_names(
        __name__,
        {
            "DSV4_NOPE_DIM": "mem_cache_kernels.deepseek_v4:NOPE_DIM",
            "DSV4_PAGE_ALIGN": "mem_cache_kernels.deepseek_v4:PAGE_ALIGN",
            "DSV4_QUANT_GROUP": "mem_cache_kernels.deepseek_v4:QUANT_GROUP",
            "DSV4_ROPE_DIM": "mem_cache_kernels.deepseek_v4:ROPE_DIM",
            "DSV4_SCALE_BYTES": "mem_cache_kernels.deepseek_v4:SCALE_BYTES",
            "DSV4_SCALE_PART_BYTES": "mem_cache_kernels.deepseek_v4:SCALE_PART_BYTES",
            "DSV4_TOKEN_BYTES": "mem_cache_kernels.deepseek_v4:TOKEN_BYTES",
            "DSV4_UE8M0_BIAS": "mem_cache_kernels.deepseek_v4:UE8M0_BIAS",
            "DSV4_VALUE_BYTES": "mem_cache_kernels.deepseek_v4:VALUE_BYTES",
            "dequantize_dsv4_nope": "mem_cache_kernels.deepseek_v4:dequantize_nope",
            "dsv4_page_bytes": "mem_cache_kernels.deepseek_v4:page_row_bytes",
            "pack_dsv4_records": "mem_cache_kernels.deepseek_v4:pack_records",
            "quantize_dsv4_nope": "mem_cache_kernels.deepseek_v4:quantize_nope",
            "read_dsv4_records": "mem_cache_kernels.deepseek_v4:read_records",
            "unpack_dsv4_records": "mem_cache_kernels.deepseek_v4:unpack_records",
            "write_dsv4_records": "mem_cache_kernels.deepseek_v4:write_records",
        },
    )
