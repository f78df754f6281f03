"""Store, MLA, move and transfer kernels: Triton (interpreter) vs the torch reference, bit-exact.

Cases are tiny (a handful of rows, 1-2 layers) so the interpreter stays fast; sizes are odd on
purpose (row sizes that force 2- and 1-byte words, odd row counts, page sizes 1/16/64).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import mem_cache_kernels as mk

pytestmark = [pytest.mark.triton, pytest.mark.usefixtures("triton_interpret")]

FP8 = torch.float8_e4m3fn
# (logical dtype, storage dtype): fp8 pools store uint8 and pass dtype=fp8
DTYPES = [
    (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float16),
    (torch.float32, torch.float32),
    (FP8, torch.uint8),
]
IDX = [torch.int32, torch.int64]


def _rand(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Random bits of ``dtype`` (every byte pattern, NaNs included: comparisons are bitwise)."""
    n = 1
    for s in shape:
        n *= s
    raw = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8)
    return raw.view(dtype).view(shape)


def _both(fn: Callable[[str], object]) -> tuple[object, object]:
    return fn("torch"), fn("triton")


def _equal_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _perm(n: int, k: int, idx: torch.dtype, *, neg: bool = True) -> torch.Tensor:
    out = torch.randperm(n)[:k]
    if neg and k > 2:
        out[1] = -1  # a skipped pair
    return out.to(idx)


@pytest.mark.parametrize("idx", IDX)
@pytest.mark.parametrize(("logical", "storage"), DTYPES)
@pytest.mark.parametrize("heads_dim", [(1, 3), (2, 8), (3, 5)])
def test_store_kv(
    logical: torch.dtype, storage: torch.dtype, idx: torch.dtype, heads_dim: tuple[int, int]
) -> None:
    h, d = heads_dim
    rows, n = 11, 5
    k_cache = _rand((rows, h, d), storage)
    v_cache = _rand((rows, h, d + 1), storage)
    k = torch.randn(n, h, d, dtype=torch.float32)
    v = torch.randn(n, h, d + 1, dtype=torch.float32)
    loc = _perm(rows, n, idx)
    caches = [(k_cache.clone(), v_cache.clone()) for _ in range(2)]
    dtype = logical if logical != storage else None
    for (kc, vc), backend in zip(caches, ("torch", "triton")):
        mk.store_kv(kc, vc, loc, k, v, dtype=dtype, backend=backend)  # type: ignore[arg-type]
    assert _equal_bits(caches[0][0], caches[1][0]) and _equal_bits(caches[0][1], caches[1][1])
    written = loc[loc >= 0].long()
    assert _equal_bits(caches[1][0][written], k[loc >= 0].to(logical).view(storage))


@pytest.mark.parametrize("idx", IDX)
@pytest.mark.parametrize(("logical", "storage"), DTYPES)
def test_mla_set_and_get(logical: torch.dtype, storage: torch.dtype, idx: torch.dtype) -> None:
    rows, n, nope, rope = 9, 4, 12, 5
    buf = _rand((rows, 1, nope + rope), storage)
    k_nope = torch.randn(n, 1, nope)
    k_rope = torch.randn(n, 1, rope)
    loc = _perm(rows, n, idx)
    dtype = logical if logical != storage else None
    bufs = [buf.clone(), buf.clone()]
    for b, backend in zip(bufs, ("torch", "triton")):
        mk.set_mla_kv_buffer(b, loc, k_nope, k_rope, dtype=dtype, backend=backend)  # type: ignore[arg-type]
    assert _equal_bits(bufs[0], bufs[1])
    got = [
        mk.get_mla_kv_buffer(bufs[0], loc, nope, dtype=dtype, backend=b)
        for b in ("torch", "triton")
    ]  # type: ignore[arg-type]
    assert _equal_bits(got[0][0], got[1][0]) and _equal_bits(got[0][1], got[1][1])
    assert got[1][0].dtype == (logical if dtype else storage)


@pytest.mark.parametrize("idx", IDX)
def test_copy_all_layer_overlapping(idx: torch.dtype) -> None:
    # two layers x (K, V) with different row sizes, shifted by 2 rows: targets overlap sources
    buffers = [
        _rand((13, 2, 3), torch.bfloat16),
        _rand((13, 2, 5), torch.bfloat16),
        _rand((13, 7), torch.uint8),
        _rand((13, 4), torch.float32),
    ]
    src = torch.tensor([1, 2, 3, 4, 5, -1, 9], dtype=idx)
    tgt = torch.tensor([3, 4, 5, 6, 7, 8, -1], dtype=idx)
    results = []
    for backend in ("torch", "triton"):
        bufs = [b.clone() for b in buffers]
        mk.copy_all_layer_kv_cache(bufs, tgt, src, backend=backend)  # type: ignore[arg-type]
        results.append(bufs)
    for a, b, orig in zip(*results, buffers):
        assert _equal_bits(a, b)
        assert _equal_bits(b[3:8], orig[1:6])  # old contents, not the already moved rows
        assert _equal_bits(b[8:], orig[8:]) and _equal_bits(b[:3], orig[:3])


@pytest.mark.parametrize("idx", IDX)
@pytest.mark.parametrize(("logical", "storage"), DTYPES)
@pytest.mark.parametrize("row", [(1, 3), (2, 4), (1, 64)])
def test_transfers_all_layouts(
    logical: torch.dtype, storage: torch.dtype, idx: torch.dtype, row: tuple[int, ...]
) -> None:
    del logical
    layers, dev_rows, host_slots, n = 2, 9, 11, 5
    dev = [[_rand((dev_rows, *row), storage) for _ in range(layers)] for _ in range(2)]
    host_lf = [[_rand((host_slots, *row), storage) for _ in range(layers)] for _ in range(2)]
    host_pf = [_rand((host_slots, layers, *row), storage) for _ in range(2)]
    di, hi = _perm(dev_rows, n, idx), _perm(host_slots, n, idx, neg=False)

    def run(backend: str) -> list[torch.Tensor]:
        h_lf = [[t.clone() for t in r] for r in host_lf]
        h_pf = [t.clone() for t in host_pf]
        d_out = [[t.clone() for t in r] for r in dev]
        mk.transfer_rows_all_layers(dev, h_lf, di, hi, backend=backend)  # type: ignore[arg-type]
        mk.transfer_rows(
            [h_lf[0][1], h_lf[1][1]], [d_out[0][0], d_out[1][0]], hi, di, backend=backend
        )  # type: ignore[arg-type]
        mk.backup_all_layers_to_page_first(dev, h_pf, di, hi, backend=backend)  # type: ignore[arg-type]
        mk.load_layer_from_page_first(h_pf, [d_out[0][1], d_out[1][1]], hi, di, 0, backend=backend)  # type: ignore[arg-type]
        return [*(t for r in h_lf for t in r), *h_pf, *(t for r in d_out for t in r)]

    ref, tri = run("torch"), run("triton")
    assert all(_equal_bits(a, b) for a, b in zip(ref, tri))
    keep = di >= 0
    assert _equal_bits(tri[4][hi[keep].long(), 1], dev[0][1][di[keep].long()])


@pytest.mark.parametrize("ps", [1, 16, 64])
def test_direct_ops_match_kernels(ps: int) -> None:
    """The host-driven copies agree with the row kernels on the same page-granular indices."""
    pages, layers = 4, 2
    dev = [[_rand((pages * ps + ps, 3), torch.float16) for _ in range(layers)]]
    src_pages = torch.tensor([3, 1, 2])
    dst_pages = torch.tensor([0, 2, 3])
    dev_idx = (src_pages[:, None] * ps + torch.arange(ps)).flatten()
    host_idx = (dst_pages[:, None] * ps + torch.arange(ps)).flatten()
    host_pfd = [torch.zeros(pages, layers, ps, 3, dtype=torch.float16)]
    mk.direct_backup_all_layers_to_page_first_direct(dev, host_pfd, dev_idx, host_idx, ps)
    host_pf = [torch.zeros(pages * ps, layers, 3, dtype=torch.float16)]
    mk.backup_all_layers_to_page_first(dev, host_pf, dev_idx, host_idx, backend="triton")
    assert _equal_bits(host_pfd[0].transpose(1, 2).reshape(pages * ps, layers, 3), host_pf[0])
    out = [torch.zeros_like(dev[0][0])]
    mk.direct_load_layer_from_page_first_direct(host_pfd, out, host_idx, dev_idx, 1, ps)
    assert _equal_bits(out[0][dev_idx], dev[0][1][dev_idx])


def test_grid_stride_loop_under_a_tiny_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    """With one program per job, each program walks every row block (grid-stride loop)."""
    import importlib

    rows_mod = importlib.import_module("mem_cache_kernels._triton.rows")
    monkeypatch.setattr(rows_mod, "HOST_QUOTA", 1)
    src = [_rand((20, 2048), torch.float32), _rand((20, 2048), torch.float32)]  # 8 KiB rows
    dst = [torch.zeros(20, 2048), torch.zeros(20, 2048)]
    si = torch.tensor([19, 0, 7, 3, 11, 2, 5, 13, 17, 1, 4, 8, 9])  # 13 rows = 4 row blocks of 4
    di = torch.arange(13)
    mk.transfer_rows(src, dst, si, di, backend="triton")
    assert all(_equal_bits(d[:13], s[si]) for s, d in zip(src, dst))


def test_unpinned_host_tensors_are_refused_before_a_gpu_launch() -> None:
    """The GPU path checks host tensors are pinned (CPU-only machine: call the check directly)."""
    import importlib

    rows_mod = importlib.import_module("mem_cache_kernels._triton.rows")
    host = torch.zeros(4, 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"host tensors must be pinned.*buffer 1, destination"):
        # job 0 lives on a non-CPU device (meta stands in for the GPU); job 1 writes to host memory
        rows_mod._check_pinned([(host.to("meta"), host.to("meta")), (host.to("meta"), host)])
