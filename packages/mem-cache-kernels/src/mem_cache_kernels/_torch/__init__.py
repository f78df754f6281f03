"""Torch reference implementations of the mem_cache_kernels ops.

One module per op family, with the same function names and signatures as the Triton launchers in
:mod:`mem_cache_kernels._triton`. These functions do **not** validate their arguments: the public
ops (``mem_cache_kernels.<op>``) validate, then dispatch here or to Triton. They are the CPU path
of the library and the oracle of the tests; :mod:`mem_cache_kernels.reference` re-exports them.
"""

__all__: list[str] = []
