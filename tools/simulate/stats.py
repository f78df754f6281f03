"""Counters and timers the engine fills in and the report renders."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OpTimer", "SimStats", "TransferStat"]


@dataclass(slots=True)
class OpTimer:
    """Calls and wall time of one allocator operation kind."""

    calls: int = 0
    total_ns: int = 0
    items: int = 0

    @property
    def ns_per_call(self) -> float:
        return self.total_ns / self.calls if self.calls else 0.0


@dataclass(slots=True)
class TransferStat:
    """Bytes and wall time of one transfer direction (completed transfers only count bytes)."""

    calls: int = 0
    tokens: int = 0
    bytes: int = 0
    total_ns: int = 0
    failed: int = 0
    aborted: int = 0

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.total_ns if self.total_ns else 0.0

    def record_failure(self, aborted: bool) -> None:
        """One transfer that did not complete: an injected abort, or any other failure."""
        if aborted:
            self.aborted += 1
        else:
            self.failed += 1

    def record(self, ns: int, tokens: int, nbytes: int) -> None:
        """One completed transfer of ``tokens`` tokens (``nbytes`` bytes) in ``ns``."""
        self.calls += 1
        self.total_ns += ns
        self.tokens += tokens
        self.bytes += nbytes


@dataclass(slots=True)
class SimStats:
    steps: int = 0
    requests_done: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    recomputed_tokens: int = 0
    returning_turns: int = 0
    device_hits: int = 0
    host_hits: int = 0
    misses: int = 0
    reusable_tokens: int = 0
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    evictions_to_host: int = 0
    host_drops: int = 0
    device_drops: int = 0
    retractions: int = 0
    shared_prefix_hits: int = 0
    shared_prefix_hit_tokens: int = 0
    duplicate_pages_freed: int = 0
    shared_prefix_evictions: int = 0
    draft_tokens: int = 0
    rejected_draft_tokens: int = 0
    peak_device_tokens: int = 0
    peak_host_tokens: int = 0
    peak_running: int = 0
    conservation_checks: int = 0
    pages_verified: int = 0
    tokens_verified: int = 0
    sequences_verified: int = 0
    integrity_failures: int = 0
    layer_waits: int = 0
    wall_s: float = 0.0
    device_capacity: int = 0
    host_capacity: int = 0
    bytes_per_token: int = 0
    faults_injected: int = 0
    alloc_ops: dict[str, OpTimer] = field(default_factory=dict)
    transfers: dict[str, TransferStat] = field(default_factory=dict)
    leaks: dict[str, tuple[int, int]] = field(default_factory=dict)
    hybrid: dict[str, int] = field(default_factory=dict)  # --model hybrid: state-slot figures
    failures: list[str] = field(default_factory=list)
    l3: Any = None  # storage_tier.L3Stats when the storage tier (L3) ran

    @contextmanager
    def timed(self, kind: str, items: int = 0) -> Iterator[None]:
        """Time one allocator call of ``kind`` (``items`` = tokens or slots it handled)."""
        t0 = time.perf_counter_ns()
        try:
            yield
        finally:
            op = self.alloc_ops.setdefault(kind, OpTimer())
            op.calls += 1
            op.total_ns += time.perf_counter_ns() - t0
            op.items += items

    def transfer(self, direction: str) -> TransferStat:
        return self.transfers.setdefault(direction, TransferStat())

    def fail(self, message: str) -> None:
        """Record an integrity failure (kept to the first 20 messages)."""
        self.integrity_failures += 1
        if len(self.failures) < 20:
            self.failures.append(message)

    @property
    def leaked(self) -> bool:
        return any(avail != cap for avail, cap in self.leaks.values())
