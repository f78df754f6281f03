"""Triton implementations of the mem_cache_kernels ops.

Importing this subpackage imports ``triton``. Only :mod:`mem_cache_kernels._dispatch` imports it,
lazily, on the first call that resolves to the Triton backend.
"""

import triton  # noqa: F401  (the one place where an eager triton import is allowed)

__all__: list[str] = []
