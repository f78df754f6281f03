"""Torch reference implementations of the mem_cache_kernels ops.

``alloc`` and ``req_table``: one module per op family, with the same function names and
signatures as the Triton launchers in :mod:`mem_cache_kernels._triton`. ``jobs`` (with ``rows``):
the torch row-job executor that the data-movement bodies of :mod:`mem_cache_kernels._row_ops` run
on. These functions do **not** validate their arguments: the public ops
(``mem_cache_kernels.<op>``) validate, then dispatch here or to Triton. They are the CPU path of
the library and the oracle of the tests (see :mod:`mem_cache_kernels.reference`).
"""

__all__: list[str] = []
