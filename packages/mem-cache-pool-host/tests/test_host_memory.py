"""Host memory: exact sizes, close(), chunked registration with rollback, pluggable allocators."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from mem_cache_pool_host import (
    HostAllocation,
    HostTensorAllocator,
    MHATokenToKVPoolHost,
    MmapHostTensorAllocator,
    default_host_tensor_allocator,
)
from mem_cache_pool_host.registration import HostRegistrar, register_chunked

MakePool = Callable[..., Any]


class FakeRegistrar:
    """Records register/unregister calls; fails the ``fail_at``-th register call."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.calls = 0
        self.live: dict[int, int] = {}

    def register(self, ptr: int, nbytes: int) -> None:
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at:
            raise RuntimeError("injected registration failure")
        assert ptr not in self.live
        self.live[ptr] = nbytes

    def unregister(self, ptr: int) -> None:
        del self.live[ptr]


@pytest.mark.parametrize("nbytes", [1, 4095, 4097, 3 * 1024 * 1024 + 7, 5_000_000])
def test_host_allocation_is_exactly_the_requested_size(nbytes: int) -> None:
    alloc = MmapHostTensorAllocator(register=False).allocate(nbytes)
    assert alloc.nbytes == nbytes
    assert alloc.tensor.numel() == nbytes and alloc.tensor.dtype == torch.uint8
    assert alloc.tensor.is_contiguous() and alloc.tensor.device.type == "cpu"
    assert alloc.tensor.data_ptr() % 4096 == 0  # mmap is page aligned
    alloc.tensor[-1] = 7  # the last byte is writable
    assert int(alloc.tensor[-1]) == 7
    assert isinstance(alloc, HostAllocation)


def test_default_allocator_on_cpu_is_plain_memory_with_the_same_api() -> None:
    allocator = default_host_tensor_allocator()
    assert isinstance(allocator, HostTensorAllocator)
    alloc = allocator.allocate(1000)
    assert alloc.pinned is torch.cuda.is_available()
    alloc.close()


def test_close_is_idempotent_and_views_stay_valid() -> None:
    alloc = MmapHostTensorAllocator(register=False).allocate(8192)
    view = alloc.tensor[100:200]
    view.fill_(5)
    alloc.close()
    alloc.close()
    assert alloc.closed
    with pytest.raises(RuntimeError, match="closed"):
        _ = alloc.tensor
    assert int(view.sum()) == 500  # memory lives as long as a view does


def test_transparent_huge_pages_hint_keeps_exact_size() -> None:
    alloc = MmapHostTensorAllocator(huge_pages="transparent", register=False).allocate(3_000_001)
    assert alloc.tensor.numel() == 3_000_001


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"huge_pages": "giant"}, "huge_pages"),
        ({"register": "yes"}, "register"),
        ({"register_chunk_bytes": 0}, "register_chunk_bytes"),
    ],
)
def test_allocator_rejects_bad_options(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MmapHostTensorAllocator(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("nbytes", "error"), [(0, ValueError), (-5, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_allocate_rejects_bad_sizes(nbytes: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="nbytes"):
        MmapHostTensorAllocator(register=False).allocate(nbytes)  # type: ignore[arg-type]


def test_registration_is_chunked_and_undone_on_close() -> None:
    reg = FakeRegistrar()
    assert isinstance(reg, HostRegistrar)
    alloc = MmapHostTensorAllocator(registrar=reg, register_chunk_bytes=4096).allocate(10_000)
    base = alloc.tensor.data_ptr()
    assert alloc.pinned
    assert alloc.registered_chunks == ((base, 4096), (base + 4096, 4096), (base + 8192, 1808))
    assert reg.live == dict(alloc.registered_chunks)
    alloc.close()
    assert reg.live == {} and not alloc.pinned


def test_failed_registration_rolls_back_every_chunk() -> None:
    reg = FakeRegistrar(fail_at=3)
    with pytest.raises(RuntimeError, match="injected"):
        register_chunked(reg, 1 << 20, 5 * 100, 100)
    assert reg.live == {}
    with pytest.raises(RuntimeError, match="injected"):
        MmapHostTensorAllocator(
            registrar=FakeRegistrar(fail_at=2), register_chunk_bytes=64
        ).allocate(1000)


def test_register_true_without_cuda_fails_clearly() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(RuntimeError, match="CUDA"):
        MmapHostTensorAllocator(register=True)


class CountingAllocator:
    """A storage backend's allocator: plain tensors, counts allocations and closes."""

    def __init__(self) -> None:
        self.inner = MmapHostTensorAllocator(register=False)
        self.allocs: list[HostAllocation] = []

    def allocate(self, nbytes: int) -> HostAllocation:
        alloc = self.inner.allocate(nbytes)
        self.allocs.append(alloc)
        return alloc


def test_pool_uses_a_plugged_in_allocator_and_closes_it(make_pool: MakePool) -> None:
    allocator = CountingAllocator()
    device = make_pool("mha", torch.float16, page_size=4, size=32, seed=None)
    host = MHATokenToKVPoolHost(device, allocator=allocator)
    desc = device.get_buffer_desc()
    assert len(allocator.allocs) == 1  # K and V: the halves of one kv_buffer
    assert host.kv_buffer is not None and host.kv_buffer.shape[0] == 2
    assert sum(a.nbytes for a in allocator.allocs) == host.size * desc.bytes_per_token
    assert host.nbytes == host.size * desc.bytes_per_token
    host.close()
    host.close()
    assert all(a.closed for a in allocator.allocs)
    assert host.kv_buffer is None
    with pytest.raises(RuntimeError, match="closed"):
        host.alloc(4)
