"""Conformance kit for the HiSparse allocators (``mem_cache_allocator.testing`` re-exports it).

:func:`hisparse_state_machine` drives ``HiSparseTokenToKVPoolAllocator`` and
``DeepSeekV4HiSparseTokenToKVPoolAllocator`` (or an engine's class with the same surface) the
way SGLang 0.5.23's scheduler and HiSparse coordinator do -- ``alloc_extend`` (new requests and
continuations, also right after logical-only decode tokens), ``alloc_decode`` (logical only),
``alloc_device_buffer`` (the request's logical slots, or its logical *compressed* slots when
``compress_ratio > 1``), ``free_hisparse`` / ``free_hisparse_indices`` / ``free`` (shuffled,
several requests concatenated, inside free groups) -- and the scheduler hooks
(``configure_spec_scratch``, ``request_slot_reserve``, ``get_last_loc_compressed``,
``swa_capacity_and_available`` and ``full_available_size`` where present). After every step:

* logical conservation: ``logical available + page_size x pages of live slots == capacity``;
* device conservation: ``device available + device page x pages holding a mapped slot or a
  buffer slot == device capacity`` (nothing leaks, nothing is freed twice);
* no device slot is mapped twice or both mapped and in a buffer; no buffer lists a slot twice;
  the padding page is never handed out on either side;
* ``available_size() == min(logical available, compress_ratio x device available)``.

This module imports ``hypothesis`` (install the ``testing`` extra).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

__all__ = ["hisparse_state_machine"]


def _ints(t: torch.Tensor) -> list[int]:
    out: list[int] = t.detach().cpu().tolist()
    return out


def hisparse_state_machine(
    factory: Callable[[], Any], *, max_batch: int = 2, max_extend: int = 40
) -> type[RuleBasedStateMachine]:
    """A state machine class for HiSparse allocators built by ``factory()``."""

    class HiSparseMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            a = factory()
            self.a = a
            self.ratio = int(getattr(a, "compress_ratio", 1))
            self.ps = int(a.page_size)
            self.logical = a.logical_attn_allocator
            self.dev = a.hisparse_attn_allocator
            self.dev_ps = int(self.dev.page_size)
            self.logical_capacity = int(self.logical.available_size())
            self.dev_capacity = int(self.dev.available_size())
            self.mapping: torch.Tensor = a.full_to_hisparse_device_index_mapping
            self.device = torch.device(getattr(a, "device", "cpu"))
            self.reqs: dict[int, list[int]] = {}
            self.buffers: dict[int, list[int]] = {}
            self.next_id = 0
            self.scratch = 0

        # ---------------------------------------------------------- helpers
        def _t(self, values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=self.device)

        def _live_logical(self) -> set[int]:
            return {s for slots in self.reqs.values() for s in slots}

        def _mapped(self) -> list[int]:
            return [v for v in _ints(self.mapping[:-1]) if v > 0]

        def _keys(self, slots: list[int]) -> list[int]:
            """What ``alloc_device_buffer`` takes for a request's logical slots."""
            if self.ratio == 1:
                return slots
            return [s // self.ratio for s in slots if (s + 1) % self.ratio == 0]

        # ---------------------------------------------------------- rules
        @rule(data=st.data())
        def extend(self, data: st.DataObject) -> None:
            bs = data.draw(st.integers(1, max_batch), label="bs")
            ids: list[int] = []
            for _ in range(bs):
                choices = [r for r in self.reqs if r not in ids and r not in self.buffers]
                cont: bool = data.draw(st.booleans(), label="continue")
                if choices and cont:
                    ids.append(data.draw(st.sampled_from(choices), label="req"))
                else:
                    ids.append(-1 - len(ids))
            ext = [data.draw(st.integers(1, max_extend), label="n") for _ in ids]
            pre = [len(self.reqs.get(r, [])) for r in ids]
            seq = [p + n for p, n in zip(pre, ext, strict=True)]
            last = [self.reqs[r][-1] if r >= 0 and self.reqs[r] else -1 for r in ids]
            before = (self.logical.available_size(), self.dev.available_size())
            mapped_before = self._mapped()
            out = self.a.alloc_extend(
                self._t(pre), torch.tensor(pre), self._t(seq), torch.tensor(seq),
                self._t(last), sum(ext),
            )  # fmt: skip
            if out is None:
                after = (self.logical.available_size(), self.dev.available_size())
                assert after == before, "a failed alloc_extend changed the capacities"
                assert self._mapped() == mapped_before, "a failed alloc_extend changed the mapping"
                return
            slots = _ints(out)
            assert len(slots) == sum(ext) and len(set(slots)) == len(slots)
            assert all(s >= self.ps for s in slots), f"padding page handed out: {slots}"
            assert not set(slots) & self._live_logical(), "logical slots handed out twice"
            new_dev = [int(v) for v in _ints(self.mapping[self._t(self._keys(slots))])]
            assert all(v >= self.dev_ps for v in new_dev), f"device padding slot: {new_dev}"
            off = 0
            for r, p, s in zip(ids, pre, seq, strict=True):
                mine = slots[off : off + s - p]
                off += s - p
                assert all(x % self.ps == (p + k) % self.ps for k, x in enumerate(mine))
                rid = r
                if r < 0:
                    rid, self.next_id = self.next_id, self.next_id + 1
                    self.reqs[rid] = []
                self.reqs[rid].extend(mine)

        @precondition(lambda self: any(self.reqs.values()))
        @rule(data=st.data())
        def decode(self, data: st.DataObject) -> None:
            ids = data.draw(
                st.lists(st.sampled_from(sorted(self.reqs)), min_size=1, max_size=3, unique=True)
            )
            seq = [len(self.reqs[r]) + 1 for r in ids]
            last = [self.reqs[r][-1] for r in ids]
            dev_before = self.dev.available_size()
            out = self.a.alloc_decode(self._t(seq), torch.tensor(seq), self._t(last))
            assert self.dev.available_size() == dev_before, "decode must be logical only"
            if out is None:
                return
            for r, slot in zip(ids, _ints(out), strict=True):
                assert slot >= self.ps and slot not in self._live_logical()
                self.reqs[r].append(slot)

        @precondition(lambda self: any(r not in self.buffers for r in self.reqs))
        @rule(data=st.data())
        def device_buffer(self, data: st.DataObject) -> None:
            rid = data.draw(st.sampled_from(sorted(r for r in self.reqs if r not in self.buffers)))
            need = self.dev_ps * data.draw(st.integers(1, 3), label="pages")
            keys = self._keys(self.reqs[rid])
            before = (self.dev.available_size(), self._mapped())
            out = self.a.alloc_device_buffer(self._t(keys), need)
            if out is None:
                assert (self.dev.available_size(), self._mapped()) == before
                return
            buf = _ints(out)
            assert len(buf) == need and len(set(buf)) == need, f"slot twice in a buffer: {buf}"
            assert all(v >= self.dev_ps for v in buf), f"padding slot in a buffer: {buf}"
            assert not set(buf) & set(self._mapped()), "buffer slots still mapped"
            for other in self.buffers.values():
                assert not set(buf) & set(other), "two buffers share a slot"
            if keys:
                assert not any(_ints(self.mapping[self._t(keys)])), "mapping not cleared"
            self.buffers[rid] = buf

        @precondition(lambda self: bool(self.reqs))
        @rule(data=st.data())
        def finish(self, data: st.DataObject) -> None:
            ids = data.draw(
                st.lists(st.sampled_from(sorted(self.reqs)), min_size=1, max_size=3, unique=True)
            )
            grouped = data.draw(st.booleans(), label="group")
            if grouped:
                self.a.free_group_begin()
            slots: list[int] = []
            for r in ids:
                mine = self.reqs.pop(r)
                if data.draw(st.booleans(), label="coordinator frees the device first"):
                    self.a.free_hisparse(self._t(mine))
                buf = self.buffers.pop(r, None)
                if buf is not None:
                    self.a.free_hisparse_indices(self._t(buf))
                slots += mine
            random.Random(data.draw(st.integers(0, 9))).shuffle(slots)
            if slots:
                self.a.free(self._t(slots))
            if grouped:
                self.a.free_group_end()

        @rule(n=st.integers(0, 4), k=st.integers(0, 40))
        def scheduler_hooks(self, n: int, k: int) -> None:
            cap, buf = k * self.ps, n * self.ps
            self.a.configure_spec_scratch(cap, device_buffer_size=buf)
            self.scratch = cap
            prefill = k + n
            paged = -(-prefill // self.ps) * self.ps
            want = (max((buf if cap else 0) - paged, 0), cap)
            got = self.a.request_slot_reserve(has_req_pool_slot=False, prefill_tokens=prefill)
            assert got == want[0] + want[1]
            got = self.a.request_slot_reserve(has_req_pool_slot=True, prefill_tokens=prefill)
            assert got == want[0]
            minus_one = self._t([-1])
            assert _ints(self.a.get_last_loc_compressed(minus_one)) == [-1]
            if self.ratio > 1:
                probe = self._t([self.ratio * 3 + self.ratio - 1])
                assert _ints(self.a.get_last_loc_compressed(probe)) == [3]
            if hasattr(self.a, "swa_capacity_and_available") and hasattr(
                self.logical, "swa_available_size"
            ):
                (fc, fa), (sc, sa) = self.a.swa_capacity_and_available()
                assert (fc, fa) == (self.a.size_full, self.a.full_available_size())
                assert (sc, sa) == (self.a.size_swa, self.a.swa_available_size())
                assert 0 <= fa <= fc and 0 <= sa <= sc

        # ---------------------------------------------------------- invariants
        @invariant()
        def logical_conservation(self) -> None:
            pages = {s // self.ps for s in self._live_logical()}
            avail = int(self.logical.available_size())
            assert avail + self.ps * len(pages) == self.logical_capacity, (
                f"logical available {avail} + {len(pages)} live pages != {self.logical_capacity}"
            )

        @invariant()
        def device_conservation(self) -> None:
            mapped = self._mapped()
            assert len(set(mapped)) == len(mapped), "a device slot is mapped twice"
            buffered = [s for b in self.buffers.values() for s in b]
            assert not set(mapped) & set(buffered), "a device slot is mapped and in a buffer"
            pages = {v // self.dev_ps for v in mapped + buffered}
            avail = int(self.dev.available_size())
            assert avail + self.dev_ps * len(pages) == self.dev_capacity, (
                f"device available {avail} + {len(pages)} used pages x {self.dev_ps} != "
                f"{self.dev_capacity}"
            )

        @invariant()
        def capacities(self) -> None:
            want = min(self.logical.available_size(), self.ratio * self.dev.available_size())
            assert self.a.available_size() == want
            if hasattr(self.a, "full_available_size"):
                inner = getattr(self.logical, "full_available_size", self.logical.available_size)
                assert self.a.full_available_size() == min(
                    inner(), self.ratio * self.dev.available_size()
                )

    HiSparseMachine.__name__ = HiSparseMachine.__qualname__ = "HiSparseMachine"
    return HiSparseMachine
