"""Allocation invariants (hypothesis): position congruence, page consumption order, no reuse."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mem_cache_kernels as mk
from mem_cache_kernels._torch import alloc as ref_alloc


@st.composite
def _batches(draw: st.DrawFn) -> tuple[list[int], list[int], int]:
    ps = draw(st.sampled_from([1, 2, 4, 16]))
    bs = draw(st.integers(1, 6))
    pre = draw(st.lists(st.integers(0, 3 * ps), min_size=bs, max_size=bs))
    ext = draw(st.lists(st.integers(0, 3 * ps + 1), min_size=bs, max_size=bs))
    return pre, [p + e for p, e in zip(pre, ext)], ps


@settings(max_examples=60, deadline=None)
@given(_batches())
def test_extend_invariants(batch: tuple[list[int], list[int], int]) -> None:
    pre, seq, ps = batch
    bs = len(pre)
    # request i's prefix occupies page 500 + i
    last = [(500 + i) * ps + (p - 1) % ps if p else -1 for i, p in enumerate(pre)]
    need = [-(-s // ps) - (-(-p // ps)) for p, s in zip(pre, seq)]
    free = list(range(1000, 1000 + sum(need) + 3))[::-1]  # descending: order is observable
    out = torch.empty(sum(s - p for p, s in zip(pre, seq)), dtype=torch.int64)
    mk.alloc_extend(
        torch.tensor(pre), torch.tensor(seq), torch.tensor(last), torch.tensor(free), out, ps
    )
    slots = out.tolist()
    assert len(set(slots)) == len(slots)  # no slot handed out twice
    k = 0
    used_pages: list[int] = []
    for i in range(bs):
        for j in range(pre[i], seq[i]):
            slot = slots[k]
            k += 1
            assert slot % ps == j % ps  # position congruence
            if j < -(-pre[i] // ps) * ps:
                assert slot == last[i] + 1 + (j - pre[i])  # fills the current partial page
            elif slot // ps not in used_pages:
                used_pages.append(slot // ps)
    assert used_pages == free[: sum(need)]  # pages consumed from the front, in request order
    assert k == len(slots) and bs == len(need)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=12), st.sampled_from([1, 4, 8]))
def test_decode_invariants(seq: list[int], ps: int) -> None:
    last = [9 * ps * (i + 1) + (s - 2) % ps if s > 1 else -1 for i, s in enumerate(seq)]
    free = list(range(3000, 3000 + len(seq)))[::-1]
    out = torch.empty(len(seq), dtype=torch.int64)
    mk.alloc_decode(torch.tensor(seq), torch.tensor(last), torch.tensor(free), out, ps)
    new_pages = [s // ps for s, q in zip(out.tolist(), seq) if (q - 1) % ps == 0]
    assert new_pages == free[: len(new_pages)]
    for slot, q in zip(out.tolist(), seq):
        assert slot % ps == (q - 1) % ps


@settings(max_examples=40, deadline=None)
@given(_batches(), st.sampled_from([torch.int32, torch.int64]))
def test_list_and_vectorised_paths_agree(
    batch: tuple[list[int], list[int], int], idx: torch.dtype
) -> None:
    """The small-batch per-request paths and the vectorised paths of the reference agree."""
    pre, seq, ps = batch
    last = [(40 + i) * ps + (p - 1) % ps if p else -1 for i, p in enumerate(pre)]
    need = sum(-(-s // ps) - (-(-p // ps)) for p, s in zip(pre, seq))
    free = torch.randperm(need + len(seq) + 2).to(idx) + 1
    args = [torch.tensor(x, dtype=idx) for x in (pre, seq, last)]
    n = sum(s - p for p, s in zip(pre, seq))
    outs = []
    # the per-request path writing from a Python array, then through numpy, then vectorised
    for small, list_slots in ((10**9, 10**9), (10**9, -1), (-1, 10**9)):
        out = torch.full((n,), -5, dtype=torch.int64)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ref_alloc, "SMALL", small)
            mp.setattr(ref_alloc, "LIST_SLOTS", list_slots)
            ref_alloc.alloc_extend(*args, free, out, ps)
        outs.append(out)
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[2])
    seq_d = [s + 1 for s in seq]
    dec = []
    for small in (10**9, -1):
        out = torch.full((len(seq),), -5, dtype=torch.int64)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ref_alloc, "SMALL_DECODE", small)
            ref_alloc.alloc_decode(torch.tensor(seq_d, dtype=idx), args[2], free, out, ps)
        dec.append(out)
    # the vectorised decode with the page count (masked scatter) gives the same slots too
    out = torch.full((len(seq),), -5, dtype=torch.int64)
    starts = sum(1 for s in seq_d if (s - 1) % ps == 0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ref_alloc, "SMALL_DECODE", -1)
        ref_alloc.alloc_decode(
            torch.tensor(seq_d, dtype=idx), args[2], free, out, ps, num_new_pages=starts
        )
    dec.append(out)
    assert torch.equal(dec[0], dec[1]) and torch.equal(dec[0], dec[2])
