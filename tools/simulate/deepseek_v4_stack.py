"""The DeepSeek-V4 HiSparse memory stack of ``--model deepseek_v4``, built the way SGLang builds it.

* device: one :class:`~mem_cache_pool.deepseek_v4.DeepSeekV4TokenToKVPool` with
  ``enable_hisparse=True`` (a sliding-window pool for every layer, a HiSparse c4 device pool for
  the ratio-4 layers, a c128 pool for the ratio-128 layers when the page size allows them);
* allocators: ``SWATokenToKVPoolAllocator(size, size_swa, ps, ..., kvcache=<the pool>)`` (the
  pool's ``full_kv_pool`` is ``None``), wrapped by
  ``DeepSeekV4HiSparseTokenToKVPoolAllocator(swa)``;
* host: one :class:`~mem_cache_pool_host.deepseek_v4.DeepSeekV4SingleKVPoolHost` per record pool
  (window, c4, c128), all with ``host_tokens // page_size`` page rows, so a cached prefix of
  ``n`` tokens takes ``n // page_size`` rows in each.

Slot spaces (ratio ``r`` in 4, 128): a *logical* full slot ``f`` (what requests own); its window
slot ``translate_loc_from_full_to_swa(f)``; its compressed entry exists iff ``(f + 1) % r == 0``,
at logical compressed slot ``f // r``. c128 entries live at that slot; c4 entries live at the
*device* slot ``full_to_hisparse_device_index_mapping[f // 4]`` that the HiSparse allocator
assigned (the c4 pool translates logical compressed slots through that mapping).

The window pool holds every live token (``size_swa == size``): the simulator never releases
window slots early (``free_swa``), so a cached prefix keeps its window records until it is freed.

Content: every record is a pure function of (session, position, layer, kind) built from the
seeded :class:`~tools.simulate.content.ContentModel` bytes and packed with
:func:`mem_cache_kernels.deepseek_v4.pack_records`; checks unpack what the pools return
(:func:`~mem_cache_kernels.deepseek_v4.unpack_records`) and compare every part bit-exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mem_cache_allocator import SWATokenToKVPoolAllocator
from mem_cache_allocator.deepseek_v4_hisparse import DeepSeekV4HiSparseTokenToKVPoolAllocator
from mem_cache_kernels import deepseek_v4
from mem_cache_pool import ReqToTokenPool
from mem_cache_pool.deepseek_v4 import (
    DeepSeekV4SingleKVPool,
    DeepSeekV4TokenToKVPool,
    translate_full_to_compressed,
)
from mem_cache_pool_host.deepseek_v4 import DeepSeekV4SingleKVPoolHost
from tools.simulate.config import SimConfig
from tools.simulate.content import ContentModel

__all__ = ["ROLE", "DeepSeekV4Stack", "RecordKind", "build_deepseek_v4_stack", "deepseek_v4_ratios"]

_FP8 = torch.float8_e4m3fn
_NOPE, _ROPE = deepseek_v4.NOPE_DIM, deepseek_v4.ROPE_DIM
_VALUES = deepseek_v4.VALUE_BYTES  # 576: nope bytes + rope bytes
ROLE = {"swa": 0, "c4": 1, "c128": 2}  # content role of each record kind


def deepseek_v4_ratios(layers: int, page_size: int) -> list[int]:
    """Compress ratio per layer: ``0, 4`` repeated, with every fourth layer ratio 128 when
    ``page_size`` is a multiple of 128 (ratio-128 layers need it)."""
    cycle = (0, 4, 128, 4) if page_size % 128 == 0 else (0, 4)
    return [cycle[i % len(cycle)] for i in range(layers)]


@dataclass(slots=True)
class RecordKind:
    """One record pool and its host mirror: ``ratio`` 1 is the window pool (every token), 4 or
    128 a compressed pool (one entry per ``ratio`` full slots); ``layers`` are the global layer
    ids that write it, in the pool's local layer order."""

    name: str
    ratio: int
    pool: DeepSeekV4SingleKVPool
    host: DeepSeekV4SingleKVPoolHost
    layers: list[int]
    capacity: int  # host page rows


@dataclass(slots=True)
class DeepSeekV4Stack:
    """The DeepSeek-V4 stack and the content helpers of the simulator (see the module doc)."""

    cfg: SimConfig
    device: torch.device
    pool: DeepSeekV4TokenToKVPool
    swa_allocator: SWATokenToKVPoolAllocator
    allocator: DeepSeekV4HiSparseTokenToKVPoolAllocator
    req_pool: ReqToTokenPool
    kinds: list[RecordKind]
    content: ContentModel
    page_size: int
    logical_capacity: int
    swa_capacity: int
    c4_device_capacity: int
    req_capacity: int
    bytes_per_token: int

    @property
    def layers(self) -> range:
        return range(self.pool.start_layer, self.pool.start_layer + self.pool.layer_num)

    def kind(self, name: str) -> RecordKind:
        for k in self.kinds:
            if k.name == name:
                return k
        raise KeyError(name)

    # ------------------------------------------------------------------ slots
    def entry_mask(self, full: torch.Tensor, ratio: int) -> torch.Tensor:
        """Which of the logical full slots ``full`` complete a ratio-``ratio`` entry."""
        return (full + 1) % ratio == 0

    def device_slots(self, kind: RecordKind, full: torch.Tensor) -> torch.Tensor:
        """Device token slots in ``kind.pool`` of the records of logical slots ``full`` (window
        slots for the window pool; the mapped device slots of their c4 entries; their c128
        slots)."""
        if kind.ratio == 1:
            return self.allocator.translate_loc_from_full_to_swa(full)
        compressed = translate_full_to_compressed(full, kind.ratio)
        if kind.ratio == 4:
            return self.allocator.full_to_hisparse_device_index_mapping[compressed]
        return compressed

    # ------------------------------------------------------------------ content
    def hashes(self, sessions: torch.Tensor, positions: torch.Tensor, layers: int) -> torch.Tensor:
        """Content seed words ``[layers, kinds, n]`` of tokens (``sessions``, ``positions``) for
        local layers ``0..layers-1`` (index ``[layer, ROLE[kind]]``)."""
        return self.content.hashes(sessions, positions, layers)

    def parts(
        self, h: torch.Tensor, kind: str
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Expected ``(nope fp8 [n, 448], scales uint8 [n, 7], rope bf16 [n, 64])`` of ``kind``
        records with seed words ``h`` ``[n]`` (a ``hashes(...)[layer, ROLE[kind]]`` slice)."""
        raw = self.content.rows_int_from(h, ROLE[kind])  # uint8 [n, 584]
        nope = raw[:, :_NOPE].contiguous().view(_FP8)
        rope = raw[:, _NOPE:_VALUES].contiguous().view(torch.bfloat16)
        scales = raw[:, _VALUES : _VALUES + deepseek_v4.SCALE_BYTES].contiguous()
        return nope, scales, rope

    def records(self, h: torch.Tensor, kind: str) -> torch.Tensor:
        """Expected packed records uint8 ``[n, 584]`` (``pack_records`` of :meth:`parts`)."""
        return deepseek_v4.pack_records(*self.parts(h, kind))

    def mismatches(self, got: torch.Tensor, h: torch.Tensor, kind: str) -> int:
        """Records among ``got`` (uint8 ``[n, 584]``) whose unpacked parts differ bit-exact from
        the expected ones (seed words ``h`` ``[n]``)."""
        want = self.parts(h, kind)
        have = deepseek_v4.unpack_records(got.to(self.device))
        bad = torch.zeros(got.shape[0], dtype=torch.bool, device=self.device)
        for w, g in zip(want, have):
            wi = w.reshape(w.shape[0], -1).view(torch.uint8)
            gi = g.reshape(g.shape[0], -1).view(torch.uint8)
            bad |= (wi != gi).any(dim=1)
        return int(bad.sum())

    def write(self, full: torch.Tensor, sessions: torch.Tensor, positions: torch.Tensor) -> None:
        """Write every record of tokens (``sessions[i]``, ``positions[i]``) at logical slots
        ``full[i]``: window records of every layer, compressed records of the entries they
        complete (c4 at logical compressed slots, translated by the c4 pool)."""
        pool = self.pool
        swa_loc = self.allocator.translate_loc_from_full_to_swa(full)
        masks = {r: self.entry_mask(full, r) for r in (4, 128)}
        h = self.hashes(sessions, positions, pool.layer_num)
        for i, layer_id in enumerate(self.layers):
            pool.set_swa_key_buffer(layer_id, swa_loc, self.records(h[i, ROLE["swa"]], "swa"))
            ratio = pool.get_compress_ratio(layer_id)
            if ratio:
                m, kind = masks[ratio], f"c{ratio}"
                rec = self.records(h[i, ROLE[kind]][m], kind)
                pool.set_compressed_key_buffer(layer_id, full[m] // ratio, rec)

    def verify_layer(
        self, layer_index: int, full: torch.Tensor, sessions: torch.Tensor, positions: torch.Tensor
    ) -> int:
        """Mismatching records (window + compressed) of one local layer for logical ``full``,
        read through the sub-pools' record reads (c4 through the HiSparse mapping)."""
        layer_id = self.pool.start_layer + layer_index
        h = self.hashes(sessions, positions, layer_index + 1)[layer_index]
        swa_loc = self.device_slots(self.kinds[0], full)
        swa = self.pool.swa_kv_pool.get_key_records(layer_id, swa_loc)
        bad = self.mismatches(swa, h[ROLE["swa"]], "swa")
        ratio, local, sub = self.pool.layer_mapping[layer_id]
        if ratio and sub is not None:
            m, kind = self.entry_mask(full, ratio), f"c{ratio}"
            got = sub.get_key_records(local, full[m] // ratio)
            bad += self.mismatches(got, h[ROLE[kind]][m], kind)
        return bad


def build_deepseek_v4_stack(cfg: SimConfig, max_context_len: int) -> DeepSeekV4Stack:
    """Construct the stack of ``cfg`` (``page_size`` a multiple of 4; see the module doc).

    Logical capacity ``device_tokens`` (whole pages). With ratio-128 layers (page size a multiple
    of 128) the c4 device pool holds half of the logical c4 space (HiSparse: ``available_size()``
    is then ``min(logical, 4 x device)``); otherwise all of it.
    """
    ps = cfg.page_size
    if ps % 4:
        raise ValueError(f"page_size must be a multiple of 4 for --model deepseek_v4, got {ps}")
    device = torch.device(cfg.device)
    size = cfg.device_tokens // ps * ps
    ratios = deepseek_v4_ratios(cfg.layers, ps)
    has_c128 = 128 in ratios
    c128_size = size // 128 if has_c128 else 0
    c4_size = size // 8 if has_c128 else size // 4
    reqs = cfg.max_running
    pool = DeepSeekV4TokenToKVPool(
        reqs, size, c4_size, c128_size, reqs, reqs, ps, ps, _FP8, torch.float32, torch.float32,
        _NOPE, _ROPE, 64, cfg.layers, device, False, ratios, enable_hisparse=True, state_dim=8,
    )  # fmt: skip
    swa = SWATokenToKVPoolAllocator(pool.size, size, ps, _FP8, device, pool, False)
    allocator = DeepSeekV4HiSparseTokenToKVPoolAllocator(swa)
    req_pool = ReqToTokenPool(reqs, max_context_len, device)
    rows = cfg.host_tokens // ps
    kinds: list[RecordKind] = []
    subs = (("swa", 1, pool.swa_kv_pool), ("c4", 4, pool.c4_kv_pool))
    for name, ratio, sub in (*subs, ("c128", 128, pool.c128_kv_pool)):
        if sub is None:
            continue
        desc = sub.get_buffer_desc()
        host = DeepSeekV4SingleKVPoolHost(
            sub,
            host_size_bytes=rows * desc.bytes_per_token,
            layout=cfg.host_layout,
            pin_memory=device.type == "cuda",
            io_backend=cfg.io_backend,
        )
        layers = [lid for lid in range(pool.start_layer, pool.start_layer + cfg.layers)
                  if ratio == 1 or pool.get_compress_ratio(lid) == ratio]  # fmt: skip
        kinds.append(RecordKind(name, ratio, sub, host, layers, host.available_size()))
    content = ContentModel([(deepseek_v4.TOKEN_BYTES,)] * 3, torch.uint8, device, cfg.seed)
    record_bytes = deepseek_v4.TOKEN_BYTES
    per_token = sum(len(k.layers) * record_bytes / k.ratio for k in kinds)
    return DeepSeekV4Stack(
        cfg=cfg,
        device=device,
        pool=pool,
        swa_allocator=swa,
        allocator=allocator,
        req_pool=req_pool,
        kinds=kinds,
        content=content,
        page_size=ps,
        logical_capacity=swa.full_available_size(),
        swa_capacity=swa.swa_available_size(),
        c4_device_capacity=allocator.hisparse_attn_allocator.available_size(),
        req_capacity=req_pool.available_size(),
        bytes_per_token=round(per_token),
    )
