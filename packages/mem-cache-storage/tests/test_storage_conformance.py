"""The conformance kit (mem_cache_storage.testing) against our backends, and against broken
backends it must catch."""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import pytest

from mem_cache_storage import HiCacheFile, HiCacheMemory, HiCacheStorageConfig
from mem_cache_storage.backend import HiCacheMemory as _Memory
from mem_cache_storage.testing import StorageConformanceSuite, run_conformance


def corrupt_file_page(storage: HiCacheFile, key: str) -> None:
    """Flip one payload byte of the stored page of ``key`` (in its segment or page file)."""
    extent = storage.page_extent(key)
    assert extent is not None, "no page to corrupt"
    path, offset, nbytes = extent
    with open(path, "r+b") as f:
        f.seek(offset + nbytes - 7)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0x40]))


class TestFileBackend(StorageConformanceSuite):
    def make_storage(self, config: HiCacheStorageConfig) -> Any:
        return HiCacheFile(config, {"storage_dir": str(self.tmp_dir)})

    def corrupt_stored_page(self, storage: Any, key: str) -> None:
        corrupt_file_page(storage, key)


class TestFileBackendTruncated(StorageConformanceSuite):
    """Same kit, with corruption by truncation (a torn write) and no fsync."""

    def make_storage(self, config: HiCacheStorageConfig) -> Any:
        return HiCacheFile(config, storage_dir=str(self.tmp_dir), fsync=True)

    def corrupt_stored_page(self, storage: Any, key: str) -> None:
        # a torn append: the file ends 5 bytes before the end of this page's payload
        extent = storage.page_extent(key)
        assert extent is not None, "no page to truncate"
        path, offset, nbytes = extent
        os.truncate(path, offset + nbytes - 5)


class TestMemoryBackend(StorageConformanceSuite):
    def setup_method(self, method: object = None) -> None:
        super().setup_method(method)
        self.store: OrderedDict[str, bytes] = OrderedDict()

    def make_storage(self, config: HiCacheStorageConfig) -> Any:
        return HiCacheMemory(config, {"store": self.store})

    def corrupt_stored_page(self, storage: Any, key: str) -> None:
        obj = f"{storage.storage_key(key)}.0"
        data = bytearray(self.store[obj])
        data[3] ^= 1
        self.store[obj] = bytes(data)


# ---------------------------------------------------------------- broken backends
class _NoChecksumFile(HiCacheFile):
    """Never verifies the CRC: corrupted pages come back as hits."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.verify_checksum = False


class _AnyPresentExists(HiCacheFile):
    """batch_exists counts every present key instead of the leading run."""

    def batch_exists(self, keys: list[str], extra_info: object = None) -> int:
        return sum(self._exist_pages(self.keyspace.storage_keys(keys)))


class _NoNamespace(_Memory):
    """Ignores ranks and models: every instance shares one key space."""

    def storage_key(self, key: str) -> str:
        return key

    @property
    def keyspace(self) -> Any:
        class _Flat:
            page_size = 4

            @staticmethod
            def storage_keys(keys: list[str]) -> list[str]:
                return list(keys)

            @staticmethod
            def storage_key(key: str) -> str:
                return key

        return _Flat()


class _FirstWriteWins(_Memory):
    """Keeps the first value of a key (overwrites are dropped)."""

    def _batch_put_from(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[bool]:
        fresh = [(k, p, s) for k, p, s in zip(keys, ptrs, sizes) if k not in self._store]
        if fresh:
            super()._batch_put_from(*map(list, zip(*fresh)))  # type: ignore[arg-type]
        return [True] * len(keys)


class _LyingGet(_Memory):
    """Reports every page as read, even missing ones."""

    def _get_pages(self, keys: list[str], pages: Any, fmt: Any) -> list[bool]:
        super()._get_pages(keys, pages, fmt)
        return [True] * len(keys)


def _file_suite(cls: type[HiCacheFile]) -> type[StorageConformanceSuite]:
    class Suite(TestFileBackend):
        def make_storage(self, config: HiCacheStorageConfig) -> Any:
            return cls(config, {"storage_dir": str(self.tmp_dir)})

    return Suite


def _memory_suite(cls: type[_Memory]) -> type[StorageConformanceSuite]:
    class Suite(TestMemoryBackend):
        def make_storage(self, config: HiCacheStorageConfig) -> Any:
            return cls(config, {"store": self.store})

    return Suite


BROKEN: dict[str, tuple[type[StorageConformanceSuite], set[str]]] = {
    "no-checksum": (_file_suite(_NoChecksumFile), {"test_corrupted_data_is_a_miss"}),
    "exists-counts-all": (_file_suite(_AnyPresentExists),
                          {"test_batch_exists_counts_the_prefix"}),
    "no-namespace": (_memory_suite(_NoNamespace), {"test_ranks_models_and_weights_are_separate"}),
    "first-write-wins": (_memory_suite(_FirstWriteWins), {"test_overwrite_last_value_wins"}),
    "lying-get": (_memory_suite(_LyingGet), {"test_missing_keys_are_misses",
                                             "test_clear_removes_everything"}),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_kit_catches_a_broken_backend(name: str) -> None:
    suite, expected = BROKEN[name]
    failed = {f.check for f in run_conformance(suite)}
    assert expected <= failed, (name, failed)


def test_kit_passes_our_backends_without_pytest() -> None:
    for suite in (TestFileBackend, TestMemoryBackend):
        assert run_conformance(suite) == []
