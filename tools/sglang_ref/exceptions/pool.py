"""Members of SGLang's pool classes that mem_cache_pool deliberately does not mirror.

Key: (our class name, SGLang member name); reason: which SGLang feature it serves and why it is
out of scope here. Reviewed like code.
"""

from __future__ import annotations

_HOST_POOL_DECLS = (
    "SGLang's host_pool_decls() returns HiCache's pool_host declaration objects "
    "(make_kv_pool_decl from sglang.srt.mem_cache.pool_host); mem_cache_pool may not import "
    "mem_cache_pool_host (layering rule), and our host pools are built from the device pool's"
    " get_buffer_desc() instead"
)
_INDEX_KEY_CACHE = (
    "SGLang 0.5.23 keeps DSA index keys behind an IndexKeyCache facade object; ours holds the"
    " same buffers directly (index_k_with_scale_buffer) and exposes every operation the "
    "facade serves as a pool method (get/set_index_k_scale_buffer, "
    "get_index_k_with_scale_buffer, get_state_buf_infos, move_kv_cache, CPU copies), so there"
    " is no facade object"
)

EXCEPTIONS: dict[tuple[str, str], str] = {
    ("KVCache", "host_pool_decls"): _HOST_POOL_DECLS,
    ("MHATokenToKVPool", "host_pool_decls"): _HOST_POOL_DECLS,
    ("MLATokenToKVPool", "host_pool_decls"): _HOST_POOL_DECLS,
    ("BaseSWAKVPool", "host_pool_decls"): _HOST_POOL_DECLS,
    ("SWAKVPool", "host_pool_decls"): _HOST_POOL_DECLS,
    ("DSATokenToKVPool", "host_pool_decls"): _HOST_POOL_DECLS,
    ("HiSparseDSATokenToKVPool", "host_pool_decls"): _HOST_POOL_DECLS,
    ("DeepSeekV4TokenToKVPool", "host_pool_decls"): _HOST_POOL_DECLS,
    ("DSATokenToKVPool", "index_key_cache"): _INDEX_KEY_CACHE,
    ("HiSparseDSATokenToKVPool", "index_key_cache"): _INDEX_KEY_CACHE,
}
