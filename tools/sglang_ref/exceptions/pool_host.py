"""Members of SGLang's pool_host classes that mem_cache_pool_host deliberately does not mirror.

Key: (our class name, SGLang member name); reason: which SGLang feature it serves and why it is
out of scope here. Reviewed like code.
"""

from __future__ import annotations

EXCEPTIONS: dict[tuple[str, str], str] = {
    ("HostKVCache", "__init__"): (
        "SGLang's abstract base takes only keyword geometry its subclasses prepared from their "
        "buffer-info record; ours reads the geometry from the device pool's KVBufferDesc, so it "
        "needs buffer_info (the device pool or its descriptor) first. It accepts every SGLang "
        "keyword (checked against the descriptor), and the concrete pools take SGLang's "
        "positional signature."
    ),
}
