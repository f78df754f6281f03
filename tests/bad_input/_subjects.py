"""Tiny CPU instances of every public class the bad-input suite calls, and state snapshots.

``OWNERS["<module>:<Class>"]`` builds a fresh, small instance (``debug`` left at its default:
the suite tests the *default* mode). ``snapshot(obj)`` collects every tensor and scalar reachable
from an object's attributes (a few levels deep: allocators hold inner allocators and free lists,
pools hold buffers, host pools hold their slot allocator), so "a failed call changed nothing" is
checked on the real state, not on a summary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["EXEMPT_OWNERS", "OWNERS", "same_state", "snapshot"]

F16 = torch.float16
BF16 = torch.bfloat16


def _mha() -> Any:
    from mem_cache_pool import MHATokenToKVPool

    return MHATokenToKVPool(32, 4, F16, 2, 8, 2, "cpu")


def _mla() -> Any:
    from mem_cache_pool import MLATokenToKVPool

    return MLATokenToKVPool(32, 4, BF16, 8, 4, 2, "cpu")


def _swa_pool(*, mapped: bool = True) -> Any:
    from mem_cache_allocator import SWATokenToKVPoolAllocator
    from mem_cache_pool.swa import SWAKVPool

    pool = SWAKVPool(32, 16, 4, F16, 1, 8, [0], [1], "cpu")
    if mapped:  # the allocator registers its full -> swa mapping, as in an engine
        SWATokenToKVPoolAllocator(32, 16, 4, F16, "cpu", pool)
    return pool


def _dsa() -> Any:
    from mem_cache_pool.dsa import DSATokenToKVPool

    return DSATokenToKVPool(8, 4, BF16, 8, 4, 1, "cpu")


def _hisparse_pool() -> Any:
    from mem_cache_allocator import HiSparseTokenToKVPoolAllocator
    from mem_cache_pool.hisparse import HiSparseDSATokenToKVPool

    pool = HiSparseDSATokenToKVPool(4, 2, F16, 8, 4, 1, "cpu", index_buf_size=12)
    HiSparseTokenToKVPoolAllocator(4, 2, F16, "cpu", pool, host_to_device_ratio=3)  # mapping
    return pool


def _single() -> Any:
    from mem_cache_pool.deepseek_v4 import DeepSeekV4SingleKVPool

    return DeepSeekV4SingleKVPool(8, 4, torch.float8_e4m3fn, 448, 64, 1, "cpu")


def _c4() -> Any:
    from mem_cache_pool.deepseek_v4 import HiSparseC4DevicePool

    return HiSparseC4DevicePool(8, 2, torch.float8_e4m3fn, 448, 64, 1, "cpu")


def _indexer() -> Any:
    from mem_cache_pool.deepseek_v4 import DeepSeekV4IndexerPool

    return DeepSeekV4IndexerPool(8, 4, torch.float8_e4m3fn, 16, 2, "cpu")


def _v4_pool(*, hisparse: bool) -> Any:
    from mem_cache_pool.deepseek_v4 import DeepSeekV4TokenToKVPool

    return DeepSeekV4TokenToKVPool(
        2, 256, 64, 4, 2, 2, 128, 4, torch.float8_e4m3fn, torch.float32, torch.float32,
        448, 64, 16, 3, "cpu", False, [0, 4, 128], enable_hisparse=hisparse, state_dim=8,
    )  # fmt: skip


def _v4_mapped() -> Any:
    """A DeepSeek-V4 pool whose SWA / compressed mappings the allocators registered."""
    pool = _v4_pool(hisparse=True)
    _v4_alloc(pool)
    return pool


def _v4_alloc(pool: Any = None) -> Any:
    """SGLang's DeepSeek-V4 stack: the SWA allocator over the composite pool (its window side,
    two pages of 128, so the SWA methods are meaningful), HiSparse over it."""
    from mem_cache_allocator import SWATokenToKVPoolAllocator
    from mem_cache_allocator.deepseek_v4_hisparse import DeepSeekV4HiSparseTokenToKVPoolAllocator

    pool = pool if pool is not None else _v4_pool(hisparse=True)
    logical = SWATokenToKVPoolAllocator(pool.size, 256, 128, torch.float8_e4m3fn, "cpu", pool)
    return DeepSeekV4HiSparseTokenToKVPoolAllocator(logical)


def _state_pool() -> Any:
    from mem_cache_pool.deepseek_v4 import CompressStatePool

    return CompressStatePool(3, 8, 4, 2, "cpu")


def _state_layer() -> Any:
    from mem_cache_pool.deepseek_v4 import CompressStateLayer

    return CompressStateLayer(_state_pool(), 1, 4, request_scoped=False)


def _write_loc() -> Any:
    from mem_cache_pool import KVWriteLoc

    return KVWriteLoc(torch.tensor([1, 2]), swa_loc=torch.tensor([3, 4]))


def _req() -> Any:
    from mem_cache_pool import ReqToTokenPool

    return ReqToTokenPool(4, 16, "cpu")


def _token() -> Any:
    from mem_cache_allocator import TokenToKVPoolAllocator

    return TokenToKVPoolAllocator(32, F16, "cpu", _mha())


def _paged() -> Any:
    from mem_cache_allocator import PagedTokenToKVPoolAllocator

    return PagedTokenToKVPoolAllocator(32, 4, F16, "cpu", _mha())


def _swa_alloc() -> Any:
    from mem_cache_allocator import SWATokenToKVPoolAllocator

    return SWATokenToKVPoolAllocator(32, 16, 4, F16, "cpu", _swa_pool(mapped=False))


def _hisparse_alloc() -> Any:
    from mem_cache_allocator import HiSparseTokenToKVPoolAllocator

    return HiSparseTokenToKVPoolAllocator(16, 4, F16, "cpu", None)


def _mamba() -> Any:
    from mem_cache_allocator import MambaSlotAllocator

    return MambaSlotAllocator(8, "cpu")


def _hybrid_rows() -> Any:
    from mem_cache_pool import HybridReqToTokenPool, Mamba2CacheParams, Mamba2StateShape

    shape = Mamba2StateShape(conv=[(4, 3)], temporal=(2, 2, 2), conv_kernel=4)
    return HybridReqToTokenPool(
        size=4,
        mamba_size=6,
        mamba_spec_state_size=4,
        max_context_len=8,
        device="cpu",
        enable_memory_saver=False,
        cache_params=Mamba2CacheParams(shape=shape, layers=[0, 2]),
        mamba_layer_ids=[0, 2],
        enable_mamba_extra_buffer=True,
    )


def _mamba_pool() -> Any:
    return _hybrid_rows().mamba_pool


def _hybrid_kv() -> Any:
    from mem_cache_pool import HybridLinearKVPool

    return HybridLinearKVPool(16, torch.float16, 4, 2, 4, [1], "cpu", _mamba_pool())


def _mamba_host() -> Any:
    from mem_cache_pool_host import MambaPoolHost

    return MambaPoolHost(_mamba_pool(), 1.0, 0, device_capacity=4, pin_memory=False)


def _mamba_shape() -> Any:
    from mem_cache_pool import Mamba2StateShape

    return Mamba2StateShape(conv=[(4, 3)], temporal=(2, 2, 2), conv_kernel=4)


def _mamba_info() -> Any:
    from mem_cache_pool_host import MambaStateBufferInfo

    return MambaStateBufferInfo.from_pool(_mamba_pool())


def _mha_host() -> Any:
    from mem_cache_pool_host import MHATokenToKVPoolHost

    return MHATokenToKVPoolHost(_mha(), host_size_bytes=1 << 16, pin_memory=False)


def _mla_host() -> Any:
    from mem_cache_pool_host import MLATokenToKVPoolHost

    return MLATokenToKVPoolHost(_mla(), host_size_bytes=1 << 16, pin_memory=False)


def _single_host() -> Any:
    from mem_cache_pool_host.deepseek_v4 import DeepSeekV4SingleKVPoolHost

    return DeepSeekV4SingleKVPoolHost(_single(), pin_memory=False, host_to_device_ratio=1.0)


def _slots() -> Any:
    from mem_cache_pool_host import HostSlotAllocator

    return HostSlotAllocator(8, 4)


def _counter() -> Any:
    from mem_cache_pool_host import LayerDoneCounter

    return LayerDoneCounter(2)


def _mmap() -> Any:
    from mem_cache_pool_host import MmapHostTensorAllocator

    return MmapHostTensorAllocator(register=False)


def _desc() -> Any:
    return _mha().get_buffer_desc()


def _page_format() -> Any:
    from mem_cache_pool_host.page_format import PageFormat

    return PageFormat.make(
        order="token_major", roles=("k", "v"), layer_num=2, page_size=4,
        row_shapes=((2, 8), (2, 8)), store_dtype=F16,
    )  # fmt: skip


OWNERS: dict[str, Callable[[], Any]] = {
    "mem_cache_pool.mha:MHATokenToKVPool": _mha,
    "mem_cache_pool.mla:MLATokenToKVPool": _mla,
    "mem_cache_pool.swa:SWAKVPool": _swa_pool,
    "mem_cache_pool.dsa:DSATokenToKVPool": _dsa,
    "mem_cache_pool.hisparse:HiSparseDSATokenToKVPool": _hisparse_pool,
    "mem_cache_pool._deepseek_v4_single:DeepSeekV4SingleKVPool": _single,
    "mem_cache_pool._deepseek_v4_single:HiSparseC4DevicePool": _c4,
    "mem_cache_pool._deepseek_v4_indexer:DeepSeekV4IndexerPool": _indexer,
    "mem_cache_pool._deepseek_v4_state:CompressStatePool": _state_pool,
    "mem_cache_pool._deepseek_v4_layers:CompressStateLayer": _state_layer,
    "mem_cache_pool.req_to_token:ReqToTokenPool": _req,
    "mem_cache_pool.mamba:MambaPool": _mamba_pool,
    "mem_cache_pool._hybrid_requests:HybridReqToTokenPool": _hybrid_rows,
    "mem_cache_pool._hybrid_linear_kv:HybridLinearKVPool": _hybrid_kv,
    "mem_cache_pool_host.mamba:MambaPoolHost": _mamba_host,
    "mem_cache_pool._mamba_params:Mamba2StateShape": _mamba_shape,
    "mem_cache_pool_host.mamba:MambaStateBufferInfo": _mamba_info,
    "mem_cache_pool.base:KVWriteLoc": _write_loc,
    "mem_cache_pool.deepseek_v4:DeepSeekV4TokenToKVPool": _v4_mapped,
    "mem_cache_allocator.deepseek_v4_hisparse:DeepSeekV4HiSparseTokenToKVPoolAllocator": _v4_alloc,
    "mem_cache_pool.base:KVBufferDesc": _desc,
    "mem_cache_allocator.token:TokenToKVPoolAllocator": _token,
    "mem_cache_allocator.paged:PagedTokenToKVPoolAllocator": _paged,
    "mem_cache_allocator.page_allocator:PageAllocatorCore": _paged,  # the engine of paged/token
    "mem_cache_allocator.swa:SWATokenToKVPoolAllocator": _swa_alloc,
    "mem_cache_allocator.hisparse:HiSparseTokenToKVPoolAllocator": _hisparse_alloc,
    "mem_cache_allocator.mamba:MambaSlotAllocator": _mamba,
    "mem_cache_pool_host.mha:MHATokenToKVPoolHost": _mha_host,
    "mem_cache_pool_host.mla:MLATokenToKVPoolHost": _mla_host,
    "mem_cache_pool_host.deepseek_v4:DeepSeekV4SingleKVPoolHost": _single_host,
    "mem_cache_pool_host.slots:HostSlotAllocator": _slots,
    "mem_cache_pool_host.layer_counter:LayerDoneCounter": _counter,
    "mem_cache_pool_host.memory:MmapHostTensorAllocator": _mmap,
    "mem_cache_pool_host.page_format:PageFormat": _page_format,
}

# classes whose methods the suite reaches only through a concrete subclass, or cannot build here
EXEMPT_OWNERS: dict[str, str] = {
    "mem_cache_allocator.base:BaseTokenToKVPoolAllocator": "abstract: every concrete allocator",
    "mem_cache_pool.base:KVCache": "abstract: every concrete pool",
    "mem_cache_pool.swa:BaseSWAKVPool": "abstract: SWAKVPool",
    "mem_cache_pool_host.base:HostKVCache": "abstract: MHA/MLA/deepseek_v4 host pools",
    "mem_cache_pool_host.hisparse:HiSparseHostPoolMixin": "mixin: host pools",
    "mem_cache_pool_host.registration:CudaHostRegistrar": "needs CUDA (cudaHostRegister)",
    "mem_cache_pool_host.memory:MmapHostAllocation": "built by MmapHostTensorAllocator.allocate",
}


def _collect(obj: Any, depth: int, out: list[Any], seen: set[int]) -> None:
    if id(obj) in seen or depth < 0:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        out.append(obj.detach().clone() if obj.device.type != "meta" else obj.shape)
    elif isinstance(obj, (int, float, str, bool, type(None))):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj[:64]:
            _collect(item, depth - 1, out, seen)
    elif isinstance(obj, dict):
        for k in sorted(obj, key=repr)[:64]:
            out.append(repr(k))
            _collect(obj[k], depth - 1, out, seen)
    elif hasattr(obj, "__dict__") or hasattr(obj, "__slots__"):
        names = list(getattr(obj, "__dict__", {}))
        for cls in type(obj).__mro__:
            names.extend(s for s in getattr(cls, "__slots__", ()) if isinstance(s, str))
        for name in sorted(set(names)):
            if name.startswith("__") or name in ("lock", "_cond", "_lock"):
                continue
            value = getattr(obj, name, None)
            if callable(value) and not isinstance(value, torch.Tensor):
                continue
            out.append(name)
            _collect(value, depth - 1, out, seen)


def snapshot(obj: Any) -> list[Any]:
    """Every tensor (cloned) and scalar reachable from ``obj`` within a few attribute levels."""
    out: list[Any] = []
    _collect(obj, 4, out, set())
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    """fp8 tensors compare as bytes (torch.equal has no fp8 kernel)."""
    return t.view(torch.uint8) if t.dtype.is_floating_point and t.element_size() == 1 else t


def same_state(a: list[Any] | None, b: list[Any] | None) -> bool:
    """Whether two :func:`snapshot` results are equal (tensors bit-exact)."""
    if a is None or b is None:
        return a is b
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (
                isinstance(x, torch.Tensor)
                and isinstance(y, torch.Tensor)
                and x.shape == y.shape
                and x.dtype == y.dtype
                and torch.equal(_bits(x), _bits(y))
            ):
                return False
        elif x != y and not (isinstance(x, float) and math.isnan(x) and math.isnan(y)):
            return False
    return True
