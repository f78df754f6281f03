"""mem_cache_allocator."""

__all__: list[str] = []
