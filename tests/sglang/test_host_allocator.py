"""Our host pools take SGLang 0.5.23's own ``HostTensorAllocator`` (its ``allocate(dims, dtype,
device)`` interface, the one storage backends' allocators subclass) as their memory supplier."""

from __future__ import annotations

import types
from collections.abc import Callable

import torch

from mem_cache_pool import MHATokenToKVPool
from mem_cache_pool_host import MHATokenToKVPoolHost, MmapHostTensorAllocator

Load = Callable[..., list[types.ModuleType]]


def test_pool_over_sglangs_host_tensor_allocator(sglang_load: Load) -> None:
    (common,) = sglang_load("sglang.srt.mem_cache.pool_host.common")
    allocator = common.HostTensorAllocator()
    device = MHATokenToKVPool(32, 4, torch.bfloat16, 2, 8, 2, "cpu")
    for role in device.get_buffer_desc().buffers:
        for buf in role:
            buf.view(torch.uint8).copy_(torch.randint(0, 256, buf.view(torch.uint8).shape,
                                                      dtype=torch.uint8))
    host = MHATokenToKVPoolHost(device, 2.0, 0, 4, "layer_first", False, allocator=allocator)
    # SGLang's allocator recorded the one request: the whole kv_buffer, in bytes
    assert allocator.dims == (host.size * host.size_per_token,)
    assert allocator.dtype == torch.uint8
    h = host.alloc(8)
    assert h is not None
    host.backup_from_device_all_layer(device, h, torch.arange(4, 12), "direct")
    fresh = torch.arange(16, 24)
    for layer in range(2):
        host.load_to_device_per_layer(device, h, fresh, layer, "direct")
    desc = device.get_buffer_desc()
    for role in desc.buffers:
        for buf in role:
            assert torch.equal(buf[fresh].view(torch.uint8), buf[4:12].view(torch.uint8))
    host.close()


def test_our_allocator_answers_sglangs_interface_like_sglangs(sglang_load: Load) -> None:
    (common,) = sglang_load("sglang.srt.mem_cache.pool_host.common")
    theirs = common.HostTensorAllocator()
    ours = MmapHostTensorAllocator(register=False)
    for allocator in (theirs, ours):
        assert allocator.dims is None and allocator.dtype is None
        t = allocator.allocate((3, 4, 8), dtype=torch.float16, device="cpu")
        assert (t.shape, t.dtype, t.device.type, t.is_contiguous()) == (
            (3, 4, 8), torch.float16, "cpu", True)
        assert tuple(allocator.dims) == (3, 4, 8) and allocator.dtype == torch.float16
