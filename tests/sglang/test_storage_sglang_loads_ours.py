"""SGLang 0.5.23 loads our storage backends: its own ``StorageBackendFactory`` and a real
``HiCacheController`` (CPU, SGLang's device pool, allocator and host pools) attach
``mem_cache_storage.sglang_backends`` through ``dynamic`` with the configuration of our storage
README, and the controller's own threads write, query and load pages bit-exact, on the zero-copy
(``interface_v1``) and the copying path, for MHA and MLA host pools in every layout SGLang's
file backend serves.

Over *our* host pools SGLang's controller reads ``storage_format_tag`` / ``logical_size`` and
passes 0-d tensor indices to ``get_data_page``; those host-pool members arrive with the
pool-host work (see the storage README), so these tests run over SGLang's host pools.
"""

from __future__ import annotations

import tempfile
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from ._storage_support import sgl_load

PS = 16
LAYERS = 2


def _mods(sglang_load: Callable[..., list[types.ModuleType]]) -> types.SimpleNamespace:
    names = ("memory_pool", "allocator", "pool_host.mha", "pool_host.mla", "utils",
             "storage.backend_factory", "hicache_storage")
    mods = sglang_load(*(f"sglang.srt.mem_cache.{n}" for n in names),
                       "sglang.srt.managers.cache_controller", "sglang.srt.runtime_context")
    ns = types.SimpleNamespace(**{n.split(".")[-1]: m for n, m in zip(names, mods)})
    ns.cc, ns.rc = mods[-2], mods[-1]
    par = ns.rc.get_parallel()
    par.override_permanently(attn_dcp_size=1, attn_dcp_rank=0, tp_rank=0, tp_size=1,
                             pp_rank=0, pp_size=1)
    return ns


def sglang_stack(ns: types.SimpleNamespace, layout: str, mla: bool) -> tuple[Any, Any]:
    """SGLang's device pool, allocator, host pool and a HiCacheController without storage."""
    if mla:
        kv = ns.memory_pool.MLATokenToKVPool(
            size=256, page_size=PS, dtype=torch.bfloat16, kv_lora_rank=16, qk_rope_head_dim=8,
            layer_num=LAYERS, device="cpu", enable_memory_saver=False)
        host = ns.mla.MLATokenToKVPoolHost(
            kv._mla_buffer_info(), 2.0, 0, PS, layout, pin_memory=False, device="cpu",
            device_capacity_tokens=256, start_layer=0, end_layer=LAYERS,
            target_layer_num=LAYERS)
    else:
        kv = ns.memory_pool.MHATokenToKVPool(
            size=256, page_size=PS, dtype=torch.bfloat16, head_num=2, head_dim=8,
            layer_num=LAYERS, device="cpu", enable_memory_saver=False)
        host = ns.mha.MHATokenToKVPoolHost(
            kv._mha_buffer_info(), 2.0, 0, PS, layout, pin_memory=False, device="cpu",
            device_capacity_tokens=256, start_layer=0, end_layer=LAYERS)
    alloc = ns.allocator.PagedTokenToKVPoolAllocator(256, PS, torch.bfloat16, "cpu", kv,
                                                     need_sort=True)
    ctl = ns.cc.HiCacheController(alloc, host, PS, None, threading.Event(), io_backend="direct")
    return ctl, host


def fill(host: Any, slots: torch.Tensor, seed: int) -> None:
    """Random bytes into every page of ``slots`` (through SGLang's flat-page API)."""
    g = torch.Generator().manual_seed(seed)
    for first in slots[::PS].tolist():
        page = host.get_dummy_flat_data_page()
        page.view(torch.int16).copy_(torch.randint(-2000, 2000, page.view(torch.int16).shape,
                                                   generator=g, dtype=torch.int16))
        host.set_from_flat_data_page(first, page)


def pages(host: Any, slots: torch.Tensor) -> list[torch.Tensor]:
    return [host.get_data_page(int(i), flat=True).clone() for i in slots[::PS].tolist()]


def sgl_write(ctl: Any, slots: torch.Tensor, tokens: list[int], hashes: list[str]) -> int:
    ctl.write_storage(slots, tokens, hash_value=hashes)
    op = ctl.ack_backup_queue.get(timeout=30)
    return int(op.completed_tokens)


def extra(kind: str, root: str, scheme: str, v1: bool) -> dict[str, Any]:
    """The README's dynamic configuration for our ``kind`` backend."""
    cfg: dict[str, Any] = {
        "backend_name": f"mem_cache_{kind}",
        "module_path": "mem_cache_storage.sglang_backends",
        "class_name": {"file": "HiCacheFile", "memory": "HiCacheMemory"}[kind],
        "key_scheme": scheme,
    }
    if v1:
        cfg["interface_v1"] = 1
    if kind == "file":
        cfg["file_storage_path"] = root
    return cfg


@pytest.fixture(scope="module")
def ns(sglang_load: Callable[..., list[types.ModuleType]]) -> types.SimpleNamespace:
    return _mods(sglang_load)


@pytest.fixture
def root() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as d:
        yield d


def test_sglang_factory_accepts_ours_and_imports_no_sglang_until_asked(
    ns: types.SimpleNamespace, root: str
) -> None:
    import importlib
    import subprocess
    import sys

    # importing the integration module imports no SGLang (a fresh interpreter)
    code = ("import sys, mem_cache_storage.sglang_backends as m; "
            "print(any(k == 'sglang' or k.startswith('sglang.') for k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
    sb = importlib.import_module("mem_cache_storage.sglang_backends")
    cfg = ns.hicache_storage.HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="m", extra_config=extra("file", root, "mem_cache", True))
    backend = ns.backend_factory.StorageBackendFactory.create_backend("dynamic", cfg, None)
    assert isinstance(backend, ns.hicache_storage.HiCacheStorage)
    assert type(backend) is sb.HiCacheFile
    from mem_cache_storage import HiCacheFile
    assert isinstance(backend, HiCacheFile)
    # every hook SGLang's controllers call is ours, not SGLang's base stub
    for hook in ("register_mem_pool_host", "register_mem_host_pool_v2",
                 "on_host_pools_registered", "batch_exists_v2", "batch_get_v2", "batch_set_v2",
                 "batch_get_v1", "batch_set_v1", "batch_exists", "get", "set", "batch_get",
                 "batch_set", "exists", "clear", "get_stats"):
        owner = next(c for c in type(backend).__mro__ if hook in c.__dict__)
        assert owner.__module__.startswith("mem_cache_storage"), (hook, owner)


@pytest.mark.parametrize("kind", ["file", "memory"])
@pytest.mark.parametrize("v1", [True, False], ids=["zero_copy", "copying"])
@pytest.mark.parametrize("pool", ["mha-page_first", "mha-page_first_direct", "mha-layer_first",
                                  "mla-page_first", "mla-page_first_direct"])
def test_sglang_controller_round_trips_through_ours(
    ns: types.SimpleNamespace, root: str, kind: str, v1: bool, pool: str
) -> None:
    from mem_cache_storage import page_hashes

    model, layout = pool.split("-")
    mla = model == "mla"
    scheme = "sglang" if kind == "file" else "mem_cache"
    ctl, host = sglang_stack(ns, layout, mla)
    ctl.attach_storage_backend("dynamic", model_name="m",
                               storage_backend_extra_config=extra(kind, root, scheme, v1))
    try:
        assert type(ctl.storage_backend).__module__ == "mem_cache_storage.sglang_backends"
        assert (ctl.page_set_func == ctl._page_set_zero_copy) is v1
        n = 5
        tokens = list(range(1000, 1000 + n * PS))
        hashes = ns.utils.get_storage_hash_str(tokens, None, page_size=PS)
        assert hashes == page_hashes(tokens, PS)  # the default namespace: SGLang's hashes
        src = host.alloc(n * PS)
        fill(host, src, seed=n)
        want = pages(host, src)
        assert sgl_write(ctl, src, tokens, hashes) == n * PS
        hit, loaded, dst = sgl_load(ctl, host, "r1", tokens + [7] * 3)
        assert (hit, loaded) == (n * PS, n * PS)
        got = pages(host, dst)
        assert all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                   for a, b in zip(want, got))
        # an unknown prefix is a miss through SGLang's query
        assert sgl_load(ctl, host, "r2", [5] * (2 * PS))[:2] == (0, 0)
        stats = ctl.storage_backend.get_stats()
        assert stats.get_hits == n and stats.set_ok == n
    finally:
        ctl.detach_storage_backend()


def test_sglang_controller_corrupted_page_is_a_shorter_prefix(
    ns: types.SimpleNamespace, root: str
) -> None:
    """A page damaged on disk after SGLang's controller wrote it through ours loads as a miss
    at that page: the prefix before it is intact, nothing after it is returned."""
    import os

    ctl, host = sglang_stack(ns, "page_first", False)
    ctl.attach_storage_backend("dynamic", model_name="m",
                               storage_backend_extra_config=extra("file", root, "sglang", True))
    try:
        n = 4
        tokens = list(range(n * PS))
        hashes = ns.utils.get_storage_hash_str(tokens, None, page_size=PS)
        src = host.alloc(n * PS)
        fill(host, src, seed=3)
        want = pages(host, src)
        assert sgl_write(ctl, src, tokens, hashes) == n * PS
        path = ctl.storage_backend.page_path(hashes[2])
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x40]))
        hit, loaded, dst = sgl_load(ctl, host, "r", tokens)
        assert hit == n * PS and loaded == 2 * PS
        got = pages(host, dst[: 2 * PS])
        assert all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                   for a, b in zip(want, got))
        assert ctl.storage_backend.get_stats().rejected == 1
    finally:
        ctl.detach_storage_backend()
