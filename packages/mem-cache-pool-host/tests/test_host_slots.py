"""Host slot allocator: whole pages, CPU int64, None on shortage, strict frees, conservation."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mem_cache_pool_host import HostSlotAllocator


def test_alloc_returns_whole_pages_on_cpu() -> None:
    a = HostSlotAllocator(num_pages=4, page_size=4)
    s = a.alloc(8)
    assert s is not None and s.dtype == torch.int64 and s.device.type == "cpu"
    assert s.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]  # page 0 is usable on the host
    assert a.available_size() == 8
    assert a.alloc(12) is None and a.available_size() == 8  # shortage: no state change
    with pytest.raises(ValueError, match="multiple of page_size=4"):
        a.alloc(3)
    with pytest.raises(ValueError, match="need_size must be >= 0, got -4"):
        a.alloc(-4)
    e = a.alloc(0)
    assert e is not None and e.numel() == 0


def test_free_rejects_double_free_and_never_allocated_pages() -> None:
    a = HostSlotAllocator(num_pages=4, page_size=2)
    s = a.alloc(4)
    assert s is not None
    assert a.free(s) == 4
    with pytest.raises(ValueError, match="double free or never allocated"):
        a.free(s)
    with pytest.raises(ValueError, match="double free or never allocated"):
        a.free(torch.tensor([6, 7]))
    assert a.available_size() == 8


@pytest.mark.parametrize(
    ("indices", "match"),
    [
        (torch.tensor([1, 2]), "whole pages"),
        (torch.tensor([0, 2]), "whole pages"),
        (torch.tensor([0]), "multiple of page_size"),
        (torch.tensor([0, 1, 0, 1]), "same page more than once"),
        (torch.tensor([8, 9]), r"\[0, 8\)"),
        (torch.tensor([0.0, 1.0]), "int32 or int64"),
        (torch.tensor([[0, 1]]), "1-D"),
        (torch.tensor([0, 1], device="meta"), "indices must be a tensor with data .* meta"),
    ],
)
def test_free_rejects_malformed_indices_and_frees_nothing(
    indices: torch.Tensor, match: str
) -> None:
    a = HostSlotAllocator(num_pages=4, page_size=2)
    assert a.alloc(8) is not None
    error = TypeError if indices.dtype.is_floating_point else ValueError
    with pytest.raises(error, match=match):
        a.free(indices)
    assert a.available_size() == 0


def test_freed_pages_are_reused_in_ascending_order() -> None:
    # a deliberate deviation (README): SGLang 0.5.23 reuses freed slots in free order
    a = HostSlotAllocator(num_pages=6, page_size=1)
    s = a.alloc(6)
    assert s is not None
    a.free(torch.tensor([5, 1]))
    a.free(torch.tensor([3]))
    again = a.alloc(3)
    assert again is not None and again.tolist() == [1, 3, 5]


def test_clear_returns_everything() -> None:
    a = HostSlotAllocator(num_pages=3, page_size=4)
    assert a.alloc(8) is not None
    a.clear()
    assert a.available_size() == 12
    s = a.alloc(12)
    assert s is not None and sorted(s.tolist()) == list(range(12))


class SlotMachine(RuleBasedStateMachine):
    """Owned + free pages always partition the pool; allocations never overlap."""

    def __init__(self) -> None:
        super().__init__()
        self.ps = 4
        self.a = HostSlotAllocator(num_pages=8, page_size=self.ps)
        self.owned: list[torch.Tensor] = []

    @rule(pages=st.integers(0, 5))
    def alloc(self, pages: int) -> None:
        before = self.a.available_size()
        s = self.a.alloc(pages * self.ps)
        if s is None:
            assert pages * self.ps > before and self.a.available_size() == before
        else:
            assert s.numel() == pages * self.ps
            self.owned.append(s)

    @precondition(lambda self: bool(self.owned))
    @rule(i=st.integers(0, 100), double=st.booleans())
    def free(self, i: int, double: bool) -> None:
        s = self.owned.pop(i % len(self.owned))
        assert self.a.free(s) == s.numel()
        if double and s.numel():
            with pytest.raises(ValueError):
                self.a.free(s)

    @invariant()
    def conservation(self) -> None:
        held = torch.cat([torch.empty(0, dtype=torch.int64), *self.owned])
        assert torch.unique(held).numel() == held.numel()
        assert held.numel() + self.a.available_size() == self.a.size


TestHostSlotMachine = SlotMachine.TestCase
TestHostSlotMachine.settings = settings(max_examples=30, stateful_step_count=20, deadline=None)


# ------------------------------------------------ pages_of: the few-pages path = the tensor path
def _pages_both_ways(a: HostSlotAllocator, idx: torch.Tensor) -> tuple[object, object]:
    """``pages_of`` through the Python-int path (few slots), and through the tensor checks,
    both of a few pages (their first slots as ints) and of many (all tensor ops), which must
    agree: a list of page ids, or the error's type and message."""
    import mem_cache_pool_host.slots as slots_mod

    out: list[object] = []
    for small, few in ((slots_mod._SMALL, slots_mod._FEW_PAGES), (0, slots_mod._FEW_PAGES),
                       (0, 0)):
        saved = slots_mod._SMALL, slots_mod._FEW_PAGES
        slots_mod._SMALL, slots_mod._FEW_PAGES = small, few
        try:
            out.append(a.pages_of(idx).tolist())
        except ValueError as e:
            out.append((type(e), str(e)))
        finally:
            slots_mod._SMALL, slots_mod._FEW_PAGES = saved
    assert out[1] == out[2], ("few pages", out[1], "tensor ops", out[2])
    return out[0], out[1]


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_pages_of_few_pages_path_equals_the_tensor_checks(page_size: int) -> None:
    a = HostSlotAllocator(8, page_size)
    size = 8 * page_size
    gen = torch.Generator().manual_seed(page_size)
    cases = [torch.arange(0, size), torch.arange(size - page_size, size)]
    for _ in range(300):
        pages = torch.randint(0, 9, (int(torch.randint(1, 4, (1,), generator=gen)),),
                              generator=gen)
        idx = (pages[:, None] * page_size + torch.arange(page_size)).reshape(-1)
        kind = int(torch.randint(0, 5, (1,), generator=gen))
        if kind == 1:  # shift by one slot: not page-aligned
            idx = idx + 1
        elif kind == 2 and idx.numel() > 1:  # two slots swapped: not ascending
            idx[[0, 1]] = idx[[1, 0]]
        elif kind == 3:  # negative
            idx = idx - size
        cases.append(idx)
    accepted = 0
    for idx in cases:
        for dtype in (torch.int64, torch.int32):
            fast, slow = _pages_both_ways(a, idx.to(dtype))
            assert fast == slow, (idx.tolist(), fast, slow)
            accepted += isinstance(fast, list)
    assert 0 < accepted < 2 * len(cases)  # both outcomes were exercised
