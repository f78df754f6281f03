"""Hybrid linear-attention models: request rows with a state slot, and a full-attention KV pool.

Mirrors SGLang 0.5.23's ``HybridReqToTokenPool`` and ``HybridLinearKVPool``
(``sglang.srt.mem_cache.memory_pool``):

* :class:`HybridReqToTokenPool` is a :class:`~mem_cache_pool.ReqToTokenPool` whose requests also
  own a Mamba state slot of its :class:`~mem_cache_pool.mamba.MambaPool` (``mamba_pool``), handed
  out by ``mamba_allocator``; ``req_index_to_mamba_index_mapping[row]`` is the slot of the
  request in ``row`` (what the attention backends read). With ``enable_mamba_extra_buffer`` each
  request also holds ping-pong *track* slots, where the radix cache checkpoints states.
* :class:`HybridLinearKVPool` holds KV only for the full-attention layers (an MHA or MLA pool of
  ``len(full_attention_layer_ids)`` layers) and maps global layer ids onto it; the Mamba states
  ride along in ``get_cpu_copy`` / ``load_cpu_copy`` (retraction) through ``mamba_pool``.

A request is any object with ``req.kv.req_pool_idx`` and ``req.kv.mamba_pool_idx`` (SGLang
0.5.23's ``ReqKvInfo``; also ``mamba_needs_clear`` and, with the extra buffer, the ping-pong
fields), or one carrying those attributes itself (older SGLang). ``mamba_pool_idx`` is a 0-d
int64 tensor (SGLang's convention), ``None`` when the request holds no state.

Unlike SGLang (which asserts after taking the rows), ``alloc`` checks row *and* state-slot
availability first and returns ``None`` with no state change when either is short.
Out of scope: the Qwen4-Exp PLE side states (``short_conv_layer_ids``, ``ngram_context_len``),
the int8 checkpoint pool and the ReplaySSM rings (``NotImplementedError`` when requested).
"""

from __future__ import annotations

from mem_cache_pool._hybrid_linear_kv import HybridLinearKVPool
from mem_cache_pool._hybrid_requests import HybridReqToTokenPool

__all__ = ["HybridLinearKVPool", "HybridReqToTokenPool"]
