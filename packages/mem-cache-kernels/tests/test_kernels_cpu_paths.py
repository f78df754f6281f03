"""The torch reference's CPU strategies (run-by-run slice copies, chunked gather/scatter and the
plain gather/scatter) all produce the same bytes as a naive per-row copy."""

from __future__ import annotations

import pytest
import torch

import mem_cache_kernels as mk
from mem_cache_kernels._torch import rows as rows_mod


def _naive(src: torch.Tensor, dst: torch.Tensor, si: torch.Tensor, di: torch.Tensor) -> None:
    for s, d in zip(si.tolist(), di.tolist()):
        if s >= 0 and d >= 0:
            dst[d] = src[s]


def _indices(pattern: str, n: int, space: int) -> torch.Tensor:
    if pattern == "runs":  # a few long runs
        starts = torch.randperm(space // 64)[: n // 64] * 64
        return (starts[:, None] + torch.arange(64)).flatten()
    return torch.randperm(space)[:n]


@pytest.mark.parametrize("pattern", ["runs", "scattered"])
@pytest.mark.parametrize(("row", "n"), [((1024,), 2048), ((3, 7), 640), ((16,), 128)])
def test_strategies_match_naive(pattern: str, row: tuple[int, ...], n: int) -> None:
    space = 4096
    src = torch.randint(0, 2**15, (space, *row), dtype=torch.int16)
    dst = torch.randint(0, 2**15, (space, *row), dtype=torch.int16)
    si, di = _indices(pattern, n, space), _indices(pattern, n, space)
    si[5] = -1  # one skipped pair (it also splits a run)
    expected = dst.clone()
    _naive(src, expected, si, di)
    mk.transfer_rows([src], [dst], si, di, backend="torch")
    assert torch.equal(dst, expected)


def test_paths_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sizes above reach the run and the chunked strategies (the test above covers them)."""
    taken: list[str] = []
    real_runs, real_chunked = rows_mod._copy_runs, rows_mod._chunked

    def spy_runs(*args: torch.Tensor) -> bool:
        done = real_runs(*args)
        taken.append("runs" if done else "no-runs")
        return done

    def spy_chunked(*args: torch.Tensor) -> None:
        taken.append("chunked")
        real_chunked(*args)

    monkeypatch.setattr(rows_mod, "_copy_runs", spy_runs)
    monkeypatch.setattr(rows_mod, "_chunked", spy_chunked)
    src = torch.zeros(4096, 1024, dtype=torch.int16)
    dst = torch.zeros_like(src)
    mk.transfer_rows([src], [dst], _indices("runs", 2048, 4096), _indices("runs", 2048, 4096))
    mk.transfer_rows([src], [dst], torch.randperm(4096)[:2048], torch.randperm(4096)[:2048])
    assert taken == ["runs", "no-runs", "chunked"]


def test_same_buffer_runs_use_gather_first() -> None:
    """Overlapping runs in one buffer must not be copied run by run (reads before writes)."""
    buf = torch.arange(4096 * 64, dtype=torch.int32).view(4096, 64)
    orig = buf.clone()
    src = torch.arange(0, 1024)
    tgt = torch.arange(512, 1536)  # overlaps the source rows
    mk.copy_all_layer_kv_cache([buf], tgt, src, backend="torch")
    assert torch.equal(buf[512:1536], orig[0:1024])


@pytest.mark.parametrize("gap", [0, 2, 4])
@pytest.mark.parametrize("offset", [0, 1, 2, 4, 6, 8])
@pytest.mark.parametrize("row_bytes", [2, 6, 8, 12, 16, 24])
@pytest.mark.parametrize("rows", [1, 3])
def test_wide_view_is_the_widest_element_dividing_the_geometry(
    offset: int, row_bytes: int, rows: int, gap: int
) -> None:
    """``_wide`` reinterprets a uint8 ``[rows, B]`` view (any row stride) with the widest
    integer element dividing its row bytes, storage offset and row stride (torch checks the
    stride of a single row too), and views the same bytes."""
    stride = row_bytes + gap  # contiguous rows, or a gap after each
    flat = torch.randint(0, 256, (offset + stride * rows + 16,), dtype=torch.uint8)
    view = flat[offset:].as_strided((rows, row_bytes), (stride, 1))
    wide = rows_mod._wide(view)
    width = next(
        (w for w in (8, 4, 2)
         if row_bytes % w == 0 and offset % w == 0 and stride % w == 0),
        1,
    )
    assert wide.element_size() == width
    assert torch.equal(wide.view(torch.uint8) if width > 1 else wide, view)


@pytest.mark.parametrize("dst", [[3, 1, 2], [], [0, 5], [4, -1, 2], [-3]])
def test_drop_negative_of_a_store_index(dst: list[int]) -> None:
    """A store (no source index): an index without negatives comes back as it is; with
    negatives, the pairs left are the positions and entries that are not negative."""
    idx = torch.tensor(dst, dtype=torch.int64)
    src, out = rows_mod.drop_negative(None, idx)
    if all(d >= 0 for d in dst):
        assert src is None and out is idx
    else:
        keep = [i for i, d in enumerate(dst) if d >= 0]
        assert src is not None and out is not None
        assert src.tolist() == keep and out.tolist() == [dst[i] for i in keep]


@pytest.mark.parametrize("n", [1, 2, 31, 32, 33, 200])
@pytest.mark.parametrize("negative_at", [None, 0, -1])
def test_drop_negative_on_both_sides_of_the_list_cut(n: int, negative_at: int | None) -> None:
    """A store index short enough for the list scan (``_LIST_MIN``) and a longer one, 1-D and
    2-D views: a negative anywhere is found, and an index without one comes back as it is."""
    base = torch.arange(1, n + 1, dtype=torch.int64) * 3
    if negative_at is not None:
        base[negative_at] = -1
    for idx in (base, base.view(1, -1) if n > 1 else base, base[::1]):
        flat = idx.reshape(-1).tolist()
        src, out = rows_mod.drop_negative(None, idx)
        if negative_at is None:
            assert src is None and out is idx
        else:
            assert out is not None and out.tolist() == [d for d in flat if d >= 0]


def test_as_byte_rows_takes_byte_rows_as_they_are() -> None:
    """A uint8 ``[rows, bytes]`` tensor with contiguous rows is its own byte-row view (a pool's
    cached view of its buffer); other uint8 tensors are viewed as every other dtype is, and
    every result addresses the same bytes as the general path's."""
    from mem_cache_kernels._layout import as_byte_rows

    buf = torch.arange(6 * 8 * 4, dtype=torch.int32).view(6, 8, 4)
    general = as_byte_rows("t", buf)
    rows = buf.view(torch.uint8).view(6, -1)
    assert as_byte_rows("t", rows) is rows
    assert torch.equal(general, rows) and general.data_ptr() == rows.data_ptr()
    cube = buf.view(torch.uint8)  # uint8 [6, 8, 16]: one reshape
    got = as_byte_rows("t", cube)
    assert got.shape == (6, 128) and torch.equal(got, general)
    strided = torch.zeros(6, 256, dtype=torch.uint8)[:, :128]  # row stride 256, rows contiguous
    assert as_byte_rows("t", strided) is strided
    with pytest.raises(ValueError, match="C-contiguous rows"):
        as_byte_rows("t", torch.zeros(6, 8, dtype=torch.uint8).t())
