"""MambaPool: state shapes and dtypes from the cache parameters, slot operations bit-exact,
retraction round trips, speculative buffers, and the error rule (a failed call changes nothing)."""

from __future__ import annotations

import pytest
import torch

from mem_cache_pool import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape, MambaPool

LAYERS = [0, 2, 3]


def _params(conv: list[tuple[int, ...]] | None = None) -> Mamba2CacheParams:
    shape = Mamba2StateShape.create(
        tp_world_size=1,
        intermediate_size=8,
        n_groups=1,
        num_heads=2,
        head_dim=4,
        state_size=4,
        conv_kernel=4,
    )
    if conv is not None:
        shape = Mamba2StateShape(conv=conv, temporal=shape.temporal, conv_kernel=4)
    return Mamba2CacheParams(shape=shape, layers=LAYERS)


def _pool(**kw: object) -> MambaPool:
    args: dict[str, object] = dict(
        size=6, spec_state_size=3, cache_params=_params(), mamba_layer_ids=LAYERS, device="cpu"
    )
    args.update(kw)
    return MambaPool(**args)  # type: ignore[arg-type]


def _fill(pool: MambaPool, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for t in [*pool.mamba_cache.conv, pool.mamba_cache.temporal]:
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))


def _snapshot(pool: MambaPool) -> list[torch.Tensor]:
    return [t.clone() for t in [*pool.mamba_cache.conv, pool.mamba_cache.temporal]]


def test_shapes_and_dtypes_follow_the_cache_params() -> None:
    p = _params()
    assert p.shape.conv == [(16, 3)] and p.shape.temporal == (2, 4, 4)
    pool = _pool()
    assert pool.mamba_cache.conv[0].shape == (3, 7, 16, 3)
    assert pool.mamba_cache.conv[0].dtype == torch.bfloat16
    assert pool.mamba_cache.temporal.shape == (3, 7, 2, 4, 4)
    assert pool.mamba_cache.temporal.dtype == torch.float32
    assert pool.num_mamba_layers == 3 and pool.mamba_layer_ids == LAYERS
    want = (3 * 7 * 16 * 3 * 2) + (3 * 7 * 32 * 4)
    assert pool.get_kv_size_bytes() == want
    assert pool.mem_usage == pytest.approx(want / 2**30)
    assert p.mamba_cache_per_req == (16 * 3 * 2 + 32 * 4) * 3
    f16 = Mamba2CacheParams(
        shape=p.shape,
        layers=LAYERS,
        dtype=Mamba2StateDType(conv=torch.float16, temporal=torch.bfloat16),
    )
    other = _pool(cache_params=f16)
    assert other.mamba_cache.conv[0].dtype == torch.float16
    assert other.mamba_cache.temporal.dtype == torch.bfloat16


def test_layer_cache_is_a_view_of_one_layer() -> None:
    pool = _pool()
    layer = pool.mamba2_layer_cache(1)
    layer.temporal[4] = 7.0
    assert torch.all(pool.mamba_cache.temporal[1, 4] == 7.0)
    assert torch.all(pool.mamba_cache.temporal[0, 4] == 0)
    with pytest.raises(ValueError, match="layer_id"):
        pool.mamba2_layer_cache(3)


def test_copy_from_is_bit_exact_and_overlap_safe() -> None:
    pool = _pool()
    _fill(pool)
    before = _snapshot(pool)
    pool.copy_from(torch.tensor([1, 2]), torch.tensor([2, 5]))
    for got, old in zip(_snapshot(pool), before):
        want = old.clone()
        want[:, [2, 5]] = old[:, [1, 2]]
        assert torch.equal(got, want)
    pool.copy_from(torch.tensor(3), torch.tensor(4))  # 0-d slots (SGLang's req.kv.mamba_pool_idx)
    assert torch.equal(pool.mamba_cache.temporal[:, 4], pool.mamba_cache.temporal[:, 3])


def test_clear_slots_zeroes_only_those_slots() -> None:
    pool = _pool()
    _fill(pool)
    before = _snapshot(pool)
    pool.clear_slots(torch.tensor([2, 4], dtype=torch.int32))
    for got, old in zip(_snapshot(pool), before):
        assert not got[:, [2, 4]].any()
        keep = [0, 1, 3, 5, 6]
        assert torch.equal(got[:, keep], old[:, keep])


def test_cpu_copy_round_trip_is_bit_exact() -> None:
    pool = _pool(cache_params=_params([(16, 3), (5, 3)]))
    _fill(pool, 1)
    conv_cpu, temporal_cpu = pool.get_cpu_copy(torch.tensor([1, 3]))
    assert [c.shape for c in conv_cpu] == [(3, 2, 16, 3), (3, 2, 5, 3)]
    assert temporal_cpu.device.type == "cpu" and temporal_cpu.shape == (3, 2, 2, 4, 4)
    before = _snapshot(pool)
    pool.load_cpu_copy((conv_cpu, temporal_cpu), torch.tensor([6, 2]))
    for got, old in zip(_snapshot(pool), before):
        assert torch.equal(got[:, [6, 2]], old[:, [1, 3]])
        assert torch.equal(got[:, [0, 1, 3, 4, 5]], old[:, [0, 1, 3, 4, 5]])
    # SGLang's historical 3-tuples are accepted (the third part is dropped)
    pool.load_cpu_copy((conv_cpu, temporal_cpu, None), torch.tensor([5, 4]))
    assert torch.equal(pool.mamba_cache.temporal[:, 5], before[-1][:, 1])


def test_speculative_buffers() -> None:
    pool = _pool(speculative_num_draft_tokens=3)
    spec = pool.get_speculative_mamba2_params_all_layers()
    assert isinstance(spec, MambaPool.SpeculativeState)
    assert spec.intermediate_ssm is not None
    assert spec.intermediate_ssm.shape == (3, 4, 3, 2, 4, 4)
    assert spec.intermediate_conv_window[0].shape == (3, 4, 3, 16, 3)
    layer = pool.mamba2_layer_cache(2)
    assert layer.intermediate_ssm.shape == (4, 3, 2, 4, 4)
    dedup = _pool(speculative_num_draft_tokens=3, dedup_conv_window=True)
    win = dedup.mamba_cache.intermediate_conv_window[0]  # type: ignore[attr-defined]
    assert win.shape == (3, 4, 3, 16, 3)
    win[0, 1, 0, :, 1] = 5.0  # step 0's column 1 is step 1's column 0 (overlapping windows)
    assert torch.all(win[0, 1, 1, :, 0] == 5.0)
    assert dedup.mem_usage < pool.mem_usage
    with pytest.raises(RuntimeError, match="speculative"):
        _pool().get_speculative_mamba2_params_all_layers()


def test_transfer_descriptors() -> None:
    pool = _pool()
    ptrs, lens, items = pool.get_contiguous_buf_infos()
    assert len(ptrs) == 2 * len(LAYERS)
    assert items[0] == 16 * 3 * 2 and items[-1] == 32 * 4
    assert lens[0] == 7 * items[0]
    assert pool.get_state_layer_ids() == LAYERS * 2
    assert pool.get_state_dim_per_tensor() == [16] * 3 + [2] * 3
    assert pool.get_state_slice_outer_counts() == [1] * 6
    assert pool.get_state_conv_shard_groups() == [None] * 6


def test_bad_input_changes_nothing() -> None:
    pool = _pool()
    _fill(pool)
    before = _snapshot(pool)
    with pytest.raises(ValueError, match="src_indices"):
        pool.copy_from(torch.tensor([7]), torch.tensor([1]))
    with pytest.raises(ValueError, match="dst_indices must not repeat"):
        pool.copy_from(torch.tensor([1, 2]), torch.tensor([3, 3]))
    with pytest.raises(ValueError, match="length"):
        pool.copy_from(torch.tensor([1, 2]), torch.tensor([3]))
    with pytest.raises(TypeError, match="indices"):
        pool.clear_slots(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="indices"):
        pool.clear_slots(torch.tensor([-1]))
    conv_cpu, temporal_cpu = pool.get_cpu_copy(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="shape"):
        pool.load_cpu_copy((conv_cpu, temporal_cpu), torch.tensor([3]))
    with pytest.raises(TypeError, match="float32"):
        pool.load_cpu_copy((conv_cpu, temporal_cpu.double()), torch.tensor([3, 4]))
    with pytest.raises(ValueError, match="parts"):
        pool.load_cpu_copy((conv_cpu,), torch.tensor([3, 4]))
    for got, old in zip(_snapshot(pool), before):
        assert torch.equal(got, old)


def test_constructor_errors() -> None:
    with pytest.raises(TypeError, match="cache_params"):
        _pool(cache_params=object())
    with pytest.raises(ValueError, match="mamba_layer_ids"):
        _pool(mamba_layer_ids=[0, 0])
    with pytest.raises(TypeError, match="size"):
        _pool(size=2.0)
    with pytest.raises(NotImplementedError, match="enable_linear_replayssm"):
        _pool(enable_linear_replayssm=True)
    with pytest.raises(NotImplementedError, match="envelope_layout"):
        _pool(envelope_layout=True)
    with pytest.raises(ValueError, match="divisible"):
        Mamba2StateShape.create(
            tp_world_size=2,
            intermediate_size=8,
            n_groups=1,
            num_heads=3,
            head_dim=4,
            state_size=4,
            conv_kernel=4,
        )
