"""Every attribute SGLang 0.5.23's controllers read on a host pool exists on ours.

The names are read from SGLang's source (``HiCacheController``, ``HybridCacheController`` and the
L2 transfer engine), so a member those callers start reading shows up here. Names that belong to
SGLang's ``HostPoolGroup`` facade (which wraps our pools) or to its page-interleaved pools (a
feature we do not have) are listed with the reason.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from mem_cache_pool import MHATokenToKVPool, MLATokenToKVPool
from mem_cache_pool_host import HostKVCache, MHATokenToKVPoolHost, MLATokenToKVPoolHost

Load = Callable[..., list[types.ModuleType]]

CALLERS = (
    "sglang.srt.managers.cache_controller",
    "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller",
    "sglang.srt.mem_cache.l2_transfer",
)
_READ = re.compile(
    r"\b(?:self\.mem_pool_host|self\.storage_host_pool|transfer\.host_pool|entry\.host_pool"
    r"|anchor\.host_pool|host_pool)\.([A-Za-z_]\w*)"
)
NOT_OURS = {
    "add_entry": "HostPoolGroup (SGLang's facade over several host pools)",
    "anchor_entry": "HostPoolGroup",
    "entries": "HostPoolGroup",
    "entry_map": "HostPoolGroup",
    "get_pool": "HostPoolGroup",
    "layout_lease": "HostPoolGroup",
    "resolve_host_transfers": "HostPoolGroup",
    "placement": "PageInterleaveHostPool (page-interleaved sharded pools: not supported)",
    "shard_rank": "PageInterleaveHostPool",
}


def _read_names(modules: list[types.ModuleType]) -> set[str]:
    names: set[str] = set()
    for module in modules:
        names |= set(_READ.findall(Path(module.__file__ or "").read_text()))
    return names


def _pools() -> list[HostKVCache]:
    mha = MHATokenToKVPool(32, 4, torch.float16, 2, 8, 2, "cpu")
    mla = MLATokenToKVPool(32, 4, torch.float16, 16, 8, 2, "cpu")
    return [
        MHATokenToKVPoolHost(mha, 2.0, 0, 4, "page_first", False),
        MLATokenToKVPoolHost(mla, 2.0, 0, 4, "layer_first", False),
    ]


def test_every_attribute_sglangs_controllers_read_exists(sglang_load: Load) -> None:
    names = _read_names(sglang_load(*CALLERS))
    assert {"prepare_transfer_indices", "storage_format_tag", "logical_size"} <= names
    stale = set(NOT_OURS) - names
    assert not stale, f"no longer read by SGLang, drop from NOT_OURS: {sorted(stale)}"
    for pool in _pools():
        missing = sorted(n for n in names - set(NOT_OURS) if not hasattr(pool, n))
        assert not missing, f"{type(pool).__name__} lacks {missing}"
        pool.close()


@pytest.mark.parametrize("index", [torch.tensor(4), torch.tensor(4, dtype=torch.int32),
                                   torch.tensor([4])])
def test_storage_page_methods_take_sglangs_tensor_index(index: torch.Tensor) -> None:
    """SGLang passes ``host_indices[i * page_size]``: a 0-d tensor (int64 or int32)."""
    for pool in _pools():
        page = pool.get_data_page(index)
        assert torch.equal(page.view(torch.uint8), pool.get_data_page(4).view(torch.uint8))
        fill = torch.full_like(page.view(torch.uint8), 0x5A).view(page.dtype)
        pool.set_from_flat_data_page(index, fill)
        assert torch.equal(pool.get_data_page(4).view(torch.uint8), fill.view(torch.uint8))
        pool.close()
