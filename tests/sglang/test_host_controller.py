"""SGLang 0.5.23's own ``HiCacheController`` runs over our host pools, bit-exact.

The controller (``sglang.srt.managers.cache_controller``), its L2 transfer engine and SGLang's
``PagedTokenToKVPoolAllocator`` are SGLang's real code, loaded from the wheel; the device pool
and the host pool are ours. Every case writes device pages back to the host (``write``), loads
them into fresh device pages (``load`` + ``start_loading`` + the layer-done waits), and checks
the device bytes equal the originals; it also pushes the host pages through SGLang's storage page
path (``_generic_page_set`` / ``_generic_page_get``, which index pages with 0-d tensors) into a
dictionary store and back, and loads them again. SGLang's own flat-page methods, run unbound over
our pools, give the same bytes as ours.

SGLang's host pool classes cannot be run on a CPU-only machine (their transfers call
``sgl_kernel`` ops imported only on CUDA/HIP/XPU), so the ground truth is the device pool's own
bytes. Without a storage backend attached the controller starts no threads; each test still asks
it to stop them and checks no thread is left behind.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from mem_cache_pool import KVCache, MHATokenToKVPool, MLATokenToKVPool
from mem_cache_pool_host import HostKVCache, MHATokenToKVPoolHost, MLATokenToKVPoolHost

PAGE = 4
SIZE = 64
LAYERS = 3
# (layout, io_backend) pairs SGLang's controller and host pools accept
CASES = [
    ("layer_first", "direct"),
    ("page_first_direct", "direct"),
    ("layer_first", "kernel"),
    ("page_first", "kernel"),
]
KINDS = ["mha", "mla"]

Load = Callable[..., list[types.ModuleType]]


def _device(kind: str, seed: int) -> KVCache:
    pool: KVCache
    if kind == "mha":
        pool = MHATokenToKVPool(SIZE, PAGE, torch.bfloat16, 2, 8, LAYERS, "cpu")
    else:
        pool = MLATokenToKVPool(SIZE, PAGE, torch.float16, 16, 8, LAYERS, "cpu")
    gen = torch.Generator().manual_seed(seed)
    for role in pool.get_buffer_desc().buffers:
        for buf in role:
            raw = buf.view(torch.uint8)  # every byte value, NaN patterns included
            raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    return pool


def _host(kind: str, device: KVCache, layout: str) -> HostKVCache:
    # SGLang's positional order: buffer_info, ratio, host_size (GB), page_size, layout, pin
    if kind == "mha":
        return MHATokenToKVPoolHost(device, 2.0, 0, PAGE, layout, False)
    return MLATokenToKVPoolHost(device, 2.0, 0, PAGE, layout, False)


def _rows(device: KVCache, indices: torch.Tensor) -> list[torch.Tensor]:
    """The bytes of device rows ``indices``, every role and layer (copies)."""
    desc = device.get_buffer_desc()
    return [buf[indices].view(torch.uint8).clone() for role in desc.buffers for buf in role]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


class DictStorage:
    """A storage backend stand-in for SGLang's generic page path: pages kept as tensor copies."""

    def __init__(self) -> None:
        self.pages: dict[str, torch.Tensor] = {}

    def batch_set(self, keys: list[str], values: list[torch.Tensor]) -> bool:
        for key, value in zip(keys, values):
            self.pages[key] = value.clone()
        return True

    def batch_get(self, keys: list[str], target_locations: list[torch.Tensor]) -> list[Any]:
        out: list[Any] = []
        for key, target in zip(keys, target_locations):
            page = self.pages.get(key)
            if page is None:
                out.append(None)
                continue
            target.copy_(page.reshape(target.shape))
            out.append(target)
        return out


@pytest.fixture
def sglang(sglang_load: Load) -> tuple[types.ModuleType, types.ModuleType]:
    cc, alloc = sglang_load(
        "sglang.srt.managers.cache_controller", "sglang.srt.mem_cache.allocator"
    )
    return cc, alloc


@pytest.fixture
def no_thread_left() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not left, f"threads left running: {left}"


def _controller(cc: types.ModuleType, allocator: Any, host: HostKVCache, io: str) -> Any:
    return cc.HiCacheController(
        allocator, host, PAGE, None, threading.Event(), io_backend=io, write_policy="write_through"
    )


def _wait_writes(ctrl: Any) -> list[int]:
    nodes: list[int] = []
    for ack in ctrl.ack_write_queue:
        ack.finish_event.synchronize()
        nodes.extend(ack.node_ids)
    ctrl.ack_write_queue.clear()
    return nodes


def _load_all(ctrl: Any, layer_num: int) -> list[int]:
    """SGLang's load-back: start_loading, then the consumer's per-layer waits, then the acks."""
    producer = ctrl.start_loading()
    assert producer >= 0
    ctrl.layer_done_counter.set_consumer(producer)
    for layer in range(layer_num):
        ctrl.layer_done_counter.wait_until(layer)
    nodes: list[int] = []
    for ack in ctrl.ack_load_queue:
        ack.finish_event.synchronize()
        nodes.extend(ack.node_ids)
    ctrl.ack_load_queue.clear()
    return nodes


@pytest.mark.parametrize(("layout", "io"), CASES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("no_thread_left")
def test_write_back_and_load_back_through_sglangs_controller(
    sglang: tuple[types.ModuleType, types.ModuleType], kind: str, layout: str, io: str
) -> None:
    cc, alloc = sglang
    device = _device(kind, seed=11)
    allocator = alloc.PagedTokenToKVPoolAllocator(
        SIZE, PAGE, device.dtype, "cpu", device, need_sort=True
    )
    host = _host(kind, device, layout)
    ctrl = _controller(cc, allocator, host, io)
    try:
        # two write-backs of 2 and 3 pages; the second's pages in a scrambled page order
        first = allocator.alloc(2 * PAGE)
        second = allocator.alloc(3 * PAGE)
        assert first is not None and second is not None
        second = second.view(-1, PAGE)[torch.tensor([2, 0, 1])].reshape(-1)
        originals = [_rows(device, first), _rows(device, second)]
        h1 = ctrl.write(first, node_id=1)
        h2 = ctrl.write(second, node_id=2)
        assert h1 is not None and h2 is not None
        assert _wait_writes(ctrl) == [1, 2]
        assert host.available_size() == host.size - 5 * PAGE

        # load both back in one merged operation, into fresh device pages
        d1 = ctrl.load(h1, node_id=3)
        d2 = ctrl.load(h2, node_id=4)
        assert d1 is not None and d2 is not None
        assert not set(torch.cat([d1, d2]).tolist()) & set(torch.cat([first, second]).tolist())
        assert _load_all(ctrl, device.layer_num) == [3, 4]
        assert _same(_rows(device, d1), originals[0])
        assert _same(_rows(device, d2), originals[1])

        # host -> SGLang's generic storage page path (0-d tensor page indices) -> new host pages
        store = DictStorage()
        ctrl.storage_backend = store
        hashes = [f"p{i}" for i in range(5)]
        hosted = torch.cat([h1, h2])
        assert ctrl._generic_page_set(hashes, hosted) is True
        assert len(store.pages) == 5
        fresh = host.alloc(5 * PAGE)
        assert fresh is not None
        op = cc.PrefetchOperation("req", list(range(5 * PAGE)))
        assert ctrl._generic_page_get(op, hashes, fresh) == 5
        assert ctrl.evict_host(hosted) == 5 * PAGE
        d3 = ctrl.load(fresh, node_id=5)
        assert d3 is not None
        assert _load_all(ctrl, device.layer_num) == [5]
        assert _same(_rows(device, d3), [torch.cat(p) for p in zip(*originals)])
    finally:
        ctrl.storage_backend = None
        ctrl._stop_storage_threads()
        host.close()


class _Seen:
    """Our pool as SGLang's method sees it: SGLang's own private helpers (e.g. MLA's
    ``_storage_page_index``) bound to it, every other attribute ours."""

    def __init__(self, host: HostKVCache, cls: type) -> None:
        self._host = host
        self._cls = cls

    def __getattr__(self, name: str) -> Any:
        helper = getattr(self._cls, name, None)
        if name.startswith("_") and callable(helper):
            return types.MethodType(helper, self)
        return getattr(self._host, name)


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
@pytest.mark.parametrize("kind", KINDS)
def test_sglangs_page_methods_over_our_pool_give_our_bytes(
    sglang_load: Load, kind: str, layout: str
) -> None:
    """SGLang's own get_data_page / set_from_flat_data_page / get_page_buffer_meta, called on
    our pool (they read its kv_buffer, layout and geometry), agree byte for byte with ours."""
    mha, mla = sglang_load(
        "sglang.srt.mem_cache.pool_host.mha", "sglang.srt.mem_cache.pool_host.mla"
    )
    theirs = mha.MHATokenToKVPoolHost if kind == "mha" else mla.MLATokenToKVPoolHost
    device = _device(kind, seed=5)
    host = _host(kind, device, layout)
    seen = _Seen(host, theirs)
    try:
        slots = host.alloc(3 * PAGE)
        assert slots is not None
        io = "kernel" if layout == "page_first" else "direct"
        host.backup_from_device_all_layer(device, slots, torch.arange(8, 8 + 3 * PAGE), io)
        for p in range(3):
            index = slots[p * PAGE]  # a 0-d tensor, as SGLang's storage path passes
            ours = host.get_data_page(index)
            sgl = theirs.get_data_page(seen, index)
            assert torch.equal(ours.view(torch.uint8), sgl.reshape(-1).view(torch.uint8))
        # SGLang writes a page with its method; ours reads the same bytes back
        spare = host.alloc(PAGE)
        assert spare is not None
        page = host.get_data_page(slots[0])
        theirs.set_from_flat_data_page(seen, int(spare[0]), page)
        assert torch.equal(host.get_data_page(spare[0]).view(torch.uint8), page.view(torch.uint8))
        # zero-copy ranges: SGLang's formula over our kv_buffer gives our list
        assert theirs.get_page_buffer_meta(seen, slots) == host.get_page_buffer_meta(slots)
        assert theirs.is_stride_page_aligned(seen) == host.is_stride_page_aligned()
    finally:
        host.close()


@pytest.mark.parametrize(("layout", "io"), [("layer_first", "direct"), ("page_first", "kernel")])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("no_thread_left")
def test_round_trip_through_sglangs_hybrid_cache_controller(
    sglang_load: Load, kind: str, layout: str, io: str
) -> None:
    """SGLang 0.5.23's HybridCacheController over SGLang's HostPoolGroup whose KV anchor is our
    host pool: write-back and load-back are bit-exact, eviction frees our host pages."""
    hc, grp, hs, alloc = sglang_load(
        "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller",
        "sglang.srt.mem_cache.pool_host.group",
        "sglang.srt.mem_cache.hicache_storage",
        "sglang.srt.mem_cache.allocator",
    )
    device = _device(kind, seed=23)
    allocator = alloc.PagedTokenToKVPoolAllocator(
        SIZE, PAGE, device.dtype, "cpu", device, need_sort=True
    )
    host = _host(kind, device, layout)
    group = grp.HostPoolGroup([
        grp.PoolEntry(name=hs.PoolName.KV, host_pool=host, device_pool=device,
                      layer_mapper=lambda layer: layer, is_primary_index_anchor=True)
    ])
    ctrl = hc.HybridCacheController(
        allocator, group, PAGE, None, threading.Event(), io_backend=io,
        write_policy="write_through",
    )
    try:
        src = allocator.alloc(3 * PAGE)
        assert src is not None
        original = _rows(device, src)
        hosted = ctrl.write(src, node_id=7)
        assert hosted is not None and host.is_allocated(hosted)
        assert _wait_writes(ctrl) == [7]
        dst = ctrl.load(hosted, node_id=8)
        assert dst is not None
        assert _load_all(ctrl, device.layer_num) == [8]
        assert _same(_rows(device, dst), original)
        assert ctrl.evict_host(hosted) == 3 * PAGE
        assert host.available_size() == host.size
    finally:
        ctrl._stop_storage_threads()
        host.close()
