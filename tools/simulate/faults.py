"""Seeded fault injection for host<->device transfers.

A fault is decided before a transfer starts (so a run is reproducible) and happens inside it: a
*failed* transfer raises before moving anything; an *aborted* one raises after part of the work
(a load after ``at_layer`` layers, a backup after about half of its pages were copied). The engine
must then release everything the transfer reserved.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

__all__ = ["Fault", "FaultInjector", "InjectedTransferError"]


class InjectedTransferError(RuntimeError):
    """Raised inside a transfer by the fault injector (never by the packages)."""


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
