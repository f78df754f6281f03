"""Allocation edge cases (no new page, empty free list) and the host-side hint keywords.

Regression: a simulator run hit ``RuntimeError: output with shape [1] doesn't match the broadcast
shape [0]`` in the torch ``alloc_decode`` for a batch where no request needs a new page and the
allocator passes an empty ``free_pages``. Every path of the reference (per-request and vectorised,
with and without the page-count hint) must handle such batches.
"""

from __future__ import annotations

import pytest
import torch

import mem_cache_kernels as mk
from mem_cache_kernels._torch import alloc as ref_alloc

I64 = torch.int64
EMPTY = torch.empty(0, dtype=I64)
# (extend threshold, decode threshold, list slots): force the per-request paths (extend
# output from a Python array, then through numpy), then the vectorised ones
PATHS = [
    pytest.param((10**9, 10**9, 10**9), id="small"),
    pytest.param((10**9, 10**9, -1), id="small-numpy"),
    pytest.param((-1, -1, 10**9), id="vectorised"),
]


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    small, small_decode, list_slots = request.param
    monkeypatch.setattr(ref_alloc, "SMALL", small)
    monkeypatch.setattr(ref_alloc, "SMALL_DECODE", small_decode)
    monkeypatch.setattr(ref_alloc, "LIST_SLOTS", list_slots)
    return str(request.node.callspec.id)


def _t(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=I64)


@pytest.mark.parametrize("hint", [False, True])
@pytest.mark.parametrize("ps", [16, 64])
@pytest.mark.parametrize("bs", [1, 3, 300])
def test_decode_without_new_pages_and_empty_free_list(
    path: str, ps: int, bs: int, hint: bool
) -> None:
    # every request is inside its page: position (seq - 1) % ps == 5
    seq = torch.full((bs,), 3 * ps + 6, dtype=I64)
    last = (torch.arange(bs) + 10) * ps + 4
    out = torch.full((bs,), -1, dtype=I64)
    mk.alloc_decode(seq, last, EMPTY, out, ps, num_new_pages=0 if hint else None)
    assert torch.equal(out, last + 1)


@pytest.mark.parametrize("hint", [False, True])
@pytest.mark.parametrize("ps", [1, 16, 64])
def test_decode_every_request_starts_a_page(path: str, ps: int, hint: bool) -> None:
    bs = 7
    seq = torch.full((bs,), 2 * ps + 1, dtype=I64)
    last = torch.full((bs,), 5 * ps - 1, dtype=I64)  # unused: all take a page
    free = torch.arange(100, 100 + bs, dtype=torch.int32)
    out = torch.empty(bs, dtype=I64)
    mk.alloc_decode(seq, last, free, out, ps, num_new_pages=bs if hint else None)
    assert torch.equal(out, free.to(I64) * ps)


@pytest.mark.parametrize("ps", [1, 16, 64])
def test_decode_empty_batch(path: str, ps: int) -> None:
    # an empty batch takes no page and writes nothing, with an empty or a non-empty free list
    for free in (EMPTY, torch.arange(7, 10, dtype=torch.int32)):
        before = free.clone()
        for hint in (None, 0):
            out = torch.empty(0, dtype=I64)
            assert mk.alloc_decode(EMPTY, EMPTY, free, out, ps, num_new_pages=hint) is None
            assert out.shape == (0,) and out.dtype == I64
            assert torch.equal(free, before) and free.dtype == before.dtype
    assert EMPTY.shape == (0,)


@pytest.mark.parametrize("hint", [False, True])
@pytest.mark.parametrize("ps", [1, 16, 64])
@pytest.mark.parametrize("bs", [1, 20])
def test_extend_without_new_pages_and_empty_free_list(
    path: str, ps: int, bs: int, hint: bool
) -> None:
    # each request fills only the rest of its current page (or nothing at all)
    pre = torch.tensor([(i % 3) * ps + (1 if ps > 1 else 0) for i in range(bs)], dtype=I64)
    ext = torch.tensor([0 if ps == 1 else i % (ps - 1) for i in range(bs)], dtype=I64)
    seq = pre + ext
    last = torch.where(pre > 0, (torch.arange(bs) + 50) * ps + (pre - 1) % ps, -1)
    n = int(ext.sum())
    out = torch.full((n,), -1, dtype=I64)
    kw = {"num_new_pages": 0, "num_tokens": n} if hint else {}
    mk.alloc_extend(pre, seq, last, EMPTY, out, ps, **kw)
    expected = [
        s for i in range(bs) for s in range(int(last[i]) + 1, int(last[i]) + 1 + int(ext[i]))
    ]
    assert out.tolist() == expected


@pytest.mark.parametrize("ps", [1, 16, 64])
def test_extend_hints_give_the_same_slots(path: str, ps: int) -> None:
    pre = _t(0, 2 * ps, ps + 1 if ps > 1 else 3, 0)
    seq = pre + _t(3 * ps + 1, ps, 2 * ps, 1)
    last = torch.where(pre > 0, (torch.arange(4) + 50) * ps + (pre - 1) % ps, -1)
    pages = int(((seq + ps - 1) // ps - (pre + ps - 1) // ps).sum())
    free = torch.randperm(pages + 3, generator=torch.Generator().manual_seed(ps)) + 1
    n = int((seq - pre).sum())
    plain = torch.empty(n, dtype=I64)
    hinted = torch.empty(n, dtype=I64)
    mk.alloc_extend(pre, seq, last, free, plain, ps)
    mk.alloc_extend(pre, seq, last, free, hinted, ps, num_new_pages=pages, num_tokens=n)
    assert torch.equal(plain, hinted)
    # the reference doc's worked example, hinted
    out = torch.empty(9, dtype=I64)
    mk.alloc_extend(_t(2), _t(11), _t(1), _t(3, 4), out, 4, num_new_pages=2, num_tokens=9)
    assert out.tolist() == [2, 3, 12, 13, 14, 15, 16, 17, 18]


def test_wrong_hints_raise_value_errors_naming_them() -> None:
    pre, seq, last = _t(0), _t(20), _t(-1)  # page size 16: 2 pages, 20 tokens
    free = _t(5, 6, 7)
    out = torch.full((20,), -3, dtype=I64)
    with pytest.raises(ValueError, match="num_tokens"):
        mk.alloc_extend(pre, seq, last, free, out, 16, num_new_pages=2, num_tokens=19)
    with pytest.raises(ValueError, match="free_pages"):
        mk.alloc_extend(pre, seq, last, free, out, 16, num_new_pages=4)
    with pytest.raises(ValueError, match="num_new_pages"):
        mk.alloc_extend(pre, seq, last, free, out, 16, num_new_pages=-1)
    with pytest.raises(TypeError, match="num_new_pages"):
        mk.alloc_extend(pre, seq, last, free, out, 16, num_new_pages=2.0)  # type: ignore[arg-type]
    for wrong in (1, 3):  # the per-request CPU path verifies the count for free
        with pytest.raises(ValueError, match="num_new_pages must be 2"):
            mk.alloc_extend(pre, seq, last, free, out, 16, num_new_pages=wrong)
    assert bool((out == -3).all())  # failed calls wrote nothing
    dseq, dlast = _t(17, 5, 33), _t(-1, 40, -1)  # requests 0 and 2 start a page
    dout = torch.full((3,), -3, dtype=I64)
    with pytest.raises(ValueError, match="num_new_pages"):
        mk.alloc_decode(dseq, dlast, free, dout, 16, num_new_pages=4)  # > bs
    with pytest.raises(ValueError, match="num_new_pages must be 3 for page size 1"):
        mk.alloc_decode(dseq, dlast, free, dout, 1, num_new_pages=2)
    with pytest.raises(ValueError, match="free_pages"):
        mk.alloc_decode(dseq, dlast, free[:1], dout, 16, num_new_pages=2)
    assert bool((dout == -3).all())


def test_decode_hint_too_small_raises_on_the_vectorised_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ref_alloc, "SMALL_DECODE", -1)
    dseq, dlast = _t(17, 5, 33), _t(-1, 40, -1)
    out = torch.empty(3, dtype=I64)
    with pytest.raises(ValueError, match="num_new_pages"):
        mk.alloc_decode(dseq, dlast, _t(5, 6, 7), out, 16, num_new_pages=1)
    # a larger hint would make the caller drop pages it never used: on CPU it raises too
    out.fill_(-3)
    with pytest.raises(ValueError, match=r"num_new_pages must be 2 .* got 3"):
        mk.alloc_decode(dseq, dlast, _t(5, 6, 7), out, 16, num_new_pages=3)
    assert bool((out == -3).all())  # nothing written before the error
    mk.alloc_decode(dseq, dlast, _t(5, 6, 7), out, 16, num_new_pages=2)
    assert out.tolist() == [80, 41, 96]


@pytest.mark.triton
@pytest.mark.usefixtures("triton_interpret")
@pytest.mark.parametrize("ps", [1, 16])
def test_triton_matches_vectorised_reference_with_hints(ps: int) -> None:
    """Batches above the per-request thresholds, hinted: Triton == the vectorised reference."""
    gen = torch.Generator().manual_seed(ps)
    bs = max(ref_alloc.SMALL, ref_alloc.SMALL_DECODE) + 3
    pre = torch.randint(0, 2 * ps + 2, (bs,), generator=gen)
    seq = pre + torch.randint(0, ps + 3, (bs,), generator=gen)
    last = torch.where(pre > 0, (torch.arange(bs) + 100) * ps + (pre - 1) % ps, -1)
    pages = int(((seq + ps - 1) // ps - (pre + ps - 1) // ps).sum())
    free = torch.randperm(pages + bs + 2, generator=gen) + 1000
    n = int((seq - pre).sum())
    outs = []
    for backend in ("torch", "triton"):
        out = torch.full((n,), -9, dtype=I64)
        mk.alloc_extend(pre, seq, last, free, out, ps, num_new_pages=pages, num_tokens=n,
                        backend=backend)  # fmt: skip
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    dseq = seq + 1
    dlast = torch.where(seq > 0, (torch.arange(bs) + 300) * ps + (seq - 1) % ps, -1)
    starts = int(((dseq - 1) % ps == 0).sum())
    douts = []
    for backend in ("torch", "triton"):
        out = torch.full((bs,), -9, dtype=I64)
        mk.alloc_decode(dseq, dlast, free, out, ps, num_new_pages=starts, backend=backend)
        douts.append(out)
    assert torch.equal(douts[0], douts[1])
