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
