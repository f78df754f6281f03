"""SGLang's own radix cache over our hybrid pools: ``UnifiedRadixCache`` with its Mamba component.

SGLang 0.5.23's wheel ships no mamba pool unit tests (no ``test_mamba_unittest.py``), but it ships
the fixture kit of its unified radix-cache suite (``sglang.test.kits.unified_radix_cache``), which
builds ``HybridReqToTokenPool`` + ``HybridLinearKVPool`` for its Mamba configurations and drives
SGLang's real ``UnifiedRadixCache`` (whose ``MambaComponent`` allocates, copies and frees state
slots through the pools) with SGLang's real ``Req`` objects.

Here the kit runs twice per configuration from the same seeded stream: once on SGLang's classes,
once with SGLang's imports of ``HybridReqToTokenPool`` / ``HybridLinearKVPool`` / ``MambaPool``
rewritten to ours (module attributes, restored afterwards; their function-local ``from
memory_pool import ...`` resolve through them). The two runs must agree on every insert and match
result, on the slots the requests and the tree hold, on the free state slots and on every state
byte.
"""

from __future__ import annotations

import random
import sys
import types
from array import array
from collections.abc import Callable
from typing import Any

import pytest
import torch

import mem_cache_pool as ours

_MODULES = (
    "sglang.test.kits.unified_radix_cache.fixtures",
    "sglang.test.kits.unified_radix_cache.config",
    "sglang.test.kits.unified_radix_cache.mixins",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.base_prefix_cache",
)
_NAMES = ("HybridReqToTokenPool", "HybridLinearKVPool", "MambaPool")


@pytest.fixture(scope="module")
def kit(sglang_load: Callable[..., list[types.ModuleType]]) -> tuple[types.ModuleType, ...]:
    return tuple(sglang_load(*_MODULES))


def _rewrite(mp: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Point every loaded SGLang module's binding of the three classes at ours."""
    swap = {id(getattr(mp, n)): getattr(ours, n) for n in _NAMES}
    done = []
    for name, mod in list(sys.modules.items()):
        if not name.startswith("sglang.") or mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            if id(value) in swap:
                monkeypatch.setattr(mod, attr, swap[id(value)])
                done.append(f"{name}.{attr}")
    return done


def _configs(cfgm: types.ModuleType) -> list[Any]:
    return [c for c in cfgm.CONFIGS if c.has_mamba and not c.has_swa]


def _state_bytes(rtp: Any) -> list[torch.Tensor]:
    cache = rtp.mamba_pool.mamba_cache
    return [t.view(torch.uint8).clone() for t in [*cache.conv, cache.temporal]]


def _scenario(kit: tuple[types.ModuleType, ...], cfg: Any, seed: int) -> list[Any]:
    """A seeded stream on the radix cache: requests take rows and state slots, write states,
    insert their sequences (sharing prefixes), match, finish (freeing their state slots), evict.
    Returns everything observable, step by step."""
    fx, _, mx, _, bpc = kit
    fx.get_device = lambda: "cpu"
    cache, allocator, rtp = fx.build_fixture(cfg)
    suite = type("Suite", (mx.UnifiedRadixCacheFixtures,), {})()
    suite.cfg = cfg
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    ps = cfg.page_size
    log: list[Any] = [("pool", type(rtp).__module__, type(cache.req_to_token_pool).__module__)]
    history: list[list[int]] = []
    stems = [suite._make_seq(1000 * i, 1) for i in range(3)]
    for step in range(12):
        if history and step % 3 == 2:  # a sequence the tree has seen: its checkpoint exists
            tokens = rng.choice(history)
        else:
            stem = rng.choice(stems)
            tail = [100_000 + step * 64 + k for k in range(ps * rng.randint(1, 2))]
            tokens = stem + tail
            history.append(tokens)
        req = suite._make_req(rtp)
        slot = int(req.kv.mamba_pool_idx)
        for t in [*rtp.mamba_pool.mamba_cache.conv, rtp.mamba_pool.mamba_cache.temporal]:
            t[:, slot] = torch.randn(t[:, slot].shape, generator=gen).to(t.dtype)
        match = fx.match_prefix(cache, tokens)
        value = suite._alloc(allocator, len(tokens))
        key = fx.RadixKey(array("q", tokens))
        params = bpc.InsertParams(key=key, value=value[: len(key)])
        # the tree checkpoints a fork of the request's state (copy-on-write into a fresh slot)
        fork = rtp.mamba_allocator.alloc(1)
        rtp.copy_mamba_state(req.kv.mamba_pool_idx.unsqueeze(0), fork)
        params.mamba_value = fork
        result = cache.insert(params)
        log.append(("step", step, match.device_prefix_len, result.prefix_len, result.mamba_exist))
        if result.prefix_len:  # KV the tree already held
            allocator.free(value[: result.prefix_len])
        if result.mamba_exist:  # the tree kept its own checkpoint
            rtp.mamba_allocator.free(fork)
        rtp.free_mamba_cache(req)
        rtp.free(req)
        log.append(("free", rtp.available_size(), rtp.mamba_allocator.available_size()))
        if step % 4 == 3:
            evicted = cache.evict(bpc.EvictParams(num_tokens=ps, mamba_num=1))
            log.append(("evict", type(evicted).__name__, rtp.mamba_allocator.available_size()))
        again = fx.match_prefix(cache, tokens)
        log.append(("rematch", again.device_prefix_len))
    log.append(("slots", rtp.mamba_allocator.free_slots.tolist()))
    log.append(("states", _state_bytes(rtp)))
    return log


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a[1:], b[1:]):
        if x[0] == "states":
            assert all(torch.equal(s, t) for s, t in zip(x[1], y[1]))
        else:
            assert x == y


@pytest.mark.parametrize("index", [0, 1])
def test_sglang_radix_cache_runs_the_same_on_our_pools(
    kit: tuple[types.ModuleType, ...], monkeypatch: pytest.MonkeyPatch, index: int
) -> None:
    cfgs = _configs(kit[1])
    assert len(cfgs) >= 2, [c.label for c in kit[1].CONFIGS]
    cfg = cfgs[index]
    want = _scenario(kit, cfg, seed=index)
    with monkeypatch.context() as mp:
        rewritten = _rewrite(kit[3], mp)
        assert "sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool" in rewritten
        got = _scenario(kit, cfg, seed=index)
    assert want[0][1] == "sglang.srt.mem_cache.memory_pool"
    assert got[0][1:] == ("mem_cache_pool._hybrid_requests", "mem_cache_pool._hybrid_requests")
    _same(want, got)
    steps = [x for x in want if x[0] == "step"]
    assert any(x[4] for x in steps) and any(not x[4] for x in steps)  # both insert outcomes
    assert any(x[3] for x in steps)  # shared prefixes matched
