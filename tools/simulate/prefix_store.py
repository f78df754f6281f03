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
    sequence order for ``"device"``, host slots for ``"host"``. A device entry's first ``shared``
    slots are borrowed from the shared-prefix cache (``shared_prefix.py``): the entry holds a
    reference to it and does not own those slots; a host entry owns all its slots.
    """

    session: SessionId
    length: int
    tier: Tier
    slots: torch.Tensor
    shared: int = 0

    @property
    def owned(self) -> int:
        """Slots this entry owns on its tier."""
        return self.length - self.shared


class PrefixStore:
    """LRU over sessions; the most recently used entry is last."""

    def __init__(self) -> None:
        self._entries: OrderedDict[SessionId, PrefixEntry] = OrderedDict()
        self._tokens: dict[Tier, int] = {"device": 0, "host": 0}

    def __len__(self) -> int:
        return len(self._entries)

    def tokens(self, tier: Tier) -> int:
        """Slots owned by entries on ``tier`` (borrowed shared-prefix slots not counted)."""
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
        if not 0 <= entry.shared <= entry.length or (entry.shared and entry.tier != "device"):
            raise RuntimeError(
                f"entry of session {entry.session}: {entry.shared} shared tokens on "
                f"{entry.tier} with length {entry.length}"
            )
        self._entries[entry.session] = entry
        self._tokens[entry.tier] += entry.owned

    def peek(self, session: SessionId) -> PrefixEntry | None:
        return self._entries.get(session)

    def take(self, session: SessionId) -> PrefixEntry | None:
        """Remove and return the session's entry (the caller now owns its slots)."""
        entry = self._entries.pop(session, None)
        if entry is not None:
            self._tokens[entry.tier] -= entry.owned
        return entry

    def oldest(self, tier: Tier) -> PrefixEntry | None:
        """The least recently used entry on ``tier`` (still in the store)."""
        for entry in self._entries.values():
            if entry.tier == tier:
                return entry
        return None

    def move_to_host(self, session: SessionId, host_slots: torch.Tensor) -> torch.Tensor:
        """Re-tier a device entry to the host; returns its device slots (for the caller to free).

        The entry keeps its LRU position (a backup is not a use). The returned slots include
        any borrowed shared-prefix slots (``entry.shared`` before the call): the caller frees
        only the owned ones and releases the cache reference.
        """
        entry = self._entries[session]
        if entry.tier != "device" or host_slots.numel() != entry.length:
            raise RuntimeError(f"cannot move entry of session {session} ({entry.tier}) to host")
        device_slots = entry.slots
        self._tokens["device"] -= entry.owned
        entry.tier, entry.slots, entry.shared = "host", host_slots, 0
        self._tokens["host"] += entry.length
        return device_slots

    def sessions(self) -> list[SessionId]:
        """Sessions in LRU order (oldest first)."""
        return list(self._entries)
