"""The chunked free list (front offset, write-once push_back arena) and the kernel hints."""

from __future__ import annotations

import random

import pytest
import torch

import mem_cache_kernels
from mem_cache_allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator, page_allocator
from mem_cache_allocator import _free_list as free_list_module
from mem_cache_allocator.page_allocator import ChunkedFreeList
from mem_cache_kernels import dispatch
from mem_cache_kernels.checks import SMALL_BATCH

CPU = torch.device("cpu")


def _ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


@pytest.mark.parametrize("merge_ahead", [1024, 2, 0])
def test_free_list_matches_a_python_deque_model(
    merge_ahead: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random pushes (front/back), takes, snapshots and restores against a list model; with a
    small MERGE_AHEAD most takes that span chunks split the last one (the arena's back chunk
    included, which later pushes still widen)."""
    monkeypatch.setattr(free_list_module, "MERGE_AHEAD", merge_ahead)
    rng = random.Random(7)
    fl = ChunkedFreeList(CPU, [_ids(*range(1, 40))], arena_size=64)  # small arena: switches
    model = list(range(1, 40))
    taken: list[tuple[torch.Tensor, list[int]]] = []  # results must never change later
    snaps: list[tuple[object, list[int]]] = []
    nxt = 1000
    for _ in range(600):
        op = rng.random()
        if op < 0.3:
            vals = list(range(nxt, nxt + rng.randint(1, 9)))
            nxt += len(vals)
            if len(vals) > 2 and rng.random() < 0.5:  # several parts in one write
                fl.extend_back([_ids(*vals[:2]), _ids(*vals[2:])])
            else:
                fl.push_back(_ids(*vals))
            model.extend(vals)
        elif op < 0.45:
            vals = list(range(nxt, nxt + rng.randint(1, 5)))
            nxt += len(vals)
            fl.push_front(_ids(*vals))
            model[:0] = vals
        elif op < 0.8:
            n = rng.randint(0, min(len(model), 12))
            out = fl.take(n)
            assert out.tolist() == model[:n]
            taken.append((out, model[:n]))
            del model[:n]
        elif op < 0.9:
            snaps.append((fl.snapshot(), list(model)))
        elif snaps:
            snap, saved = snaps[rng.randrange(len(snaps))]
            fl.restore(snap)  # type: ignore[arg-type]
            model = list(saved)
        assert len(fl) == len(model)
        assert fl.to_tensor().tolist() == model
    for out, values in taken:
        assert out.tolist() == values  # the arena is write-once: results stay intact


def test_token_allocator_takes_are_slices_after_frees() -> None:
    """Frees appended to the token allocator coalesce, so later allocations need no cat."""
    a = TokenToKVPoolAllocator(64, torch.float16, "cpu", None)
    x = a.alloc(60)
    assert x is not None
    for i in range(6):
        a.free(x[i * 10 : (i + 1) * 10])
    y = a.alloc(4)  # rest of the initial chunk
    assert y is not None and y.tolist() == [61, 62, 63, 64]
    assert a._free.num_chunks == 1  # the six frees became one chunk
    z = a.alloc(25)
    assert z is not None and z.tolist() == x[:25].tolist()
    held = z.clone()
    for _ in range(20):  # churn: later frees must not overwrite z's memory
        w = a.alloc(30)
        assert w is not None
        a.free(w)
    assert torch.equal(z, held)


def test_a_take_spanning_into_a_long_chunk_copies_only_what_it_needs() -> None:
    """A take that runs past the front chunk into a long one joins only the ids it needs (plus
    nothing of the long chunk's rest), and the rest stays the arena's back chunk: later frees
    still widen it rather than adding chunks."""
    fl = ChunkedFreeList(CPU, [_ids(1, 2, 3)], arena_size=1 << 14)
    for i in range(3000):  # one long back chunk in the arena
        fl.push_back(_ids(100 + i))
    assert fl.num_chunks == 2
    out = fl.take(5)
    assert out.tolist() == [1, 2, 3, 100, 101]
    assert fl.num_chunks == 1 and fl._chunks[0].shape[0] == 2998  # a view, not a copy
    fl.push_back(_ids(7))  # widens the back chunk
    assert fl.num_chunks == 1 and len(fl) == 2999
    assert fl.to_tensor()[-2:].tolist() == [3099, 7]


@pytest.mark.parametrize("ps", [16, 64])
def test_paged_allocator_passes_host_counts_to_the_kernels(
    ps: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The allocator runs the trusted kernel body (``dispatch.pick``), never the validating
    public op, with the page count it computed on the host."""
    calls: list[tuple[str, dict[str, object]]] = []
    real_pick = dispatch.pick  # not page_allocator.pick: a placeholder until first use

    def pick(op: str, backend: str, *tensors: torch.Tensor) -> object:
        impl = real_pick(op, backend, *tensors)

        def run(*args: object, **kw: object) -> None:
            calls.append((op, kw))
            impl(*args, **kw)

        return run  # not the torch body: the CPU decode goes through it too (as on a GPU)

    def public_op(*args: object, **kw: object) -> None:
        raise AssertionError("the allocator called the validating public kernel op")

    monkeypatch.setattr(page_allocator, "pick", pick)
    monkeypatch.setattr(mem_cache_kernels, "alloc_extend", public_op)
    monkeypatch.setattr(mem_cache_kernels, "alloc_decode", public_op)
    a = PagedTokenToKVPoolAllocator(64 * ps, ps, torch.float16, "cpu", None)
    pre, seq = _ids(0, 3), _ids(ps + 2, 3 + 2 * ps)
    out = a.alloc_extend(pre, pre, seq, seq, _ids(-1, 5 * ps + 2), 3 * ps + 2)
    assert out is not None
    assert calls[-1] == ("alloc_extend", {"num_new_pages": 4, "num_tokens": 3 * ps + 2})
    dseq = _ids(ps + 3, 2 * ps + 1, 1)  # requests 1 and 2 start a page
    dec = a.alloc_decode(dseq, dseq, _ids(int(out[ps + 1]), 7 * ps - 1, -1))
    assert dec is not None and dec[0] == out[ps + 1] + 1
    assert calls[-1] == ("alloc_decode", {"num_new_pages": 2})
    with pytest.raises(ValueError, match="num_new_pages"):
        a.alloc_extend(pre, pre, seq, seq, _ids(-1, 5 * ps + 2), 3 * ps + 2, num_new_pages=5)


@pytest.mark.parametrize("ps", [2, 16, 64])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_host_decode_equals_the_kernel(ps: int, dtype: torch.dtype) -> None:
    """The CPU allocators' host decode returns the kernel's slots, batch for batch."""
    g = torch.Generator().manual_seed(ps)
    for bs in (1, 3, 5, 40, 300):
        seq = torch.randint(1, 8 * ps, (bs,), generator=g)
        last = (torch.randint(1, 1000, (bs,), generator=g) * ps + (seq - 2) % ps).to(dtype)
        starts = (seq & (ps - 1)) == 1
        n = int(starts.sum())
        pages = torch.randperm(5000, generator=g)[:n] + 1
        want = torch.empty(bs, dtype=torch.int64)
        mem_cache_kernels.alloc_decode(seq, last, pages, want, ps, backend="torch")
        got = page_allocator.host_decode(last, starts.numpy(), pages, ps.bit_length() - 1)
        assert got.dtype == torch.int64 and torch.equal(got, want), (bs, ps)


@pytest.mark.parametrize("ps", [2, 16, 64])
def test_host_decode_small_equals_the_kernel(ps: int) -> None:
    """The list twin of a small CPU decode batch returns the kernel's slots."""
    g = torch.Generator().manual_seed(ps + 1)
    for bs in (1, 2, 7, 33, SMALL_BATCH):
        seq = torch.randint(1, 8 * ps, (bs,), generator=g)
        last = torch.randint(1, 1000, (bs,), generator=g) * ps + (seq - 2) % ps
        n = int(((seq & (ps - 1)) == 1).sum())
        pages = torch.randperm(5000, generator=g)[:n] + 1
        want = torch.empty(bs, dtype=torch.int64)
        mem_cache_kernels.alloc_decode(seq, last, pages, want, ps, backend="torch")
        need = [q & (ps - 1) == 1 for q in seq.tolist()]
        got = page_allocator.host_decode_small(last, need, pages, ps.bit_length() - 1)
        assert got.dtype == torch.int64 and torch.equal(got, want), (bs, ps)


@pytest.mark.parametrize("bs", [1, 40, 64, 65, 300])
def test_cpu_decode_batch_size_picks_the_twin_with_the_same_result(
    bs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CPU batch of at most SMALL_BATCH requests is planned on lists, a larger one in
    numpy; both hand out what the kernel would, and leave the same free list."""
    ps = 4
    calls: list[str] = []
    for twin in ("host_decode", "host_decode_small"):

        def spy(*args: object, _real: object = getattr(page_allocator, twin),
                _name: str = twin) -> torch.Tensor:
            calls.append(_name)
            return _real(*args)  # type: ignore[operator, no-any-return]

        monkeypatch.setattr(page_allocator, twin, spy)
    a = PagedTokenToKVPoolAllocator(ps * 2048, ps, torch.float16, "cpu", None)
    first = a.alloc(ps)  # binds the decode body
    assert first is not None
    assert a.alloc_decode(_ids(ps + 1), _ids(ps + 1), _ids(int(first[-1]))) is not None
    g = torch.Generator().manual_seed(bs)
    seq = torch.randint(1, 8 * ps, (bs,), generator=g)
    taken = a.alloc(ps * bs)
    assert taken is not None
    last = taken.view(bs, ps)[:, 0] + (seq - 2) % ps  # each request's own page
    state = a.backup_state()
    calls.clear()
    got = a.alloc_decode(seq, seq.to(torch.int32), last)
    assert calls == ["host_decode_small" if bs <= SMALL_BATCH
                     else "host_decode"]
    n = int(((seq & (ps - 1)) == 1).sum())
    a.restore_state(state)
    pages = a._free.head(n)
    want = torch.empty(bs, dtype=torch.int64)
    mem_cache_kernels.alloc_decode(seq, last, pages, want, ps, backend="torch")
    assert got is not None and torch.equal(got, want)
    assert a.alloc_decode(seq, seq, last) is not None
    assert a.available_size() == (2048 - 1 - 1 - bs - n) * ps


def test_cpu_decode_runs_on_the_host_unless_another_kernel_is_picked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CPU decode takes :func:`host_decode` when the torch body would run (backend ``auto``
    or ``torch``), and the picked body otherwise (as under the Triton interpreter); the body is
    picked on the allocator's first kernel allocation and kept."""
    host_calls: list[int] = []
    kernel_calls: list[int] = []
    real_pick = dispatch.pick
    for twin in ("host_decode", "host_decode_small"):  # numpy, and lists for small batches

        def host(*args: object, _real: object = getattr(page_allocator, twin)) -> torch.Tensor:
            host_calls.append(1)
            return _real(*args)  # type: ignore[operator, no-any-return]

        monkeypatch.setattr(page_allocator, twin, host)
    a = PagedTokenToKVPoolAllocator(64 * 4, 4, torch.float16, "cpu", None)
    x = a.alloc(8)
    assert x is not None
    seq, last = _ids(4, 5), torch.stack((x[2], x[7]))  # request 1's token starts a page
    st = a.backup_state()
    on_host = a.alloc_decode(seq, seq, last)
    assert on_host is not None and host_calls == [1]
    a.restore_state(st)
    monkeypatch.setenv("MEM_CACHE_KERNELS_BACKEND", "torch")
    assert torch.equal(a.alloc_decode(seq, seq, last), on_host)  # type: ignore[arg-type]
    assert host_calls == [1, 1]
    a.restore_state(st)

    def pick(op: str, backend: str, *tensors: torch.Tensor) -> object:
        impl = real_pick(op, backend, *tensors)

        def other(*args: object, **kw: object) -> None:
            kernel_calls.append(1)
            impl(*args, **kw)

        return other

    monkeypatch.setattr(page_allocator, "pick", pick)
    # an allocator keeps the body it picked first: a new one picks the stand-in
    assert a.alloc_decode(seq, seq, last) is not None and host_calls == [1, 1, 1]
    b = PagedTokenToKVPoolAllocator(64 * 4, 4, torch.float16, "cpu", None)
    assert b.alloc(8) is not None
    assert torch.equal(b.alloc_decode(seq, seq, last), on_host)  # type: ignore[arg-type]
    assert host_calls == [1, 1, 1] and kernel_calls == [1]


def test_token_allocator_arena_path_is_sync_free() -> None:
    """Frees into the arena, group writes and slice takes never read device data (meta)."""
    meta = torch.device("meta")
    a = TokenToKVPoolAllocator(64, torch.float16, meta, None)
    x = a.alloc(40)
    assert x is not None
    a.free(x[:10])
    a.free(x[10:20])
    a.free_group_begin()
    a.free(x[20:25])
    a.free(x[25:30])
    a.free_group_end()
    y = a.alloc(30)
    assert y is not None and y.device == meta and y.shape == (30,)
    assert a.available_size() == 24 and a._free.num_chunks == 1
    state = a.backup_state()
    assert a.alloc(a.available_size()) is not None
    a.restore_state(state)
    assert a.available_size() == 24


def test_alloc_unique_sorted_matches_torch_unique_on_long_inputs() -> None:
    from mem_cache_allocator.page_allocator import unique_sorted

    g = torch.Generator().manual_seed(3)
    for n, hi in ((10, 5), (2048, 100), (2049, 100), (5000, 400), (9000, 1 << 20), (7000, 3)):
        x = torch.randint(0, hi, (n,), generator=g)
        assert torch.equal(unique_sorted(x), torch.unique(x)), (n, hi)


@pytest.mark.parametrize("limit", [1, 7, 64, 5000])
def test_host_sorted_ids_equals_torch_sort(limit: int) -> None:
    """The bitmap sort returns torch.sort's values for distinct ids in [0, limit], and None
    (the caller sorts) for a repeated id or one outside the range."""
    g = torch.Generator().manual_seed(limit)
    for n in sorted({1, limit // 2 + 1, limit + 1}):
        ids = torch.randperm(limit + 1, generator=g)[:n]
        got = page_allocator.host_sorted_ids(ids, limit)
        assert got is not None and got.dtype == torch.int64
        assert torch.equal(got, torch.sort(ids).values)
    assert page_allocator.host_sorted_ids(torch.tensor([1, 0, 1]), limit) is None
    assert page_allocator.host_sorted_ids(torch.tensor([0, -1]), limit) is None
    assert page_allocator.host_sorted_ids(torch.tensor([0, limit + 1]), limit) is None


@pytest.mark.parametrize("ps", [1, 16])
def test_need_sort_merge_by_bitmap_keeps_sglang_order_and_duplicates(ps: int) -> None:
    """A need_sort merge leaves the free list sorted whichever way it sorts; a slot freed twice
    (which the count check cannot see while other slots are out) stays twice, as SGLang's
    torch.sort keeps it."""
    def make() -> TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator:
        if ps == 1:
            return TokenToKVPoolAllocator(256, torch.float16, "cpu", None, need_sort=True)
        return PagedTokenToKVPoolAllocator(256 * ps, ps, torch.float16, "cpu", None, True)

    a = make()
    x = a.alloc(200 * ps)
    assert x is not None
    order = torch.randperm(200, generator=torch.Generator().manual_seed(ps))
    for i in range(0, 200, 10):  # freed in a scrambled order, 20 calls
        a.free(x.view(200, ps)[order[i : i + 10]].reshape(-1))
    a.merge_and_sort_free()
    got = a._free.to_tensor()
    assert torch.equal(got, torch.arange(1, 257)) and len(a._free) == 256
    b = make()
    y = b.alloc(200 * ps)
    assert y is not None
    b.free(y[:ps])
    b.free(y[:ps])  # a double free within capacity
    b.merge_and_sort_free()
    want = torch.sort(torch.cat([torch.arange(201, 257), torch.tensor([1, 1])])).values
    assert torch.equal(b._free.to_tensor(), want)
