"""The radix-loop driver: SGLang 0.5.23's own radix cache and scheduler memory paths, run over a
token allocator and a ``ReqToTokenPool`` (SGLang's or ours) without SGLang's server.

SGLang's ``Req`` and ``ScheduleBatch`` are not built (their constructors need a tokenizer and a
model config): :class:`Req` and :class:`Batch` carry the attributes SGLang's
``RadixCache`` (match / insert / lock / evict / ``free_kv_row``), ``allocation.alloc_for_extend``
/ ``alloc_for_decode``, ``ScheduleBatch.check_decode_mem`` and ``common.release_kv_cache`` read,
and the request's KV record is SGLang's own ``ReqKvInfo``. :class:`RadixLoop` is one engine:
SGLang's ``RadixCache`` over the given allocator and request table, and the batches and prefix
matches a scheduler step hands SGLang's functions. The calls themselves (``alloc_for_extend``
and the rest) stay with the caller, who times or traces them.

Used by ``tests/sglang/test_alloc_radix_loop.py`` (the same trace over SGLang's allocator and
ours) and :mod:`tools.bench.sglang_step` (the memory layer's time per scheduler step).
"""

from __future__ import annotations

import types
import warnings
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["MODULES", "Batch", "RadixLoop", "Req", "load_modules"]

#: the SGLang modules the loop runs, in the order :func:`load_modules` names them
MODULES = (
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.allocator",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.mem_cache.allocation",
    "sglang.srt.mem_cache.common",
    "sglang.srt.managers.schedule_batch",
)


def load_modules(load: Callable[..., list[types.ModuleType]] | None = None
                 ) -> types.SimpleNamespace:
    """SGLang's modules of :data:`MODULES` as ``mp, alloc, radix, cip, bpc, allocation, common,
    sched``, loaded with ``load`` (default :func:`tools.sglang_ref.load`; a test passes its
    fixture, which fails instead of raising).

    SGLang's runtime context is published by its server from the server args; nothing publishes
    it here. The stand-ins set are what a CPU server with default arguments reads: the
    torch_native attention backend (the row writes are SGLang's non-Triton paths), no
    speculative decoding, no thinking-strip.
    """
    from tools.sglang_ref import load as load_wheel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SGLang's import-time "only CUDA supports X" notes
        mp, alloc, radix, cip, bpc, allocation, common, sched = (load or load_wheel)(*MODULES)
    vars(allocation).update(attention_backends=lambda: ("torch_native", "torch_native"))
    vars(common).update(
        get_spec=lambda: types.SimpleNamespace(speculative_algorithm=None),
        get_serving=lambda: types.SimpleNamespace(strip_thinking_cache=False),
    )
    return types.SimpleNamespace(mp=mp, alloc=alloc, radix=radix, cip=cip, bpc=bpc,
                                 allocation=allocation, common=common, sched=sched)


@dataclass
class Req:
    """The attributes of SGLang's ``Req`` its memory-layer paths read; the sequence is
    ``origin_input_ids`` (the prompt) then ``output_ids`` (generated so far)."""

    rid: int
    origin_input_ids: list[int]
    kv: Any  # SGLang's ReqKvInfo
    max_new: int = 0  # output tokens the request generates
    output_ids: list[int] = field(default_factory=list)
    prefix_len: int = 0
    last_node: Any = None
    lock: Any = None
    extra_key: Any = None
    cache_salt: Any = None
    priority: Any = None
    dllm_incomplete_ids: Any = None
    beam_group: Any = None
    session: Any = None
    skip_radix_cache_insert: bool = False
    finished_len: Any = None
    kv_rotation_base: Any = None

    @property
    def fill_ids(self) -> list[int]:
        """The whole sequence (a new list)."""
        return self.origin_input_ids + self.output_ids

    @property
    def full_untruncated_fill_ids(self) -> list[int]:
        return self.fill_ids

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def drop_last_token(self) -> None:
        """Forget the sequence's last token (a retracted request recomputes it)."""
        (self.output_ids or self.origin_input_ids).pop()

    def refresh_fill_ids(self) -> None:
        pass

    def finished(self) -> bool:
        return len(self.output_ids) >= self.max_new

    def owned_kv_len(self) -> int:
        return int(self.kv.kv_committed_len)


@dataclass
class Batch:
    """The ``ScheduleBatch`` attributes ``alloc_for_extend`` / ``alloc_for_decode`` /
    ``check_decode_mem`` read; :meth:`RadixLoop.batch` binds SGLang's own ``check_decode_mem``
    and ``new_tokens_required_next_decode`` to it."""

    reqs: list[Any]
    tree_cache: Any
    req_to_token_pool: Any
    token_to_kv_pool_allocator: Any
    spec: Any
    device: str = "cpu"
    prefix_lens: list[int] = field(default_factory=list)
    extend_lens: list[int] = field(default_factory=list)
    extend_num_tokens: int = 0
    seq_lens: torch.Tensor | None = None
    seq_lens_cpu: torch.Tensor | None = None
    req_pool_indices: torch.Tensor | None = None
    req_pool_indices_cpu: torch.Tensor | None = None
    hisparse_coordinator: Any = None
    model_config: Any = field(
        default_factory=lambda: types.SimpleNamespace(is_encoder_decoder=False)
    )

    @property
    def spec_algorithm(self) -> Any:
        return self.spec

    def maybe_evict_swa(self) -> None:
        return

    def is_dllm(self) -> bool:
        return False


class RadixLoop:
    """One engine: SGLang's ``RadixCache`` over ``allocator`` and ``req_to_token_pool``, and the
    batches and prefix matches a scheduler step hands SGLang's functions."""

    def __init__(self, sgl: types.SimpleNamespace, allocator: Any, req_to_token_pool: Any,
                 page_size: int) -> None:
        self.sgl, self.allocator, self.rtp, self.ps = sgl, allocator, req_to_token_pool, page_size
        self.tree = sgl.radix.RadixCache(sgl.cip.CacheInitParams(
            disable=False, req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=allocator, page_size=page_size))
        self.spec = types.SimpleNamespace(is_none=lambda: True)
        sb = sgl.sched.ScheduleBatch
        self.batch_cls: type[Batch] = type("Batch", (Batch,), {
            "check_decode_mem": sb.check_decode_mem,
            "new_tokens_required_next_decode": sb.new_tokens_required_next_decode,
        })

    def batch(self, reqs: Sequence[Any]) -> Batch:
        """An empty batch of ``reqs`` over this engine's tree, table and allocator."""
        return self.batch_cls(reqs=list(reqs), tree_cache=self.tree,
                              req_to_token_pool=self.rtp,
                              token_to_kv_pool_allocator=self.allocator, spec=self.spec)

    def extend_batch(self, reqs: Sequence[Any], prefix_lens: list[int],
                     ends: list[int]) -> Batch:
        """The prefill batch for ``alloc_for_extend``: request ``i`` extends from
        ``prefix_lens[i]`` to ``ends[i]``."""
        b = self.batch(reqs)
        b.prefix_lens = prefix_lens
        b.extend_lens = [e - p for e, p in zip(ends, prefix_lens, strict=True)]
        b.extend_num_tokens = sum(b.extend_lens)
        b.seq_lens_cpu = torch.tensor(ends, dtype=torch.int64)
        b.seq_lens = b.seq_lens_cpu.clone()
        return b

    def decode_batch(self, reqs: Sequence[Any], seq_lens: list[int]) -> Batch:
        """The decode batch for ``alloc_for_decode`` / ``check_decode_mem``."""
        b = self.batch(reqs)
        b.seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int64)
        b.seq_lens = b.seq_lens_cpu.clone()
        b.req_pool_indices_cpu = torch.tensor([r.kv.req_pool_idx for r in reqs],
                                              dtype=torch.int64)
        b.req_pool_indices = b.req_pool_indices_cpu.clone()
        return b

    def key(self, tokens: Sequence[int]) -> Any:
        """SGLang's ``RadixKey`` of ``tokens``."""
        return self.sgl.radix.RadixKey(array("q", tokens))

    def match(self, req: Any, key: Any) -> None:
        """Match ``key`` in the tree and lock the match, as the scheduler admits ``req``: the
        tree owns the matched part (``cache_protected_len``)."""
        m = self.tree.match_prefix(self.sgl.bpc.MatchPrefixParams(key=key))
        req.prefix_len, req.last_node = m.device_prefix_len, m.last_device_node
        req.lock = self.tree.lock(req.last_node)
        req.kv.cache_protected_len = req.prefix_len
