"""The storage tier (L3) of the models with several host pools: how ``--model hybrid`` and
``--model deepseek_v4`` put their pages in storage (the :class:`~tools.simulate.storage_tier.
L3Binding` of each; mha / mla use ``StackBinding``).

* **hybrid**: the main pool is the MHA host pool of the full-attention layers; the Mamba state
  host pool (``MambaPoolHost``, one slot per cached prefix) is an extra pool named ``mamba``
  with SGLang's ``trailing_pages`` policy (one page): a prefix's state is stored under its last
  page's key, so a prefix restores from L3 only at a length where a state was stored (the
  controller picks the longest such length), and the state read back is verified bit-exact
  against the content of (session, length) by the model's host->device load, as a host hit's.
* **deepseek_v4**: one ``DeepSeekV4SingleKVPoolHost`` mirror per record pool, one page row per
  token page in each. The window mirror is the main pool; the c4 and c128 mirrors are extra
  pools ``deepseek_v4_c4`` / ``deepseek_v4_c128`` with the ``all_pages`` policy: the simulated
  window pool holds every live token (see ``deepseek_v4_stack.py``) and the load verifies every
  record of the prefix, so every page of every pool is needed (SGLang keeps only a window of
  SWA pages; this stack has no such window).
"""

from __future__ import annotations

import torch

from mem_cache_storage.controller import ExtraPool, PrefetchResult
from tools.simulate.deepseek_v4 import DeepSeekV4Model, HostRows
from tools.simulate.hybrid import HostRes, HybridModel
from tools.simulate.prefix_store import PrefixEntry
from tools.simulate.workload import SessionId

__all__ = ["DeepSeekV4Binding", "HybridBinding"]


class HybridBinding:
    """The L3 binding of a :class:`~tools.simulate.hybrid.HybridModel` (see the module)."""

    def __init__(self, model: HybridModel) -> None:
        hs = model.hs
        self.model = model
        self.model_name = f"sim-hybrid-{len(hs.full_ids) + len(hs.mamba_ids)}L"
        self.host_pool = hs.base.host_pool
        self.extra_pools = (ExtraPool("mamba", hs.host_states, "trailing_pages", 1),)
        self.host_bytes = hs.base.host_capacity * hs.base.bytes_per_token

    def host_slots(self, entry: PrefixEntry) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return entry.slots, {"mamba": self.model.host_res[entry.session].state}

    def adopt(self, session: SessionId, result: PrefetchResult, tokens: int) -> PrefixEntry:
        res = HostRes(result.host_indices, result.extra_host_indices["mamba"], length=tokens)
        return PrefixEntry(session, tokens, "host", self.model.host_bind(session, res))


def _pool_name(kind: str) -> str:
    return f"deepseek_v4_{kind}"


class DeepSeekV4Binding:
    """The L3 binding of a :class:`~tools.simulate.deepseek_v4.DeepSeekV4Model` (see the
    module)."""

    def __init__(self, model: DeepSeekV4Model) -> None:
        stack = model.stack
        self.model = model
        self.model_name = f"sim-deepseek_v4-{stack.cfg.layers}L"
        main, *rest = stack.kinds
        self.main = main.name
        self.host_pool = main.host
        self.extra_pools = tuple(ExtraPool(_pool_name(k.name), k.host, "all_pages")
                                 for k in rest)
        self.kinds = [k.name for k in rest]
        self.host_bytes = main.capacity * stack.page_size * stack.bytes_per_token

    def host_slots(self, entry: PrefixEntry) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        rows = self.model.host_rows[entry.session]
        return rows[self.main], {_pool_name(k): rows[k] for k in self.kinds}

    def adopt(self, session: SessionId, result: PrefetchResult, tokens: int) -> PrefixEntry:
        rows: HostRows = {self.main: result.host_indices}
        for k in self.kinds:
            rows[k] = result.extra_host_indices[_pool_name(k)]
        return PrefixEntry(session, tokens, "host", self.model.host_bind(session, rows))
