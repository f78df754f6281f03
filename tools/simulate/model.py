"""What the engine loop (``loop.py``) needs from a model: the request record and the adapter.

The loop is model-independent: arrivals, admission with the whole future footprint reserved,
prefill, decode, finish, retraction, the host tier's backup/load hooks and the statistics. What
differs between models goes through a :class:`ModelAdapter`: the allocator and request table of
its stack, what is written and verified per token, how a finished request's partial last page is
freed, how much future room a running request may still take, its host tier (how host room is
reserved, backed up to and loaded from) and its conservation / leak checks.

Implementations: ``engine.MemoryStackModel`` (mha/mla over ``stack.MemoryStack``) and
``deepseek_v4.DeepSeekV4Model`` (the DeepSeek-V4 HiSparse stack of ``deepseek_v4_stack.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from mem_cache_allocator import BaseTokenToKVPoolAllocator
from mem_cache_pool import ReqToTokenPool
from tools.simulate.config import SimConfig
from tools.simulate.prefix_store import PrefixEntry, PrefixStore
from tools.simulate.workload import SessionId, SessionSpec

__all__ = ["H", "ModelAdapter", "Req"]

H = TypeVar("H")
"""A model's host reservation (host slots, or host page rows per record pool)."""


@dataclass(slots=True)
class Req:
    """A running turn. ``seq_len`` tokens have KV; it finishes at ``final_len``. Its first
    ``shared`` slots are borrowed from the shared-prefix cache (one reference held)."""

    spec: SessionSpec
    turn: int
    row: int
    prefix_len: int
    prefix_slots: torch.Tensor
    input_len: int
    final_len: int
    seq_len: int = 0
    shared: int = 0


class ModelAdapter(Protocol[H]):
    """The model-specific parts of the engine loop (see the module doc).

    ``cfg`` is the configuration the loop runs with: options a model does not support are
    turned off there (the run's report keeps the configuration as given). Slots are int64 device
    slots (logical full slots for DeepSeek-V4) on ``device``; sizes are in tokens.
    """

    cfg: SimConfig
    device: torch.device
    page_size: int
    allocator: BaseTokenToKVPoolAllocator
    """``alloc`` on a ``TokenToKVPoolAllocator``, else ``alloc_extend`` / ``alloc_decode``."""
    req_pool: ReqToTokenPool
    layer_num: int
    device_capacity: int
    capacity_name: str
    decode_by_extend: bool
    """Decode allocates through ``alloc_extend`` (one token per request) instead of
    ``alloc_decode``."""

    # ------------------------------------------------------------- device
    def write(self, slots: torch.Tensor, sessions: torch.Tensor, positions: torch.Tensor) -> None:
        """Write every layer's records of tokens (``sessions[i]``, ``positions[i]``) at
        ``slots[i]``."""
        ...

    def verify_layer(
        self, layer: int, slots: torch.Tensor, sessions: torch.Tensor, positions: torch.Tensor
    ) -> int:
        """How many of the tokens' records of local layer ``layer`` differ from their content."""
        ...

    def mismatch_text(self, bad: int, seq_len: int) -> str:
        """What ``bad`` mismatches of a ``seq_len``-token sequence are, for a failure message."""
        ...

    def future_tokens(self, seq_len: int, final_len: int) -> int:
        """``available_size()`` tokens a request at ``seq_len`` may still take up to
        ``final_len`` (its reservation)."""
        ...

    def tail_slots(self, slots: torch.Tensor, aligned: int) -> torch.Tensor:
        """What to free of a finished sequence ``slots`` past its page-aligned cached part
        ``slots[:aligned]`` (non-empty tail)."""
        ...

    # --------------------------------------------------------------- host
    def host_available(self) -> int:
        """Free host tokens."""
        ...

    def host_alloc(self, tokens: int) -> H | None:
        """Reserve host room for ``tokens`` (whole pages); ``None`` when there is none."""
        ...

    def host_free(self, host: H) -> None:
        """Release a host reservation."""
        ...

    def host_bind(self, session: SessionId, host: H) -> torch.Tensor:
        """``host`` now holds ``session``'s cached prefix: the host slots its entry records."""
        ...

    def host_unbind(self, entry: PrefixEntry) -> H:
        """The reservation of a host ``entry`` that left the store (the caller now owns it)."""
        ...

    def backup(self, device_slots: torch.Tensor, host: H) -> bool:
        """Copy every layer of ``device_slots`` into ``host``; ``False`` if the transfer failed
        (``host`` then holds garbage)."""
        ...

    def load(self, host: H, start: int, device_slots: torch.Tensor, session: SessionId) -> bool:
        """Load tokens ``start..`` of the prefix in ``host`` into ``device_slots`` layer by
        layer, verifying each layer; ``False`` if the transfer failed."""
        ...

    # ------------------------------------------------------------- checks
    def check(self, running: Sequence[Req], store: PrefixStore, shared_held: int) -> None:
        """Slot conservation on every pool (a violation is an integrity failure)."""
        ...

    def leak_check(self) -> None:
        """Record every pool's (available, capacity) after the run is drained."""
        ...

    def close(self) -> None:
        """Stop the transfer threads."""
        ...

    def close_host(self) -> None:
        """Release the host pools (after the leak check)."""
        ...
