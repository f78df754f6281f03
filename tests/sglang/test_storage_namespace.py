"""Tenant isolation: a namespace (SGLang's ``cache_salt``, a LoRA id as ``extra_key``) enters
the page hash chain exactly as SGLang 0.5.23 seeds it, two namespaces never see each other's
pages, and no namespace keeps SGLang's plain hashes (SGLang issue #26747: pages leaked across
tenants when keys ignored ``cache_salt``)."""

from __future__ import annotations

import tempfile
import types
from collections.abc import Callable

import pytest
import torch

from mem_cache_pool import MHATokenToKVPool
from mem_cache_pool_host import MHATokenToKVPoolHost
from mem_cache_storage import (
    HiCacheFile,
    HiCacheStorageConfig,
    StorageController,
    namespace_seed,
    page_hashes,
)

PS = 4
CASES = [(None, None), (None, "tenant-a"), ("lora-7", None), ("lora-7", "tenant-a"), ("", None),
         (None, ""), ("a", "bc"), ("ab", "c")]


@pytest.mark.parametrize("extra_key,cache_salt", CASES)
def test_namespace_hashes_are_sglangs(
    sglang_load: Callable[..., list[types.ModuleType]], extra_key: str | None,
    cache_salt: str | None,
) -> None:
    (utils,) = sglang_load("sglang.srt.mem_cache.utils")
    tokens = list(range(3 * PS))
    seed = utils.storage_namespace_seed(extra_key, cache_salt)
    assert namespace_seed(extra_key, cache_salt) == seed
    assert page_hashes(tokens, PS, extra_key=extra_key, cache_salt=cache_salt) == (
        utils.get_hash_str(tokens, seed, page_size=PS))


def test_namespaces_never_share_pages() -> None:
    spaces = [(None, None), (None, "tenant-a"), (None, "tenant-b"), ("lora-7", "tenant-a")]
    tokens = list(range(5 * PS))
    chains = [page_hashes(tokens, PS, extra_key=e, cache_salt=c) for e, c in spaces]
    assert len({h for chain in chains for h in chain}) == 5 * len(spaces)  # all distinct
    dev = MHATokenToKVPool(64, PS, torch.bfloat16, 2, 8, 2, "cpu")
    host = MHATokenToKVPoolHost(dev, 2.0, 0, PS, "page_first", pin_memory=False)
    with tempfile.TemporaryDirectory() as root:
        ctl = StorageController(
            HiCacheFile(HiCacheStorageConfig(model_name="m"), {"storage_dir": root}), host)
        try:
            slots = host.alloc(5 * PS)
            assert ctl.write(chains[1], slots).written == 5  # tenant a writes
            assert ctl.lookup(chains[1]) == 5
            for other in (chains[0], chains[2], chains[3]):  # nobody else sees its pages
                assert ctl.lookup(other) == 0
                assert ctl.prefetch(other).wait(timeout=10).status == "miss"
        finally:
            ctl.close()
            host.close()
