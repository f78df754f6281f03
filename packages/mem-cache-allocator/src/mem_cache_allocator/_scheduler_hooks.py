"""Scheduler-facing capacity arithmetic shared by the HiSparse allocators (private).

SGLang 0.5.23's scheduler asks the allocator, not its own type switches, how much to hold back
per request and what each side's capacity is. The functions here are pure host-side arithmetic.
"""

from __future__ import annotations

from mem_cache_kernels.checks import check_int

__all__ = ["capacity_pair", "request_slot_reserve"]


def _non_negative(name: str, value: object) -> int:
    return check_int(name, value, minimum=0)


def request_slot_reserve(num_reqs: int, page_size: int, spec_scratch_tokens: int) -> int:
    """Tokens to keep free for ``num_reqs`` requests: a page each (any request may open a new
    page) plus its speculative scratch (``spec_scratch_tokens``) rounded up to whole pages.

    Example: page size 16, 3 draft tokens, 2 requests -> ``2 * (16 + 16) = 64``.
    """
    n = _non_negative("num_reqs", num_reqs)
    scratch_pages = -(-spec_scratch_tokens // page_size)
    return n * (1 + scratch_pages) * page_size


def capacity_pair(
    full: tuple[int, int], swa: tuple[int, int], full_capacity: int | None, swa_capacity: int | None
) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((full capacity, full available), (swa capacity, swa available))``.

    The hint arguments are what a scheduler last priced each side at; for pools whose sides own
    their buffers (every pool here) the allocator's own capacity wins, as in SGLang, so they
    are validated and otherwise ignored.
    """
    for name, hint in (("full_capacity", full_capacity), ("swa_capacity", swa_capacity)):
        if hint is not None:
            _non_negative(name, hint)
    return full, swa
