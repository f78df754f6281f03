"""How segment records are laid out and written: a record is its payload alone, the pages of one
size back to back (whatever the keys' lengths), a writer reserves blocks
ahead of its segment's end without changing the file's size and gives them back at rotation and
at close, and where no reservation can be made (another platform, a file system without it) the
writes append as before."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import mem_cache_storage._segment_format as segment_format
from mem_cache_storage import HiCacheFile, HiCacheStorageConfig
from mem_cache_storage._segment_format import RESERVE_BYTES, SEGMENT_SUFFIX, reserve

from .conftest import PS, make_host, pages_of

CFG = HiCacheStorageConfig(model_name="m", extra_config={"model_fingerprint": "w1"})
#: caller keys of 65 lengths (a record's place does not depend on its key)
KEYS = ["k" * n for n in range(1, 66)]


@pytest.fixture
def host() -> Iterator[Any]:
    pool = make_host(size=512)  # 256 host pages: three sets of KEYS
    yield pool
    pool.close()


def _segments(root: Path) -> list[Path]:
    return sorted(root.glob(f"*{SEGMENT_SUFFIX}"))


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def _reserve_works(root: Path) -> bool:
    """Whether this file system reserves blocks (what the store's writes see)."""
    probe = root / "probe"
    fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        return reserve(fd, 0, 1 << 20) and os.fstat(fd).st_size == 0
    finally:
        os.close(fd)
        probe.unlink()


def test_payloads_lie_back_to_back_and_round_trip(tmp_path: Path, host: Any) -> None:
    """A record is its payload alone: the pages of one size lie back to back in write order,
    page ``n`` at ``n * page bytes`` (so a page of ``2**k`` bytes starts at a multiple of
    ``2**k``), whatever the length of the keys, in batches and in one-page calls."""
    st = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    src, dst = host.alloc(len(KEYS) * PS), host.alloc(len(KEYS) * PS)
    assert src is not None and dst is not None
    # batches of several records, then one-page calls
    for lo, hi in [(i, i + 9) for i in range(0, 36, 9)] + [(i, i + 1) for i in range(36, 65)]:
        part = src[lo * PS : hi * PS]
        assert st.batch_set_v1(KEYS[lo:hi], part) == [True] * (hi - lo)
    page_bytes = st.get_stats().set_bytes // len(KEYS)
    (seg,) = _segments(tmp_path)
    for n, key in enumerate(KEYS):
        assert st.page_extent(key) == (seg, n * page_bytes, page_bytes), key
    assert os.stat(seg).st_size == len(KEYS) * page_bytes
    assert st.batch_get_v1(KEYS, dst) == [True] * len(KEYS)
    assert all(torch.equal(a, b) for a, b in zip(pages_of(host, src), pages_of(host, dst)))
    st.close()
    # another instance (its own reads, from the log) finds every page, bit-exact
    other = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    again = host.alloc(len(KEYS) * PS)
    assert again is not None
    assert other.batch_get_v1(KEYS, again) == [True] * len(KEYS)
    assert all(torch.equal(a, b) for a, b in zip(pages_of(host, src), pages_of(host, again)))


def test_blocks_are_reserved_ahead_and_given_back(tmp_path: Path, host: Any) -> None:
    works = _reserve_works(tmp_path)
    st = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    src = host.alloc(2 * PS)
    assert src is not None
    assert st.batch_set_v1(KEYS[:2], src) == [True, True]
    (seg,) = _segments(tmp_path)
    size = os.stat(seg).st_size
    extent = st.page_extent(KEYS[1])
    assert extent is not None and size == extent[1] + extent[2]  # the size: what was written
    if works:  # the reservation holds blocks past the end
        assert _allocated(seg) >= RESERVE_BYTES
    else:
        assert _allocated(seg) < size + (1 << 20)
    st.close()
    assert os.stat(seg).st_size == size
    assert _allocated(seg) < size + (1 << 20)  # given back at close


def test_a_rotated_segment_gives_its_reserved_blocks_back(tmp_path: Path, host: Any) -> None:
    st = HiCacheFile(CFG, host, storage_dir=str(tmp_path), segment_bytes=4096)
    src, dst = host.alloc(12 * PS), host.alloc(12 * PS)
    assert src is not None and dst is not None
    for i in range(12):
        assert st.batch_set_v1(KEYS[i : i + 1], src[i * PS : (i + 1) * PS]) == [True]
    segs = _segments(tmp_path)
    assert len(segs) >= 2
    for seg in segs:  # the reservation stops at the segment's end: nothing beyond is held
        assert _allocated(seg) < 4096 + (1 << 20), seg
    assert st.batch_get_v1(KEYS[:12], dst) == [True] * 12
    assert all(torch.equal(a, b) for a, b in zip(pages_of(host, src), pages_of(host, dst)))


def test_without_a_reservation_the_writes_append(
    tmp_path: Path, host: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int, int, int]] = []

    def refused(fd: int, mode: int, offset: int, nbytes: int) -> int:
        calls.append((fd, mode, offset, nbytes))
        return -1  # what libc returns for EOPNOTSUPP / ENOSPC

    monkeypatch.setattr(segment_format, "_fallocate", refused)
    st = HiCacheFile(CFG, host, storage_dir=str(tmp_path))
    src, dst = host.alloc(4 * PS), host.alloc(4 * PS)
    assert src is not None and dst is not None
    assert st.batch_set_v1(KEYS[:2], src[: 2 * PS]) == [True, True]
    assert st.batch_set_v1(KEYS[2:4], src[2 * PS :]) == [True, True]
    assert len(calls) == 1 and calls[0][1] == 1  # FALLOC_FL_KEEP_SIZE, tried once per segment
    assert st.batch_get_v1(KEYS[:4], dst) == [True] * 4
    assert all(torch.equal(a, b) for a, b in zip(pages_of(host, src), pages_of(host, dst)))
    monkeypatch.setattr(segment_format, "_fallocate", False)  # no such call on this platform
    assert not reserve(0, 0, 4096)


def test_each_record_size_has_its_own_segment(tmp_path: Path) -> None:
    """Pages of two sizes written in turn (a hybrid model's KV pages and state pages) go to one
    segment per size, so each size's pages still lie back to back, each at a multiple of its
    size; both read back bit-exact, and ``close`` closes every open segment."""
    import ctypes

    from mem_cache_storage._page_format import PageFormat
    from mem_cache_storage._segments import SegmentStore

    counted: list[dict[str, int]] = []
    st = SegmentStore(str(tmp_path), segment_bytes=1 << 20, fsync=False, verify=True,
                      count=lambda **kw: counted.append(kw))
    fmts = {4096: PageFormat("flat", "bf16", (4096,)), 1536: PageFormat("flat", "bf16", (1536,))}
    data = {n: bytearray(torch.randint(0, 256, (6 * n,), dtype=torch.uint8).numpy())
            for n in fmts}
    base = {n: ctypes.addressof((ctypes.c_ubyte * len(b)).from_buffer(b)) for n, b in data.items()}
    for i in range(6):
        for n, fmt in fmts.items():
            assert st.put_one(f"k{n}-{i}", ((base[n] + i * n, n),), fmt) == n
    locs = {n: st.locations([f"k{n}-{i}" for i in range(6)]) for n in fmts}
    for n, found in locs.items():
        assert len({loc.segment for loc in found if loc}) == 1, n
        assert [loc.offset if loc else -1 for loc in found] == [i * n for i in range(6)], n
    assert locs[4096][0] and locs[1536][0] and locs[4096][0].segment != locs[1536][0].segment
    for n, fmt in fmts.items():
        back = bytearray(6 * n)
        addr = ctypes.addressof((ctypes.c_ubyte * len(back)).from_buffer(back))
        pages = [((addr + i * n, n),) for i in range(6)]
        assert [st.get_one(f"k{n}-{i}", pages[i], fmt) for i in range(6)] == [True] * 6
        assert back == data[n]
    st.close()
    assert not counted and not st._segs
