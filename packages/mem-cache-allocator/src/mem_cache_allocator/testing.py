"""Conformance kit: hypothesis state machines any engine can run against its own allocator.

Usage (pytest)::

    from hypothesis import settings
    from mem_cache_allocator.testing import allocator_state_machine

    Machine = allocator_state_machine(lambda: MyAllocator(64, 4, torch.float16, "cpu", None))
    TestMyAllocator = Machine.TestCase
    TestMyAllocator.settings = settings(max_examples=20, stateful_step_count=30, deadline=None)

The machine drives a token/paged-style allocator (``alloc``, ``alloc_extend``, ``alloc_decode``,
``free``, ``free_segment``, ``free_group_begin/end``, ``backup_state/restore_state``,
``available_size``, ``page_size``) with random requests and checks after every step:

* conservation: ``available_size() + page_size * (pages owned by live requests) == capacity``;
* no slot is handed out twice, page 0 is never handed out, slots are int64 on the right device;
* position congruence (``slot % ps == position % ps``), and an extend continues the request's
  partial page from ``last_loc + 1``;
* a ``None`` result happens exactly when the request needs more pages than are available, and it
  leaves ``available_size()`` unchanged;
* a free gives back exactly the freed pages; a free group defers nothing past its end and
  rejects nesting; ``restore_state`` undoes everything allocated after ``backup_state``.

Frees are generated the way engines and SGLang's tests make them: shuffled, reversed, int32,
partial last pages, several requests concatenated, the same page twice in one free group
(page allocators, ``page_size > 1``: they deduplicate; the token allocator, like SGLang's, does
not), speculative decoding's rejected drafts (a request's slots past its accepted pages), and
retraction of a running request (its whole row).

:func:`slot_allocator_state_machine` does the same for request-level slot allocators
(``MambaSlotAllocator``: ``alloc``, ``free``, ``alloc_group_begin/end``).

:func:`hisparse_state_machine` drives the two HiSparse allocators the way SGLang's HiSparse
coordinator and scheduler call them (logical-only decode tokens, ``alloc_device_buffer`` with
compressed indices, ``free_hisparse``, free groups, the scheduler hooks).

This module imports ``hypothesis`` (install the ``testing`` extra).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mem_cache_allocator._testing_hisparse import hisparse_state_machine

__all__ = ["allocator_state_machine", "hisparse_state_machine", "slot_allocator_state_machine"]


def _shaped(
    data: st.DataObject, slots: list[int], device: torch.device, dups: bool
) -> torch.Tensor:
    """``slots`` as an engine may pass them: in order, shuffled, reversed, with duplicates
    (``dups``), int64 or int32."""
    out = list(slots)
    mode = data.draw(
        st.sampled_from(
            ["plain", "shuffled", "reversed", "dups"] if dups else ["plain", "shuffled", "reversed"]
        ),
        label="shape",
    )
    if mode == "shuffled":
        out = data.draw(st.permutations(out), label="perm")
    elif mode == "reversed":
        out.reverse()
    elif mode == "dups" and out:
        out = out + out[: data.draw(st.integers(1, len(out)), label="ndup")]
        out = data.draw(st.permutations(out), label="perm")
    dtype = data.draw(st.sampled_from([torch.int64, torch.int32]), label="dtype")
    return torch.tensor(out, dtype=dtype, device=device)


def _as_list(t: Any) -> list[int]:
    if not isinstance(t, torch.Tensor):
        raise AssertionError(f"allocation returned {type(t).__name__}, expected a torch.Tensor")
    if t.dtype != torch.int64:
        raise AssertionError(f"allocation returned dtype {t.dtype}, expected torch.int64")
    if t.dim() != 1:
        raise AssertionError(f"allocation returned shape {tuple(t.shape)}, expected 1-D")
    out: list[int] = t.cpu().tolist()
    return out


def allocator_state_machine(
    factory: Callable[[], Any],
    *,
    decode: bool = True,
    max_batch: int = 3,
    max_extend: int = 24,
    split_in_group: bool | None = None,
) -> type[RuleBasedStateMachine]:
    """A state machine class exercising allocators built by ``factory()`` (a fresh one per run).

    ``decode=False`` skips ``alloc_decode`` (for allocators whose decode allocates on one side
    only, like HiSparse). ``max_batch`` requests per call, up to ``max_extend`` tokens each.
    ``split_in_group=False`` never frees a page twice inside one free group (for allocators whose
    groups do not defer, like SGLang's HiSparse); the default is ``decode`` (the HiSparse-style
    allocators, decode on one side only, are the ones whose groups do not defer).
    """
    split_pages_in_group = decode if split_in_group is None else split_in_group

    class AllocatorMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.a = factory()
            self.ps: int = int(self.a.page_size)
            self.capacity: int = int(self.a.available_size())
            self.device = torch.device(getattr(self.a, "device", "cpu"))
            self.reqs: dict[int, list[int]] = {}
            self.blocks: dict[int, list[int]] = {}
            self.next_id = 0
            self.live: set[int] = set()

        # ---------------------------------------------------------- helpers
        def _owned_pages(self) -> set[int]:
            return {s // self.ps for s in self.live}

        def _check_new(
            self, slots: list[int], tensor: torch.Tensor, continued: set[int] | None = None
        ) -> None:
            """New slots: unique, not page 0, not live; outside ``continued`` (slots that extend a
            request's own partial page) they must lie in pages nobody owned before."""
            assert tensor.device == self.device, f"slots on {tensor.device}, want {self.device}"
            assert len(set(slots)) == len(slots), f"duplicate slots in one allocation: {slots}"
            assert all(s >= self.ps for s in slots), f"page 0 handed out: {slots}"
            again = self.live.intersection(slots)
            assert not again, f"slots handed out twice: {sorted(again)}"
            owned = self._owned_pages()
            cont = continued or set()
            shared = {s // self.ps for s in slots if s not in cont} & owned
            assert not shared, f"new slots in pages already owned by others: {sorted(shared)}"

        def _pages_needed(self, prefix: int, seq: int) -> int:
            ps = self.ps
            return -(-seq // ps) - -(-prefix // ps)

        def _available_pages(self) -> int:
            return int(self.a.available_size()) // self.ps

        # ---------------------------------------------------------- rules
        @rule(data=st.data())
        def extend(self, data: st.DataObject) -> None:
            bs = data.draw(st.integers(1, max_batch), label="bs")
            ids: list[int] = []
            for _ in range(bs):
                choices = [r for r in self.reqs if r not in ids]
                existing = data.draw(st.booleans(), label="existing")
                if choices and existing:
                    ids.append(data.draw(st.sampled_from(choices), label="req"))
                else:
                    ids.append(-1 - len(ids))  # new request placeholder
            ext = [data.draw(st.integers(1, max_extend), label="n") for _ in ids]
            prefix = [len(self.reqs.get(r, [])) for r in ids]
            seq = [p + n for p, n in zip(prefix, ext)]
            last = [self.reqs[r][-1] if r >= 0 and self.reqs[r] else -1 for r in ids]
            need = sum(self._pages_needed(p, s) for p, s in zip(prefix, seq))
            before = self.a.available_size()
            dev = self.device
            out = self.a.alloc_extend(
                torch.tensor(prefix, dtype=torch.int64, device=dev),
                torch.tensor(prefix, dtype=torch.int64),
                torch.tensor(seq, dtype=torch.int64, device=dev),
                torch.tensor(seq, dtype=torch.int64),
                torch.tensor(last, dtype=torch.int64, device=dev),
                sum(ext),
            )
            if out is None:
                assert need > self._available_pages(), (
                    f"alloc_extend returned None with {need} pages needed and "
                    f"{self._available_pages()} available"
                )
                assert self.a.available_size() == before, "a failed alloc_extend changed state"
                return
            assert need <= before // self.ps, "alloc_extend succeeded beyond capacity"
            slots = _as_list(out)
            assert len(slots) == sum(ext)
            continued: set[int] = set()
            off = 0
            for p, s, lst in zip(prefix, seq, last):
                if lst >= 0:
                    n_old = min(s, -(-p // self.ps) * self.ps) - p
                    continued.update(slots[off : off + n_old])
                off += s - p
            self._check_new(slots, out, continued)
            off = 0
            for r, p, s, lst in zip(ids, prefix, seq, last):
                mine = slots[off : off + s - p]
                off += s - p
                for k, slot in enumerate(mine):
                    pos = p + k
                    assert slot % self.ps == pos % self.ps, (
                        f"congruence broken: position {pos} at slot {slot} (page size {self.ps})"
                    )
                    if lst >= 0 and pos < -(-p // self.ps) * self.ps:
                        assert slot == lst + 1 + k, f"partial page not continued: {mine}"
                rid = r
                if r < 0:
                    rid = self.next_id
                    self.next_id += 1
                    self.reqs[rid] = []
                self.reqs[rid].extend(mine)
                self.live.update(mine)
            assert self.a.available_size() == before - need * self.ps

        @precondition(lambda self: decode and any(self.reqs.values()))
        @rule(data=st.data())
        def decode_step(self, data: st.DataObject) -> None:
            candidates = [r for r, s in self.reqs.items() if s]
            ids = data.draw(
                st.lists(st.sampled_from(candidates), min_size=1, max_size=max_batch, unique=True)
            )
            seq = [len(self.reqs[r]) + 1 for r in ids]
            last = [self.reqs[r][-1] for r in ids]
            need = sum(1 for s in seq if (s - 1) % self.ps == 0)
            before = self.a.available_size()
            dev = self.device
            out = self.a.alloc_decode(
                torch.tensor(seq, dtype=torch.int64, device=dev),
                torch.tensor(seq, dtype=torch.int64),
                torch.tensor(last, dtype=torch.int64, device=dev),
            )
            if out is None:
                assert need > self._available_pages(), "alloc_decode returned None with room"
                assert self.a.available_size() == before, "a failed alloc_decode changed state"
                return
            slots = _as_list(out)
            assert len(slots) == len(ids)
            self._check_new(slots, out, {x for x, s in zip(slots, seq) if (s - 1) % self.ps})
            for r, s, lst, slot in zip(ids, seq, last, slots):
                assert slot % self.ps == (s - 1) % self.ps, "decode congruence broken"
                if (s - 1) % self.ps:
                    assert slot == lst + 1, f"decode must continue the page: {lst} -> {slot}"
                self.reqs[r].append(slot)
                self.live.add(slot)
            assert self.a.available_size() == before - need * self.ps

        @rule(pages=st.integers(0, 4))
        def alloc_block(self, pages: int) -> None:
            before = self.a.available_size()
            out = self.a.alloc(pages * self.ps)
            if out is None:
                assert pages > self._available_pages(), "alloc returned None with room"
                assert self.a.available_size() == before, "a failed alloc changed state"
                return
            slots = _as_list(out)
            assert len(slots) == pages * self.ps
            self._check_new(slots, out)
            for i in range(0, len(slots), self.ps):
                page = slots[i : i + self.ps]
                assert page == list(range(page[0], page[0] + self.ps)), f"page not whole: {page}"
                assert page[0] % self.ps == 0
            bid = self.next_id
            self.next_id += 1
            self.blocks[bid] = slots
            self.live.update(slots)
            assert self.a.available_size() == before - pages * self.ps

        def _free_slots(
            self, slots: list[int], *, grouped: bool, data: st.DataObject | None = None
        ) -> None:
            before = self.a.available_size()
            pages = {s // self.ps for s in slots}
            if data is None:
                arg = torch.tensor(slots, dtype=torch.int64, device=self.device)
            else:
                arg = _shaped(data, slots, self.device, self.ps > 1)
            self.a.free(arg)
            self.live.difference_update(slots)
            if not grouped:
                assert self.a.available_size() == before + len(pages) * self.ps, (
                    "free did not give back exactly the freed pages"
                )

        @precondition(lambda self: bool(self.reqs) or bool(self.blocks))
        @rule(data=st.data())
        def free_one(self, data: st.DataObject) -> None:
            keys = [("r", k) for k in self.reqs] + [("b", k) for k in self.blocks]
            kind, key = data.draw(st.sampled_from(keys))
            if kind == "b":
                self._free_slots(self.blocks.pop(key), grouped=False, data=data)
                return
            slots = self.reqs[key]
            # free a page-aligned tail (whole request when start == 0)
            npages = -(-len(slots) // self.ps)
            start = data.draw(st.integers(0, max(npages - 1, 0))) * self.ps
            tail = slots[start:]
            if start and tail:
                before = self.a.available_size()
                self.a.free_segment(
                    torch.tensor(tail, dtype=torch.int64, device=self.device), start_pos=start
                )
                self.live.difference_update(tail)
                freed = {s // self.ps for s in tail}
                assert self.a.available_size() == before + len(freed) * self.ps
                self.reqs[key] = slots[:start]
            else:
                self._free_slots(slots, grouped=False, data=data)  # retraction / finish
                del self.reqs[key]

        @precondition(lambda self: len(self.reqs) >= 2)
        @rule(data=st.data())
        def free_concatenated(self, data: st.DataObject) -> None:
            """Several finished requests' slots (partial last pages) in one ``free``."""
            keys = data.draw(
                st.lists(st.sampled_from(sorted(self.reqs)), min_size=2, max_size=3, unique=True)
            )
            slots = [s for k in keys for s in self.reqs.pop(k)]
            self._free_slots(slots, grouped=False, data=data)

        @precondition(lambda self: any(len(v) > 1 for v in self.reqs.values()))
        @rule(data=st.data())
        def reject_drafts(self, data: st.DataObject) -> None:
            """Speculative decoding: the draft slots past the accepted tokens' pages go back."""
            key = data.draw(st.sampled_from(sorted(k for k, v in self.reqs.items() if len(v) > 1)))
            row = self.reqs[key]
            accepted = data.draw(st.integers(1, len(row) - 1), label="accepted")
            keep = -(-accepted // self.ps) * self.ps
            if keep >= len(row):
                return
            self.reqs[key] = row[:keep]
            self._free_slots(row[keep:], grouped=False, data=data)

        @precondition(lambda self: len(self.reqs) + len(self.blocks) >= 1)
        @rule(data=st.data())
        def free_group(self, data: st.DataObject) -> None:
            keys = [("r", k) for k in self.reqs] + [("b", k) for k in self.blocks]
            chosen = data.draw(st.lists(st.sampled_from(keys), min_size=1, unique=True))
            before = self.a.available_size()
            freed_pages: set[int] = set()
            self.a.free_group_begin()
            try:
                self.a.free_group_begin()
            except RuntimeError:
                pass
            else:
                raise AssertionError("nested free_group_begin() did not raise")
            for kind, key in chosen:
                slots = self.blocks.pop(key) if kind == "b" else self.reqs.pop(key)
                freed_pages.update(s // self.ps for s in slots)
                parts = [slots]
                split = split_pages_in_group and self.ps > 1 and len(slots) > self.ps
                if split and data.draw(st.booleans(), label="split"):
                    # prefix insertion frees the duplicate pages, then the tail: the page at
                    # the cut is listed twice in the group (released once)
                    cut = data.draw(st.integers(1, (len(slots) - 1) // self.ps), label="cut")
                    parts = [slots[: cut * self.ps + 1], slots[cut * self.ps :]]
                for part in parts:
                    view = _shaped(data, part, self.device, self.ps > 1)
                    self.a.free(view)
                    view.fill_(0)  # the allocator must have copied what it queued
                self.live.difference_update(slots)
            self.a.free_group_end()
            assert self.a.available_size() == before + len(freed_pages) * self.ps

        @rule(data=st.data())
        def backup_restore(self, data: st.DataObject) -> None:
            state = self.a.backup_state()
            before = self.a.available_size()
            pages = data.draw(st.integers(1, 3))
            out = self.a.alloc(pages * self.ps)
            if out is not None and self.reqs and data.draw(st.booleans()):
                key = data.draw(st.sampled_from(sorted(self.reqs)))
                if self.reqs[key]:
                    self.a.free(torch.tensor(self.reqs[key], dtype=torch.int64, device=self.device))
            self.a.restore_state(state)
            assert self.a.available_size() == before, "restore_state did not restore capacity"

        # ---------------------------------------------------------- invariants
        @invariant()
        def conservation(self) -> None:
            owned = len(self._owned_pages())
            avail = int(self.a.available_size())
            assert avail + owned * self.ps == self.capacity, (
                f"available {avail} + owned pages {owned} x {self.ps} != capacity {self.capacity}"
            )

    AllocatorMachine.__name__ = AllocatorMachine.__qualname__ = "AllocatorMachine"
    return AllocatorMachine


def slot_allocator_state_machine(factory: Callable[[], Any]) -> type[RuleBasedStateMachine]:
    """A state machine for request-level slot allocators (``MambaSlotAllocator``-like)."""

    class SlotMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.a = factory()
            self.capacity = int(self.a.available_size())
            self.live: list[int] = []

        def _take(self, out: Any) -> None:
            slots = _as_list(out)
            assert all(s >= 1 for s in slots), f"slot 0 handed out: {slots}"
            assert not set(slots) & set(self.live), "slot handed out twice"
            assert len(set(slots)) == len(slots)
            self.live.extend(slots)

        @rule(n=st.integers(0, 5))
        def alloc(self, n: int) -> None:
            before = self.a.available_size()
            out = self.a.alloc(n)
            if out is None:
                assert n > before and self.a.available_size() == before
                return
            assert len(out) == n
            self._take(out)

        @rule(num=st.integers(0, 5), used=st.integers(0, 6))
        def group(self, num: int, used: int) -> None:
            self.a.alloc_group_begin(num)
            for _ in range(used):
                out = self.a.alloc(1)
                if out is None:
                    break
                self._take(out)
            self.a.alloc_group_end()

        @precondition(lambda self: bool(self.live))
        @rule(data=st.data())
        def free(self, data: st.DataObject) -> None:
            k = data.draw(st.integers(1, len(self.live)))
            slots, self.live = self.live[:k], self.live[k:]
            self.a.free(torch.tensor(slots, dtype=torch.int64))

        @rule()
        def backup_restore(self) -> None:
            state = self.a.backup_state()
            before = self.a.available_size()
            self.a.alloc(1)
            self.a.restore_state(state)
            assert self.a.available_size() == before

        @invariant()
        def conservation(self) -> None:
            assert self.a.available_size() + len(self.live) == self.capacity

    SlotMachine.__name__ = SlotMachine.__qualname__ = "SlotMachine"
    return SlotMachine
