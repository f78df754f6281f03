"""SGLang's attention-backend write calls on our device pools, byte-for-byte against SGLang's own.

Every SGLang 0.5.23 attention backend writes K/V with ``token_to_kv_pool.set_kv_buffer(layer,
loc, k, v, k_scale, v_scale)`` (torch-native / triton backends: ``layer`` is the
``RadixAttention`` module, read for ``layer.layer_id``), MLA backends with
``set_mla_kv_buffer(layer, loc, k_nope, k_rope)`` and read back with
``get_key_buffer(layer.layer_id)`` / ``get_value_buffer`` / ``get_kv_buffer`` /
``get_mla_kv_buffer(layer, loc, dtype)``. Here the same calls go to SGLang's real pools
(constructed on the CPU from the wheel) and to ours; the stored buffers must be bitwise equal.

CPU limits of SGLang's side (stated, not hidden): its MLA ``set_mla_kv_buffer`` /
``get_mla_kv_buffer`` and DSA index writes run Triton kernels (no CPU path), so for MLA/DSA
SGLang's ``set_kv_buffer`` with the concatenated row is the reference for our
``set_mla_kv_buffer``; its CPU MHA store is plain indexing, which writes slot 0 (the CUDA
``store_cache`` kernel, which ours follows, skips it), so the compared writes avoid slot 0 and a
separate check pins our padding-slot behaviour.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest
import torch

from mem_cache_pool import (
    DSATokenToKVPool,
    KVWriteLoc,
    MHATokenToKVPool,
    MLATokenToKVPool,
    SWAKVPool,
)

Load = Callable[..., list[types.ModuleType]]
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
FP8 = torch.float8_e4m3fn


class Layer:
    """The part of SGLang's ``RadixAttention`` the pools read."""

    def __init__(self, layer_id: int, *, k_scale: float | None = None) -> None:
        self.layer_id = layer_id
        self.k_scale = k_scale
        self.v_scale = k_scale
        self.is_cross_attention = False


@pytest.fixture(scope="module")
def mp(sglang_load: Load) -> types.ModuleType:
    (mod,) = sglang_load("sglang.srt.mem_cache.memory_pool")
    return mod


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    assert torch.equal(_bits(a), _bits(b))


def _locs(gen: torch.Generator, n: int, rows: int) -> torch.Tensor:
    return torch.randperm(rows - 1, generator=gen)[:n] + 1  # distinct, never the padding slot


@pytest.mark.parametrize(
    ("dtype", "src", "v_head_dim", "scale"),
    [
        (BF16, BF16, None, None),
        (F16, F32, None, None),
        (BF16, F32, 4, None),  # asymmetric K/V: two allocations
        (FP8, BF16, None, 0.5),  # fp8 stored as uint8, scaled on the way in
    ],
)
def test_mha_set_kv_buffer_matches_sglang(
    mp: types.ModuleType,
    dtype: torch.dtype,
    src: torch.dtype,
    v_head_dim: int | None,
    scale: float | None,
) -> None:
    args: dict[str, Any] = dict(
        size=60, page_size=4, dtype=dtype, head_num=2, head_dim=8, layer_num=3, device="cpu",
        enable_memory_saver=False, v_head_dim=v_head_dim, start_layer=2,
    )  # fmt: skip
    # SGLang's end_layer is the last layer (inclusive), ours the half-open bound
    theirs = mp.MHATokenToKVPool(**args, end_layer=4)
    ours = MHATokenToKVPool(**args, end_layer=5)
    gen = torch.Generator().manual_seed(0)
    vd = v_head_dim or 8
    for step in range(6):
        layer = Layer(2 + step % 3)
        loc = _locs(gen, 5, 64)
        if step % 2:
            loc = loc.to(torch.int32)
        k = torch.randn(5, 2, 8, generator=gen).to(src)
        v = torch.randn(5, 2, vd, generator=gen).to(src)
        # SGLang divides its inputs in place: hand each side its own copy
        theirs.set_kv_buffer(layer, loc, k.clone(), v.clone(), scale, scale)
        ours.set_kv_buffer(layer, KVWriteLoc(loc) if step == 3 else loc, k, v, scale, scale)
    for lid in (2, 3, 4):
        _same(ours.get_key_buffer(lid), theirs.get_key_buffer(lid))
        _same(ours.get_value_buffer(lid), theirs.get_value_buffer(lid))
        for a, b in zip(ours.get_kv_buffer(Layer(lid)), theirs.get_kv_buffer(lid)):
            _same(a, b)
    assert ours.get_v_head_dim() == theirs.get_v_head_dim() == vd
    assert ours.get_kv_size_bytes() == tuple(int(x) for x in theirs.get_kv_size_bytes())


def test_mha_layout_matches_sglang(mp: types.ModuleType) -> None:
    """K and V as two block-aligned halves of one allocation: shapes, strides, V's offset from
    K and the pointer/stride tables are SGLang's."""
    for size, ps in ((60, 4), (30, 8), (16, 1)):
        args: dict[str, Any] = dict(
            size=size, page_size=ps, dtype=BF16, head_num=2, head_dim=8, layer_num=2,
            device="cpu", enable_memory_saver=False,
        )  # fmt: skip
        theirs, ours = mp.MHATokenToKVPool(**args), MHATokenToKVPool(**args)
        for a, b in ((ours.k_buffer, theirs.k_buffer), (ours.v_buffer, theirs.v_buffer)):
            for x, y in zip(a, b):
                assert x.shape == y.shape and x.stride() == y.stride()
                assert x.is_contiguous() and y.is_contiguous()
        for i in range(2):
            gap = ours.v_buffer[i].data_ptr() - ours.k_buffer[i].data_ptr()
            assert gap == theirs.v_buffer[i].data_ptr() - theirs.k_buffer[i].data_ptr()
        assert torch.equal(ours.data_strides, theirs.data_strides.to(torch.int64))
        ptrs = ours.data_ptrs.view(torch.int64).tolist()
        assert ptrs == [t.data_ptr() for t in (*ours.k_buffer, *ours.v_buffer)]
        assert ours.row_dim == theirs.row_dim and ours.v_row_dim == theirs.v_row_dim
        assert ours.model_layer_ids == theirs.model_layer_ids
        assert ours.kv_cache_layout == theirs.kv_cache_layout == "nhd"
        ours_info, theirs_info = ours.get_contiguous_buf_infos(), theirs.get_contiguous_buf_infos()
        assert ours_info[1:] == tuple(list(map(int, x)) for x in theirs_info[1:])


def test_mha_padding_slot_is_skipped_as_sglangs_cuda_kernel_does() -> None:
    pool = MHATokenToKVPool(16, 4, BF16, 1, 4, 1, "cpu", False)
    pool.set_kv_buffer(Layer(0), torch.tensor([0, 5]), torch.ones(2, 1, 4), torch.ones(2, 1, 4))
    assert not pool.k_buffer[0][0].any() and pool.k_buffer[0][5].all()


def test_mla_writes_match_sglang(mp: types.ModuleType) -> None:
    args: dict[str, Any] = dict(
        size=60, page_size=4, dtype=BF16, kv_lora_rank=16, qk_rope_head_dim=4, layer_num=2,
        device="cpu", enable_memory_saver=False,
    )  # fmt: skip
    theirs = mp.MLATokenToKVPool(**args, dcp_replicated=True)
    ours = MLATokenToKVPool(**args)
    gen = torch.Generator().manual_seed(1)
    for step in range(4):
        layer = Layer(step % 2)
        loc = _locs(gen, 6, 64)
        nope = torch.randn(6, 1, 16, generator=gen)
        rope = torch.randn(6, 1, 4, generator=gen)
        theirs.set_kv_buffer(layer, loc, torch.cat([nope, rope], -1), None)
        if step % 2:
            ours.set_mla_kv_buffer(layer, loc, nope, rope)
        else:
            ours.set_kv_buffer(layer, loc, torch.cat([nope, rope], -1), None)
        got_nope, got_rope = ours.get_mla_kv_buffer(layer, loc, F32)
        assert got_rope is not None
        _same(got_nope, theirs.get_key_buffer(step % 2)[loc][..., :16].float())
        _same(got_rope, theirs.get_key_buffer(step % 2)[loc][..., 16:].float())
    for lid in (0, 1):
        _same(ours.get_key_buffer(lid), theirs.get_key_buffer(lid))
        _same(ours.get_value_buffer(lid), theirs.get_value_buffer(lid))
    ours_info, theirs_info = ours.get_contiguous_buf_infos(), theirs.get_contiguous_buf_infos()
    assert ours_info[1:] == theirs_info[1:]


def test_swa_writes_route_as_sglang(sglang_load: Load) -> None:
    (swa,) = sglang_load("sglang.srt.mem_cache.swa_memory_pool")
    args: dict[str, Any] = dict(
        size=32, size_swa=16, page_size=4, dtype=BF16, head_num=2, head_dim=8,
        swa_attention_layer_ids=[1, 3], full_attention_layer_ids=[0, 2], device="cpu",
    )  # fmt: skip
    theirs, ours = swa.SWAKVPool(**args), SWAKVPool(**args)
    gen = torch.Generator().manual_seed(2)
    for step in range(8):
        layer = Layer(step % 4)
        full = _locs(gen, 3, 36)
        window = _locs(gen, 3, 20)
        k = torch.randn(3, 2, 8, generator=gen)
        v = torch.randn(3, 2, 8, generator=gen)
        wl = KVWriteLoc(full, window)
        theirs.set_kv_buffer(
            layer, _their_write_loc(sglang_load, full, window), k.clone(), v.clone()
        )
        ours.set_kv_buffer(layer, wl, k, v)
    for lid in range(4):
        _same(ours.get_key_buffer(lid), theirs.get_key_buffer(lid))
        _same(ours.get_value_buffer(lid), theirs.get_value_buffer(lid))
    assert ours.get_v_head_dim() == theirs.get_v_head_dim()
    assert ours.get_kv_size_bytes() == tuple(int(x) for x in theirs.get_kv_size_bytes())


def _their_write_loc(sglang_load: Load, loc: torch.Tensor, swa_loc: torch.Tensor) -> Any:
    (mod,) = sglang_load("sglang.srt.mem_cache.memory_pool")
    return mod.KVWriteLoc(loc, swa_loc)


def test_dsa_latent_writes_match_sglang(mp: types.ModuleType, sglang_load: Load) -> None:
    (rc,) = sglang_load("sglang.srt.runtime_context")
    with rc.get_parallel().override(attn_dcp_size=1):
        theirs = mp.DSATokenToKVPool(
            64, 64, 16, BF16, 4, 2, "cpu", 128, False, 20, dcp_replicated=True
        )
    # SGLang's positional order (kv_lora_rank before dtype)
    ours = DSATokenToKVPool(64, 64, 16, BF16, 4, 2, "cpu", 128, False, 20)
    gen = torch.Generator().manual_seed(3)
    for step in range(4):
        layer = Layer(step % 2)
        loc = _locs(gen, 5, 128)
        nope = torch.randn(5, 1, 16, generator=gen)
        rope = torch.randn(5, 1, 4, generator=gen)
        theirs.set_kv_buffer(layer, loc, torch.cat([nope, rope], -1), None)
        ours.set_mla_kv_buffer(layer, loc, nope, rope)
    for lid in (0, 1):
        _same(ours.get_key_buffer(lid), theirs.get_key_buffer(lid))
    assert ours.index_page_size == theirs.index_page_size
    assert [b.shape for b in ours.index_k_with_scale_buffer] == [
        b.shape for b in theirs.index_k_with_scale_buffer
    ]
    assert ours.get_kv_size_bytes() == int(theirs.get_kv_size_bytes())
