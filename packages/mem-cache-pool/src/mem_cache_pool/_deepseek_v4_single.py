"""``DeepSeekV4SingleKVPool`` and ``HiSparseC4DevicePool`` (private; re-exported by
:mod:`mem_cache_pool.deepseek_v4`)."""

from __future__ import annotations

import torch

from mem_cache_kernels import checks, deepseek_v4
from mem_cache_kernels.checks import check_dtype
from mem_cache_kernels.dispatch import pick
from mem_cache_pool._checks import (
    check_copy_layers,
    check_copy_roles,
    check_mapping,
    check_rows,
    check_slots,
)
from mem_cache_pool._page_row_pool import PageRowPool
from mem_cache_pool.base import CpuKVCopy, KVWriteLoc, _write_slots, unwrap_write_loc

__all__ = [
    "DeepSeekV4SingleKVPool",
    "HiSparseC4DevicePool",
    "compressed_last_loc",
    "translate_full_to_compressed",
]


def translate_full_to_compressed(full_loc: torch.Tensor, compress_ratio: int = 4) -> torch.Tensor:
    """Compressed slots of the full slots that complete a compressed entry.

    A full slot ``f`` has a compressed slot iff ``(f + 1) % compress_ratio == 0``, namely
    ``f // compress_ratio``; the others are dropped (order kept). Returns int64 on ``full_loc``'s
    device. Example (ratio 4): ``[3, 4, 7, 8, 11] -> [0, 1, 2]``. The boolean selection reads
    device memory (a sync on GPUs).
    """
    loc = checks.check_index("full_loc", full_loc).long()
    checks.check_index_values("full_loc", loc, limit=2**62)
    return loc[(loc + 1) % compress_ratio == 0] // compress_ratio


def compressed_last_loc(last_loc: torch.Tensor, compress_ratio: int = 4) -> torch.Tensor:
    """Compressed ``last_loc`` of a full ``last_loc``: ``(L - (ratio - 1)) // ratio``; -1 stays -1.

    ``L`` is the full slot of the last prefix token. When ``L``'s offset in its page is at least
    ``ratio - 1``, the result is the compressed slot of the prefix's last complete entry (it
    shares ``L``'s page); otherwise it may name an entry of another page. In every case it
    keeps the page congruence the allocation kernels rely on: ``(result + 1) % (ps // ratio)
    == (P // ratio) % (ps // ratio)`` for a prefix of ``P`` tokens with ``(L + 1) % ps == P %
    ps``. Example (ratio 4): ``[-1, 3, 6, 7, 8] -> [-1, 0, 0, 1, 1]``.
    """
    loc = checks.check_index("last_loc", last_loc).long()
    return torch.where(
        loc < 0, torch.full_like(loc, -1), (loc - (compress_ratio - 1)) // compress_ratio
    )


class DeepSeekV4SingleKVPool(PageRowPool):
    """DeepSeek-V4 compressed-KV pool: per layer uint8 ``[num_pages, page_row_bytes(ps)]``.

    One 584-byte record per token (448 fp8 e4m3 nope bytes, 64 bf16 rope values, 7 ue8m0 scale
    bytes, 1 pad byte) in the split page layout of :mod:`mem_cache_kernels.deepseek_v4`:
    ``[values (576 B each)][scales (8 B each)][pad to a multiple of 576 B]``.

    Args (SGLang order): ``size``, ``page_size``, ``dtype`` (must be ``torch.float8_e4m3fn``, the
    nope dtype), ``qk_nope_head_dim`` (448), ``qk_rope_head_dim`` (64), ``layer_num``, ``device``,
    ``enable_memory_saver``, ``start_layer``, ``end_layer``; keyword ``debug``.

    Writes: :meth:`set_key_buffer` (records), :meth:`set_key_buffer_parts` (quantised parts) or
    :meth:`set_kv_buffer` (float rows, quantised here). Reads: :meth:`get_key_buffer` (the page
    rows), :meth:`get_key_records`, :meth:`get_key_parts`. Slots are checked against
    ``slot_limit`` (values only on CPU / debug). ``move_kv_cache``, ``get_cpu_copy`` and
    ``load_cpu_copy`` are token-granular (records).
    """

    bytes_per_token = deepseek_v4.TOKEN_BYTES

    def __init__(  # noqa: PLR0917 (SGLang-compatible positional signature)
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str | torch.device,
        enable_memory_saver: bool = False,
        start_layer: int | None = None,
        end_layer: int | None = None,
        *,
        debug: bool = False,
    ) -> None:
        if check_dtype("dtype", dtype) != torch.float8_e4m3fn:
            raise ValueError(f"dtype must be torch.float8_e4m3fn (the nope dtype), got {dtype}")
        dims = (
            checks.check_int("qk_nope_head_dim", qk_nope_head_dim),
            checks.check_int("qk_rope_head_dim", qk_rope_head_dim),
        )
        if dims != (deepseek_v4.NOPE_DIM, deepseek_v4.ROPE_DIM):
            raise ValueError(
                "qk_nope_head_dim and qk_rope_head_dim must be 448 and 64 (a 584-byte record: "
                f"448 fp8 + 64 x 2 bf16 + 7 scales + 1 pad), got {qk_nope_head_dim} and "
                f"{qk_rope_head_dim}"
            )
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.bytes_per_page_padded = deepseek_v4.page_row_bytes(
            checks.check_int("page_size", page_size, minimum=1)
        )
        super().__init__(
            size,
            page_size,
            dtype,
            layer_num,
            device,
            enable_memory_saver,
            start_layer,
            end_layer,
            page_bytes=self.bytes_per_page_padded,
            debug=debug,
        )

    # ---------------------------------------------------------------- slot translation hook
    def _device_loc(self, name: str, loc: torch.Tensor) -> torch.Tensor:
        """Validated device slots for key writes/reads (HiSparse translates here)."""
        return self._check_slots(name, loc)

    # ---------------------------------------------------------------- writes
    def set_key_buffer(
        self, layer_id: int, loc: torch.Tensor | KVWriteLoc, records: torch.Tensor
    ) -> None:
        """Write packed records uint8 ``[n, 584]`` at slots ``loc`` ``[n]`` of one layer."""
        self._set_records(layer_id, "loc", loc, records)

    def _set_records(
        self,
        layer_id: int,
        name: str,
        loc: torch.Tensor | KVWriteLoc,
        records: torch.Tensor,
        records_name: str = "records",
    ) -> None:
        """:meth:`set_key_buffer` with the slot and record arguments called ``name`` and
        ``records_name`` (composite pools)."""
        index = self.layer_index(layer_id)
        slots = self._device_loc(name, _write_slots(name, loc))
        shape = (slots.numel(), deepseek_v4.TOKEN_BYTES)
        check_rows(records_name, records, shape, self.device, dtypes=(torch.uint8,))
        self._write_records(self.kv_buffer[index], slots, records)

    def set_key_buffer_parts(
        self,
        layer_id: int,
        loc: torch.Tensor | KVWriteLoc,
        nope_fp8: torch.Tensor,
        scales: torch.Tensor,
        rope: torch.Tensor,
    ) -> None:
        """Pack ``nope_fp8`` (fp8/uint8 ``[n, 448]``), ``scales`` (uint8 ``[n, 7]``) and ``rope``
        (bf16 ``[n, 64]``) and write them at slots ``loc``."""
        self._set_parts(self.layer_index(layer_id), "loc", loc, nope_fp8, scales, rope)

    def _set_parts(  # noqa: PLR0917 (set_key_buffer_parts' arguments, slot name first)
        self,
        index: int,
        name: str,
        loc: torch.Tensor | KVWriteLoc,
        nope_fp8: torch.Tensor,
        scales: torch.Tensor,
        rope: torch.Tensor,
    ) -> None:
        """:meth:`set_key_buffer_parts` on local layer ``index``, the slot argument ``name``."""
        slots = self._device_loc(name, unwrap_write_loc(loc))
        n = slots.numel()
        nope_dtypes = (torch.float8_e4m3fn, torch.uint8)
        check_rows(
            "nope_fp8", nope_fp8, (n, self.qk_nope_head_dim), self.device, dtypes=nope_dtypes
        )
        check_rows(
            "scales", scales, (n, deepseek_v4.SCALE_BYTES), self.device, dtypes=(torch.uint8,)
        )
        check_rows("rope", rope, (n, self.qk_rope_head_dim), self.device, dtypes=(torch.bfloat16,))
        records = deepseek_v4.pack_records(nope_fp8, scales, rope)
        self._write_records(self.kv_buffer[index], slots, records)

    def set_kv_buffer(
        self,
        layer: object,
        loc_info: torch.Tensor | KVWriteLoc,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor | None = None,
    ) -> None:
        """Quantise float rows ``cache_k`` ``[n, 512]`` or ``[n, 1, 512]`` (nope | rope) and
        write them at ``loc_info`` of ``layer`` (an int or a layer object with an int ``layer_id``).
        ``cache_v`` is ignored (no value buffer). The nope part is quantised with
        :func:`mem_cache_kernels.deepseek_v4.quantize_nope`, rope cast to bf16."""
        self._quantize_write(self.layer_index(layer, "layer"), "loc_info", loc_info, cache_k)

    def _quantize_write(
        self, index: int, name: str, loc: torch.Tensor | KVWriteLoc, cache_k: torch.Tensor
    ) -> None:
        """:meth:`set_kv_buffer` on local layer ``index`` with the slot argument called ``name``
        (composite pools)."""
        slots = self._device_loc(name, _write_slots(name, loc))
        n, width = slots.numel(), self.qk_nope_head_dim + self.qk_rope_head_dim
        t = checks.check_tensor("cache_k", cache_k)
        if not t.dtype.is_floating_point:
            raise TypeError(f"cache_k must have a floating-point dtype, got {t.dtype}")
        if tuple(t.shape) not in ((n, width), (n, 1, width)):
            raise ValueError(
                f"cache_k must have shape ({n}, {width}) or ({n}, 1, {width}), got {tuple(t.shape)}"
            )
        checks.check_on_device("cache_k", t, self.device)
        k = t.reshape(n, width)
        nope, scales = deepseek_v4.quantize_nope(k[:, : self.qk_nope_head_dim].float())
        rope = k[:, self.qk_nope_head_dim :].to(torch.bfloat16)
        records = deepseek_v4.pack_records(nope, scales, rope)
        self._write_records(self.kv_buffer[index], slots, records)

    def _write_records(self, buf: torch.Tensor, slots: torch.Tensor, records: torch.Tensor) -> None:
        """``write_records``' trusted body (dispatch.pick) on arguments the caller checked."""
        if slots.numel():
            rec = records.contiguous()
            pick("write_records", "auto", buf, slots, rec)(buf, slots, rec, self.page_size)

    # ---------------------------------------------------------------- reads
    def get_key_records(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
        """Records uint8 ``[n, 584]`` of slots ``loc`` (a copy). Waits once for the layer."""
        index = self._wait_layer(layer_id)
        slots = self._device_loc("loc", loc)
        return deepseek_v4.read_records(self.kv_buffer[index], slots, self.page_size)

    def get_key_parts(
        self, layer_id: int, loc: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(nope fp8 [n, 448], scales uint8 [n, 7], rope bf16 [n, 64])`` of slots ``loc``."""
        return deepseek_v4.unpack_records(self.get_key_records(layer_id, loc))

    # ---------------------------------------------------------------- token-granular bulk ops
    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Every layer: the records of slots ``tgt_loc`` get those of ``src_loc`` (device slots,
        no translation; all reads of a layer happen before its writes)."""
        self._move_records(tgt_loc, src_loc, "tgt_loc", "src_loc")

    def _move_records(
        self, tgt_loc: torch.Tensor, src_loc: torch.Tensor, tgt_name: str, src_name: str
    ) -> None:
        tgt = self._check_slots(tgt_name, tgt_loc)
        checks.check_distinct(tgt_name, tgt, full=self.debug)
        src = self._check_slots(src_name, src_loc, length=tgt.numel())
        if not tgt.numel():
            return
        for buf in self.kv_buffer:
            records = deepseek_v4.read_records(buf, src, self.page_size)
            self._write_records(buf, tgt, records)

    def get_cpu_copy(
        self,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> CpuKVCopy:
        """``{"kv": [per-layer CPU records uint8 [n, 584]]}`` of device slots ``indices``."""
        idx = self._check_slots("indices", indices)
        return {
            "kv": [deepseek_v4.read_records(b, idx, self.page_size).cpu() for b in self.kv_buffer]
        }

    def _check_cpu_copy(
        self, kv_cache_cpu: CpuKVCopy, idx: torch.Tensor, arg: str = "kv_cache_cpu"
    ) -> None:
        """Check that ``kv_cache_cpu`` is ``{"kv": layer_num x uint8 [n, 584]}``."""
        copy = check_copy_roles(kv_cache_cpu, ["kv"])
        want = (idx.numel(), deepseek_v4.TOKEN_BYTES)
        check_copy_layers("kv_cache_cpu['kv']", copy["kv"], self.layer_num, torch.uint8, want)

    def load_cpu_copy(
        self,
        kv_cache_cpu: CpuKVCopy,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> None:
        """Write a :meth:`get_cpu_copy` result at distinct device slots ``indices`` (checked
        first)."""
        idx = self._check_slots("indices", indices)
        checks.check_distinct("indices", idx, full=self.debug)
        self._check_cpu_copy(kv_cache_cpu, idx)
        for buf, t in zip(self.kv_buffer, kv_cache_cpu["kv"]):
            self._write_records(buf, idx, t.to(self.device))


class HiSparseC4DevicePool(DeepSeekV4SingleKVPool):
    """The device side of the HiSparse c4 pool: compress ratio 4, logical -> device slots.

    ``size`` is the number of *device* compressed slots. The allocator owns a logical compressed
    slot -> device slot mapping (int64, ``mapping[-1] == -1``, 0 = unmapped; any length >= 2) and
    installs it with :meth:`register_mapping`. Key writes and reads (:meth:`set_key_buffer`,
    :meth:`set_kv_buffer`, :meth:`get_key_records`, ...) take *logical* compressed slots and go
    through the mapping (an unmapped slot lands in the padding page). ``move_kv_cache`` /
    :meth:`transfer_values_on_device` and the CPU copy take device slots.
    """

    compress_ratio = 4

    def __init__(  # noqa: PLR0917 (SGLang-compatible positional signature)
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str | torch.device,
        enable_memory_saver: bool = False,
        start_layer: int | None = None,
        end_layer: int | None = None,
        *,
        debug: bool = False,
    ) -> None:
        super().__init__(
            size,
            page_size,
            dtype,
            qk_nope_head_dim,
            qk_rope_head_dim,
            layer_num,
            device,
            enable_memory_saver,
            start_layer,
            end_layer,
            debug=debug,
        )
        self.full_to_hisparse_device_index_mapping: torch.Tensor | None = None

    def register_mapping(self, mapping: torch.Tensor) -> None:
        """Install the logical compressed -> device slot mapping (see the class doc)."""
        length = checks.check_index("mapping", mapping, dtypes=(torch.int64,)).numel()
        if length < 2:
            raise ValueError(f"mapping must have at least 2 elements, got {length}")
        self.full_to_hisparse_device_index_mapping = check_mapping(
            "mapping", mapping, self.device, length, full=self.debug, targets=self.slot_limit
        )

    def translate_loc_from_full_to_compressed(self, full_loc: torch.Tensor) -> torch.Tensor:
        """Logical compressed slots of the full slots ``full_loc`` that complete an entry."""
        return translate_full_to_compressed(full_loc, self.compress_ratio)

    def _device_loc(self, name: str, loc: torch.Tensor) -> torch.Tensor:
        mapping = self.full_to_hisparse_device_index_mapping
        if mapping is None:
            raise RuntimeError(
                "no logical -> device mapping registered: call register_mapping(mapping) first"
            )
        logical = check_slots(name, loc, self.device, mapping.numel() - 1, full=self.debug)
        return mapping[logical.long()]

    def transfer_values_on_device(self, dst_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Copy the records of device slots ``src_loc`` to device slots ``dst_loc``, all layers."""
        self._move_records(dst_loc, src_loc, "dst_loc", "src_loc")
