"""Several simulator engines on one real Mooncake Store (``tools.mooncake.instances``): a
session's turns run on different instances, pages written by one are served bit-exact to
another; a master killed mid-run and injected storage faults cost misses, never integrity
failures or leaks. Also: ``--storage mooncake`` in the single-engine simulator."""

from __future__ import annotations

from typing import Any

from tools.mooncake.instances import build_parser, run
from tools.simulate.config import SimConfig
from tools.simulate.simulation import run_simulation

# a tiny model and workload: each instance process serves a handful of turns
SMALL = ["--requests", "32", "--layers", "2", "--device-tokens", "2048", "--host-tokens",
         "2048", "--mean-turns", "4",
         "--think-steps", "1", "--no-progress"]


def _run(*extra: str) -> dict[str, Any]:
    args, sim = build_parser().parse_known_args(["--instances", "2", "--segment-mib", "64",
                                                 *extra])
    return run(args, SMALL + sim)


def test_cross_instance_hits_and_faults_with_a_killed_master() -> None:
    doc = _run("--kill-master-at", "1", "--storage-fault-rate", "0.05")
    total = doc["total"]
    assert doc["ok"], doc["instances"]
    assert total["integrity_failures"] == 0
    assert total["leaks"] == 0
    assert all(not r["leaks"] for r in doc["instances"])
    assert total["cross_instance_hit_pages"] > 0  # waves 2+ read the other instance's pages
    assert total["pages_verified"] >= total["l3_hit_pages"] > 0
    assert total["requests"] == 32
    assert all(r["requests"] > 0 for r in doc["instances"])


def test_single_engine_on_a_local_mooncake_store() -> None:
    # the restart flushes every cached prefix to the store: later turns are served from it
    cfg = SimConfig(storage="mooncake", requests=24, layers=2, device_tokens=2048,
                    host_tokens=1024, max_prompt=96, max_output=32, think_steps=20,
                    arrival_per_step=0.5, restart_at=60)
    stats = run_simulation(cfg)
    assert stats.integrity_failures == 0, stats.failures
    assert not stats.leaked
    assert stats.l3 is not None and stats.l3.backend == "mooncake"
    assert stats.l3.pages_written > 0
    assert stats.l3.hits_after_restart > 0 and stats.pages_verified > 0
