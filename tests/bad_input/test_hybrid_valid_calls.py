"""The valid calls of the hybrid linear-attention pools' error-rule rows, and what each changes.

``packages/mem-cache-pool/tests/test_pool_error_rule.py`` (``MambaPool``,
``HybridReqToTokenPool``, ``HybridLinearKVPool``) and
``packages/mem-cache-pool-host/tests/test_host_error_rule.py`` (``MambaPoolHost``) feed every
argument of these methods its hostile kinds; here the same valid calls run on the same subjects
and each is checked for the state it promises (bit-exact), and a failed physical transfer of the
host pool is checked to change nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from mem_cache_pool import Mamba2CacheParams, Mamba2StateShape
from tests.bad_input._subjects import _hybrid_kv, _hybrid_rows, _mamba_host, _mamba_pool


def _i(*v: int) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.int64)


def _states(pool: Any) -> list[torch.Tensor]:
    """A MambaPool's slot-indexed state tensors ``[layers, slots, ...]`` (conv..., temporal)."""
    return [*pool.mamba_cache.conv, pool.mamba_cache.temporal]


def _fill(pool: Any, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    for t in _states(pool):
        t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
    return [t.clone() for t in _states(pool)]


def _req() -> Any:
    return SimpleNamespace(
        kv=SimpleNamespace(req_pool_idx=None, mamba_pool_idx=None,
                           mamba_ping_pong_track_buffer=None))


class _Sibling:
    def __init__(self) -> None:
        self.reset: list[list[int]] = []

    def reset_slots(self, indices: torch.Tensor) -> None:
        self.reset.append(indices.tolist())

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        pass

    def get_cpu_slots(self, indices: torch.Tensor) -> list[object]:
        return []

    def load_cpu_slots(self, data: object, indices: torch.Tensor) -> None:
        pass

    def iter_transfer_state_entries(self) -> list[object]:
        return []


# ----------------------------------------------------------------------------- MambaPool
def test_mamba_pool_slot_operations_move_exactly_the_named_slots() -> None:
    pool = _mamba_pool()
    before = _fill(pool)
    pool.clear_slots(_i(1, 2))
    for t, b in zip(_states(pool), before):
        assert not t[:, [1, 2]].any()
        assert torch.equal(t[:, [0, 3, 4, 5, 6]], b[:, [0, 3, 4, 5, 6]])

    before = _fill(pool, 1)
    pool.copy_from(_i(1, 2), _i(3, 4))
    for t, b in zip(_states(pool), before):
        assert torch.equal(t[:, [3, 4]], b[:, [1, 2]])
        assert torch.equal(t[:, [0, 1, 2, 5, 6]], b[:, [0, 1, 2, 5, 6]])

    before = _fill(pool, 2)
    conv_cpu, temporal_cpu = pool.get_cpu_copy(_i(1, 2))
    assert [torch.equal(c, b[:, [1, 2]]) for c, b in zip(conv_cpu, before)] == [True]
    assert torch.equal(temporal_cpu, before[-1][:, [1, 2]])
    assert all(torch.equal(t, b) for t, b in zip(_states(pool), before))  # a read

    pool.load_cpu_copy((conv_cpu, temporal_cpu), _i(3, 4))
    for t, b in zip(_states(pool), before):
        assert torch.equal(t[:, [3, 4]], b[:, [1, 2]])
        assert torch.equal(t[:, [0, 1, 2, 5, 6]], b[:, [0, 1, 2, 5, 6]])


def test_mamba_pool_layer_views_and_registered_siblings() -> None:
    pool = _mamba_pool()
    layer = pool.mamba2_layer_cache(1)
    assert layer.conv[0].data_ptr() == pool.mamba_cache.conv[0][1].data_ptr()
    assert layer.temporal.data_ptr() == pool.mamba_cache.temporal[1].data_ptr()
    sibling = _Sibling()
    pool.register_slot_state(sibling)
    pool.clear_slots(_i(1, 2))
    assert sibling.reset == [[1, 2]]


# ----------------------------------------------------------------------------- HybridReqToTokenPool
def test_hybrid_rows_bind_track_and_free_state_slots() -> None:
    pool = _hybrid_rows()
    free_slots = pool.mamba_allocator.available_size()
    r = _req()
    assert pool.alloc([r]) == [4]
    slot, tracks = int(r.kv.mamba_pool_idx), r.kv.mamba_ping_pong_track_buffer.tolist()
    assert (slot, tracks) == (1, [2, 3])
    assert pool.mamba_allocator.available_size() == free_slots - 3
    assert pool.get_mamba_indices(_i(4)).tolist() == [1]
    assert pool.req_index_to_mamba_ping_pong_track_buffer_mapping[4].tolist() == [2, 3]
    assert torch.equal(pool.translate_mamba_indices(_i(1, 5)), _i(1, 5))
    assert (pool.mamba2_layer_index(0), pool.mamba2_layer_index(2)) == (0, 1)
    assert pool.mamba2_layer_cache(2).temporal.data_ptr() == (
        pool.mamba_pool.mamba_cache.temporal[1].data_ptr())
    assert pool.get_mamba_ping_pong_other_idx(0) == 1

    before = _fill(pool.mamba_pool)
    pool.copy_mamba_state(_i(1), _i(5))
    for t, b in zip(_states(pool.mamba_pool), before):
        assert torch.equal(t[:, 5], b[:, 1]) and torch.equal(t[:, :5], b[:, :5])

    pool.set_mamba_ping_pong_slot(r, 1, -1)
    assert r.kv.mamba_ping_pong_track_buffer.tolist() == [2, -1]
    assert pool.req_index_to_mamba_ping_pong_track_buffer_mapping[4].tolist() == [2, -1]
    assert r.kv.mamba_ping_pong_empty == [False, True]
    pool.set_mamba_ping_pong_slot(r, 1, _i(3)[0])
    assert r.kv.mamba_ping_pong_empty == [False, False]

    keep = pool.get_mamba_ping_pong_keep_idx(r)
    assert keep == r.kv.mamba_last_track_idx
    held = int(r.kv.mamba_ping_pong_track_buffer[keep])
    donated = pool.donate_mamba_ping_pong_slot(r, _i(5))
    assert donated.tolist() == [held] and int(r.kv.mamba_ping_pong_track_buffer[keep]) == 5
    assert pool.req_index_to_mamba_ping_pong_track_buffer_mapping[4, keep].item() == 5

    free_before = pool.mamba_allocator.available_size()
    pool.free_mamba_cache(r)
    assert r.kv.mamba_pool_idx is None and r.kv.mamba_ping_pong_track_buffer is None
    assert pool.mamba_allocator.available_size() == free_before + 3  # state + two tracks


def test_hybrid_rows_wait_for_the_layer_and_clone_a_draft_pool() -> None:
    pool = _hybrid_rows()
    waits: list[int] = []
    pool.register_layer_transfer_counter(SimpleNamespace(wait_until=waits.append))
    pool.mamba2_layer_index(2)
    assert waits == [2]
    pool.register_layer_transfer_counter(None)
    assert pool.layer_transfer_counter is None

    params = Mamba2CacheParams(
        shape=Mamba2StateShape(conv=[(4, 3)], temporal=(2, 2, 2), conv_kernel=4), layers=[0, 2])
    clone = pool.clone_with_new_mamba(mamba_size=4, mamba_spec_state_size=2, cache_params=params,
                                      device="cpu", enable_mamba_extra_buffer=True,
                                      draft_model_idx=0)
    assert clone.req_to_token is pool.req_to_token
    assert clone.req_index_to_mamba_index_mapping is pool.req_index_to_mamba_index_mapping
    assert clone.mamba_pool is not pool.mamba_pool
    assert clone.mamba_pool.mamba_cache.temporal.shape[0] == 1  # the one draft layer
    assert pool.mamba_pool.mamba_cache.temporal.shape[0] == 2  # the original is untouched


# ----------------------------------------------------------------------------- HybridLinearKVPool
def test_hybrid_kv_addresses_global_full_attention_layers() -> None:
    kv = _hybrid_kv()
    k = torch.randn(2, 2, 4, generator=torch.Generator().manual_seed(3))
    v = torch.randn(2, 2, 4, generator=torch.Generator().manual_seed(4))
    kv.set_kv_buffer(1, _i(4, 5), k, v)
    assert torch.equal(kv.get_key_buffer(1)[4:6], k.half())
    assert torch.equal(kv.get_value_buffer(1)[4:6], v.half())
    keys, values = kv.get_kv_buffer(1)
    assert torch.equal(keys, kv.get_key_buffer(1)) and torch.equal(values, kv.get_value_buffer(1))
    assert kv.layer_index(1) == 0
    assert not kv.get_key_buffer(1)[[0, 1, 2, 3, 6, 7]].any()

    kv.move_kv_cache(_i(8, 9), _i(4, 5))
    assert torch.equal(kv.get_key_buffer(1)[8:10], k.half())
    assert torch.equal(kv.get_value_buffer(1)[8:10], v.half())

    waits: list[int] = []
    kv.register_layer_transfer_counter(SimpleNamespace(wait_until=waits.append))
    kv.get_key_buffer(1)
    assert waits == [1]


def test_hybrid_kv_cpu_copy_carries_kv_and_states() -> None:
    kv = _hybrid_kv()
    k = torch.randn(2, 2, 4, generator=torch.Generator().manual_seed(5))
    kv.set_kv_buffer(1, _i(4, 5), k, k + 1)
    states = _fill(kv.mamba_pool)
    cache_cpu = kv.get_cpu_copy(_i(4, 5), _i(1, 2))
    kv.load_cpu_copy(cache_cpu, _i(8, 9), _i(3, 4))
    assert torch.equal(kv.get_key_buffer(1)[8:10], k.half())
    assert torch.equal(kv.get_value_buffer(1)[8:10], (k + 1).half())
    for t, b in zip(_states(kv.mamba_pool), states):
        assert torch.equal(t[:, [3, 4]], b[:, [1, 2]])
        assert torch.equal(t[:, [0, 1, 2, 5, 6]], b[:, [0, 1, 2, 5, 6]])


# ----------------------------------------------------------------------------- MambaPoolHost
def _host_state(h: Any) -> list[torch.Tensor]:
    return [h.temporal_buffer.clone(), *(b.clone() for b in h.conv_buffer),
            h._slots.page_used.clone(), *(t.clone() for t in h._own_states)]


def test_mamba_host_constructor_sizes_the_pool() -> None:
    h = _mamba_host()
    assert h.size == 4 * 1 + 1  # device_capacity x ratio, plus SGLang's extra page
    assert h.temporal_buffer.shape[0] == h.size and not h.temporal_buffer.any()
    assert h.num_mamba_layers == 2 and h.available_size() == h.size


def test_mamba_host_physical_transfers_round_trip_bit_exact() -> None:
    h = _mamba_host()
    device = h._own_states  # conv..., temporal: [layers, slots, ...]
    gen = torch.Generator().manual_seed(6)
    for t in device:
        t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
    saved = [t.clone() for t in device]
    slots = h.alloc(2)
    assert slots is not None
    h.backup_from_device_all_layer_physical(None, slots, _i(1, 2), "kernel")
    for view, d in zip(h._host_views(), device):
        assert torch.equal(view[:, slots], d[:, [1, 2]])

    h.load_to_device_per_layer_physical(None, slots, _i(3, 4), 0, "kernel")
    for d, s in zip(device, saved):
        assert torch.equal(d[0, [3, 4]], s[0, [1, 2]])  # layer 0 loaded
        assert torch.equal(d[1], s[1])  # layer 1 untouched
        assert torch.equal(d[0, [0, 1, 2, 5, 6]], s[0, [0, 1, 2, 5, 6]])


def test_mamba_host_storage_probes() -> None:
    h = _mamba_host()
    temporal_bytes = h.num_mamba_layers * h.temporal_state_elem_size * h.temporal_dtype.itemsize
    assert h.get_page_buffer_element_size(1) == temporal_bytes
    slots = h.alloc(1)
    assert slots is not None
    _, sizes = h.get_page_buffer_meta(slots)
    assert sizes[0] == temporal_bytes  # the first zero-copy range of a slot
    assert h.is_stride_page_aligned(1) is True
    assert h.is_stride_page_aligned(temporal_bytes * 1000 + 1) is False  # no stride divides it


_BAD_TRANSFERS: dict[str, Callable[[Any, torch.Tensor], object]] = {
    "backup, device_indices out of range": lambda h, s: h.backup_from_device_all_layer_physical(
        None, s, _i(1, 99), "kernel"),
    "backup, unknown io_backend": lambda h, s: h.backup_from_device_all_layer_physical(
        None, s, _i(1, 2), "fast"),
    "backup, host slots not allocated": lambda h, s: h.backup_from_device_all_layer_physical(
        None, _i(3, 4), _i(1, 2), "kernel"),
    "load, layer past the last": lambda h, s: h.load_to_device_per_layer_physical(
        None, s, _i(1, 2), 2, "kernel"),
    "load, device_indices shorter": lambda h, s: h.load_to_device_per_layer_physical(
        None, s, _i(1), 0, "kernel"),
}


@pytest.mark.parametrize("case", sorted(_BAD_TRANSFERS))
def test_mamba_host_failed_transfer_changes_nothing(case: str) -> None:
    h = _mamba_host()
    gen = torch.Generator().manual_seed(7)
    for t in (*h._own_states, h.temporal_buffer, *h.conv_buffer):
        t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
    slots = h.alloc(2)
    assert slots is not None
    before = _host_state(h)
    with pytest.raises((TypeError, ValueError)):
        _BAD_TRANSFERS[case](h, slots)
    after = _host_state(h)
    assert all(torch.equal(a, b) for a, b in zip(after, before)), case
