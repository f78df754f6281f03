"""MHATokenToKVPool: accounting, round trips, moves, readiness waiter, bad input, descriptor."""

from __future__ import annotations

import pytest
import torch

from mem_cache_pool import KVBufferDesc, KVWriteLoc, MHATokenToKVPool

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _pool(dtype: torch.dtype = torch.float16, **kw: object) -> MHATokenToKVPool:
    args: dict[str, object] = dict(
        size=16, page_size=4, dtype=dtype, head_num=2, head_dim=8, layer_num=2, device="cpu"
    )
    args.update(kw)
    return MHATokenToKVPool(**args)  # type: ignore[arg-type]


class _CountingWaiter:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def wait_until(self, layer_index: int) -> None:
        self.calls.append(layer_index)


def test_memory_accounting_equals_buffer_sizes() -> None:
    pool = _pool(torch.bfloat16, v_head_dim=4)
    k_bytes, v_bytes = pool.get_kv_size_bytes()
    assert k_bytes == 2 * (16 + 4) * 2 * 8 * 2
    assert v_bytes == 2 * (16 + 4) * 2 * 4 * 2
    assert k_bytes == sum(t.numel() * t.element_size() for t in pool.k_buffer)
    assert pool.get_total_bytes() == k_bytes + v_bytes
    assert pool.mem_usage == pytest.approx((k_bytes + v_bytes) / 2**30)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_set_get_round_trip_bit_exact(dtype: torch.dtype) -> None:
    pool = _pool(dtype, start_layer=3)
    assert pool.k_buffer[0].dtype == (torch.uint8 if dtype.itemsize == 1 else dtype)
    loc = torch.tensor([5, 4, 19, 7])
    k = torch.randn(4, 2, 8).to(dtype)
    v = torch.randn(4, 2, 8).to(dtype)
    pool.set_kv_buffer(4, loc, k, v)
    assert pool.get_key_buffer(4).dtype == dtype
    assert torch.equal(_bits(pool.get_key_buffer(4)[loc]), _bits(k))
    assert torch.equal(_bits(pool.get_value_buffer(4)[loc]), _bits(v))
    # the other layer is untouched
    assert not pool.k_buffer[0].any()
    # KVWriteLoc and int32 locations write the same way
    pool.set_kv_buffer(3, KVWriteLoc(loc.to(torch.int32)), k, v)
    assert torch.equal(_bits(pool.get_kv_buffer(3)[1][loc]), _bits(v))


def test_input_cast_and_scale() -> None:
    pool = _pool(torch.float16)
    loc = torch.tensor([1, 2])
    k = torch.full((2, 2, 8), 6.0)
    pool.set_kv_buffer(0, loc, k, k, k_scale=2.0, v_scale=3.0)
    three, two = (torch.full((2, 2, 8), x, dtype=torch.float16) for x in (3.0, 2.0))
    assert torch.equal(pool.get_key_buffer(0)[loc], three)
    assert torch.equal(pool.get_value_buffer(0)[loc], two)
    assert torch.equal(k, torch.full((2, 2, 8), 6.0))  # inputs not modified


def test_move_kv_cache_overlapping() -> None:
    pool = _pool(torch.float32)
    for layer in range(2):
        pool.k_buffer[layer].copy_(torch.randn(pool.k_buffer[layer].shape))
        pool.v_buffer[layer].copy_(torch.randn(pool.v_buffer[layer].shape))
    before_k = [t.clone() for t in pool.k_buffer]
    before_v = [t.clone() for t in pool.v_buffer]
    src = torch.tensor([4, 5, 6, 7])
    tgt = torch.tensor([5, 6, 7, 8])  # shifted by one: every target but 8 is also a source
    pool.move_kv_cache(tgt, src)
    for layer in range(2):
        expect_k, expect_v = before_k[layer].clone(), before_v[layer].clone()
        expect_k[tgt] = before_k[layer][src]
        expect_v[tgt] = before_v[layer][src]
        assert torch.equal(pool.k_buffer[layer], expect_k)
        assert torch.equal(pool.v_buffer[layer], expect_v)


def test_waiter_called_once_per_layer_read() -> None:
    pool = _pool(start_layer=2)
    waiter = _CountingWaiter()
    pool.register_layer_transfer_counter(waiter)
    pool.get_key_buffer(2)
    pool.get_value_buffer(3)
    pool.get_kv_buffer(3)
    assert waiter.calls == [0, 1, 1]
    pool.set_kv_buffer(2, torch.tensor([1]), torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
    pool.get_buffer_desc()
    assert waiter.calls == [0, 1, 1]  # writes and descriptors do not wait
    pool.register_layer_transfer_counter(None)
    pool.get_key_buffer(2)
    assert waiter.calls == [0, 1, 1]
    with pytest.raises(TypeError, match="counter"):
        pool.register_layer_transfer_counter(object())  # type: ignore[arg-type]


def test_buffer_desc() -> None:
    pool = _pool(torch.float8_e4m3fn, v_head_dim=4, start_layer=1)
    desc = pool.get_buffer_desc()
    assert isinstance(desc, KVBufferDesc)
    assert desc.roles == ("k", "v")
    assert desc.row_shape == ((2, 8), (2, 4))
    assert desc.row_bytes == (16, 8)
    assert desc.item_bytes == (64, 32)
    assert desc.bytes_per_token == 48
    assert (desc.size, desc.page_size, desc.layer_num, desc.start_layer) == (16, 4, 2, 1)
    assert desc.store_dtype == torch.uint8 and desc.dtype == torch.float8_e4m3fn
    assert desc.data_ptrs.dtype == torch.uint64
    ptrs = [t.data_ptr() for t in (*pool.k_buffer, *pool.v_buffer)]
    assert desc.data_ptrs.view(torch.int64).tolist() == ptrs
    assert desc.role_buffers("v")[1] is pool.v_buffer[1]
    assert pool.data_strides.tolist() == [16, 16, 8, 8]
    with pytest.raises(ValueError, match="role"):
        desc.role_buffers("kv")


def test_cpu_copy_round_trip() -> None:
    pool = _pool(torch.bfloat16)
    loc = torch.tensor([4, 9, 10])
    k, v = torch.randn(3, 2, 8).to(torch.bfloat16), torch.randn(3, 2, 8).to(torch.bfloat16)
    pool.set_kv_buffer(1, loc, k, v)
    copy = pool.get_cpu_copy(loc)
    assert sorted(copy) == ["k", "v"] and len(copy["k"]) == 2
    new_loc = torch.tensor([12, 13, 14])
    pool.load_cpu_copy(copy, new_loc)
    assert torch.equal(pool.get_key_buffer(1)[new_loc], k)
    assert torch.equal(pool.get_value_buffer(1)[new_loc], v)
    with pytest.raises(ValueError, match="kv_cache_cpu"):
        pool.load_cpu_copy({"k": copy["k"]}, new_loc)
    with pytest.raises(ValueError, match="kv_cache_cpu"):
        pool.load_cpu_copy(copy, new_loc[:2])


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        (dict(layer=2), ValueError, r"layer must lie in \[0, 2\), got 2"),
        (dict(layer=-1), ValueError, "layer"),
        (dict(layer=True), TypeError, "layer"),
        (dict(loc_info=torch.tensor([1.0, 2.0])), TypeError, "loc_info must be int32 or int64"),
        (dict(loc_info=torch.tensor([[1, 2]])), ValueError, "loc_info must be 1-D"),
        (
            dict(loc_info=torch.tensor([1, 20])),
            ValueError,
            r"loc_info values must lie in \[0, 20\)",
        ),
        (dict(loc_info=torch.tensor([-1, 2])), ValueError, "loc_info values"),
        (dict(loc_info=[1, 2]), TypeError, "loc_info must be a torch.Tensor"),
        (dict(cache_k=torch.zeros(2, 2, 4)), ValueError, r"cache_k must have shape \(2, 2, 8\)"),
        (dict(cache_v=torch.zeros(3, 2, 8)), ValueError, "cache_v must have shape"),
        (dict(cache_k=torch.zeros(2, 2, 8, dtype=torch.int32)), TypeError, "cache_k"),
        (
            dict(cache_v=torch.zeros(2, 2, 8, device="meta")),
            ValueError,
            "cache_v must be a tensor with data",
        ),
    ],
)
def test_bad_input_leaves_buffers_untouched(
    kwargs: dict[str, object], exc: type[Exception], match: str
) -> None:
    pool = _pool(torch.float32)
    args: dict[str, object] = dict(
        layer=0,
        loc_info=torch.tensor([1, 2]),
        cache_k=torch.ones(2, 2, 8),
        cache_v=torch.ones(2, 2, 8),
    )
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        pool.set_kv_buffer(**args)  # type: ignore[arg-type]
    assert not any(t.any() for t in (*pool.k_buffer, *pool.v_buffer))


def test_bad_move_and_constructor_arguments() -> None:
    pool = _pool()
    with pytest.raises(ValueError, match="src_loc must have 2 elements"):
        pool.move_kv_cache(torch.tensor([1, 2]), torch.tensor([3]))
    with pytest.raises(ValueError, match="tgt_loc values"):
        pool.move_kv_cache(torch.tensor([1, 99]), torch.tensor([3, 4]))
    with pytest.raises(ValueError, match="tgt_loc must not repeat a slot"):
        pool.move_kv_cache(torch.tensor([1, 1]), torch.tensor([3, 4]))
    with pytest.raises(ValueError, match="indices must not repeat"):
        pool.load_cpu_copy(pool.get_cpu_copy(torch.tensor([3, 4])), torch.tensor([5, 5]))
    with pytest.raises(ValueError, match="end_layer"):
        _pool(start_layer=1, end_layer=4)
    with pytest.raises(ValueError, match="page_size"):
        _pool(page_size=0)
    with pytest.raises(TypeError, match="dtype"):
        _pool(dtype="float16")  # type: ignore[arg-type]


def test_debug_mode_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEM_CACHE_DEBUG", "1")
    assert _pool().debug
    monkeypatch.setenv("MEM_CACHE_DEBUG", "0")
    assert not _pool().debug
    assert _pool(debug=True).debug


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=str)
def test_set_kv_buffer_skips_the_padding_slot(dtype: torch.dtype, index_dtype: torch.dtype) -> None:
    # SGLang 0.5.23's store_cache kernel skips slot 0 (reserved_skip_index=0): padded tokens of
    # a CUDA-graph batch write there, and the slot keeps its zeros
    pool = _pool(dtype)
    loc = torch.tensor([0, 1, 0, 5], dtype=index_dtype)
    k = (torch.randn(4, 2, 8) + 3).to(dtype)
    v = (torch.randn(4, 2, 8) - 3).to(dtype)
    for layer_loc in (loc, KVWriteLoc(loc)):
        pool.set_kv_buffer(1, layer_loc, k, v)
        assert not pool.k_buffer[1][0].any() and not pool.v_buffer[1][0].any()
        # only slot 0 is skipped: slot 1 (same padding page) and slot 5 are written
        assert torch.equal(_bits(pool.get_key_buffer(1)[[1, 5]]), _bits(k[[1, 3]]))
        assert torch.equal(_bits(pool.get_value_buffer(1)[[1, 5]]), _bits(v[[1, 3]]))
    assert loc.tolist() == [0, 1, 0, 5]  # the caller's slots are not modified
    assert not pool.k_buffer[0].any()


def test_scale_of_the_wrong_kind_raises_before_writing() -> None:
    pool = _pool(torch.float16)
    k = torch.ones(1, 2, 8)
    with pytest.raises(TypeError, match="k_scale must be a number, a tensor or None, got str"):
        pool.set_kv_buffer(0, torch.tensor([1]), k, k, k_scale="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="v_scale must be"):
        pool.set_kv_buffer(0, torch.tensor([1]), k, k, v_scale=True)
    assert not pool.k_buffer[0].any() and not pool.v_buffer[0].any()
    pool.set_kv_buffer(0, torch.tensor([1]), k.float() * 4, k.float() * 4, torch.tensor(2.0), 4)
    assert pool.k_buffer[0][1].tolist() == torch.full((2, 8), 2.0).tolist()
    assert pool.v_buffer[0][1].tolist() == torch.ones(2, 8).tolist()


def test_layer_below_start_layer_raises_instead_of_writing_the_last_layer() -> None:
    # deliberate deviation (README): SGLang indexes k_buffer[layer_id - start_layer], so layer 2
    # of a pool holding layers [3, 5) would silently write local layer -1, the last one
    pool = _pool(torch.float16, start_layer=3)
    k = torch.ones(1, 2, 8)
    for call in (
        lambda: pool.set_kv_buffer(2, torch.tensor([1]), k, k),
        lambda: pool.set_kv_buffer(4, torch.tensor([1]), k, k, layer_id_override=2),
        lambda: pool.get_key_buffer(2),
    ):
        with pytest.raises(ValueError, match=r"layer(_id|_id_override)? must lie in \[3, 5\), "):
            call()
    assert not any(t.any() for t in (*pool.k_buffer, *pool.v_buffer))


def test_cpu_copy_takes_sglang_0_5_23_keywords() -> None:
    # SGLang 0.5.23: get_cpu_copy(indices, mamba_indices=None, req_pool_index=None); the
    # allocator forwards mamba_indices, and a KV pool ignores it
    pool = _pool(torch.float32)
    pool.set_kv_buffer(0, torch.tensor([1, 2]), torch.ones(2, 2, 8), torch.ones(2, 2, 8))
    copy = pool.get_cpu_copy(torch.tensor([1, 2]), mamba_indices=None, req_pool_index=3)
    pool.load_cpu_copy(copy, torch.tensor([5, 6]), torch.tensor([0]), req_pool_index=3)
    assert torch.equal(pool.k_buffer[0][[5, 6]], torch.ones(2, 2, 8))


def test_set_kv_buffer_follows_a_replaced_layer_buffer() -> None:
    """The pool keeps each layer's byte-row views between writes; a buffer replaced in
    ``k_buffer`` or ``v_buffer`` (SGLang's post-capture assignment does this), or given other
    memory in place (``set_``), is written from the next write on, the old one left alone."""
    pool = _pool(torch.bfloat16)
    k = (torch.randn(2, 2, 8) + 3).to(torch.bfloat16)
    loc = torch.tensor([1, 6])
    pool.set_kv_buffer(1, loc, k, -k)
    for step, role in enumerate(("k", "v", "k-set_", "v-set_")):
        buffers = pool.k_buffer if role.startswith("k") else pool.v_buffer
        old = buffers[1]
        before = old[[1, 6]].clone()
        if role.endswith("set_"):
            old.set_(torch.zeros_like(old))  # same tensor object, new memory
        else:
            buffers[1] = torch.zeros_like(old)
        scale = step + 2
        pool.set_kv_buffer(1, loc, scale * k, -scale * k)
        assert torch.equal(_bits(pool.k_buffer[1][[1, 6]]), _bits(scale * k)), role
        assert torch.equal(_bits(pool.v_buffer[1][[1, 6]]), _bits(-scale * k)), role
        if not role.endswith("set_"):
            assert torch.equal(_bits(old[[1, 6]]), _bits(before)), role  # no stale view
