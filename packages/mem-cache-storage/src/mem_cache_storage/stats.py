"""Counters of a backend or controller, and a latency recorder with percentiles.

Everything here is thread safe (one lock per object) and cheap enough for the IO path.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from mem_cache_kernels.checks import check_int

__all__ = ["LatencyRecorder", "LatencySummary", "StorageStats"]


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Percentiles (seconds) over the last ``count`` samples kept (``total`` ever recorded)."""

    count: int
    total: int
    p50_s: float
    p99_s: float
    max_s: float


class LatencyRecorder:
    """Keeps the last ``window`` latencies; :meth:`summary` gives p50/p99/max."""

    def __init__(self, window: int = 8192) -> None:
        check_int("window", window, minimum=1)
        self._samples: deque[float] = deque(maxlen=window)
        self._total = 0
        self._lock = threading.Lock()

    def record(self, seconds: float) -> None:
        with self._lock:
            self._samples.append(float(seconds))
            self._total += 1

    def summary(self) -> LatencySummary:
        with self._lock:
            data = sorted(self._samples)
            total = self._total
        if not data:
            return LatencySummary(0, total, 0.0, 0.0, 0.0)

        def pct(q: float) -> float:
            return data[min(len(data) - 1, int(q * (len(data) - 1) + 0.5))]

        return LatencySummary(len(data), total, pct(0.50), pct(0.99), data[-1])


@dataclass(slots=True)
class StorageStats:
    """Page counters of one backend (a snapshot is a copy: :meth:`snapshot`).

    ``get_*``/``set_*`` count pages of the get and set paths (both the copying and the zero-copy
    calls); ``*_bytes`` count payload bytes of successful pages; ``errors`` count backend calls
    that raised or returned a malformed result (their pages count as misses / failed sets);
    ``rejected`` count stored pages that failed verification (torn, foreign, corrupted);
    ``set_refused`` counts page writes the store refused (Mooncake's "BatchPut failed ...
    insufficient space"), every attempt, including those a retry then stored: ``set_failed``
    is what stayed unstored.
    """

    get_hits: int = 0
    get_misses: int = 0
    get_bytes: int = 0
    set_ok: int = 0
    set_failed: int = 0
    set_bytes: int = 0
    exists_queries: int = 0
    errors: int = 0
    rejected: int = 0
    evicted: int = 0
    set_refused: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def snapshot(self) -> StorageStats:
        with self._lock:
            return StorageStats(
                self.get_hits, self.get_misses, self.get_bytes, self.set_ok, self.set_failed,
                self.set_bytes, self.exists_queries, self.errors, self.rejected, self.evicted,
                self.set_refused,
            )

    def as_dict(self) -> dict[str, int]:
        s = self.snapshot()
        return {
            "get_hits": s.get_hits, "get_misses": s.get_misses, "get_bytes": s.get_bytes,
            "set_ok": s.set_ok, "set_failed": s.set_failed, "set_bytes": s.set_bytes,
            "exists_queries": s.exists_queries, "errors": s.errors, "rejected": s.rejected,
            "evicted": s.evicted,
        }
