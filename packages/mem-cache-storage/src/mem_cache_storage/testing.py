"""Conformance kit: the checks every storage backend must pass, for outside backend authors too.

Usage (pytest)::

    from mem_cache_storage.testing import StorageConformanceSuite

    class TestMyBackend(StorageConformanceSuite):
        def make_storage(self, config):
            # every instance made during one test must share one store: use self.tmp_dir
            return MyBackend(config, {"storage_dir": str(self.tmp_dir)})

        def corrupt_stored_page(self, storage, key):  # optional (else that check is skipped)
            ...  # damage the stored bytes of caller key `key`

pytest collects the ``test_*`` methods. Without pytest, :func:`run_conformance` runs a suite and
returns the failures. The checks:

* zero-copy round trip (``batch_set_v1`` / ``batch_get_v1``) bit-exact for MHA and MLA host
  pools in ``page_first`` and ``layer_first`` layouts, into other host pages;
* copying round trip (``set`` / ``get`` / ``batch_set`` / ``batch_get``) bit-exact;
* ``batch_exists``: the number of consecutive keys present from the first;
* missing keys: ``exists`` false, ``get`` ``None``, ``batch_get_v1`` ``False``;
* overwrite: the last value wins;
* concurrent writers of one key (and readers meanwhile): every successful read is exactly one
  of the written pages;
* ``clear``: nothing is found afterwards;
* a page of another layout (another format) is a miss or the exact logical page, never other
  bytes; other ranks / models / weights never see a page (MLA: every TP rank shares);
* corrupted stored data is a miss (needs ``corrupt_stored_page``).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import traceback
import unittest
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mem_cache_pool import MHATokenToKVPool, MLATokenToKVPool
from mem_cache_pool_host import MHATokenToKVPoolHost, MLATokenToKVPoolHost
from mem_cache_storage.config import HiCacheStorageConfig
from mem_cache_storage.keys import page_hashes

__all__ = ["CheckFailure", "StorageConformanceSuite", "run_conformance"]

PAGE_SIZE = 4
LAYERS = 3


@dataclass(frozen=True, slots=True)
class CheckFailure:
    """One failed check of :func:`run_conformance`: its name and the error text."""

    check: str
    error: str


def _as_int(t: torch.Tensor) -> torch.Tensor:
    width = t.element_size()
    return t.reshape(-1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[width])


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(_as_int(a), _as_int(b))


class StorageConformanceSuite:
    """Base class of a backend's conformance tests (see the module docstring)."""

    tmp_dir: Path
    model_name = "conformance-model"

    # ------------------------------------------------------------ author hooks
    def make_storage(self, config: HiCacheStorageConfig) -> Any:
        """A backend for ``config``; all backends made in one test share one store."""
        raise NotImplementedError("subclasses implement make_storage(config)")

    def corrupt_stored_page(self, storage: Any, key: str) -> None:
        """Damage the stored bytes of caller key ``key`` (override to enable that check)."""
        raise unittest.SkipTest(f"{type(self).__name__} does not implement corrupt_stored_page")

    # ---------------------------------------------------------------- fixtures
    def setup_method(self, method: object = None) -> None:
        self.tmp_dir = Path(tempfile.mkdtemp(prefix="mem-cache-storage-kit-"))
        self._pools: list[Any] = []
        self._backends: list[Any] = []

    def teardown_method(self, method: object = None) -> None:
        for b in self._backends:
            close = getattr(b, "close", None)
            if callable(close):
                close()
        for p in self._pools:
            p.close()
        shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def config(self, **changes: Any) -> HiCacheStorageConfig:
        extra = {"model_fingerprint": "kit-weights-1", **changes.pop("extra", {})}
        values: dict[str, Any] = {"model_name": self.model_name, "extra_config": extra}
        values.update(changes)
        return HiCacheStorageConfig(**values)

    def storage(self, pool: Any, **config: Any) -> Any:
        backend = self.make_storage(self.config(**config))
        backend.register_mem_pool_host(pool)
        self._backends.append(backend)
        return backend

    def host_pool(self, model: str = "mha", layout: str = "page_first") -> Any:
        host: Any
        dev: Any
        if model == "mha":
            dev = MHATokenToKVPool(64, PAGE_SIZE, torch.bfloat16, 2, 8, LAYERS, "cpu")
            host = MHATokenToKVPoolHost(dev, 2.0, 0, PAGE_SIZE, layout, pin_memory=False)
        else:
            dev = MLATokenToKVPool(64, PAGE_SIZE, torch.float16, 8, 8, LAYERS, "cpu")
            host = MLATokenToKVPoolHost(dev, 2.0, 0, PAGE_SIZE, layout, pin_memory=False)
        gen = torch.Generator().manual_seed(len(self._pools))
        for buf in host.buffers:
            raw = buf.view(torch.uint8)
            raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
        self._pools.append(host)
        return host

    @staticmethod
    def keys(n: int, salt: int = 0) -> list[str]:
        return page_hashes([salt * 100_000 + i for i in range(n * PAGE_SIZE)], PAGE_SIZE)

    @staticmethod
    def pages(pool: Any, slots: torch.Tensor) -> list[torch.Tensor]:
        return [pool.get_data_page(int(s)) for s in slots[::PAGE_SIZE]]

    @staticmethod
    def alloc(pool: Any, pages: int) -> torch.Tensor:
        slots = pool.alloc(pages * PAGE_SIZE)
        if slots is None:
            raise RuntimeError("conformance host pool is too small")
        return slots  # type: ignore[no-any-return]

    # ---------------------------------------------------------------- checks
    def _roundtrip_v1(self, model: str, layout: str) -> None:
        pool = self.host_pool(model, layout)
        mla = model == "mla"
        storage = self.storage(pool, is_mla_model=mla)
        keys = self.keys(5)
        src = self.alloc(pool, 5)
        want = self.pages(pool, src)
        assert storage.batch_set_v1(keys, src, None) == [True] * 5, "batch_set_v1 failed"
        assert storage.batch_exists(keys, None) == 5, "batch_exists after batch_set_v1"
        dst = self.alloc(pool, 5)
        assert storage.batch_get_v1(keys, dst, None) == [True] * 5, "batch_get_v1 failed"
        got = self.pages(pool, dst)
        for i, (a, b) in enumerate(zip(want, got)):
            assert _same(a, b), f"page {i} differs after the zero-copy round trip"
        # another backend object on the same store (a restarted engine) reads them too
        again = self.storage(pool, is_mla_model=mla)
        dst2 = self.alloc(pool, 5)
        assert again.batch_get_v1(keys, dst2, None) == [True] * 5, "a second instance missed"
        assert all(_same(a, b) for a, b in zip(want, self.pages(pool, dst2)))

    def test_roundtrip_v1_mha_page_first(self) -> None:
        self._roundtrip_v1("mha", "page_first")

    def test_roundtrip_v1_mha_layer_first(self) -> None:
        self._roundtrip_v1("mha", "layer_first")

    def test_roundtrip_v1_mla_page_first(self) -> None:
        self._roundtrip_v1("mla", "page_first")

    def test_roundtrip_v1_mla_layer_first(self) -> None:
        self._roundtrip_v1("mla", "layer_first")

    def test_roundtrip_copying(self) -> None:
        pool = self.host_pool("mha", "page_first")
        storage = self.storage(pool)
        keys = self.keys(3, salt=1)
        src = self.alloc(pool, 3)
        pages = self.pages(pool, src)
        assert storage.set(keys[0], pages[0]) is True, "set failed"
        assert storage.batch_set(keys[1:], pages[1:]) is True, "batch_set failed"
        target = pool.get_dummy_flat_data_page()
        got = storage.get(keys[0], target)
        assert got is not None and _same(got, pages[0]), "get returned other bytes"
        outs = storage.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
        assert all(o is not None and _same(o, p) for o, p in zip(outs, pages)), "batch_get"

    def test_batch_exists_counts_the_prefix(self) -> None:
        pool = self.host_pool()
        storage = self.storage(pool)
        keys = self.keys(6, salt=2)
        src = self.alloc(pool, 6)
        ok = storage.batch_set_v1(keys[:3] + keys[4:5], torch.cat(
            [src[: 3 * PAGE_SIZE], src[4 * PAGE_SIZE : 5 * PAGE_SIZE]]), None)
        assert ok == [True] * 4, f"batch_set_v1 returned {ok}"
        assert storage.batch_exists(keys, None) == 3, "prefix of a chain with a hole at 3"
        assert storage.batch_exists(keys[3:], None) == 0, "a chain starting at a missing key"
        assert storage.batch_exists(keys[:3], None) == 3
        assert storage.batch_exists([], None) == 0
        assert storage.exists(keys[4]) is True and storage.exists(keys[3]) is False

    def test_missing_keys_are_misses(self) -> None:
        pool = self.host_pool()
        storage = self.storage(pool)
        keys = self.keys(2, salt=3)
        assert storage.exists(keys[0]) is False
        assert storage.get(keys[0], pool.get_dummy_flat_data_page()) is None
        dst = self.alloc(pool, 2)
        assert storage.batch_get_v1(keys, dst, None) == [False, False]
        assert storage.batch_exists(keys, None) == 0

    def test_overwrite_last_value_wins(self) -> None:
        pool = self.host_pool()
        storage = self.storage(pool)
        key = self.keys(1, salt=4)
        a, b = self.alloc(pool, 1), self.alloc(pool, 1)
        assert storage.batch_set_v1(key, a, None) == [True]
        assert storage.batch_set_v1(key, b, None) == [True]
        dst = self.alloc(pool, 1)
        assert storage.batch_get_v1(key, dst, None) == [True]
        assert _same(self.pages(pool, dst)[0], self.pages(pool, b)[0]), "overwrite lost"

    def test_concurrent_writers_of_one_key(self) -> None:
        pool = self.host_pool()
        key = self.keys(1, salt=5)
        writers = 4
        backends = [self.storage(pool) for _ in range(writers + 1)]
        sources = [self.alloc(pool, 1) for _ in range(writers)]
        candidates = [self.pages(pool, s)[0] for s in sources]
        errors: list[str] = []
        bad_reads = [0]
        stop = threading.Event()

        def write(i: int) -> None:
            for _ in range(8):
                if backends[i].batch_set_v1(key, sources[i], None) != [True]:
                    errors.append(f"writer {i}: batch_set_v1 failed")

        def read() -> None:
            dst = self.alloc(pool, 1)
            while not stop.is_set():
                if backends[-1].batch_get_v1(key, dst, None) == [True]:
                    got = self.pages(pool, dst)[0]
                    if not any(_same(got, c) for c in candidates):
                        bad_reads[0] += 1

        reader = threading.Thread(target=read)
        reader.start()
        threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        reader.join()
        assert not errors, errors[0]
        assert bad_reads[0] == 0, f"{bad_reads[0]} reads returned a mix of pages"
        dst = self.alloc(pool, 1)
        assert backends[0].batch_get_v1(key, dst, None) == [True]
        got = self.pages(pool, dst)[0]
        assert any(_same(got, c) for c in candidates), "the final page is none of the writes"

    def test_clear_removes_everything(self) -> None:
        pool = self.host_pool()
        storage = self.storage(pool)
        keys = self.keys(3, salt=6)
        assert storage.batch_set_v1(keys, self.alloc(pool, 3), None) == [True] * 3
        storage.clear()
        assert storage.batch_exists(keys, None) == 0
        assert not any(storage.exists(k) for k in keys)
        assert storage.batch_get_v1(keys, self.alloc(pool, 3), None) == [False] * 3

    def test_other_layout_is_a_miss_or_exact(self) -> None:
        writer_pool = self.host_pool("mha", "page_first")
        reader_pool = self.host_pool("mha", "layer_first")
        keys = self.keys(2, salt=7)
        src = self.alloc(writer_pool, 2)
        assert self.storage(writer_pool).batch_set_v1(keys, src, None) == [True, True]
        dst = self.alloc(reader_pool, 2)
        ok = self.storage(reader_pool).batch_get_v1(keys, dst, None)
        for i, hit in enumerate(ok):
            if hit:
                assert _same(self.pages(writer_pool, src)[i], self.pages(reader_pool, dst)[i]), (
                    f"page {i} read through another layout returned other bytes"
                )

    def test_ranks_models_and_weights_are_separate(self) -> None:
        pool = self.host_pool()
        keys = self.keys(1, salt=8)
        src = self.alloc(pool, 1)
        assert self.storage(pool, tp_rank=0, tp_size=2).batch_set_v1(keys, src, None) == [True]
        assert self.storage(pool, tp_rank=1, tp_size=2).exists(keys[0]) is False, "TP ranks"
        assert self.storage(pool, tp_rank=0, tp_size=2, model_name="other").exists(
            keys[0]) is False, "models"
        assert self.storage(pool, tp_rank=0, tp_size=2, extra={
            "model_fingerprint": "kit-weights-2"}).exists(keys[0]) is False, "weights"
        mla_pool = self.host_pool("mla")
        mla_src = self.alloc(mla_pool, 1)
        writer = self.storage(mla_pool, is_mla_model=True, tp_rank=0, tp_size=2)
        assert writer.batch_set_v1(keys, mla_src, None) == [True]
        reader = self.storage(mla_pool, is_mla_model=True, tp_rank=1, tp_size=2)
        assert reader.exists(keys[0]) is True, "MLA pages are shared by every TP rank"

    def test_corrupted_data_is_a_miss(self) -> None:
        pool = self.host_pool()
        storage = self.storage(pool)
        keys = self.keys(2, salt=9)
        assert storage.batch_set_v1(keys, self.alloc(pool, 2), None) == [True, True]
        self.corrupt_stored_page(storage, keys[1])
        dst = self.alloc(pool, 2)
        ok = storage.batch_get_v1(keys, dst, None)
        assert ok[1] is False, "a corrupted page was returned as a hit"
        assert ok[0] is True, "an intact page next to a corrupted one was lost"


def run_conformance(suite: type[StorageConformanceSuite]) -> list[CheckFailure]:
    """Run every ``test_*`` check of ``suite`` (skips are not failures); the failures."""
    failures: list[CheckFailure] = []
    for name in sorted(n for n in dir(suite) if n.startswith("test_")):
        inst = suite()
        inst.setup_method()
        check: Callable[[], None] = getattr(inst, name)
        try:
            check()
        except unittest.SkipTest:
            pass
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}" if str(exc) else traceback.format_exc(limit=3)
            failures.append(CheckFailure(name, text))
        finally:
            inst.teardown_method()
    return failures
