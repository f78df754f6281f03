"""DeepSeek-V4 device pools: page-row geometry, record writes, translation, routing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mem_cache_kernels.deepseek_v4 import dequantize_nope, pack_records, page_row_bytes
from mem_cache_pool.deepseek_v4 import (
    CompressStatePool,
    DeepSeekV4IndexerPool,
    DeepSeekV4SingleKVPool,
    DeepSeekV4TokenToKVPool,
    HiSparseC4DevicePool,
    compressed_last_loc,
    translate_full_to_compressed,
)

FP8 = torch.float8_e4m3fn
MakeDeepSeekV4Pool = Callable[..., DeepSeekV4TokenToKVPool]


def _records(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    nope = torch.randint(0, 256, (n, 448), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 256, (n, 7), dtype=torch.uint8, generator=g)
    rope = torch.randint(-(2**15), 2**15, (n, 64), dtype=torch.int16, generator=g)
    return pack_records(nope, scales, rope.view(torch.bfloat16))


def _single(size: int = 10, ps: int = 4, layers: int = 2, start: int = 0) -> DeepSeekV4SingleKVPool:
    return DeepSeekV4SingleKVPool(size, ps, FP8, 448, 64, layers, "cpu", start_layer=start)


class _Waiter:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def wait_until(self, layer_index: int) -> None:
        self.calls.append(layer_index)


# ----------------------------------------------------------------------------- single pool


def test_single_pool_geometry_and_descriptor() -> None:
    pool = _single(size=10, ps=4, layers=2, start=3)
    # ceil(10 / 4) + 1 = 4 pages (page 0 padding); 4 * 584 = 2336 -> 2880 bytes per page
    assert pool.num_pages == 4 and pool.slot_limit == 16
    assert pool.bytes_per_page_padded == 2880 == page_row_bytes(4)
    assert [tuple(b.shape) for b in pool.kv_buffer] == [(4, 2880), (4, 2880)]
    assert all(b.dtype == torch.uint8 and int(b.sum()) == 0 for b in pool.kv_buffer)
    assert pool.get_key_buffer(4) is pool.kv_buffer[1]
    desc = pool.get_buffer_desc()
    assert desc.roles == ("kv",) and desc.row_bytes == (2880,) and desc.row_shape == ((2880,),)
    assert (desc.size, desc.page_size, desc.layer_num, desc.start_layer) == (3, 1, 2, 3)
    assert desc.store_dtype == torch.uint8
    assert desc.data_ptrs.view(torch.int64).tolist() == [b.data_ptr() for b in pool.kv_buffer]
    assert pool.get_kv_size_bytes() == 2 * 4 * 2880 and pool.mem_usage > 0


def test_single_pool_rejects_bad_geometry() -> None:
    with pytest.raises(ValueError, match=r"dtype must be torch\.float8_e4m3fn"):
        DeepSeekV4SingleKVPool(8, 4, torch.bfloat16, 448, 64, 1, "cpu")
    with pytest.raises(ValueError, match="584-byte record"):
        DeepSeekV4SingleKVPool(8, 4, FP8, 512, 64, 1, "cpu")
    with pytest.raises(NotImplementedError, match="no value buffer"):
        _single().get_value_buffer(0)


def test_set_key_buffer_writes_the_split_layout() -> None:
    pool = _single()
    rec = _records(2)
    pool.set_key_buffer(1, torch.tensor([6, 9]), rec)
    buf = pool.kv_buffer[1]
    # slot 6: page 1, offset 2; slot 9: page 2, offset 1
    assert torch.equal(buf[1, 2 * 576 : 3 * 576], rec[0, :576])
    assert torch.equal(buf[1, 4 * 576 + 2 * 8 : 4 * 576 + 3 * 8], rec[0, 576:])
    assert torch.equal(buf[2, 576:1152], rec[1, :576])
    assert torch.equal(buf[2, 2304 + 8 : 2304 + 16], rec[1, 576:])
    assert int(pool.kv_buffer[0].sum()) == 0
    assert int(buf[:, 2336:].sum()) == 0  # tail padding of every page row
    assert torch.equal(pool.get_key_records(1, torch.tensor([9, 6])), rec.flip(0))


def test_set_key_buffer_validates_before_writing() -> None:
    pool = _single()
    with pytest.raises(ValueError, match=r"loc values must lie in \[0, 16\)"):
        pool.set_key_buffer(0, torch.tensor([3, 16]), _records(2))
    with pytest.raises(ValueError, match="layer_id must lie in"):
        pool.set_key_buffer(2, torch.tensor([3]), _records(1))
    with pytest.raises(ValueError, match=r"records must have shape \(2, 584\), got \(1, 584\)"):
        pool.set_key_buffer(0, torch.tensor([3, 4]), _records(1))
    assert all(int(b.sum()) == 0 for b in pool.kv_buffer)


def test_set_kv_buffer_quantises_and_parts_round_trip() -> None:
    pool = _single()
    g = torch.Generator().manual_seed(3)
    k = torch.randn(3, 1, 512, generator=g).to(torch.bfloat16)
    pool.set_kv_buffer(0, torch.tensor([4, 5, 13]), k, None)
    nope, scales, rope = pool.get_key_parts(0, torch.tensor([4, 5, 13]))
    assert nope.dtype == FP8 and rope.dtype == torch.bfloat16
    assert torch.equal(rope, k[:, 0, 448:])
    err = (dequantize_nope(nope, scales) - k[:, 0, :448].float()).abs()
    assert float(err.max()) <= float(k.float().abs().max()) * 2.0**-4
    pool.set_key_buffer_parts(1, torch.tensor([7, 8, 12]), nope, scales, rope)
    assert torch.equal(
        pool.get_key_records(1, torch.tensor([7, 8, 12])),
        pool.get_key_records(0, torch.tensor([4, 5, 13])),
    )
    with pytest.raises(ValueError, match=r"cache_k must have shape \(1, 512\) or \(1, 1, 512\)"):
        pool.set_kv_buffer(0, torch.tensor([4]), torch.zeros(1, 2, 512))


def test_reads_wait_for_the_layer_once() -> None:
    pool = _single(start=2)
    waiter = _Waiter()
    pool.register_layer_transfer_counter(waiter)
    pool.get_key_buffer(3)
    pool.get_key_records(2, torch.tensor([4]))
    assert waiter.calls == [1, 0]


def test_move_kv_cache_overlapping_reads_before_writes() -> None:
    pool = _single()
    rec = _records(3, seed=5)
    for layer in (0, 1):
        pool.set_key_buffer(layer, torch.tensor([5, 6, 7]), rec)
    pool.move_kv_cache(torch.tensor([6, 7]), torch.tensor([5, 6]))
    for layer in (0, 1):
        got = pool.get_key_records(layer, torch.tensor([5, 6, 7]))
        assert torch.equal(got, rec[[0, 0, 1]])
    with pytest.raises(ValueError, match="tgt_loc must not repeat a slot"):
        pool.move_kv_cache(torch.tensor([9, 9]), torch.tensor([5, 6]))
    with pytest.raises(ValueError, match="indices must not repeat a slot"):
        pool.load_cpu_copy(pool.get_cpu_copy(torch.tensor([5, 6])), torch.tensor([9, 9]))


def test_cpu_copy_round_trip() -> None:
    pool = _single()
    rec = _records(2, seed=9)
    pool.set_key_buffer(0, torch.tensor([4, 11]), rec)
    copy = pool.get_cpu_copy(torch.tensor([4, 11]))
    assert sorted(copy) == ["kv"] and [tuple(t.shape) for t in copy["kv"]] == [(2, 584)] * 2
    other = _single()
    other.load_cpu_copy(copy, torch.tensor([8, 9]))
    assert torch.equal(other.get_key_records(0, torch.tensor([8, 9])), rec)
    with pytest.raises(ValueError, match=r"must be uint8 \(1, 584\)"):
        other.load_cpu_copy(copy, torch.tensor([8]))


# ----------------------------------------------------------------------------- translation


def test_translate_full_to_compressed_hand_worked() -> None:
    full = torch.arange(12)
    # full slots 3, 7, 11 complete a group of 4 -> compressed slots 0, 1, 2
    assert translate_full_to_compressed(full).tolist() == [0, 1, 2]
    assert translate_full_to_compressed(torch.tensor([3, 4, 7, 8, 11])).tolist() == [0, 1, 2]
    assert translate_full_to_compressed(
        torch.tensor([15, 12, 259], dtype=torch.int32)
    ).tolist() == [
        3,
        64,
    ]
    assert translate_full_to_compressed(torch.tensor([127, 255, 200]), 128).tolist() == [0, 1]
    assert translate_full_to_compressed(torch.tensor([], dtype=torch.int64)).numel() == 0


def test_compressed_last_loc_hand_worked() -> None:
    last = torch.tensor([-1, 3, 6, 7, 8, 35])
    assert compressed_last_loc(last).tolist() == [-1, 0, 0, 1, 1, 8]
    # congruence the allocation kernel relies on: (c + 1) % (ps / 4) == (P // 4) % (ps / 4)
    ps = 16
    for prefix in range(1, 40):
        full_last = 5 * ps + (prefix - 1) % ps  # some page, position-congruent offset
        c = int(compressed_last_loc(torch.tensor([full_last]))[0])
        assert (c + 1) % (ps // 4) == (prefix // 4) % (ps // 4)
    with pytest.raises(TypeError, match=r"last_loc must be int32 or int64, got torch\.float32"):
        compressed_last_loc(torch.tensor([1.0]))


def test_hisparse_c4_pool_writes_through_the_mapping() -> None:
    pool = HiSparseC4DevicePool(8, 2, FP8, 448, 64, 1, "cpu")
    assert pool.compress_ratio == 4
    assert pool.translate_loc_from_full_to_compressed(torch.arange(8)).tolist() == [0, 1]
    with pytest.raises(RuntimeError, match="register_mapping"):
        pool.set_key_buffer(0, torch.tensor([1]), _records(1))
    mapping = torch.zeros(12 + 2 + 1, dtype=torch.int64)  # logical c4 size 12, page 2
    mapping[-1] = -1
    mapping[5], mapping[6] = 9, 2
    pool.register_mapping(mapping)
    rec = _records(3, seed=1)
    pool.set_key_buffer(0, torch.tensor([5, 6, 7]), rec)  # logical 7 is unmapped -> slot 0
    assert torch.equal(pool.get_key_records(0, torch.tensor([5, 6])), rec[:2])
    raw = pool.get_cpu_copy(torch.tensor([9, 2, 0]))["kv"][0]  # device slots, no translation
    assert torch.equal(raw, rec)
    pool.transfer_values_on_device(torch.tensor([4]), torch.tensor([9]))
    assert torch.equal(pool.get_cpu_copy(torch.tensor([4]))["kv"][0], rec[:1])
    with pytest.raises(ValueError, match=r"loc values must lie in \[0, 14\)"):
        pool.set_key_buffer(0, torch.tensor([14]), _records(1))
    bad = mapping.clone()
    bad[-1] = 0
    with pytest.raises(ValueError, match="sentinel -1"):
        pool.register_mapping(bad)
    bad = mapping.clone()
    bad[3] = pool.slot_limit
    with pytest.raises(ValueError, match=r"mapping\[:-1\] values must lie in \[0, 10\)"):
        pool.register_mapping(bad)


# ----------------------------------------------------------------------------- indexer / state


@pytest.mark.parametrize("use_fp4", [False, True])
def test_indexer_pool_page_major_layout(use_fp4: bool) -> None:
    pool = DeepSeekV4IndexerPool(8, 4, FP8, 16, 2, "cpu", use_fp4=use_fp4)
    kb = 8 if use_fp4 else 16
    assert pool.key_bytes == kb and tuple(pool.kv_buffer[0].shape) == (3, 4 * (kb + 4))
    keys = torch.randint(0, 256, (2, kb), dtype=torch.uint8)
    scales = torch.tensor([1.5, -0.25])
    pool.set_index_k_scale_buffer(1, torch.tensor([5, 10]), keys, scales)
    buf = pool.kv_buffer[1]
    assert torch.equal(buf[1, kb : 2 * kb], keys[0])  # slot 5: page 1, offset 1
    assert torch.equal(buf[1, 4 * kb + 4 : 4 * kb + 8].view(torch.float32), scales[:1])
    k2, s2 = pool.get_index_k_scale_buffer(1, torch.tensor([10, 5]))
    assert torch.equal(k2.view(torch.uint8), keys.flip(0)) and torch.equal(s2, scales.flip(0))
    assert k2.dtype == (torch.uint8 if use_fp4 else FP8)
    pool.move_kv_cache(torch.tensor([6]), torch.tensor([10]))
    copy = pool.get_cpu_copy(torch.tensor([6]))
    other = DeepSeekV4IndexerPool(8, 4, FP8, 16, 2, "cpu", use_fp4=use_fp4)
    other.load_cpu_copy(copy, torch.tensor([7]))
    k3, s3 = other.get_index_k_scale_buffer(1, torch.tensor([7]))
    assert torch.equal(k3.view(torch.uint8), keys[1:]) and torch.equal(s3, scales[1:])
    assert int(pool.kv_buffer[0].sum()) == 0
    with pytest.raises(TypeError, match=r"index_k_scale must have dtype torch\.float32"):
        pool.set_index_k_scale_buffer(0, torch.tensor([5]), keys[:1], scales[:1].double())


def test_compress_state_ring_addressing() -> None:
    pool = CompressStatePool(3, 8, 4, 2, "cpu")
    assert tuple(pool.kv_state[0].shape) == (32, 4)
    loc = pool.ring_loc(torch.tensor([2, 2, 1]), torch.tensor([9, 17, 7]))
    assert loc.tolist() == [17, 17, 15]  # 2 * 8 + 9 % 8, ring wraps: 17 % 8 == 1
    kv = torch.arange(8.0).view(2, 4)
    pool.set_state(1, torch.tensor([2, 3]), torch.tensor([0, 5]), kv, -kv)
    got_kv, got_score = pool.get_state(1, torch.tensor([3, 2]), torch.tensor([13, 8]))
    assert torch.equal(got_kv, kv.flip(0)) and torch.equal(got_score, -kv.flip(0))
    pool.clear(torch.tensor([2]))
    assert int(pool.kv_state[1][16:24].abs().sum()) == 0
    assert torch.equal(pool.kv_state[1][29], kv[1])
    desc = pool.get_buffer_desc()
    assert desc.roles == ("kv_state", "score_state") and desc.row_bytes == (16, 16)
    assert (desc.size, desc.page_size) == (24, 8)
    with pytest.raises(ValueError, match=r"req_pool_indices values must lie in \[0, 4\)"):
        pool.ring_loc(torch.tensor([4]), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"layer_index must lie in \[0, 2\)"):
        pool.get_state(2, torch.tensor([1]), torch.tensor([0]))


# ----------------------------------------------------------------------------- composite


def test_composite_routes_layers_by_compress_ratio(
    make_deepseek_v4_pool: MakeDeepSeekV4Pool,
) -> None:
    pool = make_deepseek_v4_pool()
    assert (pool.size, pool.page_size, pool.start_layer, pool.end_layer) == (256, 128, 1, 5)
    assert {k: v[:2] for k, v in pool.layer_mapping.items()} == {
        1: (0, -1),
        2: (4, 0),
        3: (128, 0),
        4: (4, 1),
    }
    assert pool.layer_mapping[2][2] is pool.c4_kv_pool
    assert pool.layer_mapping[3][2] is pool.c128_kv_pool
    c4, c128, idx = pool.c4_kv_pool, pool.c128_kv_pool, pool.c4_indexer_kv_pool
    assert c4 is not None and c128 is not None and idx is not None
    assert (c4.page_size, c4.layer_num, type(c4)) == (32, 2, DeepSeekV4SingleKVPool)
    assert (c128.page_size, c128.layer_num, c128.size) == (1, 1, 2)
    assert (idx.size, idx.page_size, idx.layer_num) == (64, 32, 2)
    assert pool.swa_kv_pool.layer_num == 4 and pool.swa_kv_pool.page_size == 4
    assert (pool.c4_ring_size, pool.c128_ring_size) == (8, 128)
    assert sorted(pool.get_buffer_descs()) == [
        "c128",
        "c128_state",
        "c4",
        "c4_indexer",
        "c4_indexer_state",
        "c4_state",
        "swa",
    ]
    assert pool.get_buffer_desc() is pool.swa_kv_pool.get_buffer_desc()
    state, local = pool.get_state_pool(4)
    assert state is pool.c4_state_pool and local == 1
    sub = sum(p.get_total_bytes() for p in (pool.swa_kv_pool, c4, c128, idx))
    states = [pool.c4_state_pool, pool.c4_indexer_state_pool, pool.c128_state_pool]
    assert pool.get_total_bytes() == sub + sum(s.get_total_bytes() for s in states if s)


def test_composite_writes_go_to_the_routed_sub_pool(
    make_deepseek_v4_pool: MakeDeepSeekV4Pool,
) -> None:
    pool = make_deepseek_v4_pool()
    rec = _records(2, seed=4)
    pool.set_compressed_key_buffer(4, torch.tensor([33, 40]), rec)  # c4 local layer 1
    c4 = pool.c4_kv_pool
    assert c4 is not None
    assert torch.equal(c4.get_key_records(1, torch.tensor([33, 40])), rec)
    assert int(c4.kv_buffer[0].sum()) == 0
    pool.set_compressed_key_buffer(3, torch.tensor([1]), rec[:1])
    assert torch.equal(pool.get_compressed_key_buffer(3)[1, :576], rec[0, :576])
    keys = torch.full((1, 16), 7, dtype=torch.uint8)
    pool.set_index_k_scale_buffer(2, torch.tensor([40]), keys, torch.tensor([2.0]))
    assert int(pool.get_indexer_key_buffer(2)[1].sum()) > 0
    with pytest.raises(ValueError, match="compress ratio 0"):
        pool.set_compressed_key_buffer(1, torch.tensor([1]), rec[:1])
    with pytest.raises(ValueError, match="compress ratio 128; the indexer needs 4"):
        pool.set_index_k_scale_buffer(3, torch.tensor([1]), keys, torch.tensor([2.0]))
    k = torch.randn(1, 512)
    with pytest.raises(ValueError, match="swa_loc set"):
        pool.set_kv_buffer(2, torch.tensor([5]), k)
    from mem_cache_pool.base import KVWriteLoc

    pool.set_kv_buffer(2, KVWriteLoc(torch.tensor([130]), torch.tensor([5])), k)
    assert int(pool.swa_kv_pool.get_key_records(2, torch.tensor([5])).sum()) > 0
    assert int(pool.swa_kv_pool.get_key_records(1, torch.tensor([5])).sum()) == 0


def test_composite_mapping_and_hisparse_variant(make_deepseek_v4_pool: MakeDeepSeekV4Pool) -> None:
    pool = make_deepseek_v4_pool(enable_hisparse=True, online_mtp_max_draft_tokens=2)
    assert isinstance(pool.c4_kv_pool, HiSparseC4DevicePool)
    assert (pool.c4_ring_size, pool.c128_ring_size) == (16, 256)
    with pytest.raises(RuntimeError, match="register_mapping"):
        pool.translate_loc_from_full_to_swa(torch.tensor([1]))
    mapping = torch.zeros(256 + 128 + 1, dtype=torch.int64)
    mapping[-1] = -1
    mapping[130] = 5
    pool.register_mapping(mapping)
    assert pool.translate_loc_from_full_to_swa(torch.tensor([130, 131])).tolist() == [5, 0]
    assert pool.translate_loc_from_full_to_compressed(torch.arange(260), 128).tolist() == [0, 1]
    with pytest.raises(ValueError, match="mapping must have 385 elements, got 384"):
        pool.register_mapping(mapping[:-1])
    assert pool.full_kv_pool is None  # SGLang reads it with a default of None
    with pytest.raises(NotImplementedError):
        pool.move_kv_cache(torch.tensor([1]), torch.tensor([2]))


def test_composite_rejects_bad_ratios_and_page_size(
    make_deepseek_v4_pool: MakeDeepSeekV4Pool,
) -> None:
    with pytest.raises(ValueError, match="compression_ratios must hold layer_num=4 values"):
        make_deepseek_v4_pool(compression_ratios=[0, 4, 8, 4])
    with pytest.raises(ValueError, match="page_size must be a multiple of 128"):
        make_deepseek_v4_pool(page_size=64)


# ----------------------------------------------------------------------------- stateful model


class _SingleKVModel(RuleBasedStateMachine):
    """Writes, moves and CPU round trips of a page-row pool against a {(layer, slot): record}
    model; every slot reads back its model record (zeros when never written)."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = _single(size=12, ps=4, layers=2)  # slots [0, 16)
        self.model: dict[tuple[int, int], torch.Tensor] = {}
        self.seed = 0

    def _record(self, n: int) -> torch.Tensor:
        self.seed += 1
        return _records(n, seed=self.seed)

    @rule(
        layer=st.integers(0, 1),
        slots=st.lists(st.integers(0, 15), min_size=1, max_size=5, unique=True),
    )
    def write(self, layer: int, slots: list[int]) -> None:
        rec = self._record(len(slots))
        self.pool.set_key_buffer(layer, torch.tensor(slots), rec)
        for i, s in enumerate(slots):
            self.model[layer, s] = rec[i]

    @rule(
        pairs=st.lists(
            st.tuples(st.integers(0, 15), st.integers(0, 15)),
            min_size=1,
            max_size=4,
            unique_by=lambda p: p[0],
        )
    )
    def move(self, pairs: list[tuple[int, int]]) -> None:
        tgt, src = [t for t, _ in pairs], [s for _, s in pairs]
        self.pool.move_kv_cache(torch.tensor(tgt), torch.tensor(src))
        zero = torch.zeros(584, dtype=torch.uint8)
        old = {(l, s): self.model.get((l, s), zero) for l in (0, 1) for s in src}
        for layer in (0, 1):
            for t, s in pairs:
                self.model[layer, t] = old[layer, s]

    @rule(
        slots=st.lists(st.integers(0, 15), min_size=1, max_size=4, unique=True),
        shift=st.integers(0, 15),
    )
    def retract_and_restore(self, slots: list[int], shift: int) -> None:
        copy = self.pool.get_cpu_copy(torch.tensor(slots))
        dst = [(s + shift) % 16 for s in slots]
        self.pool.load_cpu_copy(copy, torch.tensor(dst))
        zero = torch.zeros(584, dtype=torch.uint8)
        old = {(l, s): self.model.get((l, s), zero) for l in (0, 1) for s in slots}
        for layer in (0, 1):
            for s, d in zip(slots, dst):
                self.model[layer, d] = old[layer, s]

    @invariant()
    def reads_match_the_model(self) -> None:
        zero = torch.zeros(584, dtype=torch.uint8)
        for layer in (0, 1):
            got = self.pool.get_key_records(layer, torch.arange(16))
            want = torch.stack([self.model.get((layer, s), zero) for s in range(16)])
            assert torch.equal(got, want)
            assert int(self.pool.kv_buffer[layer][:, 4 * 584 :].sum()) == 0


TestSingleKVModel = _SingleKVModel.TestCase
TestSingleKVModel.settings = settings(max_examples=12, stateful_step_count=12, deadline=None)


def test_every_store_writes_the_padding_slot_like_sglang(
    make_deepseek_v4_pool: MakeDeepSeekV4Pool,
) -> None:
    # SGLang 0.5.23's DeepSeek-V4 stores (SetKAndS, fused_store_cache, the indexer store) take
    # no skip index: slot 0 is written like any other slot
    pool = _single()
    rec = _records(2, seed=5)
    pool.set_key_buffer(0, torch.tensor([0, 1]), rec)
    assert torch.equal(pool.get_key_records(0, torch.tensor([0, 1])), rec)
    k = torch.randn(1, 512).to(torch.bfloat16)
    pool.set_kv_buffer(1, torch.tensor([0]), k)
    assert torch.equal(pool.get_key_parts(1, torch.tensor([0]))[2], k[:, 448:])
    indexer = DeepSeekV4IndexerPool(8, 4, FP8, 16, 1, "cpu")
    keys = torch.full((1, 16), 9, dtype=torch.uint8)
    indexer.set_index_k_scale_buffer(0, torch.tensor([0]), keys, torch.tensor([0.5]))
    got_k, got_s = indexer.get_index_k_scale_buffer(0, torch.tensor([0]))
    assert torch.equal(got_k.view(torch.uint8), keys) and got_s.tolist() == [0.5]
    composite = make_deepseek_v4_pool()
    composite.set_swa_key_buffer(1, torch.tensor([0]), rec[:1])
    assert torch.equal(composite.swa_kv_pool.get_key_records(1, torch.tensor([0])), rec[:1])


def test_composite_sglang_0_5_23_size_names_and_helpers(
    make_deepseek_v4_pool: MakeDeepSeekV4Pool,
) -> None:
    class Waiter:
        def __init__(self) -> None:
            self.calls: list[int] = []

        def wait_until(self, layer_index: int) -> None:
            self.calls.append(layer_index)

    pool = make_deepseek_v4_pool()
    assert (pool.swa_size, pool.swa_page_size, pool.c128_size) == (16, 4, 2)
    assert pool.full_size == 2 * 128 and pool.num_req_slots == 5
    assert pool.indexer_head_dim == 16 and pool.online_mtp_max_draft_tokens == 0
    assert (pool.get_ring_size(4), pool.get_ring_size(128)) == (8, 128)
    assert make_deepseek_v4_pool(online_mtp_max_draft_tokens=2).get_ring_size(4) == 16
    assert pool.get_swa_key_page_size() == 4
    assert pool.get_index_k_page_size() == 128 // 4
    with pytest.raises(ValueError, match="compress_ratio"):
        pool.get_index_k_page_size(128)
    with pytest.raises(ValueError, match="compress_ratio"):
        pool.get_ring_size(0)
    waiter = Waiter()
    pool.register_layer_transfer_counter(waiter)
    pool.wait_layer_transfer(3)
    assert waiter.calls == [2]
    with pytest.raises(ValueError, match="layer_id"):
        pool.wait_layer_transfer(0)
