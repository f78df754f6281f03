"""``python -m tools.bench.storage``: the side-by-side rows against SGLang 0.5.23's own
``HiCacheFile`` (``--only-sglang`` and the ``storage`` hook of ``tools.bench.sglang``), at the tiny
``--quick`` size. No timing is asserted (the figures depend on the machine): what is asserted is
that every op, page size and batch is measured on all three sides for every round (each side's
reads are checked bit-exact inside the bench) and that the hook gives ``tools.bench.sglang`` one
row per comparison with the 2x goal on our scheme's set and get. Needs SGLang's wheel
(tools/sglang_ref): without it these tests fail with the how-to message, never skip."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tools.bench import sglang as bench_sglang
from tools.bench import storage as bench_storage


def test_only_sglang_json_has_every_row_per_round(tmp_path: Path) -> None:
    out = tmp_path / "storage.json"
    argv = ["--quick", "--only-sglang", "--rounds", "2", "--json", str(out),
            "--dir", str(tmp_path)]
    assert bench_storage.main(argv) == 0
    side = json.loads(out.read_text())["side_by_side"]
    got = {(r["impl"], r["op"], r["page_size"], r["batch"]) for r in side}
    assert got == {(impl, op, ps, b) for impl in bench_storage.SIDES
                   for op in ("set", "get", "exists") for ps in (16, 64) for b in (1, 32, 128)}
    for r in side:
        assert len(r["round_seconds"]) == 2 and all(s > 0 for s in r["round_seconds"])
        assert math.isfinite(r["pages_per_s"]) and r["pages_per_s"] > 0
    assert [p.name for p in tmp_path.iterdir()] == ["storage.json"]  # its directory is removed


def test_hook_feeds_the_sglang_bench() -> None:
    rows = bench_storage.sglang_file_rows(quick=True, rounds=1)
    assert len(rows) == 2 * 3 * 2 * 3  # our two schemes x ops x page sizes x batches
    goals = {r["name"]: r["goal"] for r in rows}
    assert goals["file get ps=16 batch=128 (4 KiB pages), mem_cache scheme"] == 0.5
    assert goals["file set ps=64 batch=1 (16 KiB pages), mem_cache scheme"] == 0.5
    assert goals["file exists ps=64 batch=1 (16 KiB pages), mem_cache scheme"] is None
    assert goals["file get ps=16 batch=128 (4 KiB pages), sglang scheme"] is None
    made = [bench_sglang.make_row("storage", r["name"], r["ours_us"], r["sglang_us"],
                                  goal=r["goal"]) for r in rows]
    assert all(math.isfinite(m.ratio) and m.ratio > 0 for m in made)
    assert bench_sglang.storage_rows(True, 1)[0].section == "storage"


def test_recycler_writes_and_frees_the_bytes_asked(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The recycler flushes dirty pages, then writes exactly ``n`` bytes (its buffer again and
    again past its size) to one scratch file and removes it; the side-by-side run calls it
    before each series of timed sets and gets, and ``--no-recycle`` not at all."""
    import os

    from tools.bench.recycle import Recycler

    written: list[int] = []
    real = os.pwrite

    def count(fd: int, data: memoryview, offset: int) -> int:
        assert offset == sum(written)
        written.append(real(fd, data, offset))
        return written[-1]

    rec = Recycler(tmp_path, 1000)
    monkeypatch.setattr(os, "pwrite", count)
    monkeypatch.setattr(os, "sync", lambda: written.clear() or written.append(0))
    rec(2500)
    assert written == [0, 1000, 1000, 500] and list(tmp_path.iterdir()) == []
    monkeypatch.undo()

    calls: list[int] = []
    monkeypatch.setattr(Recycler, "__call__", lambda self, n: calls.append(n))
    for flags, expect in (([], True), (["--no-recycle"], False)):
        calls.clear()
        out = tmp_path / "s.json"
        assert bench_storage.main(["--quick", "--only-sglang", "--rounds", "1", "--json",
                                   str(out), "--dir", str(tmp_path), *flags]) == 0
        # per page size, batch and side: one series of sets and one of gets
        assert len(calls) == (2 * 3 * 3 * 2 if expect else 0)
        assert json.loads(out.read_text())["memory_recycled"] is expect
