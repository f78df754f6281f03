"""``--model deepseek_v4``: the simulator over the DeepSeek-V4 HiSparse stack, tiny configurations.

Each run must build the stack the way SGLang builds it, evict to the host and load back, and end
with zero integrity failures and zero leaks; the mutants show the checks can fail.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mem_cache_allocator import SWATokenToKVPoolAllocator
from mem_cache_allocator.deepseek_v4_hisparse import DeepSeekV4HiSparseTokenToKVPoolAllocator
from mem_cache_pool.deepseek_v4 import DeepSeekV4TokenToKVPool, HiSparseC4DevicePool
from mem_cache_pool_host.deepseek_v4 import DeepSeekV4SingleKVPoolHost
from tools.simulate import SimConfig, run_simulation
from tools.simulate.cli import main
from tools.simulate.config import config_from_args
from tools.simulate.deepseek_v4_stack import build_deepseek_v4_stack, deepseek_v4_ratios
from tools.simulate.options import build_parser
from tools.simulate.report import report_dict

TINY = SimConfig(
    model="deepseek_v4",
    layers=2,
    device_tokens=1024,
    host_tokens=1024,
    requests=16,
    max_running=6,
    system_prompts=2,
    prompt_mu=3.5,
    output_mu=2.5,
    max_prompt=128,
    max_output=24,
    arrival_per_step=0.5,
    think_steps=4,
)


def test_stack_is_built_as_sglang_builds_it() -> None:
    stack = build_deepseek_v4_stack(TINY, 200)
    assert isinstance(stack.pool, DeepSeekV4TokenToKVPool) and stack.pool.full_kv_pool is None
    assert isinstance(stack.pool.c4_kv_pool, HiSparseC4DevicePool)
    assert isinstance(stack.swa_allocator, SWATokenToKVPoolAllocator)
    assert stack.swa_allocator.get_kvcache() is stack.pool
    assert isinstance(stack.allocator, DeepSeekV4HiSparseTokenToKVPoolAllocator)
    assert stack.allocator.logical_attn_allocator is stack.swa_allocator
    assert [k.name for k in stack.kinds] == ["swa", "c4"]
    assert all(isinstance(k.host, DeepSeekV4SingleKVPoolHost) for k in stack.kinds)
    assert (stack.logical_capacity, stack.c4_device_capacity) == (1024, 256)
    assert deepseek_v4_ratios(5, 128) == [0, 4, 128, 4, 0]
    assert deepseek_v4_ratios(3, 16) == [0, 4, 0]


def test_records_round_trip_through_the_hisparse_mapping() -> None:
    stack = build_deepseek_v4_stack(TINY, 200)
    a = stack.allocator
    p = torch.tensor([0])
    full = a.alloc_extend(p, p, torch.tensor([20]), torch.tensor([20]), torch.tensor([-1]), 20)
    assert full is not None
    pos = torch.arange(20)
    sess = torch.full_like(pos, 7)
    stack.write(full, sess, pos)
    assert stack.verify_layer(1, full, sess, pos) == 0  # ratio-4 layer: window + c4
    dev = stack.device_slots(stack.kind("c4"), full)
    assert dev.numel() == 5 and bool((dev > 0).all())
    assert stack.verify_layer(1, full, torch.full_like(pos, 8), pos) > 0  # other content


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"host_layout": "layer_first", "faults": 0.3},
        {"page_size": 128, "layers": 4, "device_tokens": 2048, "host_tokens": 2048,
         "host_layout": "page_first_direct"},
    ],
    ids=["ps16-page_first", "ps16-layer_first-faults", "ps128-c128-page_first_direct"],
)
def test_deepseek_v4_run_is_clean(overrides: dict[str, object]) -> None:
    cfg = dataclasses.replace(TINY, **overrides)  # type: ignore[arg-type]
    stats = run_simulation(cfg)
    assert stats.failures == [] and stats.integrity_failures == 0
    assert stats.leaks and not stats.leaked, stats.leaks
    assert stats.requests_done == cfg.requests
    assert stats.evictions_to_host > 0 and stats.host_hits > 0  # the host tier was exercised
    assert stats.tokens_verified > 0 and stats.sequences_verified == cfg.requests
    if cfg.faults:
        assert stats.faults_injected > 0


def test_deepseek_v4_run_catches_a_corrupted_host_load(monkeypatch: pytest.MonkeyPatch) -> None:
    real = DeepSeekV4SingleKVPoolHost.load_tokens_to_device_per_layer

    def corrupt(self: DeepSeekV4SingleKVPoolHost, pool: object, host: torch.Tensor,
                dev: torch.Tensor, layer_id: int) -> None:  # fmt: skip
        real(self, pool, host.flip(0), dev, layer_id)  # type: ignore[arg-type]

    monkeypatch.setattr(DeepSeekV4SingleKVPoolHost, "load_tokens_to_device_per_layer", corrupt)
    stats = run_simulation(TINY)
    assert stats.integrity_failures > 0
    assert any("loaded records differ" in m for m in stats.failures)


def test_deepseek_v4_run_catches_a_leaked_device_page(monkeypatch: pytest.MonkeyPatch) -> None:
    def keep(self: DeepSeekV4HiSparseTokenToKVPoolAllocator, free_indices: torch.Tensor) -> None:
        return None  # the c4 device slots of freed entries are never released

    monkeypatch.setattr(DeepSeekV4HiSparseTokenToKVPoolAllocator, "free_hisparse", keep)
    stats = run_simulation(dataclasses.replace(TINY, requests=4))
    assert stats.integrity_failures > 0 or stats.leaked


def test_cli_accepts_model_deepseek_v4(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config_from_args(build_parser().parse_args(["--model", "deepseek_v4"]))
    assert cfg.model == "deepseek_v4"
    rc = main(["--model", "deepseek_v4", "--layers", "2", "--requests", "3",
               "--device-tokens", "1024", "--host-tokens", "1024", "--no-progress",
               "--json", "-"])  # fmt: skip
    assert rc == 0
    assert '"ok": true' in capsys.readouterr().out
    with pytest.raises(ValueError, match="multiple of 4"):
        run_simulation(dataclasses.replace(TINY, page_size=2))


def test_deepseek_v4_runs_the_shared_loop_with_what_it_does_not_model_off() -> None:
    """Speculative decoding, retraction and the restart are options of the shared engine loop
    that this mode does not model (nor the shared prefix, on by default): the DeepSeek-V4
    adapter turns them off for the loop, so the run is the same as without them, and the
    report keeps the options as given."""
    plain = dataclasses.replace(TINY, shared_prefix_tokens=0)
    asked = dataclasses.replace(TINY, spec_draft=2, retract_after=1, restart_at=5)
    a, b = report_dict(plain, run_simulation(plain)), report_dict(asked, run_simulation(asked))
    assert b["ok"] and b["config"]["spec_draft"] == 2 and b["config"]["restart_at"] == 5
    for key in ("steps", "requests", "tokens", "retractions", "hits", "evictions", "memory"):
        assert a[key] == b[key], key
    assert b["tokens"]["draft"] == 0 and b["retractions"] == 0
    assert b["shared_prefix"]["hits"] == 0 and b["shared_prefix"]["duplicate_pages_freed"] == 0
    assert a["checks"] == b["checks"]
    assert {k: v["items"] for k, v in a["allocator"].items()} == {
        k: v["items"] for k, v in b["allocator"].items()
    }
