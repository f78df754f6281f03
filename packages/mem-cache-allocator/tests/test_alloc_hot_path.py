"""The hot path never needs device data on the host: run it on the ``meta`` device.

Meta tensors carry shapes but no data, so any device->host read (``.item()``, ``.tolist()``,
``torch.unique``, boolean-mask indexing, ``nonzero``...) raises. Allocation, free, free groups,
``need_sort`` merges, backups and ``available_size`` must all work there; only the lengths'
``*_cpu`` copies live on the CPU.

The allocation kernels are stubbed here (they write ``out`` without reading data): on GPUs they
run as Triton kernels; this test covers the allocator's own code around them.
"""

from __future__ import annotations

import pytest
import torch

from mem_cache_allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator, page_allocator
from mem_cache_allocator.swa import SWATokenToKVPoolAllocator

META = torch.device("meta")
F16 = torch.float16


@pytest.fixture(autouse=True)
def _stub_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    def fill(*args: torch.Tensor | int, num_new_pages: int, **kw: int) -> None:
        # (..., free_pages, out, page_size; num_new_pages=): the host-side page count is passed
        free, out = args[-3], args[-2]
        assert isinstance(out, torch.Tensor) and isinstance(free, torch.Tensor)
        assert free.shape[0] == num_new_pages
        out.fill_(0)

    # the trusted kernel bodies the allocator picks (after its own checks)
    monkeypatch.setattr(page_allocator, "pick", lambda op, backend, *tensors: fill)


def cpu(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def dev(*values: int) -> torch.Tensor:
    return cpu(*values).to(META)


@pytest.mark.parametrize("need_sort", [False, True])
def test_alloc_paged_hot_path_is_sync_free(need_sort: bool) -> None:
    a = PagedTokenToKVPoolAllocator(256, 4, F16, META, None, need_sort)
    x = a.alloc(8)
    assert x is not None and x.device == META and x.shape == (8,)
    ext = a.alloc_extend(dev(0, 2), cpu(0, 2), dev(5, 11), cpu(5, 11), dev(-1, 5), 14)
    assert ext is not None and ext.shape == (14,) and ext.dtype == torch.int64
    dec = a.alloc_decode(dev(6, 12), cpu(6, 12), dev(12, 22))
    assert dec is not None and dec.shape == (2,)
    z = a.alloc(4)
    assert z is not None
    used = 8 + 4 * 4 + 4
    assert a.available_size() == 256 - used
    a.free_group_begin()
    a.free_segments([(ext[:5], 0)])  # request 1: 2 pages
    a.free_segment(ext[7:], start_pos=4)  # request 2 after x's page: 2 pages
    a.free_segment(x[4:], start_pos=4)  # page 2
    a.free_group_end()
    # request 2's prefix (slots 4, 5) and positions 2, 3 (slots 6, 7): page 1, shared by two
    # segments, released once
    a.free_segments([(x[:2], 0), (ext[5:7], 2)])
    a.free_page_ids(z[:1] // 4)
    assert a.available_size() == 256
    state = a.backup_state()
    big = a.alloc(a.available_size())  # forces a need_sort merge when staged pages exist
    assert big is not None and a.available_size() == 0
    assert a.alloc(4) is None
    a.restore_state(state)
    assert a.available_size() == 256


def test_alloc_token_hot_path_is_sync_free() -> None:
    a = TokenToKVPoolAllocator(64, F16, META, None, need_sort=True)
    x = a.alloc(10)
    assert x is not None and x.device == META
    a.free(x[:5])
    d = a.alloc_decode(dev(3, 4), cpu(3, 4), dev(1, 2))
    assert d is not None and d.shape == (2,)
    y = a.alloc(a.available_size())
    assert y is not None and a.available_size() == 0


def test_alloc_swa_allocation_is_sync_free() -> None:
    a = SWATokenToKVPoolAllocator(128, 64, 4, F16, META, None)
    ext = a.alloc_extend(dev(0), cpu(0), dev(6), cpu(6), dev(-1), 6)
    assert ext is not None and ext.shape == (6,)
    dec = a.alloc_decode(dev(7), cpu(7), ext[-1:])
    assert dec is not None and a.available_size() == 64 - 8


def test_alloc_meta_device_detects_syncs() -> None:
    """The probe can fail: the set-shaped ``free`` deduplicates (``torch.unique``, a sync)."""
    a = PagedTokenToKVPoolAllocator(64, 4, F16, META, None)
    x = a.alloc(8)
    assert x is not None
    with pytest.raises((NotImplementedError, RuntimeError)):
        a.free(x)
    a.free_group_begin()
    a.free(x)  # queued: no sync yet
    with pytest.raises((NotImplementedError, RuntimeError)):
        a.free_group_end()  # the group's one dedup
