"""The conformance kit (mem_cache_allocator.testing) run against every allocator class."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from mem_cache_allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from mem_cache_allocator.hisparse import HiSparseTokenToKVPoolAllocator
from mem_cache_allocator.mamba import MambaSlotAllocator
from mem_cache_allocator.swa import SWATokenToKVPoolAllocator
from mem_cache_allocator.testing import allocator_state_machine, slot_allocator_state_machine

F16 = torch.float16
SETTINGS = settings(
    max_examples=20,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

FACTORIES: dict[str, tuple[Callable[[], Any], bool]] = {
    "token": (lambda: TokenToKVPoolAllocator(48, F16, "cpu", None), True),
    "token-sort": (lambda: TokenToKVPoolAllocator(48, F16, "cpu", None, True), True),
    "token-debug": (lambda: TokenToKVPoolAllocator(48, F16, "cpu", None, debug=True), True),
    "paged1": (lambda: PagedTokenToKVPoolAllocator(40, 1, F16, "cpu", None), True),
    "paged4": (lambda: PagedTokenToKVPoolAllocator(96, 4, F16, "cpu", None), True),
    "paged4-sort": (lambda: PagedTokenToKVPoolAllocator(96, 4, F16, "cpu", None, True), True),
    "paged4-debug": (
        lambda: PagedTokenToKVPoolAllocator(96, 4, F16, "cpu", None, debug=True),
        True,
    ),
    "paged8-odd-size": (lambda: PagedTokenToKVPoolAllocator(100, 8, F16, "cpu", None), True),
    "swa1": (lambda: SWATokenToKVPoolAllocator(48, 40, 1, F16, "cpu", None), True),
    "swa4": (lambda: SWATokenToKVPoolAllocator(96, 64, 4, F16, "cpu", None, debug=True), True),
    "hisparse4": (
        lambda: HiSparseTokenToKVPoolAllocator(64, 4, F16, "cpu", None, debug=True),
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_alloc_conformance(name: str) -> None:
    factory, decode = FACTORIES[name]
    machine = allocator_state_machine(factory, decode=decode)
    run_state_machine_as_test(machine, settings=SETTINGS)


def test_alloc_conformance_mamba() -> None:
    machine = slot_allocator_state_machine(lambda: MambaSlotAllocator(12, "cpu", debug=True))
    run_state_machine_as_test(machine, settings=SETTINGS)


class _LeakyFree(PagedTokenToKVPoolAllocator):
    """A broken allocator: free drops the last page of every free (a leak)."""

    def free(self, free_index: torch.Tensor) -> None:
        super().free(
            free_index[: -self.page_size] if free_index.numel() > self.page_size else free_index
        )


class _DoubleHand(TokenToKVPoolAllocator):
    """A broken allocator: alloc hands out slot 1 again and again."""

    def alloc(self, need_size: int) -> torch.Tensor | None:
        out = super().alloc(need_size)
        if out is not None and out.numel():
            out[0] = 1
        return out


class _StrideFree(PagedTokenToKVPoolAllocator):
    """A broken allocator: the earlier stride-based ``free`` (pages ``free_index[::ps] // ps``,
    sorted), right only for page-aligned runs: shuffled or concatenated frees release a page
    twice and leak another."""

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel():
            pages = free_index.to(torch.int64)[:: self.page_size] // self.page_size
            self.free_page_ids(torch.sort(pages).values)


@pytest.mark.parametrize(
    "factory",
    [
        lambda: _LeakyFree(96, 4, F16, "cpu", None),
        lambda: _DoubleHand(48, F16, "cpu", None),
        lambda: _StrideFree(96, 4, F16, "cpu", None),
    ],
    ids=["leaky-free", "double-hand-out", "stride-free"],
)
def test_alloc_conformance_kit_catches_broken_allocators(factory: Callable[[], Any]) -> None:
    machine = allocator_state_machine(factory)
    # The kit reports a broken allocator as an AssertionError; the stride-based free may instead
    # trip our own default-mode double-free count check (a ValueError) on a free the kit made
    # legally: a conforming allocator raises neither.
    with pytest.raises((AssertionError, ValueError)):
        run_state_machine_as_test(
            machine,
            settings=settings(
                SETTINGS,
                max_examples=60,
                stateful_step_count=25,
                report_multiple_bugs=False,
                phases=(Phase.explicit, Phase.generate),
            ),
        )
