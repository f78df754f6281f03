"""Runs one simulation end to end: workload -> stack -> engine loop -> drain -> leak check
(``--model deepseek_v4`` / ``hybrid``: their stacks and engines, with the storage tier bound to
their host pools by ``l3_bindings.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from tools.simulate.config import SimConfig
from tools.simulate.deepseek_v4 import DeepSeekV4Engine
from tools.simulate.deepseek_v4_stack import build_deepseek_v4_stack
from tools.simulate.engine import Engine
from tools.simulate.faults import FaultInjector
from tools.simulate.hybrid import HybridEngine, build_hybrid_stack
from tools.simulate.l3_bindings import DeepSeekV4Binding, HybridBinding
from tools.simulate.stack import build_stack
from tools.simulate.stats import SimStats
from tools.simulate.storage_tier import StorageTier
from tools.simulate.workload import generate_workload

__all__ = ["ProgressFn", "run_simulation"]

ProgressFn = Callable[[int, int], None]
"""Called after every step with (requests done, requests total)."""


def run_simulation(cfg: SimConfig, progress: ProgressFn | None = None) -> SimStats:
    """Simulate ``cfg`` and return the filled-in statistics (see ``report.py``).

    Integrity problems are recorded in the result, never raised; a ``RuntimeError`` means the
    simulator itself could not continue (e.g. a reservation it relies on was broken).
    """
    cfg.validate()
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _run(cfg, progress)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: SimConfig, progress: ProgressFn | None) -> SimStats:
    t0 = time.perf_counter()
    workload = generate_workload(cfg)
    faults = FaultInjector(cfg.faults, cfg.seed)
    engine: Engine | DeepSeekV4Engine | HybridEngine
    l3: StorageTier | None = None

    def tier(stack: Any, binding: Any = None) -> StorageTier | None:
        if cfg.storage not in ("file", "mooncake"):
            return None
        return StorageTier(stack, directory=cfg.storage_dir, write_policy=cfg.storage_write,
                           fault_rate=cfg.storage_fault_rate, seed=cfg.seed,
                           capacity_bytes=cfg.storage_capacity_mb << 20, binding=binding)

    if cfg.model == "deepseek_v4":
        dstack = build_deepseek_v4_stack(cfg, workload.max_context_len + 1)
        stats = SimStats(
            device_capacity=dstack.logical_capacity,
            host_capacity=dstack.kinds[0].capacity * dstack.page_size,
            bytes_per_token=dstack.bytes_per_token,
        )
        engine = DeepSeekV4Engine(workload, dstack, stats, faults,
                                  lambda m: tier(dstack, DeepSeekV4Binding(m)))
    elif cfg.model == "hybrid":
        hstack = build_hybrid_stack(cfg, workload.max_context_len + 1)
        stats = SimStats(
            device_capacity=hstack.base.device_capacity,
            host_capacity=hstack.base.host_capacity,
            bytes_per_token=hstack.base.bytes_per_token,
        )
        engine = HybridEngine(workload, hstack, stats, faults,
                              lambda m: tier(hstack.base, HybridBinding(m)))
    else:
        stack = build_stack(cfg, workload.max_context_len + 1)
        stats = SimStats(
            device_capacity=stack.device_capacity,
            host_capacity=stack.host_capacity,
            bytes_per_token=stack.bytes_per_token,
        )
        engine = Engine(workload, stack, stats, faults, tier(stack))
    l3 = engine.l3
    try:
        while not engine.done():
            engine.step()
            if progress is not None:
                progress(stats.requests_done, engine.total_requests)
        engine.check()
        engine.drain()
    finally:
        engine.close()
        if l3 is not None:
            l3.close()
            stats.l3 = l3.stats
    engine.check()
    engine.leak_check()
    if l3 is not None:  # prefetch reservations: none may be left after the controller closed
        budget = l3.controller.prefetch_budget_pages
        stats.leaks["l3 prefetch"] = (budget - l3.stats.prefetch_reserved_at_end, budget)
    engine.model.close_host()
    stats.wall_s = time.perf_counter() - t0
    return stats
