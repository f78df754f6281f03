"""HybridReqToTokenPool (rows + a state slot per request) and HybridLinearKVPool (KV of the
full-attention layers only, global layer ids, states carried through retraction)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mem_cache_pool import (
    HybridLinearKVPool,
    HybridReqToTokenPool,
    Mamba2CacheParams,
    Mamba2StateShape,
    MHATokenToKVPool,
)

LAYERS = [0, 1, 3, 4]
FULL = [2, 5]


def _params() -> Mamba2CacheParams:
    shape = Mamba2StateShape.create(
        tp_world_size=1,
        intermediate_size=8,
        n_groups=1,
        num_heads=2,
        head_dim=4,
        state_size=4,
        conv_kernel=4,
    )
    return Mamba2CacheParams(shape=shape, layers=LAYERS)


def _req_pool(extra: bool = False, rows: int = 4, slots: int = 6) -> HybridReqToTokenPool:
    return HybridReqToTokenPool(
        size=rows,
        mamba_size=slots,
        mamba_spec_state_size=rows,
        max_context_len=16,
        device="cpu",
        enable_memory_saver=False,
        cache_params=_params(),
        mamba_layer_ids=LAYERS,
        enable_mamba_extra_buffer=extra,
    )


def _req() -> SimpleNamespace:
    return SimpleNamespace(
        kv=SimpleNamespace(
            req_pool_idx=None, mamba_pool_idx=None, mamba_ping_pong_track_buffer=None
        )
    )


def test_alloc_binds_a_state_slot_per_request() -> None:
    pool = _req_pool()
    reqs = [_req(), _req()]
    rows = pool.alloc(reqs)
    assert rows == [3, 4]  # rows from the tail (SGLang)
    assert [int(r.kv.mamba_pool_idx) for r in reqs] == [1, 2]  # slots from the head
    assert all(r.kv.mamba_needs_clear for r in reqs)
    assert pool.get_mamba_indices(torch.tensor([3, 4])).tolist() == [1, 2]
    assert pool.mamba_allocator.available_size() == 4
    # a continuing request keeps its row and slot
    assert pool.alloc([reqs[0]]) == [3]
    assert int(reqs[0].kv.mamba_pool_idx) == 1 and pool.mamba_allocator.available_size() == 4
    pool.free_mamba_cache(reqs[0])
    pool.free(reqs[0])
    assert reqs[0].kv.mamba_pool_idx is None and reqs[0].kv.req_pool_idx is None
    assert pool.mamba_allocator.available_size() == 5 and pool.available_size() == 3
    with pytest.raises(ValueError, match="double free"):
        pool.free_mamba_cache(reqs[0])


def test_alloc_short_of_rows_or_slots_changes_nothing() -> None:
    pool = _req_pool(rows=4, slots=2)
    reqs = [_req() for _ in range(3)]
    assert pool.alloc(reqs) is None
    assert all(r.kv.req_pool_idx is None and r.kv.mamba_pool_idx is None for r in reqs)
    assert pool.available_size() == 4 and pool.mamba_allocator.available_size() == 2
    assert not pool.req_index_to_mamba_index_mapping.any()
    small = _req_pool(rows=1, slots=6)
    assert small.alloc([_req(), _req()]) is None
    assert small.mamba_allocator.available_size() == 6


def test_extra_buffer_ping_pong_slots() -> None:
    pool = _req_pool(extra=True, rows=3, slots=9)
    r = _req()
    (row,) = pool.alloc([r])
    assert int(r.kv.mamba_pool_idx) == 1
    assert r.kv.mamba_ping_pong_track_buffer.tolist() == [2, 3]
    assert pool.req_index_to_mamba_ping_pong_track_buffer_mapping[row].tolist() == [2, 3]
    assert pool.get_mamba_ping_pong_keep_idx(r) == 1
    before = pool.req_index_to_mamba_ping_pong_track_buffer_mapping.clone()
    with pytest.raises(ValueError, match="new_slot must hold a slot, got an empty tensor"):
        pool.donate_mamba_ping_pong_slot(r, torch.tensor([], dtype=torch.int64))
    assert torch.equal(pool.req_index_to_mamba_ping_pong_track_buffer_mapping, before)
    assert r.kv.mamba_ping_pong_track_buffer.tolist() == [2, 3]
    donated = pool.donate_mamba_ping_pong_slot(r, torch.tensor([7]))
    assert donated.tolist() == [3]
    assert pool.req_index_to_mamba_ping_pong_track_buffer_mapping[row].tolist() == [2, 7]
    pool.free_mamba_cache(r, mamba_ping_pong_track_buffer_to_keep=None)
    assert r.kv.mamba_ping_pong_track_buffer is None
    # slots 1, 2, 7 back (3 was donated to the radix cache, 7 came from elsewhere)
    assert pool.mamba_allocator.free_slots.tolist()[-3:] == [1, 2, 7]


def test_copy_mamba_state_and_layer_cache() -> None:
    pool = _req_pool()
    reqs = [_req(), _req()]
    pool.alloc(reqs)
    a, b = (r.kv.mamba_pool_idx for r in reqs)
    pool.mamba2_layer_cache(3).temporal[a] = 3.0
    pool.copy_mamba_state(a.reshape(1), b.reshape(1))
    assert torch.all(pool.mamba_pool.mamba_cache.temporal[2, b] == 3.0)
    assert pool.mamba2_layer_index(4) == 3
    with pytest.raises(ValueError, match="Mamba layer"):
        pool.mamba2_layer_cache(2)
    waits: list[int] = []
    pool.register_layer_transfer_counter(SimpleNamespace(wait_until=waits.append))  # type: ignore[arg-type]
    pool.mamba2_layer_cache(3)
    assert waits == [3]


def test_clear_frees_everything() -> None:
    pool = _req_pool(extra=True, slots=12)
    pool.alloc([_req(), _req()])
    pool.clear()
    assert pool.available_size() == 4 and pool.mamba_allocator.available_size() == 12
    assert not pool.req_index_to_mamba_index_mapping.any()


def test_bad_requests() -> None:
    pool = _req_pool()
    with pytest.raises(TypeError, match="requests"):
        pool.alloc(2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="mamba_pool_idx"):
        pool.alloc([SimpleNamespace(kv=SimpleNamespace(req_pool_idx=None))])
    with pytest.raises(NotImplementedError, match="PLE"):
        HybridReqToTokenPool(
            size=2,
            mamba_size=2,
            mamba_spec_state_size=2,
            max_context_len=4,
            device="cpu",
            enable_memory_saver=False,
            cache_params=_params(),
            mamba_layer_ids=LAYERS,
            enable_mamba_extra_buffer=False,
            short_conv_layer_ids=[1],
        )


def _kv(pool: HybridReqToTokenPool) -> HybridLinearKVPool:
    return HybridLinearKVPool(
        size=32,
        dtype=torch.bfloat16,
        page_size=4,
        head_num=2,
        head_dim=8,
        full_attention_layer_ids=FULL,
        device="cpu",
        mamba_pool=pool.mamba_pool,
    )


def test_kv_pool_holds_only_full_attention_layers() -> None:
    req = _req_pool()
    kv = _kv(req)
    assert isinstance(kv.full_kv_pool, MHATokenToKVPool)
    assert kv.full_kv_pool.layer_num == 2 and kv.full_layer_nums == 2
    assert kv.full_attention_layer_id_mapping == {2: 0, 5: 1}
    k = torch.randn(3, 2, 8).to(torch.bfloat16)
    v = torch.randn(3, 2, 8).to(torch.bfloat16)
    kv.set_kv_buffer(SimpleNamespace(layer_id=5), torch.tensor([1, 4, 9]), k, v)
    assert torch.equal(kv.get_key_buffer(5)[[1, 4, 9]], k)
    assert torch.equal(kv.full_kv_pool.v_buffer[1][[1, 4, 9]], v)
    assert not kv.get_key_buffer(2).any()
    with pytest.raises(ValueError, match="full attention layers"):
        kv.get_kv_buffer(1)
    assert kv.get_kv_layer_ids() == [2, 5, 2, 5]
    assert kv.get_kv_buffer_shape()[0] == kv.get_key_buffer(2).shape
    assert kv.get_state_layer_ids() == LAYERS * 2
    assert kv.get_kv_size_bytes() == kv.full_kv_pool.get_kv_size_bytes()


def test_kv_cpu_copy_carries_the_states() -> None:
    req = _req_pool()
    kv = _kv(req)
    g = torch.Generator().manual_seed(0)
    for t in [*req.mamba_pool.mamba_cache.conv, req.mamba_pool.mamba_cache.temporal]:
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    kv.set_kv_buffer(2, torch.tensor([5, 6]), torch.ones(2, 2, 8), torch.ones(2, 2, 8))
    copy = kv.get_cpu_copy(torch.tensor([5, 6]), mamba_indices=torch.tensor([2]))
    assert copy[1] is not None
    kv.load_cpu_copy(copy, torch.tensor([10, 11]), mamba_indices=torch.tensor([4]))
    assert torch.equal(kv.get_key_buffer(2)[[10, 11]], kv.get_key_buffer(2)[[5, 6]])
    cache = req.mamba_pool.mamba_cache
    assert torch.equal(cache.temporal[:, 4], cache.temporal[:, 2])
    assert torch.equal(cache.conv[0][:, 4], cache.conv[0][:, 2])
    only_kv = kv.get_cpu_copy(torch.tensor([5]))
    assert only_kv[1] is None
    # a bad state copy is refused before the KV is written
    keys = kv.get_key_buffer(2).clone()
    conv_cpu, temporal_cpu = copy[1]
    with pytest.raises(ValueError, match="shape"):
        kv.load_cpu_copy(
            (copy[0], (conv_cpu, temporal_cpu[:, :0])), torch.tensor([20, 21]), torch.tensor([5])
        )
    assert torch.equal(kv.get_key_buffer(2), keys)


def test_kv_pool_unsupported_features() -> None:
    req = _req_pool()
    with pytest.raises(NotImplementedError, match="use_dsa"):
        HybridLinearKVPool(32, torch.bfloat16, 4, 2, 8, FULL, "cpu", req.mamba_pool, use_dsa=True)
    kv = _kv(req)
    assert kv.post_capture_active is False and kv.index_kpool == 1 and kv.tail_extra_slots == 0
    with pytest.raises(NotImplementedError, match="DSA"):
        kv.get_index_k_with_scale_buffer(2)
    with pytest.raises(TypeError, match="mamba_pool"):
        HybridLinearKVPool(32, torch.bfloat16, 4, 2, 8, FULL, "cpu", object())  # type: ignore[arg-type]


def test_copy_mamba_state_and_constructor_errors_name_this_pools_arguments() -> None:
    pool = _req_pool()
    with pytest.raises(ValueError, match=r"equal lengths, got src_index=2, dst_index=1"):
        pool.copy_mamba_state(torch.tensor([1, 2]), torch.tensor([3]))
    with pytest.raises(TypeError, match="src_index must be int32 or int64"):
        pool.copy_mamba_state(torch.tensor([1.0]), torch.tensor([3]))
    with pytest.raises(ValueError, match="dst_index must not repeat a slot"):
        pool.copy_mamba_state(torch.tensor([1, 2]), torch.tensor([3, 3]))
    with pytest.raises(ValueError, match="mamba_size must be >= 0, got -1"):
        _req_pool(slots=-1)
