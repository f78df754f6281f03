"""The file backend beyond the kit: capacity/LRU, sharing between processes, foreign files,
SGLang's constructor conventions, the registry and failure handling."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from mem_cache_storage import (
    HiCacheFile,
    HiCacheMemory,
    HiCacheStorageConfig,
    StorageBackendFactory,
    create_backend,
    page_hashes,
    register_backend,
)

from .conftest import PS, make_host, pages_of

CFG = HiCacheStorageConfig(model_name="m", extra_config={"model_fingerprint": "w1"})


def _keys(n: int, salt: int = 0) -> list[str]:
    return page_hashes([salt * 1000 + i for i in range(n * PS)], PS)


@pytest.mark.parametrize("scheme", ["mem_cache", "sglang"])
def test_capacity_evicts_least_recently_used(tmp_path: Path, host: Any, scheme: str) -> None:
    """LRU by file: one page per segment (``segment_bytes=1``) in our scheme, the page file in
    SGLang's."""
    opts = {"key_scheme": scheme, "segment_bytes": 1}
    st = HiCacheFile(CFG, host, storage_dir=str(tmp_path), **opts)
    suffix = st.suffix
    src = host.alloc(PS)
    st.batch_set_v1(_keys(1, 0), src)
    page_file = next(tmp_path.glob(f"*{suffix}")).stat().st_size
    st.clear()
    st = HiCacheFile(CFG, host, storage_dir=str(tmp_path), capacity_bytes=10 * page_file,
                     **opts)
    keys = _keys(14, 1)
    slots = host.alloc(14 * PS)
    for i in range(8):
        assert st.batch_set_v1(keys[i : i + 1], slots[i * PS : (i + 1) * PS]) == [True]
    dst = host.alloc(PS)
    import time
    time.sleep(0.02)
    assert st.batch_get_v1(keys[0:1], dst) == [True]  # page 0 becomes the most recent
    for i in range(8, 14):
        time.sleep(0.002)
        assert st.batch_set_v1(keys[i : i + 1], slots[i * PS : (i + 1) * PS]) == [True]
    files = list(tmp_path.glob(f"*{suffix}"))
    assert len(files) * page_file <= 10 * page_file
    assert st.get_stats().evicted > 0
    assert st.exists(keys[0]), "the recently read page was evicted"
    assert not st.exists(keys[1]), "the least recently used page survived"
    assert st.usage_bytes == sum(f.stat().st_size for f in files)


def test_foreign_and_stale_files_are_misses(tmp_path: Path, host: Any) -> None:
    """SGLang's layout (one file per page); the segment layout's own cases are in
    test_storage_segments.py."""
    st = HiCacheFile(CFG, host, storage_dir=str(tmp_path), key_scheme="sglang")
    keys = _keys(2)
    src = host.alloc(2 * PS)
    assert st.batch_set_v1(keys, src) == [True, True]
    # a file renamed to another key's name (or a hash collision in a listing) is foreign
    shutil.copy(st.page_path(keys[0]), st.page_path(keys[1]))
    dst = host.alloc(2 * PS)
    assert st.batch_get_v1(keys, dst) == [True, False]
    assert st.get_stats().rejected == 1
    # garbage and an empty file
    st.page_path(keys[1]).write_bytes(b"not a page")
    assert st.batch_get_v1(keys[1:], dst[PS:]) == [False]
    st.page_path(keys[1]).write_bytes(b"")
    assert st.batch_get_v1(keys[1:], dst[PS:]) == [False]
    # a leftover temporary file from a crashed writer is ignored
    (tmp_path / ".tmp-deadbeef").write_bytes(b"partial")
    assert st.batch_exists(keys) == 2


def test_other_process_reads_and_concurrent_processes_write(tmp_path: Path) -> None:
    """Two processes write the same keys at once; a third reads them bit-exact."""
    script = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from conftest import make_host, PS
        from mem_cache_storage import HiCacheFile, HiCacheStorageConfig, page_hashes
        host = make_host()
        st = HiCacheFile(HiCacheStorageConfig(model_name="m",
                         extra_config={{"model_fingerprint": "w1"}}), host,
                         storage_dir={str(tmp_path)!r})
        keys = page_hashes(list(range(8 * PS)), PS)
        src = host.alloc(8 * PS)
        for _ in range(20):
            assert st.batch_set_v1(keys, src) == [True] * 8
        print("ok")
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "ok" in out, err
    host = make_host()  # same seed: same bytes as the writers' pools
    try:
        st = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
        keys = page_hashes(list(range(8 * PS)), PS)
        src = host.alloc(8 * PS)
        dst = host.alloc(8 * PS)
        assert st.batch_get_v1(keys, dst) == [True] * 8
        for a, b in zip(pages_of(host, src), pages_of(host, dst)):
            assert torch.equal(a, b)
        assert not list(tmp_path.glob(".tmp-*"))
    finally:
        host.close()


def test_sglang_constructor_conventions(tmp_path: Path, host: Any) -> None:
    # SGLang's own config dataclass: any object with its fields
    sg_config = SimpleNamespace(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="m", dp_rank=0, dp_size=1, tp_lcm_size=None, should_split_heads=False,
        extra_config={"storage_dir": str(tmp_path), "model_fingerprint": "w1",
                      "backend_name": "x", "module_path": "mem_cache_storage.file",
                      "class_name": "HiCacheFile", "interface_v1": 1},
    )
    dynamic = HiCacheFile(sg_config, {})  # backend_class(storage_config, kwargs)
    builtin = HiCacheFile(sg_config, host)  # backend_class(storage_config, mem_pool_host)
    dynamic.register_mem_pool_host(host)
    keys = _keys(2)
    assert builtin.batch_set_v1(keys, host.alloc(2 * PS)) == [True, True]
    assert dynamic.batch_exists(keys) == 2
    assert dynamic.storage_dir == tmp_path
    with pytest.raises(TypeError, match="options dict or a host pool"):
        HiCacheFile(sg_config, 42)


def test_registry_builtin_dynamic_and_errors(tmp_path: Path, host: Any) -> None:
    assert {"file", "memory"} <= set(StorageBackendFactory.registered())
    st = create_backend("file", CFG, host, storage_dir=str(tmp_path))
    assert isinstance(st, HiCacheFile) and st.mem_pool_host is host
    dyn_cfg = HiCacheStorageConfig(extra_config={
        "backend_name": "mine", "module_path": "mem_cache_storage.backend",
        "class_name": "HiCacheMemory"})
    dyn = create_backend("dynamic", dyn_cfg, host)
    assert isinstance(dyn, HiCacheMemory)
    register_backend("mem2", "mem_cache_storage.backend", "HiCacheMemory")
    assert isinstance(create_backend("mem2", CFG, host), HiCacheMemory)
    with pytest.raises(ValueError, match="unknown storage backend 'nope'"):
        create_backend("nope", CFG)
    with pytest.raises(ValueError, match=r"needs extra_config fields \['module_path'"):
        create_backend("dynamic", HiCacheStorageConfig(extra_config={"backend_name": "x"}))
    register_backend("broken", "mem_cache_storage.no_such_module", "X")
    with pytest.raises(ImportError, match="cannot import"):
        create_backend("broken", CFG)
    register_backend("notstorage", "mem_cache_storage.backend", "KeySpace")
    with pytest.raises(TypeError, match="is not a HiCacheStorage"):
        create_backend("notstorage", CFG)


class _Exploding(HiCacheMemory):
    """A backend whose client raises or answers nonsense."""

    mode = "raise"

    def _batch_get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[bool]:
        if self.mode == "raise":
            raise ConnectionError("store unreachable")
        return [True]  # wrong length: a partial batch


def test_failing_backend_calls_are_misses(host: Any) -> None:
    st = _Exploding(CFG, host)
    keys = _keys(3)
    src = host.alloc(3 * PS)
    assert st.batch_set_v1(keys, src) == [True] * 3
    dst = host.alloc(3 * PS)
    assert st.batch_get_v1(keys, dst) == [False] * 3
    st.mode = "short"
    assert st.batch_get_v1(keys, dst) == [False] * 3
    assert st.get(keys[0]) is None  # one key: the length fits, the metadata does not
    stats = st.get_stats()
    assert (stats.errors, stats.rejected, stats.get_hits) == (2, 1, 0)


def test_caller_mistakes_raise(tmp_path: Path, host: Any) -> None:
    st = HiCacheFile(CFG, storage_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="page size unknown"):
        st.exists("abc")
    st.register_mem_pool_host(host)
    with pytest.raises(ValueError, match="host_indices must be 1-D with len"):
        st.batch_set_v1(_keys(2), host.alloc(PS))
    with pytest.raises(TypeError, match=r"value must be a torch\.Tensor"):
        st.set("abc", [1, 2])
    with pytest.raises(ValueError, match=r"must be a CPU tensor|must be contiguous"):
        st.get("abc", torch.zeros(8, 2)[:, 0])
    with pytest.raises(ValueError, match="capacity_bytes must be >= 0"):
        HiCacheFile(CFG, storage_dir=str(tmp_path), capacity_bytes=-1)


def test_dynamic_loads_an_outside_duck_typed_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SGLang-style backend that does not inherit our base class, named by module path."""
    (tmp_path / "outside_backend.py").write_text(textwrap.dedent(
        """
        class OutsideStore:
            def __init__(self, storage_config, kwargs):
                self.config, self.kwargs, self.data = storage_config, kwargs, {}
            def register_mem_pool_host(self, pool):
                self.mem_pool_host = pool
            def get(self, key, target_location=None, target_sizes=None):
                return self.data.get(key)
            def batch_get(self, keys, target_locations=None, target_sizes=None):
                return [self.get(k) for k in keys]
            def set(self, key, value=None, target_location=None, target_sizes=None):
                self.data[key] = value
                return True
            def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
                return all(self.set(k, v) for k, v in zip(keys, values))
            def exists(self, key):
                return key in self.data
            def batch_exists(self, keys, extra_info=None):
                n = 0
                while n < len(keys) and keys[n] in self.data:
                    n += 1
                return n
        """
    ))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = HiCacheStorageConfig(extra_config={"backend_name": "outside",
                                             "module_path": "outside_backend",
                                             "class_name": "OutsideStore"})
    store = create_backend("dynamic", cfg, "pool-object", endpoint="x")
    assert type(store).__name__ == "OutsideStore"
    assert store.kwargs == {"endpoint": "x"} and store.mem_pool_host == "pool-object"
    assert store.set("a", 1) and store.batch_exists(["a", "b"]) == 1


class _SGLangLikeHostPool:
    """Only what SGLang's host pools offer a storage backend (no ``store_dtype``)."""

    def __init__(self, pages: int, page_size: int, page_bytes: int) -> None:
        self.page_size, self.layout, self.dtype = page_size, "page_first", torch.bfloat16
        self.size = pages * page_size
        self.k = torch.randint(0, 256, (pages, page_bytes // 2), dtype=torch.uint8)
        self.v = torch.randint(0, 256, (pages, page_bytes // 2), dtype=torch.uint8)

    def get_size_per_token(self) -> int:
        return int(self.k.shape[1] * 2 // self.page_size)

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        ptrs, sizes = [], []
        for page in (indices[:: self.page_size] // self.page_size).tolist():
            for buf in (self.k, self.v):
                ptrs.append(buf[page].data_ptr())
                sizes.append(buf.shape[1])
        return ptrs, sizes


def test_works_on_an_sglang_like_host_pool(tmp_path: Path) -> None:
    pool = _SGLangLikeHostPool(8, 4, 256)
    st = HiCacheFile(CFG, pool, storage_dir=str(tmp_path))
    keys = _keys(3)
    src = torch.arange(0, 12)
    assert st.batch_set_v1(keys, src) == [True] * 3
    dst = torch.arange(16, 28)
    assert st.batch_get_v1(keys, dst) == [True] * 3
    assert torch.equal(pool.k[4:7], pool.k[0:3]) and torch.equal(pool.v[4:7], pool.v[0:3])


def test_copying_path_pages_of_another_host_layout_are_misses(tmp_path: Path) -> None:
    """Flat pages follow the host layout (as SGLang's do): a page stored through ``set`` from a
    ``page_first`` pool is a miss for a ``layer_first`` pool, and a hit for a ``page_first`` one."""
    first, again = make_host("page_first"), make_host("page_first")
    layered = make_host("layer_first")
    try:
        key = _keys(1, 5)[0]
        writer = HiCacheFile(CFG, first, storage_dir=str(tmp_path))
        slot = int(first.alloc(PS)[0])
        page = first.get_data_page(slot)
        assert writer.set(key, page)
        other = HiCacheFile(CFG, layered, storage_dir=str(tmp_path))
        assert other.get(key, layered.get_dummy_flat_data_page()) is None
        same = HiCacheFile(CFG, again, storage_dir=str(tmp_path))
        got = same.get(key, again.get_dummy_flat_data_page())
        assert got is not None and torch.equal(got.view(torch.uint8), page.view(torch.uint8))
    finally:
        for pool in (first, layered, again):
            pool.close()


def test_one_page_read_path_checks_guards_and_counts_as_the_batch_path(
    tmp_path: Path, host: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``batch_get_v1`` of one key (the short path) and of several give the same answers and
    counters: a hit, a miss, a corrupted page (rejected), a failing read (an error, a miss),
    and wrong host slots raise as they do for a batch."""
    st = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    keys = _keys(2)
    src, dst = host.alloc(2 * PS), host.alloc(2 * PS)
    assert st.batch_set_v1(keys[:1], src[:PS]) == [True]
    assert st.batch_get_v1(keys[:1], dst[:PS]) == [True]
    assert torch.equal(pages_of(host, src)[0], pages_of(host, dst)[0])
    assert st.batch_get_v1(keys[1:], dst[PS:]) == [False]  # absent
    stats = st.get_stats()
    assert (stats.get_hits, stats.get_misses, stats.rejected, stats.errors) == (1, 1, 0, 0)
    assert stats.get_bytes == stats.set_bytes > 0  # one page read, one written
    extent = st.page_extent(keys[0])
    assert extent is not None
    path, offset, nbytes = extent
    with open(path, "r+b") as f:  # one flipped byte in the middle of the payload
        f.seek(offset + nbytes // 2)
        byte = f.read(1)
        f.seek(offset + nbytes // 2)
        f.write(bytes([byte[0] ^ 0x10]))
    assert st.batch_get_v1(keys[:1], dst[:PS]) == [False]
    assert st.get_stats().rejected == 1
    not_a_tensor: Any = [0, 1, 2, 3]
    with pytest.raises(TypeError):
        st.batch_get_v1(keys[:1], not_a_tensor)
    with pytest.raises(ValueError):
        st.batch_get_v1(keys[:1], dst[1 : PS + 1])  # not a whole page
    with pytest.raises(ValueError):
        st.batch_get_v1(["not a key!"], dst[:PS])
    segments = st._segments
    assert segments is not None

    def boom(*_: object) -> bool:
        raise OSError("disk gone")

    monkeypatch.setattr(segments, "get_one", boom)
    assert st.batch_get_v1(keys[:1], dst[:PS]) == [False]
    stats = st.get_stats()
    assert (stats.errors, stats.get_misses) == (1, 3)
    st.close()
