"""A per-session LRU prefix store over two tiers (device pool, host pool).

When a turn finishes, the page-aligned part of its sequence stays cached as the session's entry:
on the device (its device slots) until the device pool runs short, then on the host (its host
slots) after a backup. The store only does bookkeeping: it never calls an allocator or a pool, so
the engine decides what to free and when; the token totals it keeps make the per-step slot
conservation check O(1).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

import torch

from tools.simulate.workload import SessionId

__all__ = ["PrefixEntry", "PrefixStore", "Tier"]

Tier = Literal["device", "host"]


@dataclass(slots=True)
class PrefixEntry:
    """The cached first ``length`` tokens of ``session`` (``length``: a multiple of the page size).

    ``slots`` holds ``length`` int64 slot ids of the tier the entry lives on: device slots in
    sequence order for ``"device"``, host slots for ``"host"``.
    """

    session: SessionId
    length: int
    tier: Tier
    slots: torch.Tensor


class PrefixStore:
    """LRU over sessions; the most recently used entry is last."""

    def __init__(self) -> None:
        self._entries: OrderedDict[SessionId, PrefixEntry] = OrderedDict()
        self._tokens: dict[Tier, int] = {"device": 0, "host": 0}

    def __len__(self) -> int:
        return len(self._entries)

    def tokens(self, tier: Tier) -> int:
        """Slots held by entries on ``tier``."""
        return self._tokens[tier]

    def put(self, entry: PrefixEntry) -> None:
        """Insert ``entry`` as most recently used; the session must not have an entry already."""
        if entry.session in self._entries:
            raise RuntimeError(f"session {entry.session} already has a cached prefix")
        if entry.slots.numel() != entry.length:
            raise RuntimeError(
                f"entry of session {entry.session}: {entry.slots.numel()} slots for "
                f"{entry.length} tokens"
            )
        self._entries[entry.session] = entry
        self._tokens[entry.tier] += entry.length

    def peek(self, session: SessionId) -> PrefixEntry | None:
        return self._entries.get(session)

    def take(self, session: SessionId) -> PrefixEntry | None:
        """Remove and return the session's entry (the caller now owns its slots)."""
        entry = self._entries.pop(session, None)
        if entry is not None:
            self._tokens[entry.tier] -= entry.length
        return entry

    def oldest(self, tier: Tier) -> PrefixEntry | None:
        """The least recently used entry on ``tier`` (still in the store)."""
        for entry in self._entries.values():
            if entry.tier == tier:
                return entry
        return None

    def move_to_host(self, session: SessionId, host_slots: torch.Tensor) -> torch.Tensor:
        """Re-tier a device entry to the host; returns its device slots (for the caller to free).

        The entry keeps its LRU position (a backup is not a use).
        """
        entry = self._entries[session]
        if entry.tier != "device" or host_slots.numel() != entry.length:
            raise RuntimeError(f"cannot move entry of session {session} ({entry.tier}) to host")
        device_slots = entry.slots
        entry.tier, entry.slots = "host", host_slots
        self._tokens["device"] -= entry.length
        self._tokens["host"] += entry.length
        return device_slots

    def sessions(self) -> list[SessionId]:
        """Sessions in LRU order (oldest first)."""
        return list(self._entries)
