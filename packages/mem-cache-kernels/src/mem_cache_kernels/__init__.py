"""mem_cache_kernels: slot allocation, KV stores and host/device KV transfers.

Every op has a torch implementation (any device; the CPU path) and, except the host-driven
``direct_*`` copies and the DeepSeek-V4 quantisation arithmetic, a Triton implementation (GPU
tensors, or CPU under ``TRITON_INTERPRET=1``). The way down from a public op to its bytes:

1. the public op (e.g. :func:`store_kv`, defined in a private module per family) checks its
   arguments with :mod:`mem_cache_kernels.checks`, once;
2. it calls :func:`mem_cache_kernels.dispatch.pick`, which resolves
   ``backend="auto" | "torch" | "triton"`` (:func:`resolve_backend`; the environment variable
   ``MEM_CACHE_KERNELS_BACKEND`` replaces ``"auto"``) and returns the op's row of
   :data:`mem_cache_kernels.dispatch.TABLE`: a real function object;
3. that function, in the backend's module for the op family (``_torch.rows``, ``_torch.alloc``,
   ..., or ``_triton.<family>``), trusts its arguments, builds its byte-row jobs with
   ``_layout`` (the row-moving ops) and moves the bytes.

Pools, allocators and host pools validate at their own public methods and call ``pick``
themselves (step 2). Importing this package never imports triton.
"""

from mem_cache_kernels._alloc import alloc_decode, alloc_extend
from mem_cache_kernels._direct import (
    direct_backup_all_layers_to_page_first_direct,
    direct_load_layer_from_page_first_direct,
    direct_transfer_rows,
)
from mem_cache_kernels._move import copy_all_layer_kv_cache
from mem_cache_kernels._registry import OpInfo, list_ops
from mem_cache_kernels._req_table import get_last_loc, write_req_to_token
from mem_cache_kernels._store import get_mla_kv_buffer, set_mla_kv_buffer, store_kv
from mem_cache_kernels._transfer import (
    backup_all_layers_to_page_first,
    load_layer_from_page_first,
    transfer_rows,
    transfer_rows_all_layers,
)
from mem_cache_kernels.dispatch import (
    BACKEND_ENV_VAR,
    Backend,
    ResolvedBackend,
    resolve_backend,
    triton_available,
)

__all__ = [
    "BACKEND_ENV_VAR",
    "Backend",
    "OpInfo",
    "ResolvedBackend",
    "alloc_decode",
    "alloc_extend",
    "backup_all_layers_to_page_first",
    "copy_all_layer_kv_cache",
    "direct_backup_all_layers_to_page_first_direct",
    "direct_load_layer_from_page_first_direct",
    "direct_transfer_rows",
    "get_last_loc",
    "get_mla_kv_buffer",
    "list_ops",
    "load_layer_from_page_first",
    "resolve_backend",
    "set_mla_kv_buffer",
    "store_kv",
    "transfer_rows",
    "transfer_rows_all_layers",
    "triton_available",
    "write_req_to_token",
]
