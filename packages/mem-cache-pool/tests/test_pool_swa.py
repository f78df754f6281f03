"""SWAKVPool: routing by layer, swa_loc writes, mapping registration/translation, moves."""

from __future__ import annotations

import pytest
import torch

from mem_cache_pool import KVWriteLoc, MHATokenToKVPool, SWAKVPool

SIZE, SIZE_SWA, PS = 16, 8, 2


def _pool(**kw: object) -> SWAKVPool:
    args: dict[str, object] = dict(
        size=SIZE,
        size_swa=SIZE_SWA,
        page_size=PS,
        dtype=torch.float32,
        head_num=2,
        head_dim=4,
        swa_attention_layer_ids=[1, 3],
        full_attention_layer_ids=[0, 2],
        device="cpu",
    )
    args.update(kw)
    return SWAKVPool(**args)  # type: ignore[arg-type]


def _mapping() -> torch.Tensor:
    m = torch.zeros(SIZE + PS + 1, dtype=torch.int64)
    m[2:8] = torch.tensor([4, 5, 2, 3, 6, 7])  # full slots 2..7 have window slots
    m[-1] = -1
    return m


def test_routing_and_accounting() -> None:
    pool = _pool(swa_head_dim=8)
    assert isinstance(pool.full_kv_pool, MHATokenToKVPool)
    assert pool.full_kv_pool.size == SIZE and pool.swa_kv_pool.size == SIZE_SWA
    assert pool.layers_mapping == {0: (0, False), 2: (1, False), 1: (0, True), 3: (1, True)}
    assert pool.get_key_buffer(3).shape == (SIZE_SWA + PS, 2, 8)
    assert pool.get_value_buffer(2).shape == (SIZE + PS, 2, 4)
    k, v = pool.get_kv_size_bytes()
    assert k == 2 * (SIZE + PS) * 8 * 4 + 2 * (SIZE_SWA + PS) * 16 * 4
    # SGLang 0.5.23: a window pool's v_head_dim is swa_v_head_dim, else v_head_dim, else the
    # base head_dim (not swa_head_dim)
    assert v == 2 * (SIZE + PS) * 8 * 4 + 2 * (SIZE_SWA + PS) * 8 * 4
    assert pool.get_value_buffer(3).shape == (SIZE_SWA + PS, 2, 4)
    assert pool.get_total_bytes() == k + v
    assert pool.get_buffer_desc() is pool.full_kv_pool.get_buffer_desc()


def test_writes_route_by_layer() -> None:
    pool = _pool()
    loc = torch.tensor([2, 3])
    wl = KVWriteLoc(loc, swa_loc=torch.tensor([4, 5]))
    k_full, v_full = torch.randn(2, 2, 4), torch.randn(2, 2, 4)
    k_swa, v_swa = torch.randn(2, 2, 4), torch.randn(2, 2, 4)
    pool.set_kv_buffer(2, wl, k_full, v_full)
    pool.set_kv_buffer(1, wl, k_swa, v_swa)
    assert torch.equal(pool.full_kv_pool.k_buffer[1][loc], k_full)
    assert torch.equal(pool.swa_kv_pool.v_buffer[0][torch.tensor([4, 5])], v_swa)
    assert torch.equal(pool.get_key_buffer(1)[torch.tensor([4, 5])], k_swa)
    assert not pool.full_kv_pool.k_buffer[0].any() and not pool.swa_kv_pool.k_buffer[1].any()
    with pytest.raises(ValueError, match="swa_loc=None"):
        pool.set_kv_buffer(3, KVWriteLoc(loc), k_swa, v_swa)
    with pytest.raises(ValueError, match="sliding-window layer 3"):
        pool.set_kv_buffer(3, loc, k_swa, v_swa)
    with pytest.raises(ValueError, match=r"loc_info values must lie in \[0, 10\)"):
        pool.set_kv_buffer(3, KVWriteLoc(loc, torch.tensor([1, 12])), k_swa, v_swa)
    with pytest.raises(ValueError, match=r"layer must lie in \[0, 4\)"):
        pool.set_kv_buffer(4, wl, k_swa, v_swa)
    assert not pool.swa_kv_pool.k_buffer[1].any()


def test_waiter_uses_wrapper_layer_index() -> None:
    pool = _pool()
    calls: list[int] = []

    class _Waiter:
        def wait_until(self, layer_index: int) -> None:
            calls.append(layer_index)

    pool.register_layer_transfer_counter(_Waiter())
    pool.get_key_buffer(3)
    pool.get_kv_buffer(0)
    assert calls == [3, 0]
    assert pool.swa_kv_pool.layer_transfer_counter is None


def test_mapping_registration_and_translation() -> None:
    pool = _pool()
    with pytest.raises(RuntimeError, match="register_mapping"):
        pool.translate_loc_from_full_to_swa(torch.tensor([2]))
    with pytest.raises(ValueError, match="mapping must have 19 elements, got 16"):
        pool.register_mapping(torch.zeros(SIZE, dtype=torch.int64))
    with pytest.raises(TypeError, match="mapping must be int64"):
        pool.register_mapping(torch.zeros(SIZE + PS + 1, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"mapping\[-1\] must be the sentinel -1"):
        pool.register_mapping(torch.zeros(SIZE + PS + 1, dtype=torch.int64))
    pool.register_mapping(_mapping())
    out = pool.translate_loc_from_full_to_swa(torch.tensor([2, 7, 9], dtype=torch.int32))
    assert out.dtype == torch.int64 and out.tolist() == [4, 7, 0]


def test_move_kv_cache_moves_both_sub_pools() -> None:
    pool = _pool()
    for buf in (*pool.full_kv_pool.k_buffer, *pool.swa_kv_pool.v_buffer):
        buf.copy_(torch.randn(buf.shape))
    full_before = pool.full_kv_pool.k_buffer[1].clone()
    swa_before = pool.swa_kv_pool.v_buffer[0].clone()
    with pytest.raises(RuntimeError, match="register_mapping"):
        pool.move_kv_cache(torch.tensor([3]), torch.tensor([2]))
    assert torch.equal(pool.full_kv_pool.k_buffer[1], full_before)  # failed call moved nothing
    pool.register_mapping(_mapping())
    src, tgt = torch.tensor([2, 3, 4]), torch.tensor([3, 4, 5])  # overlapping
    pool.move_kv_cache(tgt, src)
    expect_full = full_before.clone()
    expect_full[tgt] = full_before[src]
    assert torch.equal(pool.full_kv_pool.k_buffer[1], expect_full)
    swa_src, swa_tgt = torch.tensor([4, 5, 2]), torch.tensor([5, 2, 3])
    expect_swa = swa_before.clone()
    expect_swa[swa_tgt] = swa_before[swa_src]
    assert torch.equal(pool.swa_kv_pool.v_buffer[0], expect_swa)


def test_cpu_copy_round_trip() -> None:
    pool = _pool()
    pool.register_mapping(_mapping())
    for buf in (*pool.full_kv_pool.k_buffer, *pool.swa_kv_pool.k_buffer):
        buf.copy_(torch.randn(buf.shape))
    copy = pool.get_cpu_copy(torch.tensor([2, 3]))
    assert sorted(copy) == ["full.k", "full.v", "swa.k", "swa.v"]
    pool.load_cpu_copy(copy, torch.tensor([6, 7]))  # window slots 6, 7
    assert torch.equal(pool.full_kv_pool.k_buffer[0][6:8], pool.full_kv_pool.k_buffer[0][2:4])
    assert torch.equal(pool.swa_kv_pool.k_buffer[1][6:8], pool.swa_kv_pool.k_buffer[1][4:6])
    with pytest.raises(ValueError, match="kv_cache_cpu"):
        pool.load_cpu_copy({"full.k": copy["full.k"]}, torch.tensor([6, 7]))


def test_constructor_names_size_swa() -> None:
    with pytest.raises(ValueError, match="size_swa must be >= 0, got -1"):
        _pool(size_swa=-1)
    with pytest.raises(ValueError, match="device must name a torch device"):
        _pool(device="nodev")


def test_constructor_validation_and_single_kind() -> None:
    with pytest.raises(ValueError, match="contiguous"):
        _pool(swa_attention_layer_ids=[1, 2], full_attention_layer_ids=[0, 2])
    with pytest.raises(ValueError, match="contiguous"):
        _pool(swa_attention_layer_ids=[5], full_attention_layer_ids=[0])
    only_full = _pool(swa_attention_layer_ids=[], full_attention_layer_ids=[4, 5])
    assert (only_full.start_layer, only_full.end_layer) == (4, 6)
    with pytest.raises(RuntimeError, match="no sliding-window layers"):
        _ = only_full.swa_kv_pool
    only_full.move_kv_cache(torch.tensor([3]), torch.tensor([2]))  # no mapping needed


def test_padding_slot_is_skipped_in_both_sub_pools() -> None:
    # SGLang 0.5.23 routes to the MHA sub-pools, whose store_cache skips slot 0: a padded token
    # (full slot 0, window slot 0) leaves both padding rows untouched
    pool = _pool()
    wl = KVWriteLoc(torch.tensor([0, 3]), swa_loc=torch.tensor([0, 5]))
    k, v = torch.ones(2, 2, 4), torch.full((2, 2, 4), 2.0)
    pool.set_kv_buffer(0, wl, k, v)
    pool.set_kv_buffer(1, wl, k, v)
    for sub in (pool.full_kv_pool, pool.swa_kv_pool):
        assert not sub.k_buffer[0][0].any() and not sub.v_buffer[0][0].any()
    assert torch.equal(pool.full_kv_pool.v_buffer[0][3], v[1])
    assert torch.equal(pool.swa_kv_pool.k_buffer[0][5], k[1])


def test_register_mapping_rejects_window_slots_out_of_range() -> None:
    pool = _pool()
    bad = _mapping()
    bad[5] = SIZE_SWA + PS  # one past the window pool's rows
    with pytest.raises(ValueError, match=r"mapping\[:-1\] values must lie in \[0, 10\)"):
        pool.register_mapping(bad)
    assert pool.full_to_swa_index_mapping is None
