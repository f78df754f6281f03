"""SGLang-in-the-loop: SGLang 0.5.23's sliding-window radix cache over our SWA allocator and pool.

SGLang 0.5.23 caches a hybrid-SWA model's prefixes in ``UnifiedRadixCache`` with a FULL and an
SWA component (the SWA component keeps each node's window slots and tombstones them when the
window part is evicted while the full part stays). The workload of
``tools/sglang_ref/loop_engine.py`` (sessions sharing system prompts, chunked prefill published
with ``checkpoint_kv_cache``, eviction under pressure on both pools, retraction with CPU backup,
finishes through SGLang's ``release_kv_cache``) runs over it with a sliding window: every decode
batch runs SGLang's ``ScheduleBatch.maybe_evict_swa``, whose ``free_swa_out_of_window_slots``
frees the window's tail through the allocator's ``free_swa_segment``; the SWA component's own
evictions and tombstones free through ``free_swa_segment`` too; a window-smaller-than-page case
is included.

Each case runs twice: over SGLang's ``ReqToTokenPool`` + ``SWAKVPool`` +
``SWATokenToKVPoolAllocator``, and over ours (with SGLang's module bindings of those classes
pointed at ours while it runs, as an engine that swaps its imports has them: SGLang's
``SWAComponent`` asserts ``isinstance(allocator, SWATokenToKVPoolAllocator)``). The traces must
be identical: matches, full and window slots of every allocation, every ``free_swa_segment``
call SGLang makes, evictions (full and window tokens), checkpoints, finishes, full / window
available sizes and the tree's full / window evictable and protected sizes after every step.
K/V: both layers (layer 0 full, layer 1 sliding-window) are written through
``set_kv_buffer(layer, KVWriteLoc(loc, swa_loc), ...)`` as SGLang's attention backends write
them, and read back at every prefix hit (the window layer through the full->window mapping,
which must cover the last ``window`` positions).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable

import pytest

from tools.sglang_ref.loop_engine import Engine, run_workload
from tools.sglang_ref.radix_loop import build_side, load_modules, our_classes_bound

STEPS = 150


@pytest.fixture(scope="module")
def sgl(sglang_load: Callable[..., list[types.ModuleType]]) -> types.SimpleNamespace:
    return load_modules(sglang_load, swa=True)


def _run(sgl: types.SimpleNamespace, ps: int, window: int, need_sort: bool,
         ours: bool) -> Engine:
    size = 12 * max(ps, 8)
    bind: contextlib.AbstractContextManager[list[str]] = (
        our_classes_bound() if ours else contextlib.nullcontext([]))
    with bind as bound:
        if ours:
            assert "sglang.srt.mem_cache.allocator.swa.SWATokenToKVPoolAllocator" in bound
        side = build_side(sgl, ours=ours, kind="swa", page_size=ps, size=size,
                          need_sort=need_sort, size_swa=size * 2 // 3)
        engine = Engine(sgl, side, ps, "swa", window=window)
        run_workload(engine, seed=ps * 10 + window + need_sort, steps=STEPS)
    return engine


# (page size, sliding window, need_sort)
_CASES = [(1, 8, False), (1, 8, True), (4, 8, False), (4, 2, True), (16, 16, False),
          (16, 4, True), (64, 64, False), (64, 64, True)]
_IDS = [f"ps{p}-w{w}-sort{int(s)}" for p, w, s in _CASES]
#: the cases whose seed retracts (CPU backup, release, re-admission, restore)
_RETRACTING = {(1, 8, False), (1, 8, True), (4, 8, False)}


@pytest.mark.parametrize(("ps", "window", "need_sort"), _CASES, ids=_IDS)
def test_swa_radix_loop_same_trace_as_sglang(
    sgl: types.SimpleNamespace, ps: int, window: int, need_sort: bool
) -> None:
    theirs = _run(sgl, ps, window, need_sort, ours=False)
    ours = _run(sgl, ps, window, need_sort, ours=True)
    assert type(ours.allocator).__module__ == "mem_cache_allocator.swa"
    assert type(ours.kv).__module__ == "mem_cache_pool.swa"
    assert type(ours.rtp).__module__ == "mem_cache_pool.req_to_token"
    assert type(theirs.allocator).__module__ == "sglang.srt.mem_cache.allocator.swa"
    kinds = {k[0] for k in theirs.trace}
    for want in ("match", "extend", "checkpoint", "decode", "finish", "evict", "free_swa"):
        assert want in kinds, f"the workload never ran {want}"
    evicts = [k for k in theirs.trace if k[0] == "evict"]
    # window tokens evicted beyond the full ones: the SWA component tombstoned nodes
    assert any((k[4] or 0) > k[3] for k in evicts), "no SWA tombstone"
    assert any(k[0] == "match" and k[2] > 0 for k in theirs.trace), "no prefix hit"
    if (ps, window, need_sort) in _RETRACTING:
        assert "restore" in kinds, "the seed no longer retracts"
    assert theirs.trace == ours.trace
    assert theirs.kv_checks == ours.kv_checks and ours.kv_checks > 0
    assert theirs.swa_freed == ours.swa_freed and ours.swa_freed > 0
    print(
        f"swa ps={ps} window={window} need_sort={need_sort}: steps={STEPS} "
        f"events={len(ours.trace)} kv_checks={ours.kv_checks} evicted_tokens={ours.evicted} "
        f"swa_segment_frees={sum(k[0] == 'free_swa' for k in ours.trace)} "
        f"swa_freed_tokens={ours.swa_freed} "
        f"tombstoning_evictions={sum((k[4] or 0) > k[3] for k in evicts)} "
        f"retractions={sum(k[0] == 'retract' for k in ours.trace)} identical=True"
    )
