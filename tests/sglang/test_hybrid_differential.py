"""Differential: our MambaPool / HybridReqToTokenPool / HybridLinearKVPool against SGLang 0.5.23's.

SGLang's real classes, loaded from its wheel, run on the CPU next to ours. A seeded stream of
request allocations (fresh and continuing), frees (state slot and row), state writes,
copy-on-write copies, slot clears and retraction round trips (``get_cpu_copy`` /
``load_cpu_copy``, KV and states) drives both; after every step the rows, the state slots of every
request, the row -> slot mappings, the free counts and every state and KV byte must be equal.

The wheel does not ship SGLang's ``test_mamba_unittest.py`` (``find`` over the unpacked wheel
finds no mamba test), so these differentials stand in for it; ``test_hybrid_sglang_scenarios``
replays its scenarios (pool construction, alloc/free, copy, layer caches) by hand.
"""

from __future__ import annotations

import random
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import mem_cache_pool as ours

LAYERS = [0, 1, 3, 4, 6]  # Mamba layers; 2 and 5 are full attention
FULL = [2, 5]


@dataclass
class _Kv:
    """The fields of SGLang 0.5.23's ``ReqKvInfo`` that the hybrid pools read and write."""

    req_pool_idx: int | None = None
    kv_allocated_len: int = 0
    mamba_pool_idx: torch.Tensor | None = None
    mamba_ping_pong_track_buffer: torch.Tensor | None = None
    mamba_ping_pong_empty: list[bool] | None = None
    mamba_next_track_idx: int | None = None
    mamba_last_track_idx: int | None = None
    mamba_last_track_seqlen: int | None = None
    mamba_prev_track_seqlen: int | None = None
    mamba_cow_src_index: torch.Tensor | None = None
    mamba_needs_clear: bool = False

    @property
    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None

    @property
    def holds_mamba(self) -> bool:
        return self.mamba_pool_idx is not None


class _Req:
    def __init__(self, rid: int) -> None:
        self.rid = rid
        self.kv = _Kv()


def _params(mu: types.ModuleType | None) -> Any:
    kw = dict(
        tp_world_size=1,
        intermediate_size=16,
        n_groups=2,
        num_heads=4,
        head_dim=4,
        state_size=8,
        conv_kernel=4,
    )
    if mu is None:
        return ours.Mamba2CacheParams(shape=ours.Mamba2StateShape.create(**kw), layers=LAYERS)
    return mu.Mamba2CacheParams(shape=mu.Mamba2StateShape.create(**kw), layers=LAYERS)


@pytest.fixture(scope="module")
def sgl(sglang_load: Callable[..., list[types.ModuleType]]) -> tuple[types.ModuleType, ...]:
    return tuple(sglang_load("sglang.srt.mem_cache.memory_pool", "sglang.srt.configs.mamba_utils"))


def _pools(mod: Any, params: Any, *, extra: bool, draft: int | None = None) -> tuple[Any, Any]:
    req = mod.HybridReqToTokenPool(
        size=6,
        mamba_size=24,
        mamba_spec_state_size=6,
        max_context_len=64,
        device="cpu",
        enable_memory_saver=False,
        cache_params=params,
        mamba_layer_ids=LAYERS,
        enable_mamba_extra_buffer=extra,
        speculative_num_draft_tokens=draft,
    )
    kw: dict[str, Any] = {"enable_memory_saver": False}
    kv = mod.HybridLinearKVPool(
        size=96,
        dtype=torch.bfloat16,
        page_size=4,
        head_num=2,
        head_dim=8,
        full_attention_layer_ids=FULL,
        device="cpu",
        mamba_pool=req.mamba_pool,
        **kw,
    )
    return req, kv


def _state_tensors(pool: Any) -> list[torch.Tensor]:
    cache = pool.mamba_pool.mamba_cache
    return [*cache.conv, cache.temporal]


def _assert_same(  # noqa: PLR0917
    a: Any, b: Any, kv_a: Any, kv_b: Any, ra: list[_Req], rb: list[_Req]
) -> None:
    assert a.available_size() == b.available_size()
    assert a.mamba_allocator.available_size() == b.mamba_allocator.available_size()
    assert torch.equal(a.mamba_allocator.free_slots, b.mamba_allocator.free_slots)
    for x, y in zip(ra, rb):
        assert x.kv.req_pool_idx == y.kv.req_pool_idx
        assert (x.kv.mamba_pool_idx is None) == (y.kv.mamba_pool_idx is None)
        if x.kv.mamba_pool_idx is not None:
            assert int(x.kv.mamba_pool_idx) == int(y.kv.mamba_pool_idx)
        assert x.kv.mamba_needs_clear == y.kv.mamba_needs_clear
        px, py = x.kv.mamba_ping_pong_track_buffer, y.kv.mamba_ping_pong_track_buffer
        assert (px is None) == (py is None)
        if px is not None:
            assert torch.equal(px, py)
    assert torch.equal(a.req_index_to_mamba_index_mapping, b.req_index_to_mamba_index_mapping)
    if a.enable_mamba_extra_buffer:
        assert torch.equal(
            a.req_index_to_mamba_ping_pong_track_buffer_mapping,
            b.req_index_to_mamba_ping_pong_track_buffer_mapping,
        )
    for s, t in zip(_state_tensors(a), _state_tensors(b)):
        assert s.dtype == t.dtype and s.shape == t.shape
        assert torch.equal(s.view(torch.uint8), t.view(torch.uint8))
    for layer in FULL:
        ka, va = kv_a.get_kv_buffer(layer)
        kb, vb = kv_b.get_kv_buffer(layer)
        assert torch.equal(ka.view(torch.uint8), kb.view(torch.uint8))
        assert torch.equal(va.view(torch.uint8), vb.view(torch.uint8))


@pytest.mark.parametrize("extra", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seeded_stream_matches_sglang(
    sgl: tuple[types.ModuleType, ...], seed: int, extra: bool
) -> None:
    mp, mu = sgl
    s_req, s_kv = _pools(mp, _params(mu), extra=extra)
    o_req, o_kv = _pools(ours, _params(None), extra=extra)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    live_s: list[_Req] = []
    live_o: list[_Req] = []
    counts = dict.fromkeys(("alloc", "continue", "free", "write", "copy", "clear", "cpu", "kv"), 0)
    next_rid = 0
    for _ in range(160):
        op = rng.choice(
            ["alloc", "alloc", "continue", "free", "write", "copy", "clear", "cpu", "kv"]
        )
        if op == "alloc":
            k = rng.randint(1, 3)
            need_slots = k * (1 + (s_req.mamba_initial_tracking_slots if extra else 0))
            if k > s_req.available_size() or need_slots > s_req.mamba_allocator.available_size():
                # SGLang asserts once its rows are taken; ours returns None, changing nothing
                new_o = [_Req(next_rid + i) for i in range(k)]
                before = o_req.available_size(), o_req.mamba_allocator.available_size()
                if k <= o_req.available_size():
                    assert o_req.alloc(new_o) is None
                    assert (
                        o_req.available_size(),
                        o_req.mamba_allocator.available_size(),
                    ) == before
                continue
            new_s = [_Req(next_rid + i) for i in range(k)]
            new_o = [_Req(next_rid + i) for i in range(k)]
            next_rid += k
            got_s = s_req.alloc(new_s)
            got_o = o_req.alloc(new_o)
            assert got_s == got_o
            for r in (*new_s, *new_o):
                r.kv.kv_allocated_len = 1
            live_s += new_s
            live_o += new_o
        elif op == "continue" and live_s:
            i = rng.randrange(len(live_s))
            assert s_req.alloc([live_s[i]]) == o_req.alloc([live_o[i]])
        elif op == "free" and live_s:
            i = rng.randrange(len(live_s))
            keep = rng.choice([None, 0]) if extra else None
            rs, ro = live_s.pop(i), live_o.pop(i)
            s_req.free_mamba_cache(rs, mamba_ping_pong_track_buffer_to_keep=keep)
            o_req.free_mamba_cache(ro, mamba_ping_pong_track_buffer_to_keep=keep)
            s_req.free(rs)
            o_req.free(ro)
        elif op == "write" and live_s:
            i = rng.randrange(len(live_s))
            slot = int(live_s[i].kv.mamba_pool_idx)
            for s, t in zip(_state_tensors(s_req), _state_tensors(o_req)):
                data = torch.randn(s[:, slot].shape, generator=gen).to(s.dtype)
                s[:, slot] = data
                t[:, slot] = data
        elif op == "copy" and len(live_s) >= 2:
            i, j = rng.sample(range(len(live_s)), 2)
            src = torch.tensor([int(live_s[i].kv.mamba_pool_idx)])
            dst = torch.tensor([int(live_s[j].kv.mamba_pool_idx)])
            s_req.copy_mamba_state(src, dst)
            o_req.copy_mamba_state(src.clone(), dst.clone())
        elif op == "clear" and live_s:
            i = rng.randrange(len(live_s))
            idx = torch.tensor([int(live_s[i].kv.mamba_pool_idx)])
            s_req.mamba_pool.clear_slots(idx)
            o_req.mamba_pool.clear_slots(idx.clone())
        elif op == "kv":
            loc = torch.tensor(rng.sample(range(1, 96), 3))
            layer = types.SimpleNamespace(layer_id=rng.choice(FULL))
            k = torch.randn(3, 2, 8, generator=gen).to(torch.bfloat16)
            v = torch.randn(3, 2, 8, generator=gen).to(torch.bfloat16)
            s_kv.set_kv_buffer(layer, loc, k, v)
            o_kv.set_kv_buffer(layer, loc, k, v)
        elif op == "cpu" and len(live_s) >= 2:
            # retraction: copy out a request's states and KV, load them back into another
            i, j = rng.sample(range(len(live_s)), 2)
            src_m = torch.tensor([int(live_s[i].kv.mamba_pool_idx)])
            dst_m = torch.tensor([int(live_s[j].kv.mamba_pool_idx)])
            src_kv = torch.tensor(rng.sample(range(1, 96), 4))
            dst_kv = torch.tensor(rng.sample(range(1, 96), 4))
            cs = s_kv.get_cpu_copy(src_kv, mamba_indices=src_m)
            co = o_kv.get_cpu_copy(src_kv.clone(), mamba_indices=src_m.clone())
            for a, b in zip(cs[1][0], co[1][0]):
                assert torch.equal(a, b)
            assert torch.equal(cs[1][1], co[1][1])
            s_kv.load_cpu_copy(cs, dst_kv, mamba_indices=dst_m)
            o_kv.load_cpu_copy(co, dst_kv.clone(), mamba_indices=dst_m.clone())
        else:
            continue
        counts[op] += 1
        _assert_same(s_req, o_req, s_kv, o_kv, live_s, live_o)
    assert min(counts.values()) > 0, counts


def test_hybrid_sglang_scenarios(sgl: tuple[types.ModuleType, ...]) -> None:
    """Shapes, dtypes, layer caches, memory figures and speculative buffers equal SGLang's."""
    mp, mu = sgl
    s_req, s_kv = _pools(mp, _params(mu), extra=False, draft=3)
    o_req, o_kv = _pools(ours, _params(None), extra=False, draft=3)
    sc, oc = s_req.mamba_pool.mamba_cache, o_req.mamba_pool.mamba_cache
    assert [t.shape for t in sc.conv] == [t.shape for t in oc.conv]
    assert sc.temporal.shape == oc.temporal.shape and sc.temporal.dtype == oc.temporal.dtype
    assert sc.intermediate_ssm.shape == oc.intermediate_ssm.shape
    assert [t.shape for t in sc.intermediate_conv_window] == [
        t.shape for t in oc.intermediate_conv_window
    ]
    # SGLang's loaded module runs its CUDA-path layout (deduplicated conv windows); ours picks it
    # by device, so build ours with it explicitly to compare footprints and strides
    dedup = ours.MambaPool(
        size=24,
        spec_state_size=6,
        cache_params=_params(None),
        mamba_layer_ids=LAYERS,
        device="cpu",
        speculative_num_draft_tokens=3,
        dedup_conv_window=True,
    )
    assert s_req.mamba_pool.mem_usage == pytest.approx(dedup.mem_usage)
    assert [t.stride() for t in sc.intermediate_conv_window] == [
        t.stride() for t in dedup.mamba_cache.intermediate_conv_window
    ]
    assert dedup.mem_usage < o_req.mamba_pool.mem_usage  # the dense CPU layout is larger
    assert s_req.mamba_pool.get_kv_size_bytes() == o_req.mamba_pool.get_kv_size_bytes()
    assert s_req.mamba_map == o_req.mamba_map
    for layer in LAYERS:
        a, b = s_req.mamba2_layer_cache(layer), o_req.mamba2_layer_cache(layer)
        assert a.temporal.shape == b.temporal.shape
        assert [t.shape for t in a.conv] == [t.shape for t in b.conv]
    assert s_req.get_state_dim_per_tensor() == o_req.get_state_dim_per_tensor()
    assert s_req.get_state_slice_outer_counts() == o_req.get_state_slice_outer_counts()
    assert s_req.get_state_conv_shard_groups() == o_req.get_state_conv_shard_groups()
    assert s_kv.get_state_layer_ids() == o_kv.get_state_layer_ids()
    assert s_kv.get_kv_layer_ids() == o_kv.get_kv_layer_ids()
    assert [n for n in s_req.get_state_buf_infos()[1:]] == [
        n for n in o_req.get_state_buf_infos()[1:]
    ]
    assert s_kv.get_kv_size_bytes() == o_kv.get_kv_size_bytes()
    assert s_kv.mem_usage == pytest.approx(o_kv.mem_usage)
    assert s_kv.get_key_buffer(5).shape == o_kv.get_key_buffer(5).shape
    with pytest.raises(ValueError):
        s_kv.get_key_buffer(1)
    with pytest.raises(ValueError):
        o_kv.get_key_buffer(1)
    # our pool's params object accepted by SGLang's shapes, and SGLang's by ours
    cross = ours.MambaPool(
        size=4, spec_state_size=2, cache_params=_params(mu), mamba_layer_ids=LAYERS, device="cpu"
    )
    assert (
        cross.mamba_cache.temporal.shape
        == mp.MambaPool(
            size=4,
            spec_state_size=2,
            cache_params=_params(mu),
            mamba_layer_ids=LAYERS,
            device="cpu",
        ).mamba_cache.temporal.shape
    )
    assert _params(None).mamba_cache_per_req == _params(mu).mamba_cache_per_req
