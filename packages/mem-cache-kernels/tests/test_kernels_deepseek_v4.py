"""DeepSeek-V4 record kernels: layout, fp8 edge values, page-row addressing, Triton parity."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mem_cache_kernels import deepseek_v4
from mem_cache_kernels.deepseek_v4 import (
    TOKEN_BYTES,
    dequantize_nope,
    pack_records,
    page_row_bytes,
    quantize_nope,
    read_records,
    unpack_records,
    write_records,
)

FP8 = torch.float8_e4m3fn


def _parts(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    nope = torch.randint(0, 256, (n, 448), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 256, (n, 7), dtype=torch.uint8, generator=g)
    rope = torch.randint(-(2**15), 2**15, (n, 64), dtype=torch.int16, generator=g)
    return nope, scales, rope.view(torch.bfloat16)


# ----------------------------------------------------------------------------- layout


@pytest.mark.parametrize(
    ("page_size", "expected"),
    [(1, 1152), (2, 1728), (4, 2880), (64, 37440), (72, 42048), (128, 74880)],
)
def test_page_bytes_hand_worked(page_size: int, expected: int) -> None:
    # ps * 584 rounded up to a multiple of 576, e.g. 64 * 584 = 37376 -> 65 * 576 = 37440
    assert page_row_bytes(page_size) == expected
    assert expected % 576 == 0 and expected >= page_size * TOKEN_BYTES


@pytest.mark.parametrize(
    ("bad", "error"), [(0, ValueError), (-4, ValueError), (2.0, TypeError), (True, TypeError)]
)
def test_page_bytes_rejects_bad_page_size(bad: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="page_size"):
        page_row_bytes(bad)  # type: ignore[arg-type]


def test_pack_puts_each_part_at_its_offset() -> None:
    nope = torch.full((1, 448), 0x11, dtype=torch.uint8)
    nope[0, 447] = 0x12
    scales = torch.tensor([[1, 2, 3, 4, 5, 6, 7]], dtype=torch.uint8)
    rope = torch.full((1, 64), 0x3344, dtype=torch.int16).view(torch.bfloat16)
    rec = pack_records(nope, scales, rope, backend="torch")[0]
    assert rec.shape == (584,)
    assert torch.all(rec[:447] == 0x11) and rec[447] == 0x12
    # bf16 0x3344 in little-endian byte order: 0x44, 0x33
    assert rec[448:576].tolist() == [0x44, 0x33] * 64
    assert rec[576:583].tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert rec[583] == 0


def test_round_trip_covers_every_fp8_bit_pattern() -> None:
    # 0x7E = +448, 0xFE = -448, 0x01..0x07 subnormals, 0x80 = -0, 0x7F / 0xFF NaN
    nope = (torch.arange(2 * 448) % 256).to(torch.uint8).view(2, 448)
    _, scales, rope = _parts(2)
    rope_bits = torch.tensor([0x7FC1, -1, 0, -(2**15), 0x0001, 0x7F80], dtype=torch.int16)
    rope.view(torch.int16)[0, :6] = rope_bits  # NaN payload, -NaN, +0, -0, subnormal, +inf
    for as_fp8 in (False, True):
        arg = nope.view(FP8) if as_fp8 else nope
        n2, s2, r2 = unpack_records(pack_records(arg, scales, rope, backend="torch"))
        assert n2.dtype == FP8 and s2.dtype == torch.uint8 and r2.dtype == torch.bfloat16
        assert torch.equal(n2.view(torch.uint8), nope)
        assert torch.equal(s2, scales)
        assert torch.equal(r2.view(torch.int16), rope.view(torch.int16))
    vals = nope.view(FP8)[0].float()
    assert vals[0x7E].item() == 448.0 and vals[0xFE].item() == -448.0
    assert vals[0x01].item() == 2.0**-9
    assert vals[0x80].item() == 0.0 and torch.signbit(vals[0x80])
    assert torch.isnan(vals[0x7F]) and torch.isnan(vals[0xFF])


def test_pack_accepts_non_contiguous_inputs() -> None:
    nope, scales, rope = _parts(6)
    rec = pack_records(nope[::2], scales[::2], rope[::2], backend="torch")
    assert torch.equal(rec, pack_records(nope, scales, rope, backend="torch")[::2])


def test_pack_validates_arguments() -> None:
    nope, scales, rope = _parts(2)
    with pytest.raises(TypeError, match=r"nope_fp8 must be float8_e4m3fn or uint8"):
        pack_records(nope.float(), scales, rope)
    with pytest.raises(ValueError, match=r"scales must have shape \[n, 7\]"):
        pack_records(nope, scales[:, :6], rope)
    with pytest.raises(TypeError, match=r"rope must be bfloat16, got torch\.float32"):
        pack_records(nope, scales, rope.float())
    with pytest.raises(ValueError, match="same number of rows"):
        pack_records(nope, scales[:1], rope)
    with pytest.raises(ValueError, match=r"records must have shape \[n, 584\]"):
        unpack_records(torch.zeros(2, 583, dtype=torch.uint8))


# ----------------------------------------------------------------------------- quantisation


def test_quantize_hand_worked_groups() -> None:
    x = torch.zeros(1, 448)
    x[0, 0], x[0, 1] = 448.0, -448.0  # group 0: amax 448 -> e = 0, byte 127
    x[0, 64] = 1.0  # group 1: 1/448 in (2^-9, 2^-8] -> e = -8, byte 119, 1.0 -> 256.0
    x[0, 128] = 896.0  # group 2: e = 1, byte 128, 896 -> 448
    x[0, 192] = -0.0  # group 3: all zero -> byte 127, -0 kept
    x[0, 256], x[0, 257] = 448.0, 2.0**-9  # group 4: 2^-9 is the smallest fp8 subnormal
    q, s = quantize_nope(x)
    assert s.tolist() == [[127, 119, 128, 127, 127, 127, 127]]
    qb = q.view(torch.uint8)[0]
    assert qb[0] == 0x7E and qb[1] == 0xFE and qb[128] == 0x7E
    assert q[0, 64].float().item() == 256.0
    assert qb[192] == 0x80 and qb[193] == 0x00
    assert qb[257] == 0x01
    back = dequantize_nope(q, s)
    assert torch.equal(back, x)  # every value above is exactly representable


def test_quantize_keeps_nan_and_bounds_error() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 448, generator=g) * torch.logspace(-6, 6, 4).unsqueeze(1)
    x[2, 5] = float("nan")
    x[1, 70] = float("inf")
    q, s = quantize_nope(x)
    back = dequantize_nope(q.view(torch.uint8), s)
    assert torch.isnan(back[2, 5])
    assert q[1, 70].float().item() == 448.0  # saturates; the scale ignores non-finite values
    ok = torch.isfinite(x)
    scale = torch.ldexp(torch.ones(4, 7), s.float() - 127).repeat_interleave(64, dim=1)
    # e4m3: half an ulp is 2^-4 of a normal value; subnormal steps are 2^-9 of the scale
    bound = torch.maximum(x.abs() * 2.0**-4, scale * 2.0**-10)
    assert torch.all((back - x).abs()[ok] <= bound[ok])
    assert torch.all(q.view(torch.uint8)[ok].view(-1) != 0x7F)


# ----------------------------------------------------------------------------- page rows


def test_write_addresses_split_layout_hand_worked() -> None:
    ps = 4  # page bytes 2880: values [0, 2304), scales [2304, 2336), tail [2336, 2880)
    buf = torch.full((3, 2880), 0xAB, dtype=torch.uint8)
    nope, scales, rope = _parts(1)
    rec = pack_records(nope, scales, rope)
    write_records(buf, torch.tensor([6]), rec, ps, backend="torch")  # page 1, offset 2
    assert torch.equal(buf[1, 1152:1728], rec[0, :576])
    assert torch.equal(buf[1, 2304 + 16 : 2304 + 24], rec[0, 576:])
    untouched = torch.ones(3, 2880, dtype=torch.bool)
    untouched[1, 1152:1728] = False
    untouched[1, 2320:2328] = False
    assert torch.all(buf[untouched] == 0xAB)


@settings(max_examples=25, deadline=None)
@given(
    page_size=st.sampled_from([1, 2, 4, 8]),
    slots=st.lists(st.integers(-2, 31), min_size=1, max_size=12),
)
def test_write_read_matches_a_slot_model(page_size: int, slots: list[int]) -> None:
    loc_list: list[int] = []
    for s in slots:
        if s < 0 or s not in loc_list:
            loc_list.append(s)
    loc = torch.tensor(loc_list, dtype=torch.int32)
    pages = 32 // page_size + 1
    buf = torch.zeros(pages, page_row_bytes(page_size), dtype=torch.uint8)
    rec = torch.randint(0, 256, (len(loc_list), 584), dtype=torch.uint8)
    write_records(buf, loc, rec, page_size, backend="torch")
    back = read_records(buf, loc, page_size, backend="torch")
    for i, s in enumerate(loc_list):
        assert torch.equal(back[i], rec[i] if s >= 0 else torch.zeros(584, dtype=torch.uint8))
    written = {s for s in loc_list if s >= 0}
    others = torch.tensor([s for s in range(32) if s not in written], dtype=torch.int64)
    assert int(read_records(buf, others, page_size).sum()) == 0
    assert int(buf[:, page_size * 584 :].sum()) == 0  # tail padding never written


def test_page_ops_validate_arguments() -> None:
    buf = torch.zeros(2, page_row_bytes(2), dtype=torch.uint8)
    rec = torch.zeros(1, 584, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"buffer must be uint8 \[pages, 2880\] for page_size=4"):
        write_records(buf, torch.tensor([1]), rec, 4)
    with pytest.raises(TypeError, match=r"loc must be int32 or int64, got torch\.float32"):
        write_records(buf, torch.tensor([1.0]), rec, 2)
    with pytest.raises(ValueError, match="one row per loc entry"):
        write_records(buf, torch.tensor([1, 2]), rec, 2)
    with pytest.raises(ValueError, match="rows must be contiguous"):
        read_records(torch.zeros(1728, 2, dtype=torch.uint8).t(), torch.tensor([1]), 2)
    with pytest.raises(ValueError, match="multiples of 4 bytes"):
        read_records(torch.zeros(2, 1729, dtype=torch.uint8)[:, :1728], torch.tensor([1]), 2)


# ----------------------------------------------------------------------------- Triton


@pytest.fixture
def interpreted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run the Triton implementation under the interpreter (see tests/conftest.py: the package
    conftest puts the whole session in interpreter mode when there is no GPU)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield


@pytest.mark.triton
def test_triton_pack_matches_torch(interpreted: None) -> None:
    nope, scales, rope = _parts(3, seed=7)
    nope[0] = torch.arange(448) % 256
    ref = pack_records(nope, scales, rope, backend="torch")
    assert torch.equal(pack_records(nope, scales, rope, backend="triton"), ref)


@pytest.mark.triton
def test_triton_unpack_matches_torch(interpreted: None) -> None:
    rec = torch.randint(0, 256, (3, 584), dtype=torch.uint8)
    for a, b in zip(unpack_records(rec, backend="triton"), unpack_records(rec)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.triton
@pytest.mark.parametrize("page_size", [1, 4])
def test_triton_write_matches_torch(interpreted: None, page_size: int) -> None:
    pages = 12 // page_size + 1
    loc = torch.tensor([5, -1, 11, 4, 2], dtype=torch.int64)
    rec = torch.randint(0, 256, (5, 584), dtype=torch.uint8)
    ref = torch.full((pages, 2, page_row_bytes(page_size)), 0xCD, dtype=torch.uint8)
    out = ref.clone()
    write_records(ref[:, 1], loc, rec, page_size, backend="torch")
    write_records(out[:, 1], loc, rec, page_size, backend="triton")
    assert torch.equal(out, ref)
    assert torch.all(out[:, 0] == 0xCD)


@pytest.mark.triton
def test_triton_read_matches_torch(interpreted: None) -> None:
    # one layer of a page_first host buffer [pages, layers, bytes]: strided rows
    buf = torch.randint(0, 256, (4, 2, page_row_bytes(4)), dtype=torch.uint8)[:, 1]
    loc = torch.tensor([15, -3, 0, 9, 6], dtype=torch.int32)
    ref = read_records(buf, loc, 4, backend="torch")
    assert torch.equal(read_records(buf, loc, 4, backend="triton"), ref)
    assert int(ref[1].sum()) == 0


def test_module_exports_are_curated() -> None:
    assert set(deepseek_v4.__all__) <= set(dir(deepseek_v4))
    assert (
        "triton" not in sys.modules
        or "mem_cache_kernels._triton.deepseek_v4" not in deepseek_v4.__all__
    )
