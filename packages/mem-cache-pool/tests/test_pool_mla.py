"""MLATokenToKVPool: accounting, split/packed writes, gathers, moves, waiter, bad input."""

from __future__ import annotations

import pytest
import torch

from mem_cache_pool import MLATokenToKVPool

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _pool(dtype: torch.dtype = torch.bfloat16, **kw: object) -> MLATokenToKVPool:
    args: dict[str, object] = dict(
        size=8,
        page_size=2,
        dtype=dtype,
        kv_lora_rank=16,
        qk_rope_head_dim=4,
        layer_num=2,
        device="cpu",
    )
    args.update(kw)
    return MLATokenToKVPool(**args)  # type: ignore[arg-type]


class _CountingWaiter:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def wait_until(self, layer_index: int) -> None:
        self.calls.append(layer_index)


def test_memory_accounting_equals_buffer_sizes() -> None:
    pool = _pool(torch.float8_e4m3fn)
    assert pool.get_kv_size_bytes() == 2 * (8 + 2) * 20
    assert pool.get_kv_size_bytes() == sum(t.numel() * t.element_size() for t in pool.kv_buffer)
    assert _pool(override_kv_cache_dim=32).get_kv_size_bytes() == 2 * 10 * 32 * 2


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trips_bit_exact(dtype: torch.dtype) -> None:
    pool = _pool(dtype)
    loc = torch.tensor([3, 2, 9])
    nope = torch.randn(3, 1, 16).to(dtype)
    rope = torch.randn(3, 1, 4).to(dtype)
    pool.set_mla_kv_buffer(1, loc, nope, rope)
    row = pool.get_key_buffer(1)[loc]
    assert row.dtype == dtype
    assert torch.equal(_bits(row), _bits(torch.cat([nope, rope], dim=-1)))
    assert torch.equal(_bits(pool.get_value_buffer(1)[loc]), _bits(nope))
    got_nope, got_rope = pool.get_mla_kv_buffer(1, loc)
    assert got_nope.dtype == dtype
    assert torch.equal(_bits(got_nope), _bits(nope))
    assert torch.equal(_bits(got_rope), _bits(rope))
    # packed write through set_kv_buffer lands the same bytes
    packed = torch.randn(3, 1, 20).to(dtype)
    pool.set_kv_buffer(0, loc, packed, None)
    assert torch.equal(_bits(pool.get_key_buffer(0)[loc]), _bits(packed))
    assert not pool.kv_buffer[0][:2].any()


def test_get_mla_kv_buffer_casts_to_dst_dtype_and_waits_once() -> None:
    pool = _pool(torch.bfloat16)
    waiter = _CountingWaiter()
    pool.register_layer_transfer_counter(waiter)
    loc = torch.tensor([4])
    pool.set_mla_kv_buffer(0, loc, torch.ones(1, 1, 16), torch.full((1, 1, 4), 2.0))
    nope, rope = pool.get_mla_kv_buffer(0, loc, torch.float32)
    assert nope.dtype == torch.float32 and torch.equal(rope, torch.full((1, 1, 4), 2.0))
    pool.get_kv_buffer(1)
    assert waiter.calls == [0, 1]


def test_move_kv_cache_overlapping() -> None:
    pool = _pool(torch.float32)
    for t in pool.kv_buffer:
        t.copy_(torch.randn(t.shape))
    before = [t.clone() for t in pool.kv_buffer]
    src, tgt = torch.tensor([6, 5, 4]), torch.tensor([5, 4, 3])
    pool.move_kv_cache(tgt, src)
    for layer in range(2):
        expect = before[layer].clone()
        expect[tgt] = before[layer][src]
        assert torch.equal(pool.kv_buffer[layer], expect)


def test_descriptor_and_cpu_copy() -> None:
    pool = _pool(torch.float16, start_layer=5)
    desc = pool.get_buffer_desc()
    assert desc.roles == ("kv",) and desc.row_shape == ((1, 20),) and desc.row_bytes == (40,)
    assert desc.item_bytes == (80,) and desc.start_layer == 5
    loc = torch.tensor([2, 3])
    pool.set_kv_buffer(6, loc, torch.randn(2, 1, 20), None)
    copy = pool.get_cpu_copy(loc)
    pool.load_cpu_copy(copy, torch.tensor([8, 9]))
    assert torch.equal(pool.kv_buffer[1][8:10], pool.kv_buffer[1][2:4])


def test_bad_input() -> None:
    pool = _pool(torch.float16)
    loc = torch.tensor([1, 2])
    with pytest.raises(ValueError, match=r"cache_k_rope must have shape \(2, 1, 4\)"):
        pool.set_mla_kv_buffer(0, loc, torch.ones(2, 1, 16), torch.ones(2, 1, 3))
    with pytest.raises(ValueError, match=r"cache_k must have shape \(2, 1, 20\)"):
        pool.set_kv_buffer(0, loc, torch.ones(2, 20), None)
    with pytest.raises(ValueError, match="layer"):
        pool.get_mla_kv_buffer(2, loc)
    with pytest.raises(ValueError, match=r"loc_info values must lie in \[0, 10\)"):
        pool.set_mla_kv_buffer(1, torch.tensor([1, 10]), torch.ones(2, 1, 16), torch.ones(2, 1, 4))
    assert not any(t.any() for t in pool.kv_buffer)
    with pytest.raises(ValueError, match="override_kv_cache_dim"):
        _pool(override_kv_cache_dim=8)


def test_set_mla_kv_buffer_skips_the_padding_slot() -> None:
    # issue 20's repro: SGLang 0.5.23's set_mla_kv_buffer (Triton, JIT and torch-native paths)
    # skips slot 0, so row 0 stays zero
    pool = MLATokenToKVPool(8, 1, torch.bfloat16, 4, 2, 1, "cpu")
    pool.set_mla_kv_buffer(0, torch.tensor([0, 1]), torch.ones(2, 1, 4), torch.ones(2, 1, 2))
    assert not pool.kv_buffer[0][0].any()
    assert torch.equal(pool.kv_buffer[0][1], torch.ones(1, 6, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
def test_padding_slot_per_store_path(dtype: torch.dtype) -> None:
    pool = _pool(dtype)
    loc = torch.tensor([0, 3, 0], dtype=torch.int32)
    nope = (torch.rand(3, 1, 16) + 1).to(dtype)
    rope = (torch.rand(3, 1, 4) + 1).to(dtype)
    pool.set_mla_kv_buffer(1, loc, nope, rope)
    assert not pool.kv_buffer[1][0].any()  # skipped
    assert torch.equal(_bits(pool.get_key_buffer(1)[3]), _bits(torch.cat([nope[1], rope[1]], -1)))
    # the packed-row store writes slot 0 like any other slot (SGLang's indexed assignment)
    packed = (torch.rand(2, 1, 20) + 1).to(dtype)
    pool.set_kv_buffer(1, torch.tensor([0, 4]), packed)
    assert torch.equal(_bits(pool.get_key_buffer(1)[[0, 4]]), _bits(packed))
    assert loc.tolist() == [0, 3, 0]


def test_get_mla_kv_buffer_rejects_a_bad_dst_dtype() -> None:
    pool = _pool()
    with pytest.raises(TypeError, match=r"dst_dtype must be a torch\.dtype or None, got str"):
        pool.get_mla_kv_buffer(0, torch.tensor([1]), dst_dtype="x")  # type: ignore[arg-type]
