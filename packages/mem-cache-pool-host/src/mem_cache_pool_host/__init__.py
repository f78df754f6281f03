"""mem_cache_pool_host: pinned host KV pools (HiCache L2) and host<->device transfers.

Public surface: host memory (:mod:`.memory`, :mod:`.registration`), sizing (:mod:`.capacity`),
layouts (:mod:`.layout`), the slot allocator (:mod:`.slots`), the pools (:mod:`.base`,
:mod:`.mha`, :mod:`.mla`), the storage page format (:mod:`.page_format`), the HiSparse host mixin
(:mod:`.hisparse`) and the layer-wise load counter (:mod:`.layer_counter`).
"""

from mem_cache_pool_host.base import DevicePoolLike, HostKVCache, resolve_buffer_desc
from mem_cache_pool_host.capacity import (
    DEFAULT_HOST_TO_DEVICE_RATIO,
    HostCapacity,
    available_host_memory,
    plan_host_capacity,
    preflight_host_memory,
)
from mem_cache_pool_host.hisparse import HiSparseHostPoolMixin
from mem_cache_pool_host.layer_counter import LayerDoneCounter, LayerLoadAbortedError
from mem_cache_pool_host.layout import IO_BACKENDS, LAYOUTS, IOBackend, Layout
from mem_cache_pool_host.mamba import MambaPoolHost, MambaStateBufferInfo
from mem_cache_pool_host.memory import (
    HostAllocation,
    HostBytesAllocator,
    HostTensorAllocator,
    MmapHostAllocation,
    MmapHostTensorAllocator,
    default_host_tensor_allocator,
)
from mem_cache_pool_host.mha import MHATokenToKVPoolHost
from mem_cache_pool_host.mla import MLATokenToKVPoolHost
from mem_cache_pool_host.page_format import (
    PAGE_FORMAT_NAME,
    PAGE_FORMAT_VERSION,
    PageFormat,
    convert_flat_page,
)
from mem_cache_pool_host.registration import CudaHostRegistrar, HostRegistrar
from mem_cache_pool_host.slots import HostSlotAllocator

__all__ = [
    "DEFAULT_HOST_TO_DEVICE_RATIO",
    "IO_BACKENDS",
    "LAYOUTS",
    "PAGE_FORMAT_NAME",
    "PAGE_FORMAT_VERSION",
    "CudaHostRegistrar",
    "DevicePoolLike",
    "HiSparseHostPoolMixin",
    "HostAllocation",
    "HostBytesAllocator",
    "HostCapacity",
    "HostKVCache",
    "HostRegistrar",
    "HostSlotAllocator",
    "HostTensorAllocator",
    "IOBackend",
    "LayerDoneCounter",
    "LayerLoadAbortedError",
    "Layout",
    "MHATokenToKVPoolHost",
    "MLATokenToKVPoolHost",
    "MambaPoolHost",
    "MambaStateBufferInfo",
    "MmapHostAllocation",
    "MmapHostTensorAllocator",
    "PageFormat",
    "available_host_memory",
    "convert_flat_page",
    "default_host_tensor_allocator",
    "plan_host_capacity",
    "preflight_host_memory",
    "resolve_buffer_desc",
]
