"""Allocation and request-table kernels: Triton (interpreter) vs the torch reference, bit-exact."""

from __future__ import annotations

import pytest
import torch

import mem_cache_kernels as mk

pytestmark = [pytest.mark.triton, pytest.mark.usefixtures("triton_interpret")]


def _batch(bs: int, ps: int, idx: torch.dtype, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A random extend batch with consistent last_loc and a shuffled free list."""
    pre = torch.randint(0, 3 * ps + 2, (bs,), generator=gen)
    pre[0] = 0  # always one empty prefix
    seq = pre + torch.randint(0, 2 * ps + 3, (bs,), generator=gen)
    # the prefix of request i lives in page 100 + i (slot = page * ps + position % ps)
    last = torch.where(pre > 0, (100 + torch.arange(bs)) * ps + (pre - 1) % ps, -1)
    need = int(((seq + ps - 1) // ps - (pre + ps - 1) // ps).sum())
    free = torch.randperm(need + 5, generator=gen) + 1000
    return {
        "prefix_lens": pre.to(idx),
        "seq_lens": seq.to(idx),
        "last_loc": last.to(idx),
        "free_pages": free.to(idx),
    }


@pytest.mark.parametrize("idx", [torch.int32, torch.int64])
@pytest.mark.parametrize(("bs", "ps"), [(1, 1), (5, 1), (3, 16), (7, 64), (2, 4)])
def test_alloc_extend_matches_reference(bs: int, ps: int, idx: torch.dtype) -> None:
    b = _batch(bs, ps, idx, torch.Generator().manual_seed(bs * 100 + ps))
    total = int((b["seq_lens"].long() - b["prefix_lens"].long()).sum())
    out_ref = torch.full((total,), -9, dtype=torch.int64)
    out_tri = out_ref.clone()
    mk.alloc_extend(**b, out=out_ref, page_size=ps, backend="torch")
    mk.alloc_extend(**b, out=out_tri, page_size=ps, backend="triton")
    assert torch.equal(out_tri, out_ref)
    assert not bool((out_ref == -9).any())


def test_alloc_extend_doc_example_on_triton() -> None:
    out = torch.empty(17, dtype=torch.int64)
    mk.alloc_extend(
        torch.tensor([2, 0]),
        torch.tensor([11, 8]),
        torch.tensor([1, -1]),
        torch.tensor([3, 4, 5, 6]),
        out,
        4,
        backend="triton",
    )
    assert out.tolist() == [2, 3, 12, 13, 14, 15, 16, 17, 18, *range(20, 28)]


@pytest.mark.parametrize("idx", [torch.int32, torch.int64])
@pytest.mark.parametrize(("bs", "ps"), [(1, 1), (7, 16), (13, 64), (150, 4)])
def test_alloc_decode_matches_reference(bs: int, ps: int, idx: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(bs + ps)
    seq = torch.randint(1, 4 * ps + 2, (bs,), generator=gen)
    last = torch.where(seq > 1, 7 * ps + (seq - 2) % ps, -1)
    free = (torch.randperm(bs + 3, generator=gen) + 50).to(idx)
    outs = [torch.full((bs,), -9, dtype=torch.int64) for _ in range(2)]
    for out, backend in zip(outs, ("torch", "triton")):
        mk.alloc_decode(seq.to(idx), last.to(idx), free, out, ps, backend=backend)  # type: ignore[arg-type]
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("idx", [torch.int32, torch.int64])
def test_req_table_matches_reference(idx: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    bs, max_len = 5, 37
    rows = torch.randperm(9, generator=gen)[:bs].to(idx)
    pre = torch.randint(0, 12, (bs,), generator=gen)
    seq = pre + torch.randint(0, 25, (bs,), generator=gen)
    new = torch.randint(0, 10**6, (int((seq - pre).sum()),), generator=gen).to(idx)
    prefix = torch.randint(0, 10**6, (int(pre.sum()),), generator=gen)
    tables = [torch.randint(0, 50, (9, max_len), generator=gen, dtype=torch.int32)] * 2
    tables = [tables[0].clone(), tables[0].clone()]
    for table, backend in zip(tables, ("torch", "triton")):
        mk.write_req_to_token(
            table,
            rows,
            pre.to(idx),
            seq.to(idx),
            new,
            prefix_slots=prefix,
            backend=backend,  # type: ignore[arg-type]
        )
    assert torch.equal(tables[0], tables[1])
    mk.write_req_to_token(tables[1], rows, pre, seq, new, backend="triton")  # no prefix slots
    assert torch.equal(tables[0], tables[1])
    lasts = [mk.get_last_loc(tables[0], rows, pre.to(idx), backend=b) for b in ("torch", "triton")]  # type: ignore[arg-type]
    assert torch.equal(lasts[0], lasts[1]) and lasts[1].dtype == torch.int64
