"""DSATokenToKVPool: page-major index-key layout, writes, gathers and moves (page size 1, 64)."""

from __future__ import annotations

import pytest
import torch

from mem_cache_pool import DSATokenToKVPool


def _pool(page_size: int, size: int | None = None, **kw: object) -> DSATokenToKVPool:
    args: dict[str, object] = dict(
        size=max(2 * page_size, 8) if size is None else size,
        page_size=page_size,
        dtype=torch.bfloat16,
        kv_lora_rank=8,
        qk_rope_head_dim=4,
        layer_num=2,
        device="cpu",
    )
    args.update(kw)
    return DSATokenToKVPool(**args)  # type: ignore[arg-type]


def _random_index(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    keys = torch.randint(0, 256, (n, 128), dtype=torch.uint8).view(torch.float8_e4m3fn)
    scales = torch.rand(n) + 0.5
    return keys, scales


def _raw_token(buf: torch.Tensor, t: int, ps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Key bytes and scale of token ``t`` read straight from the page-major bytes."""
    page, off = buf[t // ps], t % ps
    key = page[off * 128 : (off + 1) * 128]
    scale = page[ps * 128 + off * 4 : ps * 128 + (off + 1) * 4].view(torch.float32)
    return key, scale


@pytest.mark.parametrize("ps", [1, 16, 64])
def test_layout_and_accounting(ps: int) -> None:
    pool = _pool(ps)
    buf = pool.index_k_with_scale_buffer[0]
    pages = (pool.size + ps) // ps
    assert buf.dtype == torch.uint8 and buf.shape == (pages, ps * 132)
    if ps == 64:
        assert buf.shape[1] == 8448
    kv = 2 * (pool.size + ps) * 12 * 2
    assert pool.get_kv_size_bytes() == kv + 2 * pages * ps * 132
    assert pool.get_kv_size_bytes() == sum(
        t.numel() * t.element_size() for t in (*pool.kv_buffer, *pool.index_k_with_scale_buffer)
    )


@pytest.mark.parametrize("ps", [1, 64])
def test_index_writes_land_page_major(ps: int) -> None:
    pool = _pool(ps)
    loc = torch.tensor([ps + 3, 2 * ps + 1, ps, 5 % ps])
    keys, scales = _random_index(4)
    pool.set_index_k_scale_buffer(1, loc, keys, scales)
    buf = pool.index_k_with_scale_buffer[1]
    for i, t in enumerate(loc.tolist()):
        key, scale = _raw_token(buf, t, ps)
        assert torch.equal(key, keys[i].view(torch.uint8))
        assert torch.equal(scale, scales[i : i + 1])
    written = 4 * 132
    assert int((buf != 0).sum()) <= written  # nothing outside the tokens' bytes
    assert not pool.index_k_with_scale_buffer[0].any()
    assert torch.equal(pool.get_index_k(1, loc).view(torch.uint8), keys.view(torch.uint8))
    assert torch.equal(pool.get_index_k_scale(1, loc), scales)
    # [n, 1] scales and uint8 keys are accepted too
    pool.set_index_k_scale_buffer(0, loc[:1], keys[:1].view(torch.uint8), scales[:1, None])
    assert torch.equal(pool.get_index_k_scale(0, loc[:1]), scales[:1])


def test_index_k_continuous() -> None:
    ps = 4
    pool = _pool(ps, size=12)
    pages = torch.tensor([3, 1])
    tokens = torch.tensor([12, 13, 14, 15, 4, 5])
    keys, scales = _random_index(6)
    pool.set_index_k_scale_buffer(0, tokens, keys, scales)
    got = pool.get_index_k_continuous(0, 6, pages)
    assert got.shape == (6, 128) and got.dtype == torch.float8_e4m3fn
    assert torch.equal(got.view(torch.uint8), keys.view(torch.uint8))
    assert torch.equal(pool.get_index_k_scale_continuous(0, 5, pages), scales[:5])
    with pytest.raises(ValueError, match="seq_len"):
        pool.get_index_k_continuous(0, 9, pages)


@pytest.mark.parametrize("ps", [1, 64])
def test_move_kv_cache_moves_index_bytes(ps: int) -> None:
    pool = _pool(ps)
    n_tokens = pool.index_num_rows
    all_tokens = torch.arange(n_tokens)
    keys, scales = _random_index(n_tokens)
    for layer in range(2):
        pool.set_index_k_scale_buffer(layer, all_tokens, keys, scales)
        pool.kv_buffer[layer].copy_(torch.randn(pool.kv_buffer[layer].shape))
    kv_before = [t.clone() for t in pool.kv_buffer]
    # overlapping, crossing a page boundary when ps > 1
    src = torch.tensor([ps - 1, ps, ps + 1, 2 * ps + 2])
    tgt = torch.tensor([ps, ps + 1, ps + 2, 2 * ps + 3])
    pool.move_kv_cache(tgt, src)
    expect = torch.arange(n_tokens)
    expect[tgt] = src
    for layer in range(2):
        assert torch.equal(
            pool.get_index_k(layer, all_tokens).view(torch.uint8), keys[expect].view(torch.uint8)
        )
        assert torch.equal(pool.get_index_k_scale(layer, all_tokens), scales[expect])
        assert torch.equal(pool.kv_buffer[layer], kv_before[layer][expect[: pool.num_rows]])


def test_cpu_copy_round_trip() -> None:
    pool = _pool(4, size=8)
    loc, new_loc = torch.tensor([4, 5]), torch.tensor([9, 10])
    keys, scales = _random_index(2)
    pool.set_index_k_scale_buffer(1, loc, keys, scales)
    pool.set_kv_buffer(1, loc, torch.randn(2, 1, 12), None)
    copy = pool.get_cpu_copy(loc)
    assert sorted(copy) == ["index_k", "index_k_scale", "kv"]
    pool.load_cpu_copy(copy, new_loc)
    assert torch.equal(pool.get_index_k(1, new_loc).view(torch.uint8), keys.view(torch.uint8))
    assert torch.equal(pool.get_index_k_scale(1, new_loc), scales)
    assert torch.equal(pool.kv_buffer[1][new_loc], pool.kv_buffer[1][loc])
    bad = dict(copy)
    bad["index_k"] = [t[:1] for t in copy["index_k"]]
    with pytest.raises(ValueError, match="index_k"):
        pool.load_cpu_copy(bad, torch.tensor([1, 2]))
    assert not pool.kv_buffer[1][1:3].any()


def test_bad_index_input_and_waiter() -> None:
    pool = _pool(4, size=8)
    keys, scales = _random_index(2)
    loc = torch.tensor([1, 2])
    with pytest.raises(TypeError, match="index_k must have dtype"):
        pool.set_index_k_scale_buffer(0, loc, keys.float(), scales)
    with pytest.raises(ValueError, match=r"index_k_scale must have shape \(2,\)"):
        pool.set_index_k_scale_buffer(0, loc, keys, scales[:1])
    with pytest.raises(TypeError, match="index_k_scale must have dtype"):
        pool.set_index_k_scale_buffer(0, loc, keys, scales.double())
    with pytest.raises(ValueError, match=r"loc values must lie in \[0, 12\)"):
        pool.set_index_k_scale_buffer(0, torch.tensor([1, 12]), keys, scales)
    assert not any(t.any() for t in pool.index_k_with_scale_buffer)
    with pytest.raises(ValueError, match="index_head_dim must be 128"):
        _pool(4, index_head_dim=64)
    calls: list[int] = []

    class _Waiter:
        def wait_until(self, layer_index: int) -> None:
            calls.append(layer_index)

    pool.register_layer_transfer_counter(_Waiter())
    pool.get_index_k(1, loc)
    pool.get_index_k_with_scale_buffer(0)
    pool.get_key_buffer(1)
    assert calls == [1, 0, 1]


@pytest.mark.parametrize("ps", [1, 64])
def test_padding_slot_per_store_path(ps: int) -> None:
    # SGLang 0.5.23: set_mla_kv_buffer skips slot 0; the packed-row store and the indexer-key
    # store (SetKAndS) write it like any other slot
    pool = _pool(ps)
    pool.set_mla_kv_buffer(0, torch.tensor([0, 2]), torch.ones(2, 1, 8), torch.ones(2, 1, 4))
    assert not pool.kv_buffer[0][0].any()
    assert bool((pool.kv_buffer[0][2] == 1).all())
    packed = torch.full((1, 1, 12), 2.0)
    pool.set_kv_buffer(0, torch.tensor([0]), packed, None)
    assert bool((pool.kv_buffer[0][0] == 2).all())
    keys, scales = _random_index(2)
    pool.set_index_k_scale_buffer(0, torch.tensor([0, 1]), keys, scales)
    for t in (0, 1):
        key, scale = _raw_token(pool.index_k_with_scale_buffer[0], t, ps)
        assert torch.equal(key, keys[t].view(torch.uint8))
        assert torch.equal(scale, scales[t : t + 1])
