"""SGLang's Mooncake objects (the ``sglang`` key scheme of
:class:`~mem_cache_storage.mooncake.HiCacheMooncake`): a page is SGLang's ``{key}_k`` /
``{key}_v`` objects (MLA: ``{key}_k``), raw bytes, so an SGLang instance and this backend read
each other's pages; a side-car ``{key}_mcs`` (magic, size, CRC-32), written first when checksums
are on, makes a page this backend wrote and that was damaged later a miss (a page SGLang wrote
has none: its size is checked)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from mem_cache_storage._mooncake_client import _CHUNK, MooncakeClient
from mem_cache_storage.backend import PageFormat, PageRanges, StorageStats, checksum
from mem_cache_storage.config import HiCacheStorageConfig

__all__ = ["SGLangObjects"]

_SIDE = struct.Struct("<4sQI")  # the sglang scheme's side-car: magic, payload bytes, crc32
_SIDE_MAGIC = b"MCSs"


class SGLangObjects:
    """The ``sglang`` scheme's calls of :class:`~mem_cache_storage.mooncake.HiCacheMooncake`
    (a base of it: the backend's hooks call them when ``key_scheme == "sglang"``)."""

    storage_config: HiCacheStorageConfig
    stats: StorageStats
    verify_checksum: bool

    if TYPE_CHECKING:  # the backend's, used here

        @property
        def _client(self) -> MooncakeClient: ...

        def _run(self, what: str, fn: Callable[..., Any], n: int, *args: Any) -> list[int]: ...

        def _with_ranges(
            self, pages: Sequence[PageRanges], call: Callable[[], list[int]]
        ) -> list[int]: ...

        def _count_refused(self, codes: list[int]) -> None: ...

    def _sgl_parts(self, skey: str, page: PageRanges) -> list[tuple[str, PageRanges]]:
        """SGLang's objects of one page: MLA ``{skey}_k`` (every range), MHA ``{skey}_k`` /
        ``{skey}_v`` (the first / second half of the flat page: K then V)."""
        if self.storage_config.is_mla_model:
            return [(f"{skey}_k", page)]
        half = sum(n for _, n in page) // 2
        k: list[tuple[int, int]] = []
        v: list[tuple[int, int]] = []
        off = 0
        for ptr, n in page:
            if off + n <= half:
                k.append((ptr, n))
            elif off >= half:
                v.append((ptr, n))
            else:
                k.append((ptr, half - off))
                v.append((ptr + half - off, n - (half - off)))
            off += n
        return [(f"{skey}_k", tuple(k)), (f"{skey}_v", tuple(v))]

    def _sgl_objects(self, keys: list[str], pages: Sequence[PageRanges]
                     ) -> tuple[list[str], list[PageRanges], int]:
        okeys: list[str] = []
        oranges: list[PageRanges] = []
        for skey, page in zip(keys, pages):
            for okey, ranges in self._sgl_parts(skey, page):
                okeys.append(okey)
                oranges.append(ranges)
        return okeys, oranges, (1 if self.storage_config.is_mla_model else 2)

    def _sgl_exist(self, keys: list[str]) -> list[bool]:
        per = 1 if self.storage_config.is_mla_model else 2
        okeys = [f"{k}_{s}" for k in keys for s in ("k", "v")[:per]]
        found: list[bool] = []
        for lo in range(0, len(okeys), _CHUNK):
            part = okeys[lo : lo + _CHUNK]
            codes = self._run("batch_is_exist", lambda s, k: s.batch_is_exist(k), len(part), part)
            found.extend(c == 1 for c in codes)
        return [all(found[i * per : (i + 1) * per]) for i in range(len(keys))]

    def _sgl_put(
        self, keys: list[str], pages: Sequence[PageRanges], fmt: PageFormat
    ) -> list[bool]:
        """SGLang's objects, raw bytes; a present page is kept (same key, same prefix: same
        bytes, as SGLang's ``batch_set_v1`` does); a side-car ``{skey}_mcs`` (magic, size,
        CRC-32) is written first when checksums are on."""
        out = [False] * len(keys)
        present = self._sgl_exist(keys)
        todo = [i for i, p in enumerate(present) if not p]
        for i, p in enumerate(present):
            out[i] = p
        for lo in range(0, len(todo), _CHUNK):
            idx = todo[lo : lo + _CHUNK]
            ks, ps = [keys[i] for i in idx], [pages[i] for i in idx]
            side_ok = [True] * len(ks)
            if self.verify_checksum:
                side_ok = self._sgl_put_sidecars(ks, ps, fmt)
            okeys, oranges, per = self._sgl_objects(ks, ps)
            def put(okeys: list[str] = okeys, oranges: list[PageRanges] = oranges,
                    cfg: Any = self._client.replicate) -> list[int]:
                return self._run(
                    "batch_put_from_multi_buffers",
                    lambda s, k, p, z: s.batch_put_from_multi_buffers(k, p, z, cfg),
                    len(okeys), okeys, [[p for p, _ in r] for r in oranges],
                    [[n for _, n in r] for r in oranges])

            codes = self._with_ranges(ps, put)
            self._count_refused(codes)
            for j, i in enumerate(idx):
                out[i] = side_ok[j] and all(c == 0 for c in codes[j * per : (j + 1) * per])
        return out

    def _sgl_put_sidecars(self, keys: list[str], pages: Sequence[PageRanges], fmt: PageFormat
                          ) -> list[bool]:
        staging = torch.zeros(len(keys) * _SIDE.size, dtype=torch.uint8)
        base = int(staging.data_ptr())
        for i, page in enumerate(pages):
            staging[i * _SIDE.size : (i + 1) * _SIDE.size] = torch.frombuffer(
                bytearray(_SIDE.pack(_SIDE_MAGIC, fmt.nbytes, checksum(page))), dtype=torch.uint8)
        cfg = self._client.replicate

        def upsert() -> list[int]:
            return self._run("batch_upsert_from",
                             lambda s, k, p, z: s.batch_upsert_from(k, p, z, cfg), len(keys),
                             [f"{k}_mcs" for k in keys],
                             [base + i * _SIDE.size for i in range(len(keys))],
                             [_SIDE.size] * len(keys))

        codes = self._with_ranges([((base, staging.numel()),)], upsert)
        self._count_refused(codes)
        return [c == 0 for c in codes]

    def _sgl_get(
        self, keys: list[str], pages: Sequence[PageRanges], fmt: PageFormat
    ) -> list[bool]:
        out: list[bool] = []
        for lo in range(0, len(keys), _CHUNK):
            ks, ps = keys[lo : lo + _CHUNK], pages[lo : lo + _CHUNK]
            okeys, oranges, per = self._sgl_objects(ks, ps)

            def get(okeys: list[str] = okeys, oranges: list[PageRanges] = oranges) -> list[int]:
                return self._run(
                    "batch_get_into_multi_buffers",
                    lambda s, k, p, z: s.batch_get_into_multi_buffers(k, p, z),
                    len(okeys), okeys, [[p for p, _ in r] for r in oranges],
                    [[n for _, n in r] for r in oranges])

            codes = self._with_ranges(ps, get)
            crcs = self._sgl_get_sidecars(ks, fmt) if self.verify_checksum else [None] * len(ks)
            for j, page in enumerate(ps):
                sizes = [sum(n for _, n in oranges[j * per + q]) for q in range(per)]
                if any(codes[j * per + q] != sizes[q] for q in range(per)):
                    if any(c > 0 for c in codes[j * per : (j + 1) * per]):
                        self.stats.add(rejected=1)  # present but of another size
                    out.append(False)
                    continue
                want = crcs[j]
                if want is False or (want is not None and checksum(page) != want):
                    self.stats.add(rejected=1)
                    out.append(False)
                    continue
                out.append(True)
        return out

    def _sgl_get_sidecars(self, keys: list[str], fmt: PageFormat) -> list[int | bool | None]:
        """Each page's side-car CRC: ``None`` when it has none (SGLang wrote it), ``False``
        when the side-car is damaged or names another size."""
        staging = torch.zeros(len(keys) * _SIDE.size, dtype=torch.uint8)
        base = int(staging.data_ptr())

        def get() -> list[int]:
            return self._run("batch_get_into", lambda s, k, p, z: s.batch_get_into(k, p, z),
                             len(keys), [f"{k}_mcs" for k in keys],
                             [base + i * _SIDE.size for i in range(len(keys))],
                             [_SIDE.size] * len(keys))

        codes = self._with_ranges([((base, staging.numel()),)], get)
        out: list[int | bool | None] = []
        for i, code in enumerate(codes):
            if code <= 0:
                out.append(None)
                continue
            raw = bytes(staging[i * _SIDE.size : (i + 1) * _SIDE.size].numpy())
            magic, nbytes, crc = _SIDE.unpack(raw)
            out.append(int(crc) if code == _SIDE.size and magic == _SIDE_MAGIC
                       and nbytes == fmt.nbytes else False)
        return out
