"""Serving-workload simulator: drives the mem-cache packages through hierarchical caching.

One continuous-batching engine loop without a model (``loop.py``) admits multi-turn sessions
(``workload.py``) into ``ReqToTokenPool`` rows, allocates KV slots with the allocator, writes
deterministic K/V rows (``content.py``) through the device pool, keeps finished turns' prefixes in
an LRU store (``prefix_store.py``) that spills to the host pool and loads back layer by layer
(``tiers.py``, ``hicache.py``) and to the storage tier L3 (``storage_tier.py``: write-back of
evicted host pages, prefetch of returning turns that miss L1 and L2), injects transfer and
storage faults (``faults.py``, ``storage_faults.py``), checks slot conservation and content
integrity (``integrity.py``) and reports (``report.py``). What differs per model is a small
adapter (``model.py``): mha/mla over ``stack.py`` (``engine.py``), and ``--model deepseek_v4``,
the same workload over the DeepSeek-V4 HiSparse stack (``deepseek_v4_stack.py``,
``deepseek_v4.py``, ``deepseek_v4_hicache.py``), and ``--model hybrid`` (``hybrid.py``); their
extra host pools (c4/c128 records, Mamba states) reach the file L3 through the controller's v2
path (``l3_bindings.py``). ``tools/dev run --help`` (``options.py``) is the manual.
"""

from __future__ import annotations

from tools.simulate.cli import main
from tools.simulate.config import SimConfig
from tools.simulate.simulation import run_simulation
from tools.simulate.stats import SimStats

__all__ = ["SimConfig", "SimStats", "main", "run_simulation"]
