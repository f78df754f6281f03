"""SGLang 0.5.23's DeepSeek-V4 pool surface on ours: real members bit-exact, feature-off answers."""

from __future__ import annotations

import enum
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from mem_cache_kernels.deepseek_v4 import pack_records, quantize_nope, read_records
from mem_cache_pool.deepseek_v4 import (
    CompressedPoolConfig,
    CompressStateLayer,
    DeepSeekV4TokenToKVPool,
)

FP8 = torch.float8_e4m3fn
MakeDeepSeekV4Pool = Callable[..., DeepSeekV4TokenToKVPool]


def _records(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    nope, scales = quantize_nope(torch.randn(n, 448, generator=g))
    return pack_records(nope, scales, torch.randn(n, 64, generator=g).to(torch.bfloat16))


class _Waiter:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def wait_until(self, layer_index: int) -> None:
        self.calls.append(layer_index)


# ----------------------------------------------------------------------------- constructor


def test_constructor_takes_sglangs_keywords_and_sizes_state_by_request_slots(
    make_deepseek_v4_pool: MakeDeepSeekV4Pool,
) -> None:
    pool = make_deepseek_v4_pool()
    assert pool.num_req_slots == 5 and pool.max_num_reqs == 4
    wide = make_deepseek_v4_pool(num_req_slots=10)
    assert wide.num_req_slots == 10
    assert wide.c4_state_pool is not None and wide.c128_state_pool is not None
    assert (wide.c4_state_pool.size, wide.c128_state_pool.size) == (9, 9)  # slots 0..9
    assert wide.get_online_c128_state_num_req_slots() == wide.online_c128_state_num_req_slots == 10

    class Layout(str, enum.Enum):
        V4 = "v4"

    same = make_deepseek_v4_pool(
        kv_layout=Layout.V4, compressed_kv_layout="auto", unified_fp8=False
    )
    assert same.kv_layout == "v4" and same.compressed_kv_layout_option == "auto"
    with pytest.raises(NotImplementedError, match="only the V4 layout"):
        make_deepseek_v4_pool(kv_layout="v41")
    with pytest.raises(ValueError, match="kv_layout must be 'v4'"):
        make_deepseek_v4_pool(kv_layout="uniform_fp8")
    with pytest.raises(ValueError, match="compressed_kv_layout"):
        make_deepseek_v4_pool(compressed_kv_layout="fp4")
    with pytest.raises(TypeError, match="unified_fp8"):
        make_deepseek_v4_pool(unified_fp8=1)
    with pytest.raises(TypeError, match="kv_source_layers"):
        make_deepseek_v4_pool(kv_source_layers="0")
    with pytest.raises(ValueError, match="num_req_slots"):
        make_deepseek_v4_pool(num_req_slots=0)
    assert make_deepseek_v4_pool(
        kv_source_layers=[1], full_size=256, is_draft_worker=True
    ).kv_source_layers == [1]


def test_registries_and_configs(make_deepseek_v4_pool: MakeDeepSeekV4Pool) -> None:
    pool = make_deepseek_v4_pool()
    assert pool.c4_logical_size == 64
    assert pool.compressed_pool_configs == {
        4: CompressedPoolConfig(64, 4, torch.float32, 64),
        128: CompressedPoolConfig(2, 4, torch.float32, None),
    }
    assert pool.kv_pools == {4: pool.c4_kv_pool, 128: pool.c128_kv_pool}
    assert pool.index_pools == {4: pool.c4_indexer_kv_pool}
    assert pool.present_ratios == (4, 128)
    assert pool.sources_by_ratio == {4: [2, 4], 128: [3]}
    assert [pool.source_layer_of(i) for i in (2, 3, 4)] == [2, 3, 4]
    with pytest.raises(ValueError, match="compress ratio 0"):
        pool.source_layer_of(1)
    states = pool.compress_state_pools
    assert len(states) == 5 and states[0] is None and states[1] is None
    s2, s3, s4 = states[2], states[3], states[4]
    assert s2 is not None and s3 is not None and s4 is not None
    assert (s2.pool, s2.layer_index, s2.ratio, s2.request_scoped) == (
        pool.c4_state_pool,
        0,
        4,
        False,
    )
    assert (s4.layer_index, s3.pool, s3.ratio, s3.request_scoped) == (
        1,
        pool.c128_state_pool,
        128,
        True,
    )
    idx = pool.indexer_compress_state_pools
    assert [i is None for i in idx] == [True, True, False, True, False]
    i4 = idx[4]
    assert i4 is not None and i4.pool is pool.c4_indexer_state_pool and i4.kv_state.shape[1] == 16
    only_c4 = make_deepseek_v4_pool(compression_ratios=[0, 4, 0, 4], page_size=16)
    assert only_c4.present_ratios == (4,) and set(only_c4.compressed_pool_configs) == {4}
    assert only_c4.pd_kv_layout() == "v4,c4:v4"


def test_layout_getters(make_deepseek_v4_pool: MakeDeepSeekV4Pool) -> None:
    pool = make_deepseek_v4_pool()
    assert pool.pd_kv_layout() == "v4,c4:v4,c128:v4"
    assert pool.compressed_kv_layout(4) == pool.compressed_kv_layout(128) == "v4"
    assert pool.get_swa_key_layout() == "v4" and pool.get_swa_key_bytes_per_token() == 584
    assert [pool.get_extra_key_page_size(i) for i in (2, 3)] == [32, 1]
    assert pool.get_extra_key_layout(3) == "v4" and pool.get_extra_key_bytes_per_token(2) == 584
    with pytest.raises(ValueError, match="compress ratio 0"):
        pool.get_extra_key_page_size(1)
    with pytest.raises(ValueError, match="layer_id"):
        pool.get_extra_key_layout(5)


# ----------------------------------------------------------------------------- writes and reads


def test_swa_writes_records_packs_and_fused_rows_bit_exact(
    make_deepseek_v4_pool: MakeDeepSeekV4Pool,
) -> None:
    pool = make_deepseek_v4_pool()
    rec = _records(2, seed=1)
    pool.set_swa_key_buffer(2, torch.tensor([5, 9]), rec)
    assert torch.equal(pool.swa_kv_pool.get_key_records(2, torch.tensor([5, 9])), rec)
    nope, scales, rope = (
        rec[:, :448].view(FP8),
        rec[:, 576:583],
        rec[:, 448:576].view(torch.bfloat16),
    )
    pack = SimpleNamespace(k_nope_fp8=nope, k_rope_bf16=rope, scale_k_nope_ue8m0=scales)
    pool.set_swa_key_buffer_radix(3, torch.tensor([6, 7]), pack)
    assert torch.equal(pool.swa_kv_pool.get_key_records(3, torch.tensor([6, 7])), rec)
    k = torch.randn(2, 512)
    pool.set_swa_key_buffer_radix_fused(4, torch.tensor([1, 2]), k)
    q, s = quantize_nope(k[:, :448])
    want = pack_records(q, s, k[:, 448:].to(torch.bfloat16))
    assert torch.equal(pool.swa_kv_pool.get_key_records(4, torch.tensor([1, 2])), want)
    assert pool.get_swa_raw_buffer(4) is pool.swa_kv_pool.kv_buffer[3]
    waiter = _Waiter()
    pool.register_layer_transfer_counter(waiter)
    radix = pool.get_swa_key_buffer_radix(2)
    assert radix.dtype == FP8 and radix.data_ptr() == pool.swa_kv_pool.kv_buffer[1].data_ptr()
    assert torch.equal(read_records(radix.view(torch.uint8), torch.tensor([5, 9]), 4), rec)
    assert waiter.calls == [1]
    with pytest.raises(TypeError, match="cache_nope_fp8_rope_bf16_pack"):
        pool.set_swa_key_buffer(2, torch.tensor([5]), SimpleNamespace(k_nope_fp8=nope))
    with pytest.raises(ValueError, match="cache_nope_fp8_rope_bf16_pack"):
        pool.set_swa_key_buffer(2, torch.tensor([5]), rec)  # 2 records for 1 slot
    assert torch.equal(pool.swa_kv_pool.get_key_records(2, torch.tensor([5, 9])), rec)


def test_extra_key_writes_route_to_the_compressed_pool_bit_exact(
    make_deepseek_v4_pool: MakeDeepSeekV4Pool,
) -> None:
    pool = make_deepseek_v4_pool()
    rec = _records(3, seed=2)
    pool.set_extra_key_buffer(4, torch.tensor([33, 40, 63]), rec)  # c4 local layer 1
    c4, c128 = pool.c4_kv_pool, pool.c128_kv_pool
    assert c4 is not None and c128 is not None
    assert torch.equal(c4.get_key_records(1, torch.tensor([33, 40, 63])), rec)
    assert int(c4.kv_buffer[0].sum()) == 0
    extra = pool.get_extra_key_buffer(4)
    assert extra.dtype == FP8 and torch.equal(extra.view(torch.uint8), c4.kv_buffer[1])
    k = torch.randn(1, 512)
    pool.set_extra_key_buffer_fused(3, torch.tensor([1]), k)
    q, s = quantize_nope(k[:, :448])
    want = pack_records(q, s, k[:, 448:].to(torch.bfloat16))
    rows = pool.get_extra_key_buffer(3).view(torch.uint8)
    assert torch.equal(read_records(rows, torch.tensor([1]), 1), want)
    with pytest.raises(ValueError, match="freqs_cis"):
        pool.set_extra_key_buffer_fused(3, torch.tensor([1]), k, torch.zeros(1, 64))
    with pytest.raises(ValueError, match="compress ratio 0"):
        pool.set_extra_key_buffer(1, torch.tensor([1]), rec[:1])


def test_indexer_fused_store_and_sequence_gather_bit_exact(
    make_deepseek_v4_pool: MakeDeepSeekV4Pool,
) -> None:
    pool = make_deepseek_v4_pool()
    idx = pool.c4_indexer_kv_pool
    assert idx is not None
    x = torch.randn(3, 16) * torch.tensor([[1.0], [100.0], [0.0]])
    loc = torch.tensor([40, 41, 70])
    pool.set_index_k_fused(2, loc, x)
    scale = x.abs().amax(dim=1).clamp_min(1e-8) / 448.0
    keys = (x * (1.0 / scale)[:, None]).clamp(-448, 448).to(FP8)
    got_k, got_s = idx.get_index_k_scale_buffer(0, loc)
    assert torch.equal(got_k.view(torch.uint8), keys.view(torch.uint8))
    assert torch.equal(got_s, scale)
    # sequences: [40, 41] (page 1) and [70] (page 2), gathered through page tables
    pages = torch.tensor([[1, 0], [2, 0]], dtype=torch.int32)
    lens = torch.tensor([10, 7])
    k_rows, s_rows = pool.get_index_k_scale_buffer(2, lens, pages, 17, 10)
    flat = torch.cat([torch.arange(32, 42), torch.arange(64, 71)])
    ref = idx._gather(0, flat)
    assert torch.equal(k_rows, ref[:, :16]) and torch.equal(s_rows, ref[:, 16:])
    assert torch.equal(k_rows[8:10], keys[:2].view(torch.uint8))
    assert torch.equal(s_rows[16].view(torch.float32), scale[2:3])
    assert pool.get_index_k_with_scale_buffer(2) is idx.kv_buffer[0]
    with pytest.raises(ValueError, match="seq_len_sum"):
        pool.get_index_k_scale_buffer(2, lens, pages, 16, 10)
    with pytest.raises(ValueError, match="needs 4"):
        pool.set_index_k_fused(3, loc, x)
    pool.set_index_k_scale_buffer(4, torch.tensor([5]), keys[:1], scale[:1])
    assert torch.equal(idx.get_index_k_scale_buffer(1, torch.tensor([5]))[1], scale[:1])


# ----------------------------------------------------------------------------- compress state


def _fill_states(pool: DeepSeekV4TokenToKVPool) -> None:
    g = torch.Generator().manual_seed(3)
    for state in pool.compress_state_pools:
        if state is not None:
            state.kv_state.copy_(torch.randn(state.kv_state.shape, generator=g))
            state.score_state.copy_(torch.randn(state.score_state.shape, generator=g))


def test_state_views_and_request_scoped_clear(make_deepseek_v4_pool: MakeDeepSeekV4Pool) -> None:
    pool = make_deepseek_v4_pool()
    waiter = _Waiter()
    pool.register_layer_transfer_counter(waiter)
    view = pool.get_attention_compress_states(4)
    assert isinstance(view, CompressStateLayer) and waiter.calls == [3]
    view.set_state(torch.tensor([2]), torch.tensor([9]), torch.ones(1, 8), torch.full((1, 8), 2.0))
    assert pool.c4_state_pool is not None
    assert torch.equal(pool.c4_state_pool.kv_state[1][2 * 8 + 1], torch.ones(8))
    assert pool.get_indexer_compress_states(2).pool is pool.c4_indexer_state_pool
    with pytest.raises(ValueError, match="no compress state"):
        pool.get_attention_compress_states(1)
    with pytest.raises(ValueError, match="no indexer state"):
        pool.get_indexer_compress_states(3)
    _fill_states(pool)
    c4_before = pool.c4_state_pool.kv_state[0].clone()
    c128 = pool.compress_state_pools[3]
    assert c128 is not None and c128.ring_size == 128
    before_kv, before_score = c128.kv_state.clone(), c128.score_state.clone()
    pool.clear_request_scoped_state(2)
    rows = slice(2 * 128, 3 * 128)
    assert int(c128.kv_state[rows].count_nonzero()) == 0
    assert bool((c128.score_state[rows] == float("-inf")).all())
    keep = torch.ones(c128.kv_state.shape[0], dtype=torch.bool)
    keep[rows] = False
    assert torch.equal(c128.kv_state[keep], before_kv[keep])
    assert torch.equal(c128.score_state[keep], before_score[keep])
    assert torch.equal(pool.c4_state_pool.kv_state[0], c4_before)  # not request-scoped
    pool.clear_c4_req_states([1, 2])  # no-op (unified KV off), as SGLang
    assert torch.equal(pool.c4_state_pool.kv_state[0], c4_before)
    with pytest.raises(ValueError, match="req_pool_idx"):
        pool.clear_request_scoped_state(5)


def test_clear_unaccepted_c128_draft_states_clears_rejected_rows_only(
    make_deepseek_v4_pool: MakeDeepSeekV4Pool,
) -> None:
    pool = make_deepseek_v4_pool(online_mtp_max_draft_tokens=3)  # c128 ring 256
    _fill_states(pool)
    c128 = pool.compress_state_pools[3]
    assert c128 is not None and c128.ring_size == 256
    kv, score = c128.kv_state.clone(), c128.score_state.clone()
    req, seq, acc = torch.tensor([1, 3]), torch.tensor([254, 10]), torch.tensor([1, 4])
    pool.clear_unaccepted_c128_draft_states(req, seq, acc, 4)
    # request 1: drafts 1..3 at (254 + d) % 256 = 255, 0, 1; request 3: none rejected
    cleared = [1 * 256 + 255, 1 * 256 + 0, 1 * 256 + 1]
    kv[cleared], score[cleared] = 0, float("-inf")
    assert torch.equal(c128.kv_state, kv) and torch.equal(c128.score_state, score)
    pool.clear_unaccepted_c128_draft_states(req, seq, torch.zeros(2, dtype=torch.long), 1)
    assert torch.equal(c128.kv_state, kv)  # one draft token: nothing to clear
    with pytest.raises(ValueError, match="accept_lens"):
        pool.clear_unaccepted_c128_draft_states(req, seq, acc[:1], 4)


def test_request_state_transfer_indices_and_buf_infos(
    make_deepseek_v4_pool: MakeDeepSeekV4Pool,
) -> None:
    pool = make_deepseek_v4_pool()
    assert pool.request_state_transfer_indices(3, 0).tolist() == []
    assert pool.request_state_transfer_indices(3, 256).tolist() == []
    out = pool.request_state_transfer_indices(3, 300)
    assert type(out).__name__ == "ndarray" and str(out.dtype) == "int32" and out.tolist() == [3]
    spec = make_deepseek_v4_pool(
        online_mtp_max_draft_tokens=2
    )  # ring 256: two 128-row pages per request
    assert spec.request_state_transfer_indices(3, 300).tolist() == [3 * 2 + 0]
    assert spec.request_state_transfer_indices(3, 200).tolist() == [3 * 2 + 1]
    c128 = pool.compress_state_pools[3]
    assert c128 is not None
    ptrs, lens, items = pool.get_request_state_buf_infos()
    assert ptrs == [c128.kv_state.data_ptr(), c128.score_state.data_ptr()]
    assert lens == [c128.kv_state.nbytes] * 2 and items == [128 * 8 * 4] * 2
    no_c128 = make_deepseek_v4_pool(compression_ratios=[0, 4, 0, 4], page_size=16)
    assert no_c128.get_request_state_buf_infos() == ([], [], [])
    with pytest.raises(ValueError, match="no request-scoped"):
        no_c128.request_state_transfer_indices(1, 3)


def test_contiguous_buf_infos_follow_sglangs_pd_order(
    make_deepseek_v4_pool: MakeDeepSeekV4Pool,
) -> None:
    pool = make_deepseek_v4_pool()
    c4, c128, idx = pool.c4_kv_pool, pool.c128_kv_pool, pool.c4_indexer_kv_pool
    assert c4 is not None and c128 is not None and idx is not None
    bufs = [*c4.kv_buffer, *idx.kv_buffer, *c128.kv_buffer]
    ptrs, lens, items = pool.get_contiguous_buf_infos()
    assert ptrs == [b.data_ptr() for b in bufs]
    assert lens == [b.nbytes for b in bufs] and items == [b[0].nbytes for b in bufs]


# ----------------------------------------------------------------------------- features off


def test_feature_off_members_answer_as_sglang_with_the_feature_off(
    make_deepseek_v4_pool: MakeDeepSeekV4Pool,
) -> None:
    pool = make_deepseek_v4_pool()
    assert (pool.uniform_fp8, pool.needs_paged_swa_allocator) == (False, True)
    assert pool.swa_valid_from is None and pool.unified_kv_pool is None
    assert pool.online_c128_mtp_pending_seq_lens is None
    assert (pool.unified_swa_window, pool.unified_swa_ring_size, pool.unified_swa_pages) == (
        None,
        None,
        None,
    )
    assert pool.get_online_c128_mtp_state_slot_offset() == 0
    assert pool.get_online_c128_mtp_max_draft_tokens() == 0
    assert pool.get_swa_valid_from_buf_infos() == ([], [], [])
    assert pool.get_unified_swa_ring_buf_infos() == ([], [], [])
    assert pool.unified_rope_region_buffers(4) is None
    assert pool.low_ratio_index_k_is_split(2) is False and pool.low_ratio_index_k_page8(4) is False
    assert pool.low_ratio_index_k_page8_ratios() == frozenset()
    with pytest.raises(ValueError, match="needs 4"):
        pool.low_ratio_index_k_is_split(3)
    t = torch.tensor([1])
    raising: list[Callable[[], object]] = [
        pool.get_online_c128_mtp_pending_seq_lens,
        lambda: pool.set_swa_valid_from(t, t),
        lambda: pool.get_unified_kv(2),
        lambda: pool.get_unified_kv_rope(2),
        lambda: pool.unified_region_buffers(4),
        lambda: pool.set_unified_key_buffer_radix_fused_norm_rope(2, t, t, t, 1e-6, t, t),
        lambda: pool.set_index_k_fp4(2, t, t),
        lambda: pool.get_index_k_fp4_payload_buffer(2),
        lambda: pool.get_index_k_fp4_scale_buffer(2),
        lambda: pool.get_low_ratio_index_k_fp4(2, t),
        lambda: pool.get_low_ratio_index_k_dequant(2),
        lambda: make_deepseek_v4_pool(unified_fp8=True).unified_rope_region_buffers(4),
    ]
    for call in raising:
        with pytest.raises(NotImplementedError):
            call()
