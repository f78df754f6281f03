"""``--model hybrid``: the simulator over the hybrid linear-attention stack on tiny configurations.

Each run builds SGLang's hybrid stack (HybridReqToTokenPool, HybridLinearKVPool over the
full-attention layers, MambaPoolHost), evicts prefixes and their states to the host and loads them
back, restores checkpointed states on prefix hits, and ends with zero integrity failures and zero
leaks; the mutants show that the state checks can fail.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mem_cache_pool import HybridLinearKVPool, HybridReqToTokenPool, MHATokenToKVPool
from mem_cache_pool_host import MambaPoolHost
from tools.simulate import SimConfig, run_simulation
from tools.simulate.cli import main
from tools.simulate.hybrid import build_hybrid_stack
from tools.simulate.report import report_dict

TINY = SimConfig(
    model="hybrid",
    layers=8,
    heads=2,
    head_dim=16,
    device_tokens=1024,
    host_tokens=4096,
    requests=40,
    max_running=6,
    system_prompts=2,
    prompt_mu=3.5,
    output_mu=2.5,
    max_prompt=128,
    max_output=24,
    arrival_per_step=0.5,
    think_steps=4,
    storage="none",
)


def test_stack_is_built_as_sglang_builds_it() -> None:
    hs = build_hybrid_stack(TINY, 200)
    assert isinstance(hs.rows, HybridReqToTokenPool)
    assert isinstance(hs.kv, HybridLinearKVPool) and isinstance(
        hs.kv.full_kv_pool, MHATokenToKVPool
    )
    assert hs.full_ids == [3, 7] and hs.mamba_ids == [0, 1, 2, 4, 5, 6]
    assert hs.kv.full_kv_pool.layer_num == 2
    assert hs.kv.mamba_pool is hs.rows.mamba_pool
    assert hs.rows.mamba_pool.num_mamba_layers == 6
    assert isinstance(hs.host_states, MambaPoolHost)
    assert hs.host_states.num_mamba_layers == 6


def _run(cfg: SimConfig) -> dict[str, object]:
    return report_dict(cfg, run_simulation(cfg))


def test_tiny_run_moves_states_and_leaks_nothing() -> None:
    doc = _run(TINY)
    assert doc["ok"], doc["checks"]
    hybrid = doc["hybrid"]
    assert isinstance(hybrid, dict)
    assert hybrid["state restores verified"] > 0
    assert hybrid["state bytes moved"] > 0
    assert hybrid["peak state slots"] > 0
    transfers = doc["transfers"]
    assert isinstance(transfers, dict)
    assert transfers["state d2h backup"]["calls"] > 0
    assert transfers["state h2d load"]["calls"] > 0
    leaks = doc["leaks"]
    assert isinstance(leaks, dict)
    for pool in ("state slots", "host state slots", "req_to_token", "device", "host"):
        assert leaks[pool]["available"] == leaks[pool]["capacity"], pool


@pytest.mark.parametrize(
    "change",
    [{"spec_draft": 2}, {"retract_after": 2, "max_running": 4}, {"faults": 0.2}, {"page_size": 1}],
)
def test_variants_stay_correct(change: dict[str, object]) -> None:
    doc = _run(dataclasses.replace(TINY, requests=24, **change))  # type: ignore[arg-type]
    assert doc["ok"], doc["checks"]


def test_a_corrupted_checkpoint_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from tools.simulate import hybrid

    real = hybrid.HybridModel._release

    def corrupt(self: hybrid.HybridModel, rec: object) -> None:
        real(self, rec)
        for ck in self.ckpt.values():  # flip one byte of every checkpoint's temporal state
            t = self.pool.mamba_cache.temporal
            t[0, int(ck.slot)].view(torch.uint8).view(-1)[0] ^= 0xFF

    monkeypatch.setattr(hybrid.HybridModel, "_release", corrupt)
    doc = _run(TINY)
    assert not doc["ok"]
    assert any("state" in f for f in doc["checks"]["failures"])  # type: ignore[index]


def test_a_leaked_state_slot_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from tools.simulate import hybrid

    monkeypatch.setattr(hybrid._SimRows, "free_mamba_cache", lambda self, req, keep=None: None)
    doc = _run(dataclasses.replace(TINY, requests=12))
    assert not doc["ok"]


def test_cli_runs_hybrid(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--model",
        "hybrid",
        "--requests",
        "8",
        "--device-tokens",
        "1024",
        "--host-tokens",
        "2048",
        "--max-running",
        "4",
        "--storage",
        "none",
        "--no-progress",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "hybrid state bytes moved" in out and "state slots" in out
