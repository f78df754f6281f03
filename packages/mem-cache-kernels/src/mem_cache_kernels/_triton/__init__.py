"""Triton implementations of the mem_cache_kernels ops.

One module per op family (``alloc``, ``req_table``, ``rows``, ``deepseek_v4``, ``mamba``), with
the function names and argument lists of :mod:`mem_cache_kernels._torch`. Importing this
subpackage imports ``triton``. Only :mod:`mem_cache_kernels.dispatch` imports it, lazily, on the
first call that resolves to the Triton backend.
"""

import triton  # noqa: F401  (the one place where an eager triton import is allowed)

__all__: list[str] = []
