"""mem_cache_kernels."""

__all__: list[str] = []
