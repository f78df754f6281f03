"""The segment layout's on-disk format (the store is :mod:`mem_cache_storage._segments`), and the
vectored write every segment write goes through (split at ``IOV_MAX`` buffers, short writes
finished). A directory holds:

* **segments** ``seg-{pid}-{random}-{n}.kvp``: append-only files, each written by one backend
  instance of one process (never shared by writers), rotated at ``segment_bytes``. A record::

      magic "MCSR" | version u16 | key length u16 | format id u64 | payload bytes u64
      | sum64 u64 | storage key (UTF-8) | payload (the page's ranges, in order)

* **the index log** ``index.kvi``: one append-only file shared by every writer (``O_APPEND``);
  after a batch's records are written, one ``write`` appends one entry per page::

      magic "MCSI" | body bytes u16 | CRC-32 of the body u32
      | body: record offset u64 | record bytes u64 | segment name length u8 | segment name | key
      (an empty key: a tombstone, the segment was deleted)

:class:`Location` is where a record lies; :func:`_entry` builds one index entry.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "INDEX_NAME",
    "SEGMENT_PREFIX",
    "SEGMENT_SUFFIX",
    "Location",
]

SEGMENT_SUFFIX = ".kvp"
SEGMENT_PREFIX = "seg-"
INDEX_NAME = "index.kvi"
_REC = struct.Struct("<4sHHQQQ")
_REC_MAGIC = b"MCSR"
_REC_VERSION = 2
_ENT = struct.Struct("<4sHI")
_ENT_MAGIC = b"MCSI"
_BODY = struct.Struct("<QQB")
_IOV_MAX = max(16, min(1024, os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024))


@dataclass(frozen=True, slots=True)
class Location:
    """Where a page's record lies: segment file name, record offset and bytes."""

    segment: str
    offset: int
    nbytes: int


def _entry(segment: str, offset: int, nbytes: int, key: str) -> bytes:
    """One index entry (an empty ``key``: a tombstone for ``segment``)."""
    sname = segment.encode()
    body = _BODY.pack(offset, nbytes, len(sname)) + sname + key.encode()
    return _ENT.pack(_ENT_MAGIC, len(body), zlib.crc32(body)) + body


def _rest(bufs: Sequence[Any], done: int) -> list[Any]:
    """The buffers of ``bufs`` past its first ``done`` bytes."""
    out: list[Any] = []
    for b in bufs:
        n = len(b)
        if done >= n:
            done -= n
            continue
        out.append(memoryview(b)[done:] if done else b)
        done = 0
    return out


def _pwritev_all(fd: int, bufs: list[Any], offset: int) -> None:
    for i in range(0, len(bufs), _IOV_MAX):
        chunk = bufs[i : i + _IOV_MAX]
        want = sum(len(b) for b in chunk)
        done = os.pwritev(fd, chunk, offset)
        while done < want:  # a short write: the rest
            step = os.pwritev(fd, _rest(chunk, done), offset + done)
            if step <= 0:
                raise OSError(f"short write to a segment ({done} of {want} bytes)")
            done += step
        offset += want
