"""The storage conformance kit against ``HiCacheMooncake`` on a real local store (master with
HTTP metadata + holder, ``tools.mooncake.store``); the store failing to start fails the tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from mem_cache_storage.config import HiCacheStorageConfig
from mem_cache_storage.mooncake import HEADER_BYTES, HiCacheMooncake
from mem_cache_storage.testing import StorageConformanceSuite
from tools.mooncake.store import LocalMooncakeStore


@pytest.fixture(scope="module")
def mooncake_store() -> Iterator[LocalMooncakeStore]:
    with LocalMooncakeStore(segment_bytes=64 << 20) as s:
        yield s


class TestMooncakeConformance(StorageConformanceSuite):
    store: LocalMooncakeStore

    @pytest.fixture(autouse=True)
    def _use_store(self, mooncake_store: LocalMooncakeStore) -> None:
        self.store = mooncake_store

    def make_storage(self, config: HiCacheStorageConfig) -> Any:
        backend = HiCacheMooncake(config, self.store.client_options())
        assert backend.connected, backend.last_error
        return backend

    def corrupt_stored_page(self, storage: Any, key: str) -> None:
        skey = storage.storage_key(key)
        client = storage.client.store
        size = int(client.get_size(skey))
        raw = torch.empty(size, dtype=torch.uint8)
        assert client.get_into(skey, raw.data_ptr(), size) == size
        raw[HEADER_BYTES + size // 3] ^= 0x5A
        assert client.upsert_from(skey, raw.data_ptr(), size) == 0
