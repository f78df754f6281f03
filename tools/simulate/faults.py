"""Seeded fault injection for host<->device transfers.

A fault is decided before a transfer starts (so a run is reproducible) and happens inside it: a
*failed* transfer raises before moving anything; an *aborted* one raises after part of the work
(a load after ``at_layer`` layers, a backup after about half of its pages were copied). The engine
must then release everything the transfer reserved.

The failure is raised *by the package call*, not next to it: the faulty transfer call gets a
:class:`FailingDevicePool` as its ``device_pool`` (any object with ``get_buffer_desc()`` is a
device pool to ``mem_cache_pool_host``), whose ``get_buffer_desc()`` raises
:class:`InjectedTransferError` inside ``load_to_device_per_layer`` /
``backup_from_device_all_layer``. So the host pool's own failure path runs: a failing load
aborts the layer counter's batch in flight (readers get ``LayerLoadAbortedError``) and re-raises.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from mem_cache_pool import KVBufferDesc

__all__ = ["FailingDevicePool", "Fault", "FaultInjector", "InjectedTransferError"]


class InjectedTransferError(RuntimeError):
    """Raised inside a package transfer call by the fault injector's :class:`FailingDevicePool`."""


class FailingDevicePool:
    """A device pool (``get_buffer_desc()``) that fails: handed to a host-pool transfer, it makes
    that package call raise ``error`` from inside the package, before anything moves."""

    def __init__(self, error: InjectedTransferError) -> None:
        self.error = error
        self.calls = 0

    def get_buffer_desc(self) -> KVBufferDesc:
        self.calls += 1
        raise self.error


@dataclass(frozen=True, slots=True)
class Fault:
    """``kind`` "fail" (nothing moved) or "abort" (stops after ``at_layer`` layers or half the
    pages of a backup)."""

    kind: Literal["fail", "abort"]
    at_layer: int = 0


class FaultInjector:
    """Draws a fault for a transfer with probability ``rate`` (half fail, half abort)."""

    def __init__(self, rate: float, seed: int) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be in [0, 1], got {rate}")
        self.rate = rate
        self._rng = random.Random(seed ^ 0x5EED_FA17)
        self.injected = 0

    def draw(self, layers: int) -> Fault | None:
        """``None`` (no fault) or the fault the next transfer over ``layers`` layers suffers."""
        if self.rate == 0.0 or self._rng.random() >= self.rate:
            return None
        self.injected += 1
        if self._rng.random() < 0.5:
            return Fault("fail")
        return Fault("abort", at_layer=self._rng.randrange(max(1, layers)))
