"""mem_cache_pool."""

__all__: list[str] = []
