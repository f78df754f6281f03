"""The GPU check (``python3 tools/dev gpu-check``) works: its CPU dry run passes end to end, a
bit mismatch is reported with the first differing index, and no public kernel op lacks cases.

The dry run executes every section's code path on the CPU (Triton interpreter, tiny sizes, no
timing); on a CUDA machine the same code measures (see ``tools/gpu_check/__init__.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mem_cache_kernels as mk
from tools.gpu_check import _ops
from tools.gpu_check import main as gpu_check_main
from tools.gpu_check._core import DRY_SIZES, Context, first_difference
from tools.gpu_check._host import COMBOS
from tools.gpu_check._op_cases import CASES, Case
from tools.gpu_check._register import LedgerRegistrar

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MEM_CACHE_KERNELS_BACKEND"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _gpu_check(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.gpu_check", *args],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.triton
def test_dry_run_passes_every_section(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    proc = _gpu_check("--dry-run", "--no-isolate", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "all checks passed" in proc.stdout
    data = json.loads(out.read_text())
    assert data["exit_code"] == 0 and data["environment"]["dry_run"] is True
    sections = data["sections"]
    assert list(sections) == ["ops", "register", "host", "device", "alloc", "layers"]
    for name, section in sections.items():
        assert section["status"] == "ok", (name, section["notes"])
        assert section["rows"], name
        assert all(r["status"] in ("ok", "info") for r in section["rows"]), name
    # every discovered op ran its cases, each bit-exact on both backends
    op_rows = {r["item"]: r for r in sections["ops"]["rows"]}
    assert set(op_rows) == set(_ops.discover_ops())
    deepseek = {
        i.qualname for i in mk.list_ops() if i.family == "deepseek_v4" and "triton" in i.backends
    }
    assert len(deepseek) == 4 and deepseek <= set(op_rows)  # the record ops ran, bit-exact
    assert {c["op"] for c in sections["ops"]["cases"]} == set(op_rows)
    far = [c for c in sections["ops"]["cases"] if c["case"].startswith("far")]
    assert {c["op"] for c in far} >= {"store_kv", "transfer_rows", "alloc_extend"}
    # every layout / IO backend / page size / pattern / direction of the host pool was moved
    host = {(r["item"], r["case"]) for r in sections["host"]["rows"] if r["status"] == "ok"}
    for layout, io in COMBOS:
        for ps in (1, 16, 64):
            for pattern in ("contiguous", "scattered"):
                for way in ("backup", "load"):
                    assert (f"{layout} / {io}", f"ps={ps} {pattern} {way}") in host
    # no timing figures in a dry run
    assert all(r["value"] is None for s in sections.values() for r in s["rows"] if r["unit"] != "s")


@pytest.mark.triton
def test_isolated_section_runs_in_a_child_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # main() sets it for a dry run
    monkeypatch.delenv("MEM_CACHE_KERNELS_BACKEND", raising=False)
    out = tmp_path / "gpu_check.json"
    code = gpu_check_main(["--dry-run", "--isolate", "--only", "register", "--json", str(out)])
    assert code == 0, capsys.readouterr().out[-4000:]
    data = json.loads(out.read_text())
    assert data["isolated"] is True
    rows = data["sections"]["register"]["rows"]
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA answer")
def test_without_cuda_says_so_and_exits_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gpu_check.json"
    assert gpu_check_main(["--json", str(out)]) == 0
    assert "no CUDA device: nothing measured" in capsys.readouterr().out
    assert not out.exists()


def test_every_discovered_op_has_cases() -> None:
    ops = _ops.discover_ops()
    # every catalogued op with a backend choice; the quantisation arithmetic has none
    missing = {info.qualname for info in mk.list_ops()} - set(ops)
    assert missing == {"deepseek_v4.quantize_nope", "deepseek_v4.dequantize_nope"}
    assert {"deepseek_v4.pack_records", "deepseek_v4.read_records"} <= set(ops)
    assert "resolve_backend" not in ops  # takes backend positionally: not an op
    assert set(ops) == set(CASES)


def test_catalogue_alone_finds_the_deepseek_v4_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ops, "_public_modules", lambda: [mk])  # no submodule scan
    ops = _ops.discover_ops()
    family = {info.qualname for info in mk.list_ops() if info.family == "deepseek_v4"}
    assert family & set(ops) == {
        "deepseek_v4.pack_records",
        "deepseek_v4.unpack_records",
        "deepseek_v4.write_records",
        "deepseek_v4.read_records",
    }


def test_uncovered_op_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def new_op(*, backend: str = "auto") -> None:
        del backend

    monkeypatch.setattr(_ops, "discover_ops", lambda: {"new_op": new_op})
    ctx = Context(torch.device("cpu"), True, DRY_SIZES, deadline=float("inf"), full_matrix=False)
    result = _ops.run_ops(ctx)
    assert [(r.item, r.status) for r in result.rows] == [("new_op", "FAIL")]
    assert "no gpu-check case" in result.rows[0].detail
    assert result.failed


def test_mismatch_names_the_first_differing_index(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(backend: str) -> dict[str, torch.Tensor]:
        t = torch.zeros(4, 8, dtype=torch.bfloat16)
        if backend == "triton":
            t[2, 5] = 1.0
        return {"buf": t}

    status, detail = _ops._run_case(Case("ps=16 bf16 int32", torch.device("cpu"), run))
    assert status == "FAIL"
    assert "output 'buf'" in detail and "index (2, 5)" in detail and "flat 21" in detail

    def broken(backend: str) -> dict[str, torch.Tensor]:
        raise RuntimeError("kernel exploded")

    status, detail = _ops._run_case(Case("x", torch.device("cpu"), broken))
    assert status == "error" and "kernel exploded" in detail


def test_first_difference_is_bit_exact() -> None:
    nan = torch.tensor([float("nan")], dtype=torch.float16)
    assert first_difference(nan, nan.clone()) is None
    other_nan = nan.view(torch.int16).add(1).view(torch.float16)  # another NaN payload
    assert first_difference(nan, other_nan) is not None
    zero = torch.zeros(3, dtype=torch.float32)
    assert first_difference(zero, -zero) is not None  # -0.0 is not +0.0 bit for bit
    fp8 = torch.arange(6, dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert first_difference(fp8, fp8.clone()) is None
    assert first_difference(zero, zero.double()) is not None


def test_ledger_registrar_fails_like_the_driver() -> None:
    ledger = LedgerRegistrar()
    ledger.register(4096, 8192)
    with pytest.raises(RuntimeError, match="overlaps"):
        ledger.register(8192, 4096)
    assert ledger.pinned(4096 + 100) and not ledger.pinned(4096 + 8192)
    with pytest.raises(RuntimeError, match="not registered"):
        ledger.unregister(8192)
    ledger.unregister(4096)
    assert not ledger.pinned(4096)
