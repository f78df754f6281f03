"""SGLang-in-the-loop: SGLang 0.5.23's RadixCache and scheduler memory paths over our memory layer.

One seeded multi-turn workload (chat sessions sharing system prompts, chunked prefill published
with ``checkpoint_kv_cache``, eviction under pressure, decode-capacity checks with retraction to
CPU and re-admission, finishes through ``release_kv_cache``, free groups) is driven through
SGLang's own code (``tools/sglang_ref/loop_engine.py`` lists every call): ``RadixCache``,
``common.match_kv_cache`` / ``checkpoint_kv_cache`` / ``release_kv_cache``,
``allocation.alloc_for_extend`` / ``alloc_for_decode``, ``ScheduleBatch.check_decode_mem``, the
allocator's ``create_prefill_budget`` for admission, ``get_cpu_copy`` / ``load_cpu_copy`` with
``req_pool_index=`` for retraction.

It runs twice per case: over SGLang's own ``ReqToTokenPool``, KV pool and allocator, and over
ours (``mem_cache_pool.ReqToTokenPool``, ``MHATokenToKVPool`` or ``MLATokenToKVPool``, our
``TokenToKVPoolAllocator`` / ``PagedTokenToKVPoolAllocator``), and asserts the two traces
(matches, slots, evictions, admission answers, checkpoints, finishes, sizes after every step)
are identical. K/V bytes are checked at every prefix hit, every later chunk and every restore:
every token's K/V is written through the pool's ``set_kv_buffer(layer, ...)`` (MLA decode:
``set_mla_kv_buffer(layer, ...)``) with a value determined by its token prefix and read back
through ``get_key_buffer`` / ``get_value_buffer``, so a cached slot must hold exactly the value
of the prefix it is matched for.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import pytest

from tools.sglang_ref.loop_engine import Engine, run_workload
from tools.sglang_ref.radix_loop import build_side, load_modules

STEPS = 150


@pytest.fixture(scope="module")
def sgl(sglang_load: Callable[..., list[types.ModuleType]]) -> types.SimpleNamespace:
    return load_modules(sglang_load)


def _engine(sgl: types.SimpleNamespace, kind: str, ps: int, need_sort: bool,
            ours: bool) -> Engine:
    size = 12 * max(ps, 8)
    side = build_side(sgl, ours=ours, kind=kind, page_size=ps, size=size, need_sort=need_sort)
    return Engine(sgl, side, ps, kind)


_CASES = [(k, ps, s) for k in ("mha", "mla") for ps in (1, 16, 64) for s in (False, True)]
_IDS = [f"{k}-ps{p}-sort{int(s)}" for k, p, s in _CASES]


@pytest.mark.parametrize(("kind", "ps", "need_sort"), _CASES, ids=_IDS)
def test_radix_loop_same_trace_as_sglang(
    sgl: types.SimpleNamespace, kind: str, ps: int, need_sort: bool
) -> None:
    theirs = _engine(sgl, kind, ps, need_sort, ours=False)
    ours = _engine(sgl, kind, ps, need_sort, ours=True)
    assert type(ours.rtp).__module__ == "mem_cache_pool.req_to_token"
    assert type(ours.kv).__module__ == f"mem_cache_pool.{kind}"
    assert type(theirs.kv).__module__ == "sglang.srt.mem_cache.memory_pool"
    seed = ps * 10 + need_sort + (kind == "mla") * 7
    steps = run_workload(theirs, seed=seed, steps=STEPS)
    run_workload(ours, seed=seed, steps=STEPS)
    kinds = {k[0] for k in theirs.trace}
    for want in ("match", "extend", "checkpoint", "decode", "finish", "check_decode", "evict"):
        assert want in kinds, f"the workload never ran {want}"
    assert any(k[0] == "match" and k[2] > 0 for k in theirs.trace), "no prefix hit"
    assert theirs.trace == ours.trace
    assert theirs.kv_checks == ours.kv_checks and ours.kv_checks > 0
    assert theirs.evicted == ours.evicted and ours.evicted > 0, "no eviction under pressure"
    print(
        f"{kind} ps={ps} need_sort={need_sort}: steps={steps} events={len(ours.trace)} "
        f"kv_checks={ours.kv_checks} evicted_tokens={ours.evicted} "
        f"retractions={sum(k[0] == 'retract' for k in ours.trace)} "
        f"restores={sum(k[0] == 'restore' for k in ours.trace)} identical=True"
    )


def test_radix_loop_covers_retraction(sgl: types.SimpleNamespace) -> None:
    """Paged and unpaged, MHA and MLA cases above retract and restore (the seeds are fixed: this
    pins that the retraction path is in the comparison)."""
    for kind, ps, sort in (("mha", 1, False), ("mha", 16, True), ("mla", 1, True)):
        e = _engine(sgl, kind, ps, sort, ours=True)
        run_workload(e, seed=ps * 10 + sort + (kind == "mla") * 7, steps=STEPS)
        assert any(k[0] == "restore" for k in e.trace), (kind, ps, sort)
