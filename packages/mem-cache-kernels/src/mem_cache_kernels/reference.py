"""The torch reference implementations, callable directly (the tests' oracle).

Same names and signatures as the public ops minus ``backend``. These functions **do not validate**
their arguments: library code should call ``mem_cache_kernels.<op>(..., backend="torch")``, which
validates and then runs exactly these functions. The host-driven ``direct_*`` ops have a single
implementation and are not repeated here.
"""

from __future__ import annotations

from mem_cache_kernels._torch.alloc import alloc_decode, alloc_extend
from mem_cache_kernels._torch.move import copy_all_layer_kv_cache
from mem_cache_kernels._torch.req_table import get_last_loc, write_req_to_token
from mem_cache_kernels._torch.store import get_mla_kv_buffer, set_mla_kv_buffer, store_kv
from mem_cache_kernels._torch.transfer import (
    backup_all_layers_to_page_first,
    load_layer_from_page_first,
    transfer_rows,
    transfer_rows_all_layers,
)

__all__ = [
    "alloc_decode",
    "alloc_extend",
    "backup_all_layers_to_page_first",
    "copy_all_layer_kv_cache",
    "get_last_loc",
    "get_mla_kv_buffer",
    "load_layer_from_page_first",
    "set_mla_kv_buffer",
    "store_kv",
    "transfer_rows",
    "transfer_rows_all_layers",
    "write_req_to_token",
]
