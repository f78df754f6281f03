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
    alloc = MmapHostTensorAllocator(register=False).allocate_bytes(nbytes)
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
    alloc = allocator.allocate_bytes(1000)
    assert alloc.pinned is torch.cuda.is_available()
    alloc.close()


def test_close_is_idempotent_and_views_stay_valid() -> None:
    alloc = MmapHostTensorAllocator(register=False).allocate_bytes(8192)
    view = alloc.tensor[100:200]
    view.fill_(5)
    alloc.close()
    alloc.close()
    assert alloc.closed
    with pytest.raises(RuntimeError, match="closed"):
        _ = alloc.tensor
    assert int(view.sum()) == 500  # memory lives as long as a view does


def test_transparent_huge_pages_hint_keeps_exact_size() -> None:
    allocator = MmapHostTensorAllocator(huge_pages="transparent", register=False)
    alloc = allocator.allocate_bytes(3_000_001)
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
        MmapHostTensorAllocator(register=False).allocate_bytes(nbytes)  # type: ignore[arg-type]


def test_registration_is_chunked_and_undone_on_close() -> None:
    reg = FakeRegistrar()
    assert isinstance(reg, HostRegistrar)
    alloc = MmapHostTensorAllocator(registrar=reg, register_chunk_bytes=4096).allocate_bytes(10_000)
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
        ).allocate_bytes(1000)


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

    def allocate_bytes(self, nbytes: int) -> HostAllocation:
        alloc = self.inner.allocate_bytes(nbytes)
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


def test_sglang_interface_allocate_records_dims_and_dtype() -> None:
    """SGLang's allocate(dims, dtype, device): an exact tensor; dims/dtype recorded."""
    allocator = MmapHostTensorAllocator(register=False)
    assert allocator.dims is None and allocator.dtype is None
    t = allocator.allocate((2, 3, 5), torch.bfloat16, "cpu")
    assert t.shape == (2, 3, 5) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert allocator.dims == (2, 3, 5) and allocator.dtype == torch.bfloat16
    assert len(allocator.allocations) == 1 and allocator.allocations[0].nbytes == 60
    t.fill_(1.5)
    assert bool((allocator.allocations[0].tensor.view(torch.bfloat16) == 1.5).all())
    assert allocator.allocate((0, 4), torch.float32).shape == (0, 4)
    with pytest.raises(ValueError, match="device"):
        allocator.allocate((4,), torch.float32, "cuda")
    with pytest.raises(TypeError, match="dims"):
        allocator.allocate(4, torch.float32)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dtype"):
        allocator.allocate((4,), "float32")  # type: ignore[arg-type]


class TensorOnlyAllocator(HostTensorAllocator):
    """An allocator with SGLang's interface only (as a storage backend's would be)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[tuple[int, ...], torch.dtype]] = []

    def allocate(  # type: ignore[override]
        self, dims: tuple[int, ...], dtype: torch.dtype = torch.uint8, device: str = "cpu"
    ) -> torch.Tensor:
        self.calls.append((tuple(dims), dtype))
        return torch.zeros(dims, dtype=dtype)


def test_pool_over_an_sglang_interface_allocator(make_pool: MakePool) -> None:
    allocator = TensorOnlyAllocator()
    device = make_pool("mha", torch.float16, page_size=4, size=32, seed=3)
    host = MHATokenToKVPoolHost(device, allocator=allocator, pin_memory=False)
    assert allocator.calls == [((host.size * device.get_buffer_desc().bytes_per_token,),
                                torch.uint8)]
    h = host.alloc(8)
    assert h is not None
    host.backup_from_device_all_layer(device, h, torch.arange(4, 12), "kernel")
    k = device.get_buffer_desc().buffers[0][1]
    assert torch.equal(host.k_buffer[:, 1][h].view(torch.uint8), k[4:12].view(torch.uint8))
    assert not host.pinned
    host.close()
