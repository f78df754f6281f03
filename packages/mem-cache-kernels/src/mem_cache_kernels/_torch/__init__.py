"""Torch implementations of the mem_cache_kernels ops, one module per op family.

``alloc``, ``req_table``, ``rows`` (the row-moving families: store, move, transfer),
``deepseek_v4`` and ``mamba``: the same function names and argument lists as the Triton modules
of :mod:`mem_cache_kernels._triton`. These functions do **not** validate their arguments: the
public ops (``mem_cache_kernels.<op>``) validate, then :func:`mem_cache_kernels.dispatch.pick`
returns one of them (the ``torch`` column of its table) or the Triton one. They are the CPU path
of the library and the oracle of the tests (see :mod:`mem_cache_kernels.reference`).
"""

__all__: list[str] = []
