"""HiSparseDSATokenToKVPool: logical -> device translation, registration errors, moves."""

from __future__ import annotations

import pytest
import torch

from mem_cache_pool import HiSparseDSATokenToKVPool

SIZE, LOGICAL, PS = 8, 24, 4


def _pool(**kw: object) -> HiSparseDSATokenToKVPool:
    args: dict[str, object] = dict(
        size=SIZE,
        page_size=PS,
        dtype=torch.float16,
        kv_lora_rank=8,
        qk_rope_head_dim=4,
        layer_num=2,
        device="cpu",
        index_buf_size=LOGICAL,
    )
    args.update(kw)
    return HiSparseDSATokenToKVPool(**args)  # type: ignore[arg-type]


def _mapping() -> torch.Tensor:
    m = torch.zeros(LOGICAL + PS + 1, dtype=torch.int64)
    m[torch.tensor([20, 21, 22, 23, 5])] = torch.tensor([4, 5, 6, 7, 8])
    m[-1] = -1
    return m


def test_geometry() -> None:
    pool = _pool()
    assert pool.kv_buffer[0].shape == (SIZE + PS, 1, 12)
    assert pool.index_k_with_scale_buffer[0].shape == ((LOGICAL + PS) // PS, PS * 132)
    assert pool.index_num_rows == LOGICAL + PS
    kv_bytes = 2 * (SIZE + PS) * 12 * 2
    index_bytes = 2 * (LOGICAL + PS) * 132
    assert pool.get_kv_size_bytes() == kv_bytes + index_bytes == pool.get_total_bytes()


def test_writes_before_registration_raise() -> None:
    pool = _pool()
    loc = torch.tensor([20])
    with pytest.raises(RuntimeError, match="register_mapping"):
        pool.set_kv_buffer(0, loc, torch.ones(1, 1, 12), None)
    with pytest.raises(RuntimeError, match="register_mapping"):
        pool.set_mla_kv_buffer(0, loc, torch.ones(1, 1, 8), torch.ones(1, 1, 4))
    with pytest.raises(RuntimeError, match="register_mapping"):
        pool.move_kv_cache(loc, loc)
    assert not any(t.any() for t in pool.kv_buffer)
    with pytest.raises(ValueError, match="mapping must have 29 elements, got 13"):
        pool.register_mapping(torch.zeros(SIZE + PS + 1, dtype=torch.int64))


def test_translation_on_write_and_read() -> None:
    pool = _pool()
    pool.register_mapping(_mapping())
    logical = torch.tensor([21, 5, 23])
    device = torch.tensor([5, 8, 7])
    assert torch.equal(pool.translate_loc_to_device(logical), device)
    nope, rope = torch.randn(3, 1, 8).half(), torch.randn(3, 1, 4).half()
    pool.set_mla_kv_buffer(1, logical, nope, rope)
    assert torch.equal(pool.get_key_buffer(1)[device], torch.cat([nope, rope], -1))
    got_nope, got_rope = pool.get_mla_kv_buffer(1, logical)
    assert torch.equal(got_nope, nope) and torch.equal(got_rope, rope)
    packed = torch.randn(1, 1, 12).half()
    pool.set_kv_buffer(0, torch.tensor([20]), packed, None)
    assert torch.equal(pool.kv_buffer[0][4], packed[0])
    # logical locations beyond the device size are valid; beyond the logical space they are not
    with pytest.raises(ValueError, match=r"loc_info values must lie in \[0, 28\)"):
        pool.set_kv_buffer(0, torch.tensor([28]), packed, None)


def test_index_buffer_uses_logical_locations() -> None:
    pool = _pool()
    keys = torch.randint(0, 256, (2, 128), dtype=torch.uint8)
    scales = torch.tensor([1.5, 2.5])
    loc = torch.tensor([22, 26])  # beyond the device slots; no mapping needed
    pool.set_index_k_scale_buffer(0, loc, keys, scales)
    assert torch.equal(pool.get_index_k(0, loc).view(torch.uint8), keys)
    assert torch.equal(pool.get_index_k_scale(0, loc), scales)


def test_transfer_values_on_device() -> None:
    pool = _pool()
    for t in pool.kv_buffer:
        t.copy_(torch.randn(t.shape))
    before = [t.clone() for t in pool.kv_buffer]
    pool.transfer_values_on_device(torch.tensor([1, 2]), torch.tensor([9, 10]))
    for layer in range(2):
        expect = before[layer].clone()
        expect[torch.tensor([1, 2])] = before[layer][torch.tensor([9, 10])]
        assert torch.equal(pool.kv_buffer[layer], expect)
    with pytest.raises(ValueError, match=r"src_indices values must lie in \[0, 12\)"):
        pool.transfer_values_on_device(torch.tensor([1]), torch.tensor([12]))


def test_move_kv_cache_translates_latent_rows() -> None:
    pool = _pool()
    pool.register_mapping(_mapping())
    for t in pool.kv_buffer:
        t.copy_(torch.randn(t.shape))
    keys = torch.randint(0, 256, (4, 128), dtype=torch.uint8)
    tokens = torch.tensor([20, 21, 22, 23])
    pool.set_index_k_scale_buffer(0, tokens, keys, torch.arange(4.0))
    before = [t.clone() for t in pool.kv_buffer]
    # logical 20 -> 21 -> 22 (overlapping); 3 is unmapped so its latent move is skipped
    pool.move_kv_cache(torch.tensor([21, 22, 3]), torch.tensor([20, 21, 23]))
    expect = before[0].clone()
    expect[torch.tensor([5, 6])] = before[0][torch.tensor([4, 5])]
    assert torch.equal(pool.kv_buffer[0], expect)
    got = pool.get_index_k(0, torch.tensor([20, 21, 22, 3])).view(torch.uint8)
    assert torch.equal(got, keys[torch.tensor([0, 0, 1, 3])])
    assert pool.get_index_k_scale(0, torch.tensor([3])).tolist() == [3.0]


def test_cpu_copy_unsupported() -> None:
    pool = _pool()
    with pytest.raises(NotImplementedError):
        pool.get_cpu_copy(torch.tensor([1]))


def test_padding_slot_after_translation() -> None:
    # SGLang 0.5.23 translates first, then stores: set_mla_kv_buffer skips device slot 0 (which
    # is where unmapped logical tokens translate to); the packed-row store writes it
    pool = _pool()
    pool.register_mapping(_mapping())
    logical = torch.tensor([3, 21, 0])  # 3 and 0 are unmapped -> device slot 0
    nope, rope = torch.ones(3, 1, 8).half(), torch.ones(3, 1, 4).half()
    pool.set_mla_kv_buffer(0, logical, nope, rope)
    assert not pool.kv_buffer[0][0].any()
    assert bool((pool.kv_buffer[0][5] == 1).all())
    assert int((pool.kv_buffer[0] != 0).any(-1).sum()) == 1  # nothing else written
    packed = torch.full((1, 1, 12), 2.0).half()
    pool.set_kv_buffer(0, torch.tensor([3]), packed, None)
    assert torch.equal(pool.kv_buffer[0][0], packed[0])
    assert logical.tolist() == [3, 21, 0]


def test_register_mapping_rejects_device_slots_out_of_range() -> None:
    pool = _pool()
    bad = _mapping()
    bad[21] = SIZE + PS
    with pytest.raises(
        ValueError, match=r"mapping\[:-1\] values must lie in \[0, 12\), got min 0, max 12"
    ):
        pool.register_mapping(bad)
    assert pool.full_to_hisparse_device_index_mapping is None
