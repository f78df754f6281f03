"""Correctness cases of every public kernel op (used by :mod:`tools.gpu_check._ops`).

The matrix: page sizes 1, 16 and 64 (the index pattern: whole pages of ``ps`` consecutive slots in
random order; page size 1 means scattered single rows); bf16, fp16 and fp8 storage (fp8 pools
store uint8 and get bf16 inputs cast through ``dtype=torch.float8_e4m3fn``); int32 and int64
index tensors; host-side buffers pinned (Triton reads them over UVA). Every op also gets ``far``
cases: the rows it touches lie more than 2**31 bytes from the start of their buffer (a 2.1 GB
buffer; only a window at its end is initialised and compared, so in a dry run it stays virtual
memory). Some cases carry ``-1`` index entries, which data-movement ops skip.

On CUDA every combination runs (``Context.full_matrix``); the dry run takes a covering subset
(every value of every axis at least once) so the interpreter finishes in seconds.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import mem_cache_kernels as mk
from mem_cache_kernels import Backend, deepseek_v4
from tools.gpu_check._core import Context

__all__ = ["CASES", "Case", "Outputs"]

Outputs = dict[str, torch.Tensor]
PAGE_SIZES = (1, 16, 64)
DTYPES = ("bf16", "fp16", "fp8")
INDEX = (torch.int32, torch.int64)
FAR_BYTES = 2**31
_STORE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.uint8}
_LOGICAL: dict[str, torch.dtype] = {"fp8": torch.float8_e4m3fn}


@dataclass(frozen=True, slots=True)
class Case:
    """One correctness case: ``run(backend)`` builds fresh inputs from the case's seed, runs the
    op with that backend and returns every output (mutated buffers, return values) by name."""

    name: str
    device: torch.device
    run: Callable[[Backend], Outputs]


@dataclass(frozen=True, slots=True)
class Spec:
    """The axes of one case (what a run function reads)."""

    ctx: Context
    ps: int = 16
    dt: str = "bf16"
    idx: torch.dtype = torch.int64
    far: bool = False
    skip: bool = False
    direction: str = "h2d"
    table: torch.dtype = torch.int32
    prefix: bool = False
    fp8_view: bool = False


class Gen:
    """Deterministic inputs on the run's device: the same seed gives the same tensors."""

    def __init__(self, ctx: Context, seed: int) -> None:
        self.ctx = ctx
        self.dev = ctx.device
        self.gen = ctx.generator(seed)
        self.cpu = torch.Generator().manual_seed(seed)

    def bits(self, shape: Sequence[int], dtype: torch.dtype, *, host: bool = False) -> torch.Tensor:
        """Random bit patterns (NaNs, -0.0 and subnormals included) of ``dtype``."""
        nbytes = math.prod(shape) * dtype.itemsize
        raw = torch.randint(
            0, 256, (nbytes,), dtype=torch.uint8, device=self.dev, generator=self.gen
        )
        t = raw.view(dtype).view(tuple(shape))
        return self.to_host(t) if host else t

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """A host copy (pinned on CUDA, so the Triton kernels can reach it)."""
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.ctx.cuda)
        out.copy_(t)
        return out

    def randn(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.randn(tuple(shape), device=self.dev, generator=self.gen).to(dtype)

    def kv_input(self, shape: Sequence[int], dt: str) -> torch.Tensor:
        """Rows to store: bit patterns in the cache dtype, or bf16 values for fp8 caches."""
        return self.randn(shape, torch.bfloat16) if dt == "fp8" else self.bits(shape, _STORE[dt])

    def ints(self, lo: int, hi: int, n: int) -> torch.Tensor:
        """int64 CPU tensor of ``n`` values in ``[lo, hi)``."""
        return torch.randint(lo, hi, (n,), generator=self.cpu, dtype=torch.int64)

    def slots(self, n: int, ps: int, lo: int, hi: int) -> torch.Tensor:
        """``n`` distinct int64 slots on the device: ``n // ps`` random whole pages of ``ps``
        consecutive slots from rows ``[lo, hi)``, pages in random order."""
        first = -(-lo // ps)
        count = hi // ps - first
        if n % ps or n // ps > count:
            raise RuntimeError(f"cannot pick {n} slots in pages of {ps} from rows [{lo}, {hi})")
        pages = torch.randperm(count, generator=self.cpu)[: n // ps] + first
        slots = (pages[:, None] * ps + torch.arange(ps)).reshape(-1)
        return slots.to(self.dev)

    def far(self, row: Sequence[int], dtype: torch.dtype, window: int) -> tuple[torch.Tensor, int]:
        """A buffer ``[first + window, *row]`` whose rows ``[first, first + window)`` start more
        than 2**31 bytes in; only that window is initialised. Returns ``(buffer, first)``."""
        row_bytes = math.prod(row) * dtype.itemsize
        first = -(-(FAR_BYTES // row_bytes + 1) // 64) * 64
        buf = torch.empty((first + window, *row), dtype=dtype, device=self.dev)
        buf[first:] = self.bits((window, *row), dtype)
        return buf, first


def _matrix(ctx: Context, *axes: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Every combination (CUDA) or a covering subset: each value of each axis once (dry run)."""
    if ctx.full_matrix:
        return list(itertools.product(*axes))
    n = max(len(a) for a in axes)
    return [tuple(a[k % len(a)] for a in axes) for k in range(n)]


def _far_index(ctx: Context) -> tuple[torch.dtype, ...]:
    return INDEX if ctx.full_matrix else (torch.int32,)


def _iname(idx: torch.dtype) -> str:
    return "int32" if idx == torch.int32 else "int64"


RunFn = Callable[[Spec, Gen, Backend], Outputs]


def _case(op: str, name: str, fn: RunFn, sp: Spec) -> Case:
    seed = zlib.crc32(f"{op}|{name}".encode())

    def run(backend: Backend) -> Outputs:
        return fn(sp, Gen(sp.ctx, seed), backend)

    return Case(name, sp.ctx.device, run)


def _window(n: int) -> int:
    return -(-2 * n // 64) * 64


def _skip(t: torch.Tensor, every: int) -> torch.Tensor:
    t = t.clone()
    t[::every] = -1
    return t


CaseFn = Callable[[Context], Iterator[Case]]

# ----------------------------------------------------------------------------- alloc


def _far_base(sp: Spec) -> int:
    """First free page id: slots beyond 2**31 in far cases (int32 page ids need ps > 1)."""
    if not sp.far:
        return 0
    return FAR_BYTES // sp.ps + 1 if sp.idx == torch.int32 else 2**40 // sp.ps


def _alloc_extend_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    ps, idx, dev = sp.ps, sp.idx, g.dev
    bs = max(4, sp.ctx.sizes.tokens // 16)
    max_pre, max_ext = (2000, 600) if sp.ctx.cuda else (40, 70)
    pre = g.ints(0, max_pre, bs)
    ext = g.ints(0, max_ext, bs)
    seq = pre + ext
    new_pages = int((-(-seq // ps) + pre // -ps).sum())
    # each request's current page (holding its last prefix token) is one of pages [1, 4 * bs]
    cur = torch.randperm(bs * 4, generator=g.cpu)[:bs] + 1
    last = torch.where(pre > 0, cur * ps + (pre - 1) % ps, torch.full_like(pre, -1))
    free = torch.randperm(new_pages + 8, generator=g.cpu) + max(_far_base(sp), 4 * bs + 1)
    out = torch.full((int(ext.sum()),), -7, dtype=torch.int64, device=dev)
    mk.alloc_extend(
        pre.to(dev, idx),
        seq.to(dev, idx),
        last.to(dev, idx),
        free.to(dev, idx),
        out,
        ps,
        num_new_pages=new_pages,
        num_tokens=out.numel(),
        backend=backend,
    )
    return {"out": out}


def _alloc_decode_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    ps, idx, dev = sp.ps, sp.idx, g.dev
    bs = max(8, sp.ctx.sizes.tokens // 4)
    seq = g.ints(1, 300 if sp.ctx.cuda else 70, bs)
    pre = seq - 1
    cur = torch.randperm(bs * 4, generator=g.cpu)[:bs] + 1
    last = torch.where(pre > 0, cur * ps + (pre - 1) % ps, torch.full_like(pre, -1))
    new_pages = int((pre % ps == 0).sum())
    free = torch.randperm(new_pages + 8, generator=g.cpu) + max(_far_base(sp), 4 * bs + 1)
    out = torch.full((bs,), -7, dtype=torch.int64, device=dev)
    mk.alloc_decode(
        seq.to(dev, idx),
        last.to(dev, idx),
        free.to(dev, idx),
        out,
        ps,
        num_new_pages=new_pages,
        backend=backend,
    )
    return {"out": out}


def _alloc_cases(op: str, run: RunFn) -> CaseFn:
    def cases(ctx: Context) -> Iterator[Case]:
        for ps, idx in _matrix(ctx, PAGE_SIZES, INDEX):
            yield _case(op, f"ps={ps} {_iname(idx)}", run, Spec(ctx, ps=ps, idx=idx))
        for idx in _far_index(ctx):
            sp = Spec(ctx, ps=64, idx=idx, far=True)
            yield _case(op, f"far ps=64 {_iname(idx)}", run, sp)

    return cases


# ----------------------------------------------------------------------------- req_table


def _req_table(sp: Spec, g: Gen, bs: int) -> tuple[torch.Tensor, int, torch.Tensor]:
    """(table, first compared row, request rows on the CPU)."""
    if sp.far:
        max_len = 8192 if sp.ctx.cuda else 256
        table, lo = g.far((max_len,), sp.table, _window(bs))
    else:
        max_len = 4096 if sp.ctx.cuda else 128
        table, lo = g.bits((4 * bs + 1, max_len), sp.table), 0
    first = max(lo, 1)
    rows = torch.randperm(table.shape[0] - first, generator=g.cpu)[:bs] + first
    return table, lo, rows


def _write_req_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    idx, dev = sp.idx, g.dev
    bs = max(4, sp.ctx.sizes.tokens // 32)
    table, lo, rows = _req_table(sp, g, bs)
    max_len = table.shape[1]
    pre = g.ints(0, max_len // 2, bs)
    seq = pre + g.ints(0, max_len // 2, bs)
    new = g.ints(0, 2**31 - 1, int((seq - pre).sum()))
    prefix = g.ints(0, 2**31 - 1, int(pre.sum())).to(dev, idx) if sp.prefix else None
    mk.write_req_to_token(
        table,
        rows.to(dev, idx),
        pre.to(dev, idx),
        seq.to(dev, idx),
        new.to(dev, idx),
        prefix,
        backend=backend,
    )
    return {"req_to_token": table[lo:]}


def _write_req_cases(ctx: Context) -> Iterator[Case]:
    op = "write_req_to_token"
    for idx, tdt, pfx in _matrix(ctx, INDEX, (torch.int32, torch.int64), (False, True)):
        name = f"{_iname(idx)} table={_iname(tdt)} prefix_slots={'yes' if pfx else 'no'}"
        yield _case(op, name, _write_req_run, Spec(ctx, idx=idx, table=tdt, prefix=pfx))
    for idx in _far_index(ctx):
        name = f"far {_iname(idx)} table=int32 prefix_slots=yes"
        yield _case(op, name, _write_req_run, Spec(ctx, idx=idx, prefix=True, far=True))


def _last_loc_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    bs = max(4, sp.ctx.sizes.tokens // 32)
    table, _, rows = _req_table(sp, g, bs)
    pre = g.ints(0, table.shape[1] + 1, bs)
    pre[::3] = 0  # empty prefixes give -1
    got = mk.get_last_loc(table, rows.to(g.dev, sp.idx), pre.to(g.dev, sp.idx), backend=backend)
    return {"last_loc": got}


def _last_loc_cases(ctx: Context) -> Iterator[Case]:
    op = "get_last_loc"
    for (idx,) in _matrix(ctx, INDEX):
        yield _case(op, _iname(idx), _last_loc_run, Spec(ctx, idx=idx))
    for idx in _far_index(ctx):
        yield _case(op, f"far {_iname(idx)}", _last_loc_run, Spec(ctx, idx=idx, far=True))


# ----------------------------------------------------------------------------- store / move


def _cache(sp: Spec, g: Gen, row: Sequence[int], n: int) -> tuple[torch.Tensor, int]:
    """A device buffer ``[rows, *row]`` of the case's storage dtype and its first compared row."""
    if sp.far:
        return g.far(row, _STORE[sp.dt], _window(n))
    return g.bits((sp.ctx.sizes.pool_rows, *row), _STORE[sp.dt]), 0


def _store_kv_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    s = sp.ctx.sizes
    n, row = s.tokens, (s.heads, s.head_dim)
    kc, lo = _cache(sp, g, row, n)
    vc, _ = _cache(sp, g, row, n)
    loc = g.slots(n, sp.ps, max(lo, sp.ps), kc.shape[0])
    if sp.skip:
        loc = _skip(loc, 7)
    k, v = g.kv_input((n, *row), sp.dt), g.kv_input((n, *row), sp.dt)
    mk.store_kv(kc, vc, loc.to(sp.idx), k, v, dtype=_LOGICAL.get(sp.dt), backend=backend)
    return {"k_cache": kc[lo:], "v_cache": vc[lo:]}


def _set_mla_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    s = sp.ctx.sizes
    n = s.tokens
    buf, lo = _cache(sp, g, (1, s.mla_nope + s.mla_rope), n)
    loc = g.slots(n, sp.ps, max(lo, sp.ps), buf.shape[0])
    if sp.skip:
        loc = _skip(loc, 5)
    nope = g.kv_input((n, 1, s.mla_nope), sp.dt)
    rope = g.kv_input((n, 1, s.mla_rope), sp.dt)
    mk.set_mla_kv_buffer(
        buf, loc.to(sp.idx), nope, rope, dtype=_LOGICAL.get(sp.dt), backend=backend
    )
    return {"kv_buffer": buf[lo:]}


def _get_mla_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    s = sp.ctx.sizes
    n = s.tokens
    buf, lo = _cache(sp, g, (1, s.mla_nope + s.mla_rope), n)
    loc = g.slots(n, sp.ps, max(lo, sp.ps), buf.shape[0])
    if sp.skip:
        loc = _skip(loc, 5)
    nope, rope = mk.get_mla_kv_buffer(
        buf, loc.to(sp.idx), s.mla_nope, dtype=_LOGICAL.get(sp.dt), backend=backend
    )
    return {"nope": nope, "rope": rope, "kv_buffer": buf[lo:]}


def _copy_all_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    s = sp.ctx.sizes
    n, row = s.tokens, (s.heads, s.head_dim)
    made = [_cache(sp, g, row, n) for _ in range(2 * (1 if sp.far else s.layers))]
    bufs, lo = [b for b, _ in made], made[0][1]
    # targets distinct; sources distinct too and overlapping the targets (in-place moves)
    tgt = g.slots(n, sp.ps, max(lo, sp.ps), bufs[0].shape[0])
    src = g.slots(n, sp.ps, max(lo, sp.ps), bufs[0].shape[0])
    if sp.skip:
        tgt = _skip(tgt, 5)
    mk.copy_all_layer_kv_cache(bufs, tgt.to(sp.idx), src.to(sp.idx), backend=backend)
    return {f"buffers[{i}]": b[lo:] for i, b in enumerate(bufs)}


def _store_cases(op: str, run: RunFn) -> CaseFn:
    def cases(ctx: Context) -> Iterator[Case]:
        for ps, dt, idx in _matrix(ctx, PAGE_SIZES, DTYPES, INDEX):
            yield _case(op, f"ps={ps} {dt} {_iname(idx)}", run, Spec(ctx, ps=ps, dt=dt, idx=idx))
        yield _case(op, "ps=16 bf16 int64 with -1 entries", run, Spec(ctx, skip=True))
        for idx in _far_index(ctx):
            yield _case(op, f"far ps=16 bf16 {_iname(idx)}", run, Spec(ctx, idx=idx, far=True))

    return cases


# ----------------------------------------------------------------------------- transfers

_DIRECTIONS = ("h2d", "d2h", "d2d")
Layers = list[list[torch.Tensor]]


def _side(sp: Spec, g: Gen, row: Sequence[int], *, host: bool) -> tuple[torch.Tensor, int]:
    """One role's layer-first buffer: on the host (pinned) or the device (far: past 2**31 B)."""
    if host:
        return g.bits((sp.ctx.sizes.pool_rows, *row), _STORE[sp.dt], host=True), 0
    return _cache(sp, g, row, sp.ctx.sizes.tokens)


def _layerwise(sp: Spec, g: Gen, layers: int) -> tuple[Layers, Layers, torch.Tensor, torch.Tensor]:
    """(src [role][layer], dst [role][layer], src indices, dst indices) for the direction."""
    s = sp.ctx.sizes
    row, n = (s.heads, s.head_dim), s.tokens
    src: Layers = [[], []]
    dst: Layers = [[], []]
    s_lo = d_lo = 0
    for r in range(2):
        for _ in range(layers):
            a, s_lo = _side(sp, g, row, host=sp.direction == "h2d")
            b, d_lo = _side(sp, g, row, host=sp.direction == "d2h")
            src[r].append(a)
            dst[r].append(b)
    si = g.slots(n, sp.ps, max(s_lo, sp.ps), src[0][0].shape[0])
    di = g.slots(n, sp.ps, max(d_lo, sp.ps), dst[0][0].shape[0])
    return src, dst, si, di


def _dst_lo(sp: Spec, t: torch.Tensor) -> torch.Tensor:
    """The compared part of a destination: its far window, or all of it."""
    if sp.far and sp.direction != "d2h":
        return t[-_window(sp.ctx.sizes.tokens) :]
    return t


def _transfer_rows_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    src, dst, si, di = _layerwise(sp, g, 1)
    if sp.skip:
        si = _skip(si, 9)
    s1, d1 = [r[0] for r in src], [r[0] for r in dst]
    mk.transfer_rows(s1, d1, si.to(sp.idx), di.to(sp.idx), backend=backend)
    return {f"dst[{r}]": _dst_lo(sp, d1[r]) for r in range(2)}


def _transfer_all_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    src, dst, si, di = _layerwise(sp, g, 1 if sp.far else sp.ctx.sizes.layers)
    mk.transfer_rows_all_layers(src, dst, si.to(sp.idx), di.to(sp.idx), backend=backend)
    return {f"dst[{r}][{i}]": _dst_lo(sp, t) for r in range(2) for i, t in enumerate(dst[r])}


def _direct_rows_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    src, dst, si, di = _layerwise(sp, g, 1 if sp.far else sp.ctx.sizes.layers)
    mk.direct_transfer_rows(src, dst, si.to(sp.idx), di.to(sp.idx), sp.ps, backend=backend)
    return {f"dst[{r}][{i}]": _dst_lo(sp, t) for r in range(2) for i, t in enumerate(dst[r])}


def _transfer_cases(op: str, run: RunFn, *, skip_case: bool) -> CaseFn:
    def cases(ctx: Context) -> Iterator[Case]:
        for ps, dt, idx, way in _matrix(ctx, PAGE_SIZES, DTYPES, INDEX, _DIRECTIONS):
            sp = Spec(ctx, ps=ps, dt=dt, idx=idx, direction=way)
            yield _case(op, f"ps={ps} {dt} {_iname(idx)} {way}", run, sp)
        if skip_case:
            sp = Spec(ctx, skip=True, direction="h2d")
            yield _case(op, "ps=16 bf16 int64 h2d with -1 entries", run, sp)
        for idx, way in _matrix(ctx, _far_index(ctx), _DIRECTIONS):
            sp = Spec(ctx, idx=idx, direction=way, far=True)
            yield _case(op, f"far ps=16 bf16 {_iname(idx)} {way}", run, sp)

    return cases


def _host_slots(ctx: Context) -> int:
    return ctx.sizes.pool_rows // 2


def _device_layer(sp: Spec, g: Gen) -> tuple[list[torch.Tensor], torch.Tensor, int]:
    """(one device layer per role, device indices, first compared row)."""
    s = sp.ctx.sizes
    made = [_cache(sp, g, (s.heads, s.head_dim), s.tokens) for _ in range(2)]
    lo = made[0][1]
    di = g.slots(s.tokens, sp.ps, max(lo, sp.ps), made[0][0].shape[0])
    return [m[0] for m in made], di, lo


def _device_layers(sp: Spec, g: Gen, layers: int) -> tuple[Layers, torch.Tensor]:
    """(device buffers [role][layer], device indices)."""
    s = sp.ctx.sizes
    dev: Layers = [[], []]
    lo = 0
    for r in range(2):
        for _ in range(layers):
            t, lo = _cache(sp, g, (s.heads, s.head_dim), s.tokens)
            dev[r].append(t)
    return dev, g.slots(s.tokens, sp.ps, max(lo, sp.ps), dev[0][0].shape[0])


def _load_pf_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    s = sp.ctx.sizes
    shape = (_host_slots(sp.ctx), s.layers, s.heads, s.head_dim)
    host = [g.bits(shape, _STORE[sp.dt], host=True) for _ in range(2)]
    dev, di, lo = _device_layer(sp, g)
    hi = g.slots(s.tokens, sp.ps, 0, _host_slots(sp.ctx))
    mk.load_layer_from_page_first(
        host, dev, hi.to(sp.idx), di.to(sp.idx), s.layers - 1, backend=backend
    )
    return {f"device[{r}]": dev[r][lo:] for r in range(2)}


def _backup_pf_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    s = sp.ctx.sizes
    layers = 1 if sp.far else s.layers
    dev, di = _device_layers(sp, g, layers)
    shape = (_host_slots(sp.ctx), layers, s.heads, s.head_dim)
    host = [g.bits(shape, _STORE[sp.dt], host=True) for _ in range(2)]
    hi = g.slots(s.tokens, sp.ps, 0, _host_slots(sp.ctx))
    mk.backup_all_layers_to_page_first(dev, host, di.to(sp.idx), hi.to(sp.idx), backend=backend)
    return {f"host[{r}]": host[r] for r in range(2)}


def _pfd_host(sp: Spec, g: Gen, layers: int) -> list[torch.Tensor]:
    s = sp.ctx.sizes
    shape = (_host_slots(sp.ctx) // sp.ps, layers, sp.ps, s.heads, s.head_dim)
    return [g.bits(shape, _STORE[sp.dt], host=True) for _ in range(2)]


def _direct_load_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    s = sp.ctx.sizes
    host = _pfd_host(sp, g, s.layers)
    dev, di, lo = _device_layer(sp, g)
    hi = g.slots(s.tokens, sp.ps, 0, _host_slots(sp.ctx))
    mk.direct_load_layer_from_page_first_direct(
        host, dev, hi.to(sp.idx), di.to(sp.idx), s.layers - 1, sp.ps, backend=backend
    )
    return {f"device[{r}]": dev[r][lo:] for r in range(2)}


def _direct_backup_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    s = sp.ctx.sizes
    layers = 1 if sp.far else s.layers
    dev, di = _device_layers(sp, g, layers)
    host = _pfd_host(sp, g, layers)
    hi = g.slots(s.tokens, sp.ps, 0, _host_slots(sp.ctx))
    mk.direct_backup_all_layers_to_page_first_direct(
        dev, host, di.to(sp.idx), hi.to(sp.idx), sp.ps, backend=backend
    )
    return {f"host[{r}]": host[r] for r in range(2)}


def _one_way_cases(op: str, run: RunFn) -> CaseFn:
    def cases(ctx: Context) -> Iterator[Case]:
        for ps, dt, idx in _matrix(ctx, PAGE_SIZES, DTYPES, INDEX):
            yield _case(op, f"ps={ps} {dt} {_iname(idx)}", run, Spec(ctx, ps=ps, dt=dt, idx=idx))
        for idx in _far_index(ctx):
            yield _case(op, f"far ps=16 bf16 {_iname(idx)}", run, Spec(ctx, idx=idx, far=True))

    return cases


# ----------------------------------------------------------------------------- deepseek_v4


def _deepseek_v4_pack_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    n = sp.ctx.sizes.tokens
    nope = g.bits((n, deepseek_v4.NOPE_DIM), torch.uint8)
    scales = g.bits((n, deepseek_v4.SCALE_BYTES), torch.uint8)
    rope = g.bits((n, deepseek_v4.ROPE_DIM), torch.bfloat16)
    if sp.fp8_view:
        nope = nope.view(torch.float8_e4m3fn)
    return {"records": deepseek_v4.pack_records(nope, scales, rope, backend=backend)}


def _deepseek_v4_unpack_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    records = g.bits((sp.ctx.sizes.tokens, deepseek_v4.TOKEN_BYTES), torch.uint8)
    nope, scales, rope = deepseek_v4.unpack_records(records, backend=backend)
    return {"nope": nope, "scales": scales, "rope": rope}


def _deepseek_v4_buffer(sp: Spec, g: Gen) -> tuple[torch.Tensor, int, torch.Tensor]:
    """(page buffer, first compared page, token slots)."""
    n, ps = sp.ctx.sizes.tokens, sp.ps
    page_bytes = deepseek_v4.page_row_bytes(ps)
    pages = -(-max(64, _window(n) // ps) // 64) * 64
    if sp.far:
        buf, lo = g.far((page_bytes,), torch.uint8, pages)
    else:
        buf, lo = g.bits((pages, page_bytes), torch.uint8), 0
    loc = g.slots(n, ps, lo * ps, buf.shape[0] * ps)
    return buf, lo, _skip(loc, 11) if sp.skip else loc


def _deepseek_v4_write_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    buf, lo, loc = _deepseek_v4_buffer(sp, g)
    records = g.bits((sp.ctx.sizes.tokens, deepseek_v4.TOKEN_BYTES), torch.uint8)
    deepseek_v4.write_records(buf, loc.to(sp.idx), records, sp.ps, backend=backend)
    return {"buffer": buf[lo:]}


def _deepseek_v4_read_run(sp: Spec, g: Gen, backend: Backend) -> Outputs:
    buf, _, loc = _deepseek_v4_buffer(sp, g)
    return {"records": deepseek_v4.read_records(buf, loc.to(sp.idx), sp.ps, backend=backend)}


def _deepseek_v4_page_cases(op: str, run: RunFn) -> CaseFn:
    def cases(ctx: Context) -> Iterator[Case]:
        for ps, idx in _matrix(ctx, PAGE_SIZES, INDEX):
            yield _case(op, f"ps={ps} {_iname(idx)}", run, Spec(ctx, ps=ps, idx=idx))
        yield _case(op, "ps=16 int64 with -1 entries", run, Spec(ctx, skip=True))
        for idx in _far_index(ctx):
            sp = Spec(ctx, ps=64, idx=idx, far=True)
            yield _case(op, f"far ps=64 {_iname(idx)}", run, sp)

    return cases


def _deepseek_v4_pack_cases(ctx: Context) -> Iterator[Case]:
    op = "deepseek_v4.pack_records"
    for view in (False, True):
        name = "nope as float8_e4m3fn" if view else "nope as uint8"
        yield _case(op, name, _deepseek_v4_pack_run, Spec(ctx, fp8_view=view))


def _deepseek_v4_unpack_cases(ctx: Context) -> Iterator[Case]:
    yield _case("deepseek_v4.unpack_records", "records", _deepseek_v4_unpack_run, Spec(ctx))


CASES: dict[str, CaseFn] = {
    "alloc_extend": _alloc_cases("alloc_extend", _alloc_extend_run),
    "alloc_decode": _alloc_cases("alloc_decode", _alloc_decode_run),
    "write_req_to_token": _write_req_cases,
    "get_last_loc": _last_loc_cases,
    "store_kv": _store_cases("store_kv", _store_kv_run),
    "set_mla_kv_buffer": _store_cases("set_mla_kv_buffer", _set_mla_run),
    "get_mla_kv_buffer": _store_cases("get_mla_kv_buffer", _get_mla_run),
    "copy_all_layer_kv_cache": _store_cases("copy_all_layer_kv_cache", _copy_all_run),
    "transfer_rows": _transfer_cases("transfer_rows", _transfer_rows_run, skip_case=True),
    "transfer_rows_all_layers": _transfer_cases(
        "transfer_rows_all_layers", _transfer_all_run, skip_case=False
    ),
    "load_layer_from_page_first": _one_way_cases("load_layer_from_page_first", _load_pf_run),
    "backup_all_layers_to_page_first": _one_way_cases(
        "backup_all_layers_to_page_first", _backup_pf_run
    ),
    "direct_transfer_rows": _transfer_cases(
        "direct_transfer_rows", _direct_rows_run, skip_case=False
    ),
    "direct_load_layer_from_page_first_direct": _one_way_cases(
        "direct_load_layer_from_page_first_direct", _direct_load_run
    ),
    "direct_backup_all_layers_to_page_first_direct": _one_way_cases(
        "direct_backup_all_layers_to_page_first_direct", _direct_backup_run
    ),
    "deepseek_v4.pack_records": _deepseek_v4_pack_cases,
    "deepseek_v4.unpack_records": _deepseek_v4_unpack_cases,
    "deepseek_v4.write_records": _deepseek_v4_page_cases(
        "deepseek_v4.write_records", _deepseek_v4_write_run),
    "deepseek_v4.read_records": _deepseek_v4_page_cases(
        "deepseek_v4.read_records", _deepseek_v4_read_run),
}
"""Qualified op name -> its case generator."""

# the Mamba state-slot ops keep their cases in their own module (imported last: it uses the above)
from tools.gpu_check._mamba_cases import MAMBA_CASES  # noqa: E402

CASES.update(MAMBA_CASES)
