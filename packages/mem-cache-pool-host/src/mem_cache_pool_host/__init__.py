"""mem_cache_pool_host."""

__all__: list[str] = []
