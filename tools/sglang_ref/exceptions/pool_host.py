"""Members of SGLang's pool_host classes that mem_cache_pool_host deliberately does not mirror.

Key: (our class name, SGLang member name); reason: which SGLang feature it serves and why it is
out of scope here. Reviewed like code.
"""

from __future__ import annotations

EXCEPTIONS: dict[tuple[str, str], str] = {
}
