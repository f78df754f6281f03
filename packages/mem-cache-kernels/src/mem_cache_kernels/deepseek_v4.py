"""DeepSeek-V4 compressed KV records: quantisation, pack/unpack and page-row addressing.

The DeepSeek-V4 compressed KV cache stores one *record* of 584 bytes per token.

Record layout (``TOKEN_BYTES = 584`` bytes, uint8)::

    [0, 448)    nope: 448 float8_e4m3fn values (one byte each)
    [448, 576)  rope: 64 bfloat16 values (2 bytes each, native byte order)
    [576, 583)  scales: 7 ue8m0 bytes, byte g is the scale of nope[64 g : 64 g + 64]
    [583]       pad: always written as 0

A ue8m0 scale byte ``b`` stands for the power of two ``2 ** (b - 127)``; the dequantised nope value
is ``float(nope_fp8) * 2 ** (b - 127)``. The record's first 576 bytes are the *value* part, the
last 8 bytes the *scale* part.

Page rows (split layout). A page-major buffer holds one row of ``page_row_bytes(page_size)``
bytes per page: ``page_size * 584`` rounded up to a multiple of 576. Token slot ``t`` lives in page
``t // page_size`` at offset ``o = t % page_size``::

    [o * 576, o * 576 + 576)                            value part of the token's record
    [page_size * 576 + o * 8, page_size * 576 + o * 8 + 8)  scale part of the token's record
    [page_size * 584, page_bytes)                       tail padding, never written

so a page row is ``[value_0 .. value_{ps-1}][scale_0 .. scale_{ps-1}][pad]`` and a token is *not*
contiguous inside its row (its 584 bytes are two runs). Whole-row (page-aligned) copies move
tokens intact; token-granular copies go through :func:`read_records` /
:func:`write_records`.

Who does what:

* :func:`quantize_nope` / :func:`dequantize_nope` are plain torch arithmetic shared by
  every backend, so quantisation is identical whichever backend moves the bytes.
* :func:`pack_records`, :func:`unpack_records`, :func:`write_records` and
  :func:`read_records` are pure byte movement with a torch reference and a Triton
  implementation (``backend=``), bit-exact with each other.
"""

from __future__ import annotations

import torch

from mem_cache_kernels import checks as v
from mem_cache_kernels.dispatch import Backend, pick

__all__ = [
    "NOPE_DIM",
    "PAGE_ALIGN",
    "QUANT_GROUP",
    "ROPE_DIM",
    "SCALE_BYTES",
    "SCALE_PART_BYTES",
    "TOKEN_BYTES",
    "UE8M0_BIAS",
    "VALUE_BYTES",
    "dequantize_nope",
    "page_row_bytes",
    "pack_records",
    "quantize_nope",
    "read_records",
    "unpack_records",
    "write_records",
]

NOPE_DIM = 448
ROPE_DIM = 64
QUANT_GROUP = 64
SCALE_BYTES = NOPE_DIM // QUANT_GROUP  # 7
VALUE_BYTES = NOPE_DIM + 2 * ROPE_DIM  # 576
SCALE_PART_BYTES = SCALE_BYTES + 1  # 7 scale bytes + 1 pad byte
TOKEN_BYTES = VALUE_BYTES + SCALE_PART_BYTES  # 584
PAGE_ALIGN = 576
UE8M0_BIAS = 127
_FP8 = torch.float8_e4m3fn
_FP8_MAX = 448.0


def page_row_bytes(page_size: int) -> int:
    """Bytes of one page row: ``page_size * 584`` rounded up to a multiple of 576."""
    raw = v.check_int("page_size", page_size, minimum=1) * TOKEN_BYTES
    return -(-raw // PAGE_ALIGN) * PAGE_ALIGN


# ----------------------------------------------------------------------------- validation


def _check_2d(name: str, t: torch.Tensor, cols: int, dtypes: tuple[torch.dtype, ...]) -> None:
    v.check_tensor_of(name, t, dtypes=dtypes)
    if t.dim() != 2 or t.shape[1] != cols:
        raise ValueError(f"{name} must have shape [n, {cols}], got {list(t.shape)}")


def _check_page_buffer(buffer: torch.Tensor, page_size: int) -> None:
    page_bytes = page_row_bytes(page_size)
    v.check_tensor_of("buffer", buffer, dtypes=(torch.uint8,))
    if buffer.dim() != 2 or buffer.shape[1] != page_bytes:
        raise ValueError(
            f"buffer must be uint8 [pages, {page_bytes}] for page_size={page_size}, "
            f"got {buffer.dtype} {list(buffer.shape)}"
        )
    if buffer.stride(1) != 1 or buffer.stride(0) % 4 or buffer.storage_offset() % 4:
        raise ValueError(
            "buffer rows must be contiguous with a row stride and offset that are multiples "
            f"of 4 bytes, got strides {buffer.stride()} and offset {buffer.storage_offset()}"
        )


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Contiguous uint8 view of a 2-D tensor (``[n, cols * itemsize]``)."""
    return t.contiguous().view(torch.uint8)


# ----------------------------------------------------------------------------- quantisation


def quantize_nope(nope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``nope`` (float ``[n, 448]``) to fp8 e4m3 values with per-64 ue8m0 scales.

    For each group of 64 values, the scale is the smallest power of two ``2 ** e`` with
    ``amax / 2 ** e <= 448`` (``e`` clamped to ``[-127, 127]``; an all-zero group gets ``e = 0``),
    the values become ``(x * 2 ** -e).clamp(-448, 448).to(float8_e4m3fn)`` and the scale byte is
    ``e + 127``. Only finite values set the scale; NaN stays NaN and +-inf saturate to +-448.
    Returns ``(nope_fp8 [n, 448] float8_e4m3fn, scales [n, 7] uint8)``
    on ``nope``'s device. Plain torch arithmetic: identical for every backend.
    """
    _check_2d("nope", nope, NOPE_DIM, (torch.float32, torch.bfloat16, torch.float16))
    x = nope.float().view(nope.shape[0], SCALE_BYTES, QUANT_GROUP)
    amax = torch.nan_to_num(x.abs(), nan=0.0, posinf=0.0).amax(dim=-1)  # finite values only
    mant, expo = torch.frexp(amax / _FP8_MAX)  # amax / 448 = mant * 2 ** expo, mant in [0.5, 1)
    e = torch.where(mant > 0.5, expo, expo - 1)
    e = torch.where(amax == 0, torch.zeros_like(e), e).clamp(-UE8M0_BIAS, UE8M0_BIAS)
    scaled = torch.ldexp(x, (-e).unsqueeze(-1).to(torch.float32))
    q = scaled.clamp(-_FP8_MAX, _FP8_MAX).to(_FP8).view(nope.shape[0], NOPE_DIM)
    return q, (e + UE8M0_BIAS).to(torch.uint8)


def dequantize_nope(nope_fp8: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`quantize_nope`: float32 ``[n, 448]`` = ``fp8 * 2 ** (scale - 127)``.

    ``nope_fp8`` is float8_e4m3fn or its uint8 bytes ``[n, 448]``; ``scales`` uint8 ``[n, 7]``.
    """
    _check_2d("nope_fp8", nope_fp8, NOPE_DIM, (_FP8, torch.uint8))
    _check_2d("scales", scales, SCALE_BYTES, (torch.uint8,))
    q = nope_fp8.view(_FP8) if nope_fp8.dtype == torch.uint8 else nope_fp8
    x = q.float().view(q.shape[0], SCALE_BYTES, QUANT_GROUP)
    e = scales.to(torch.int32) - UE8M0_BIAS
    return torch.ldexp(x, e.unsqueeze(-1).to(torch.float32)).view(q.shape[0], NOPE_DIM)


# ----------------------------------------------------------------------------- pack / unpack


def pack_records(
    nope_fp8: torch.Tensor,
    scales: torch.Tensor,
    rope: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Pack already-quantised parts into records: uint8 ``[n, 584]`` (layout in the module doc).

    ``nope_fp8``: float8_e4m3fn or uint8 ``[n, 448]``; ``scales``: uint8 ``[n, 7]`` (ue8m0 bytes,
    copied verbatim); ``rope``: bfloat16 ``[n, 64]``. All on one device. Pure byte copy: every fp8
    bit pattern (NaN, -0, subnormals) and every bf16 bit pattern survives. The pad byte is 0.
    """
    _check_2d("nope_fp8", nope_fp8, NOPE_DIM, (_FP8, torch.uint8))
    _check_2d("scales", scales, SCALE_BYTES, (torch.uint8,))
    _check_2d("rope", rope, ROPE_DIM, (torch.bfloat16,))
    n = nope_fp8.shape[0]
    if scales.shape[0] != n or rope.shape[0] != n:
        raise ValueError(
            f"nope_fp8, scales and rope must have the same number of rows, got "
            f"{n}, {scales.shape[0]} and {rope.shape[0]}"
        )
    v.check_same_device(nope_fp8.device, scales=scales, rope=rope)
    nope_b, scales_b, rope_b = _as_bytes(nope_fp8), scales.contiguous(), _as_bytes(rope)
    out = torch.empty((n, TOKEN_BYTES), dtype=torch.uint8, device=nope_fp8.device)
    if n == 0:
        return out
    pick("pack_records", backend, nope_b, scales_b, rope_b)(nope_b, scales_b, rope_b, out)
    return out


def unpack_records(
    records: torch.Tensor, *, backend: Backend = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split records uint8 ``[n, 584]`` into ``(nope_fp8, scales, rope)``.

    Returns new tensors: float8_e4m3fn ``[n, 448]``, uint8 ``[n, 7]``, bfloat16 ``[n, 64]``
    (the pad byte is dropped). Bit-exact inverse of :func:`pack_records`.
    """
    _check_2d("records", records, TOKEN_BYTES, (torch.uint8,))
    rec = records.contiguous()
    n, dev = rec.shape[0], rec.device
    nope = torch.empty((n, NOPE_DIM), dtype=torch.uint8, device=dev)
    scales = torch.empty((n, SCALE_BYTES), dtype=torch.uint8, device=dev)
    rope = torch.empty((n, 2 * ROPE_DIM), dtype=torch.uint8, device=dev)
    if n > 0:
        pick("unpack_records", backend, rec)(rec, nope, scales, rope)
    return nope.view(_FP8), scales, rope.view(torch.bfloat16)


# ----------------------------------------------------------------------------- page rows


def _check_loc_range(loc: torch.Tensor, buffer: torch.Tensor, page_size: int) -> None:
    """``loc < pages * page_size`` where reading ``loc`` is free (CPU; any device in debug mode)."""
    host = v.host_values(loc)
    if host is not None:
        v.check_index_range("loc", host, buffer.shape[0] * page_size, "buffer (pages * page_size)")


def write_records(
    buffer: torch.Tensor,
    loc: torch.Tensor,
    records: torch.Tensor,
    page_size: int,
    *,
    backend: Backend = "auto",
) -> None:
    """Scatter ``records[i]`` into token slot ``loc[i]`` of a page-major buffer (split layout).

    ``buffer``: uint8 ``[pages, page_row_bytes(page_size)]`` (mutated in place) whose rows are
    contiguous; the row stride may exceed a row (e.g. one layer of a ``[pages, layers, bytes]``
    host buffer) but must be a multiple of 4 bytes, as must the storage offset;
    ``loc``: int32/int64 ``[n]`` token slots, ``loc[i] < pages * page_size`` (checked on CPU
    tensors and in debug mode; on a GPU the caller's guarantee), no repeats; negative slots are
    skipped; ``records``: uint8 ``[n, 584]``. The record's value part goes to the token's value
    run and its scale part to the scale run; the row's tail padding is never touched.
    """
    _check_page_buffer(buffer, page_size)
    v.check_index("loc", loc)
    _check_2d("records", records, TOKEN_BYTES, (torch.uint8,))
    if records.shape[0] != loc.shape[0]:
        raise ValueError(
            f"records must have one row per loc entry ({loc.shape[0]}), got {records.shape[0]}"
        )
    v.check_same_device(buffer.device, loc=loc, records=records)
    if loc.numel() == 0:
        return
    _check_loc_range(loc, buffer, page_size)
    rec = records.contiguous()
    pick("write_records", backend, buffer, loc, rec)(buffer, loc, rec, page_size)


def read_records(
    buffer: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Gather the records of token slots ``loc`` from a page-major buffer: uint8 ``[n, 584]``.

    Same buffer/``loc`` contract as :func:`write_records`; a negative slot yields a zero
    record. Reads only; returns a new tensor on the buffer's device.
    """
    _check_page_buffer(buffer, page_size)
    v.check_index("loc", loc)
    v.check_same_device(buffer.device, loc=loc)
    out = torch.zeros((loc.shape[0], TOKEN_BYTES), dtype=torch.uint8, device=buffer.device)
    if loc.numel() == 0:
        return out
    _check_loc_range(loc, buffer, page_size)
    pick("read_records", backend, buffer, loc)(buffer, loc, out, page_size)
    return out
