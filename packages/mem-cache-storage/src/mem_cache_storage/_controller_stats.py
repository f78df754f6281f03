"""The controller's counters: :class:`ControllerStats` (a frozen snapshot, the one declaration of
the storage controller's counters: the controller fills them, the simulator sums the snapshots of
its controllers with ``+``), per extra pool :class:`PoolStats`, the latency percentiles
(:class:`LatencySummary`). Records only: the mutable counter behind the snapshot and the latency
recorder live in :mod:`mem_cache_storage.controller` (the prefetch and write paths run through
them; this module runs only in ``stats()``). Re-exported by the controller module."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

__all__ = ["ControllerStats", "LatencySummary", "PoolStats"]


@dataclass(frozen=True, slots=True)
class PoolStats:
    """Counters of one extra pool of a controller (a snapshot; ``+`` sums two)."""

    pages_loaded: int = 0
    bytes_loaded: int = 0
    pages_written: int = 0
    pages_skipped: int = 0
    pages_write_failed: int = 0
    bytes_written: int = 0
    #: prefetches whose prefix was cut (or lost) because this pool's part was absent or failed
    part_misses: int = 0

    def __add__(self, other: PoolStats) -> PoolStats:
        if not isinstance(other, PoolStats):
            return NotImplemented
        return PoolStats(**{n: getattr(self, n) + getattr(other, n) for n in POOL_COUNTERS})


POOL_COUNTERS = tuple(f.name for f in fields(PoolStats))


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Percentiles (seconds) over the last ``count`` samples kept (``total`` ever recorded)."""

    count: int
    total: int
    p50_s: float
    p99_s: float
    max_s: float


NO_LATENCY = LatencySummary(0, 0, 0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class ControllerStats:
    """Counters of a controller (a snapshot; the one declaration of them: the controller fills
    them, the simulator sums the snapshots of its controllers with ``+``)."""

    prefetches: int = 0
    prefetch_hits: int = 0
    prefetch_misses: int = 0
    prefetch_failed: int = 0
    prefetch_cancelled: int = 0
    prefetch_timeouts: int = 0
    pages_loaded: int = 0
    bytes_loaded: int = 0
    load_seconds: float = 0.0
    pages_written: int = 0
    pages_skipped: int = 0
    pages_write_failed: int = 0
    bytes_written: int = 0
    write_seconds: float = 0.0
    backend_errors: int = 0
    prefetch_latency: LatencySummary = NO_LATENCY
    write_latency: LatencySummary = NO_LATENCY
    #: per extra pool (``extra_pools``): its pages / bytes moved and its part misses (the
    #: counters above are the KV pool's, in token pages)
    pools: Mapping[str, PoolStats] = field(default_factory=dict)

    @property
    def load_gb_per_s(self) -> float:
        return self.bytes_loaded / self.load_seconds / 1e9 if self.load_seconds else 0.0

    @property
    def write_gb_per_s(self) -> float:
        return self.bytes_written / self.write_seconds / 1e9 if self.write_seconds else 0.0

    def __add__(self, other: ControllerStats) -> ControllerStats:
        """The counters of both summed (latencies: ``other``'s, the later snapshot's)."""
        if not isinstance(other, ControllerStats):
            return NotImplemented
        sums = {n: getattr(self, n) + getattr(other, n) for n in COUNTER_NAMES}
        pools = dict(self.pools)
        for name, st in other.pools.items():
            pools[name] = pools.get(name, PoolStats()) + st
        return ControllerStats(**sums, prefetch_latency=other.prefetch_latency,
                               write_latency=other.write_latency, pools=pools)


#: the counters of :class:`ControllerStats` (its int and float fields)
COUNTER_NAMES = tuple(f.name for f in fields(ControllerStats) if f.type in ("int", "float"))
