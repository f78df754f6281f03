"""The storage tier (L3) of ``--model hybrid`` and ``--model deepseek_v4`` (``--storage file``):
their extra host pools (the Mamba state pool; the c4 record mirror) go to L3 with the main pool's
pages through the controller's v2 path and come back verified bit-exact, with zero leaks, under
injected storage faults too; a wrong byte in an extra pool's prefetched part is caught."""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any

import pytest
import torch

from tools.simulate import SimConfig, run_simulation
from tools.simulate.l3_bindings import DeepSeekV4Binding, HybridBinding
from tools.simulate.report import report_dict

BASE: dict[str, Any] = dict(
    device_tokens=1024, host_tokens=512, requests=40, max_running=6, system_prompts=2,
    prompt_mu=3.5, output_mu=2.5, max_prompt=128, max_output=24, arrival_per_step=0.5,
    think_steps=4, storage="file",
)
CFGS = {
    "hybrid": SimConfig(model="hybrid", layers=8, heads=2, head_dim=16, **BASE),
    "deepseek_v4": SimConfig(model="deepseek_v4", layers=2, **BASE),
}
POOL = {"hybrid": ("mamba", "trailing_pages"), "deepseek_v4": ("deepseek_v4_c4", "all_pages")}


def _run(cfg: SimConfig) -> dict[str, Any]:
    return report_dict(cfg, run_simulation(cfg))


def _no_leaks(doc: dict[str, Any]) -> None:
    for name, leak in doc["leaks"].items():
        assert leak["available"] == leak["capacity"], (name, leak)


@pytest.mark.parametrize("model", sorted(CFGS))
def test_extra_pools_round_trip_through_l3(model: str) -> None:
    doc = _run(CFGS[model])
    assert doc["ok"], doc["checks"]
    _no_leaks(doc)
    l3 = doc["storage"]
    name, policy = POOL[model]
    pool = l3["pools"][name]
    assert l3["hits"] > 0 and l3["load_failures"] == 0 and l3["backend_errors"] == 0
    assert pool["hit_policy"] == policy and pool["pages_written"] > 0
    assert pool["pages_write_failed"] == 0 and pool["part_misses"] == 0
    if policy == "trailing_pages":  # one state per prefix read
        assert pool["pages_loaded"] == l3["hits"]
    else:  # one record page per token page
        assert pool["pages_loaded"] == l3["pages_loaded"]
    assert pool["bytes_loaded"] > 0 and l3["set_refused"] == 0


@pytest.mark.parametrize("model", sorted(CFGS))
def test_storage_faults_never_leak_or_corrupt(model: str) -> None:
    cfg = dataclasses.replace(CFGS[model], storage_fault_rate=0.25, seed=3)
    doc = _run(cfg)
    assert doc["ok"], doc["checks"]
    _no_leaks(doc)
    l3 = doc["storage"]
    assert sum(l3["faults"].values()) > 0
    assert l3["hits"] > 0


def _flip(pool: Any, slots: torch.Tensor) -> None:
    """Flip one byte of the first host slot's page of ``pool`` (a Mamba host pool or a record
    mirror)."""
    ptrs, sizes = pool.get_page_buffer_meta(slots[:1])
    view = (ctypes.c_ubyte * sizes[0]).from_address(ptrs[0])
    view[sizes[0] // 2] ^= 0x40


@pytest.mark.parametrize("model", sorted(CFGS))
def test_a_wrong_byte_in_an_extra_part_is_caught(model: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks can fail: a byte flipped in the extra pool's prefetched slots (after the
    backend verified them) makes the model's verified load report an integrity failure."""
    binding = HybridBinding if model == "hybrid" else DeepSeekV4Binding
    name = POOL[model][0]
    real = binding.adopt

    def adopt(self: Any, session: Any, result: Any, tokens: int) -> Any:
        pool = next(p.host_pool for p in self.extra_pools if p.name == name)
        _flip(pool, result.extra_host_indices[name])
        return real(self, session, result, tokens)

    monkeypatch.setattr(binding, "adopt", adopt)
    doc = _run(CFGS[model])
    assert not doc["ok"]
    assert doc["checks"]["integrity_failures"] > 0
