"""The radix-loop driver: SGLang 0.5.23's own radix cache and scheduler memory paths, run over a
token allocator, a ``ReqToTokenPool`` and a KV pool (SGLang's or ours) without SGLang's server.

SGLang's ``Req`` and ``ScheduleBatch`` are not built (their constructors need a tokenizer and a
model config): :class:`Req` and :class:`Batch` carry the attributes SGLang's
``RadixCache`` (match / insert / lock / evict / ``free_kv_row``), ``allocation.alloc_for_extend``
/ ``alloc_for_decode``, ``ScheduleBatch.check_decode_mem`` and ``common.release_kv_cache`` read,
and the request's KV record is SGLang's own ``ReqKvInfo``. :class:`RadixLoop` is one engine:
SGLang's ``RadixCache`` over the given allocator and request table, and the batches and prefix
matches a scheduler step hands SGLang's functions; with a sliding window the tree is SGLang's
``UnifiedRadixCache`` with its FULL and SWA components, as SGLang's scheduler builds it for a
hybrid-SWA model. :func:`build_side` builds one side's allocator, request table and KV pool
(SGLang's classes or ours, same arguments). The calls themselves (``alloc_for_extend`` and the
rest) stay with the caller, who times or traces them: :mod:`tools.sglang_ref.loop_engine` traces
them (the SGLang-in-the-loop tests), :mod:`tools.bench.sglang_step` times them.
"""

from __future__ import annotations

import contextlib
import sys
import types
import warnings
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["KINDS", "MODULES", "SWA_MODULES", "Batch", "RadixLoop", "Req", "Side", "build_side",
           "load_modules", "our_classes_bound"]

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
    "sglang.srt.runtime_context",
)
#: the further modules a sliding-window loop runs (:func:`load_modules` with ``swa=True``)
SWA_MODULES = (
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.unified_cache.component_type",
    "sglang.srt.mem_cache.swa_memory_pool",
    "sglang.srt.mem_cache.allocator.swa",
)


def load_modules(load: Callable[..., list[types.ModuleType]] | None = None, *,
                 swa: bool = False) -> types.SimpleNamespace:
    """SGLang's modules of :data:`MODULES` as ``mp, alloc, radix, cip, bpc, allocation, common,
    sched, rc``, loaded with ``load`` (default :func:`tools.sglang_ref.load`; a test passes its
    fixture, which fails instead of raising); with ``swa`` also :data:`SWA_MODULES` as ``urc,
    ct, swa_pool, swa_alloc``.

    SGLang's runtime context is published by its server from the server args; nothing publishes
    it here. The stand-ins set are what a CPU server with default arguments reads: the
    torch_native attention backend (the row writes are SGLang's non-Triton paths), no
    speculative decoding, no thinking-strip.
    """
    from tools.sglang_ref import load as load_wheel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SGLang's import-time "only CUDA supports X" notes
        mods = (load or load_wheel)(*MODULES, *(SWA_MODULES if swa else ()))
    mp, alloc, radix, cip, bpc, allocation, common, sched, rc = mods[: len(MODULES)]
    vars(allocation).update(attention_backends=lambda: ("torch_native", "torch_native"))
    vars(common).update(
        get_spec=lambda: types.SimpleNamespace(speculative_algorithm=None),
        get_serving=lambda: types.SimpleNamespace(strip_thinking_cache=False),
    )
    out = types.SimpleNamespace(mp=mp, alloc=alloc, radix=radix, cip=cip, bpc=bpc,
                                allocation=allocation, common=common, sched=sched, rc=rc)
    if swa:
        out.urc, out.ct, out.swa_pool, out.swa_alloc = mods[len(MODULES):]
    return out


@dataclass(frozen=True)
class Side:
    """One side's memory layer, as SGLang's scheduler builds it and hands it to the tree."""

    allocator: Any
    req_to_token_pool: Any
    kv_pool: Any
    write_loc: Any  # the side's KVWriteLoc class (what an attention backend hands set_kv_buffer)


#: the KV pool families :func:`build_side` builds
KINDS = ("mha", "mla", "swa")


def build_side(sgl: types.SimpleNamespace, *, ours: bool, kind: str = "mha", page_size: int,
               size: int, need_sort: bool = False, rows: int = 8, context: int | None = None,
               dtype: torch.dtype = torch.float32, head_dim: int = 2,
               size_swa: int | None = None) -> Side:
    """The allocator, ``ReqToTokenPool`` and KV pool of one side: SGLang 0.5.23's classes
    (``ours=False``) or ours (``ours=True``), built with the same arguments.

    ``kind``: ``"mha"`` (``MHATokenToKVPool``, one layer, one head of ``head_dim``), ``"mla"``
    (``MLATokenToKVPool``, one layer, ``kv_lora_rank = head_dim``, ``qk_rope_head_dim =
    head_dim``) or ``"swa"`` (``SWAKVPool`` of two MHA layers, layer 0 full and layer 1
    sliding-window, under ``SWATokenToKVPoolAllocator``; ``size_swa`` window slots, default
    ``size``). The token allocator is ``TokenToKVPoolAllocator`` for page size 1 and
    ``PagedTokenToKVPoolAllocator`` otherwise. The table has ``rows`` rows of ``context``
    columns (default ``size + 2 * page_size``).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    ps = page_size
    ctx = size + 2 * ps if context is None else context
    if ours:
        import mem_cache_allocator as oa
        import mem_cache_pool as op

        rtp: Any = op.ReqToTokenPool(rows, ctx, "cpu")
        pools: Any = op
        allocs: Any = oa
        wl: Any = op.KVWriteLoc
    else:
        rtp = sgl.mp.ReqToTokenPool(size=rows, max_context_len=ctx, device="cpu",
                                    enable_memory_saver=False)
        wl = sgl.mp.KVWriteLoc
        pools = types.SimpleNamespace(
            MHATokenToKVPool=sgl.mp.MHATokenToKVPool, MLATokenToKVPool=sgl.mp.MLATokenToKVPool,
            SWAKVPool=sgl.swa_pool.SWAKVPool if kind == "swa" else None)
        allocs = types.SimpleNamespace(
            TokenToKVPoolAllocator=sgl.alloc.TokenToKVPoolAllocator,
            PagedTokenToKVPoolAllocator=sgl.alloc.PagedTokenToKVPoolAllocator,
            SWATokenToKVPoolAllocator=sgl.swa_alloc.SWATokenToKVPoolAllocator
            if kind == "swa" else None)
    kv: Any
    allocator: Any
    if kind == "swa":
        swa = size if size_swa is None else size_swa
        kv = pools.SWAKVPool(size, swa, ps, dtype, 1, head_dim, [1], [0], "cpu")
        allocator = allocs.SWATokenToKVPoolAllocator(size, swa, ps, dtype, "cpu", kv, need_sort)
        return Side(allocator, rtp, kv, wl)
    if kind == "mha":
        kv = pools.MHATokenToKVPool(size, ps, dtype, 1, head_dim, 1, "cpu", False)
    else:
        kv = pools.MLATokenToKVPool(size, ps, dtype, head_dim, head_dim, 1, "cpu", False)
    if ps == 1:
        allocator = allocs.TokenToKVPoolAllocator(size, dtype, "cpu", kv, need_sort)
    else:
        allocator = allocs.PagedTokenToKVPoolAllocator(size, ps, dtype, "cpu", kv, need_sort)
    return Side(allocator, rtp, kv, wl)


#: (SGLang module, class name, our module) of the classes SGLang's callers test with
#: ``isinstance`` on the memory paths the loops run
_BOUND = (
    ("sglang.srt.mem_cache.allocator.swa", "SWATokenToKVPoolAllocator", "mem_cache_allocator"),
    ("sglang.srt.mem_cache.swa_memory_pool", "SWAKVPool", "mem_cache_pool"),
    ("sglang.srt.mem_cache.memory_pool", "MHATokenToKVPool", "mem_cache_pool"),
    ("sglang.srt.mem_cache.memory_pool", "MLATokenToKVPool", "mem_cache_pool"),
)


@contextlib.contextmanager
def our_classes_bound() -> Iterator[list[str]]:
    """While active, every loaded SGLang module's binding of the classes in :data:`_BOUND`
    (module attributes, which SGLang's function-local ``from ... import`` read too) names
    ours: what an engine that swaps SGLang's ``mem_cache`` imports for ours runs (SGLang's
    ``SWAComponent`` asserts ``isinstance(allocator, SWATokenToKVPoolAllocator)``). Yields the
    bindings rewritten; restores them on exit."""
    import importlib

    swap: dict[int, Any] = {}
    for mod_name, cls_name, ours in _BOUND:
        mod = sys.modules.get(mod_name)
        if mod is not None and hasattr(mod, cls_name):
            swap[id(getattr(mod, cls_name))] = getattr(importlib.import_module(ours), cls_name)
    saved: list[tuple[types.ModuleType, str, Any]] = []
    for name, mod in list(sys.modules.items()):
        if not name.startswith("sglang.") or mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            if id(value) in swap:
                saved.append((mod, attr, value))
                setattr(mod, attr, swap[id(value)])
    try:
        yield [f"{m.__name__}.{a}" for m, a, _ in saved]
    finally:
        for mod, attr, value in reversed(saved):
            setattr(mod, attr, value)


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
    session_id: Any = None
    skip_radix_cache_insert: bool = False
    finished_len: Any = None
    kv_rotation_base: Any = None
    extend_end: int = 0  # this round extends fill ids [prefix_len, extend_end)
    decode_batch_idx: int = 0  # decode steps run since admission (SGLang's SWA cadence)

    @property
    def fill_ids(self) -> list[int]:
        """The whole sequence (a new list)."""
        return self.origin_input_ids + self.output_ids

    @property
    def full_untruncated_fill_ids(self) -> list[int]:
        return self.fill_ids

    def get_fill_ids(self) -> list[int]:
        """The sequence up to this round's ``extend_end`` (SGLang's)."""
        return self.fill_ids[: self.extend_end]

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

    def _compute_max_prefix_len(self, input_len: int) -> int:
        """SGLang's bound on a match: one token short of the input (no logprobs, no dLLM)."""
        return input_len - 1


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
    forward_mode: Any = None  # SGLang's ForwardMode, set by the batch builders
    forward_iter: int = 0
    enable_overlap: bool = False
    model_config: Any = field(
        default_factory=lambda: types.SimpleNamespace(is_encoder_decoder=False)
    )

    @property
    def spec_algorithm(self) -> Any:
        return self.spec

    def is_dllm(self) -> bool:
        return False


class RadixLoop:
    """One engine: SGLang's ``RadixCache`` over ``allocator`` and ``req_to_token_pool`` (with a
    ``window``: SGLang's ``UnifiedRadixCache`` with FULL and SWA components, that sliding
    window), and the batches and prefix matches a scheduler step hands SGLang's functions.

    The unified tree runs SGLang's Python tree core (``tree_core_backend="python"``, the one its
    own unified-radix-cache unit suite runs): SGLang's default, a Rust extension built for one
    CPython version, would make the run depend on the interpreter."""

    def __init__(self, sgl: types.SimpleNamespace, allocator: Any, req_to_token_pool: Any,
                 page_size: int, window: int | None = None) -> None:
        self.sgl, self.allocator, self.rtp, self.ps = sgl, allocator, req_to_token_pool, page_size
        if window is None:
            self.tree = sgl.radix.RadixCache(sgl.cip.CacheInitParams(
                disable=False, req_to_token_pool=req_to_token_pool,
                token_to_kv_pool_allocator=allocator, page_size=page_size))
        else:
            full, swa = sgl.ct.ComponentType.FULL, sgl.ct.ComponentType.SWA
            self.tree = sgl.urc.UnifiedRadixCache(params=sgl.cip.CacheInitParams(
                disable=False, req_to_token_pool=req_to_token_pool,
                token_to_kv_pool_allocator=allocator, page_size=page_size,
                sliding_window_size=window, tree_components=(full, swa),
                tree_core_backend="python"))
        self.spec = types.SimpleNamespace(is_none=lambda: True)
        sb = sgl.sched.ScheduleBatch
        # SGLang's own ScheduleBatch members the memory paths call on the batch
        self.batch_cls: type[Batch] = type("Batch", (Batch,), {
            name: getattr(sb, name)
            for name in ("check_decode_mem", "new_tokens_required_next_decode",
                         "maybe_evict_swa", "_evict_swa", "_swa_eviction_trigger")
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
        b.forward_mode = self.sgl.sched.ForwardMode.EXTEND
        b.prefix_lens = prefix_lens
        b.extend_lens = [e - p for e, p in zip(ends, prefix_lens, strict=True)]
        b.extend_num_tokens = sum(b.extend_lens)
        b.seq_lens_cpu = torch.tensor(ends, dtype=torch.int64)
        b.seq_lens = b.seq_lens_cpu.clone()
        return b

    def decode_batch(self, reqs: Sequence[Any], seq_lens: list[int]) -> Batch:
        """The decode batch for ``alloc_for_decode`` / ``check_decode_mem``."""
        b = self.batch(reqs)
        b.forward_mode = self.sgl.sched.ForwardMode.DECODE
        b.seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int64)
        b.seq_lens = b.seq_lens_cpu.clone()
        b.req_pool_indices_cpu = torch.tensor([r.kv.req_pool_idx for r in reqs],
                                              dtype=torch.int64)
        b.req_pool_indices = b.req_pool_indices_cpu.clone()
        return b

    def key(self, tokens: Sequence[int]) -> Any:
        """SGLang's ``RadixKey`` of ``tokens``."""
        return self.sgl.radix.RadixKey(array("q", tokens))

    def match(self, req: Any, key: Any = None) -> None:
        """Match ``key`` in the tree and lock the match, as the scheduler admits ``req``: the
        tree owns the matched part (``cache_protected_len``). Without ``key``: SGLang's own
        ``common.match_kv_cache`` on the request's sequence (as ``Req.init_next_round_input``
        calls it: at most one token short of the sequence), then the lock the ``PrefillAdder``
        takes."""
        if key is None:
            m = self.sgl.common.match_kv_cache(
                req, self.tree, req.origin_input_ids + req.output_ids,
                max_prefix_len=req._compute_max_prefix_len(req.seqlen))
            if m.cache_protected_len is None:
                req.kv.cache_protected_len = req.prefix_len
        else:
            m = self.tree.match_prefix(self.sgl.bpc.MatchPrefixParams(key=key))
            req.prefix_len, req.last_node = m.device_prefix_len, m.last_device_node
            req.kv.cache_protected_len = req.prefix_len
        req.lock = self.tree.lock(req.last_node)
