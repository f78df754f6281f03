"""GPU-check cases of the Mamba state-slot ops (:mod:`mem_cache_kernels.mamba`).

Each case builds state tensors ``[layers, slots, *state]`` of several entry shapes and dtypes
(bf16 conv windows, fp32 temporal states, an odd-byte uint8 entry that forces 1-byte words),
int32 or int64 slot tensors, with or without ``-1`` pairs (skipped), and for gather / scatter
the other side on the device or on the (pinned) host. ``far`` cases put the touched entries more
than 2**31 bytes into their buffer (only a window is initialised and compared). Every output is
compared byte for byte between ``backend="triton"`` and ``backend="torch"``.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Iterator

import torch

from mem_cache_kernels import Backend
from mem_cache_kernels import mamba as ops
from tools.gpu_check._core import Context
from tools.gpu_check._op_cases import FAR_BYTES, Case, Gen, Outputs

__all__ = ["MAMBA_CASES"]

_ENTRIES = (((24, 3), torch.bfloat16), ((2, 4, 8), torch.float32), ((7,), torch.uint8))
_LAYERS = 3


def _states(g: Gen, slots: int, *, host: bool = False) -> list[torch.Tensor]:
    return [g.bits((_LAYERS, slots, *shape), dt, host=host) for shape, dt in _ENTRIES]


def _pick(g: Gen, n: int, lo: int, hi: int, idx: torch.dtype, *, skip: bool) -> torch.Tensor:
    t = (torch.randperm(hi - lo, generator=g.cpu)[:n] + lo).to(idx)
    if skip:
        t[::3] = -1
    return t.to(g.dev)


def _far_state(g: Gen, window: int) -> tuple[torch.Tensor, int]:
    """One-layer fp32 state whose last ``window`` slots start beyond 2**31 bytes."""
    entry = 2 * 4 * 8
    first = FAR_BYTES // (entry * 4) + 1
    buf = torch.empty((1, first + window, 2, 4, 8), dtype=torch.float32, device=g.dev)
    buf[:, first:] = g.bits((1, window, 2, 4, 8), torch.float32)
    return buf, first


def _case(op: str, name: str, ctx: Context, fn: Callable[[Gen, Backend], Outputs]) -> Case:
    seed = zlib.crc32(f"{op}|{name}".encode())
    return Case(name, ctx.device, lambda backend: fn(Gen(ctx, seed), backend))


def _copy_run(g: Gen, backend: Backend, *, n: int, idx: torch.dtype, skip: bool) -> Outputs:
    states = _states(g, 160)
    perm = (torch.randperm(159, generator=g.cpu)[: 2 * n] + 1).to(idx)
    src, dst = perm[:n].clone(), perm[n:].clone()
    k = n // 2
    dst[:k] = src[k : 2 * k]  # overlap: some destinations are other pairs' sources
    if skip:
        src[::2] = -1
    ops.copy_state_slots(states, src.to(g.dev), dst.to(g.dev), backend=backend)
    return {f"state{i}": t for i, t in enumerate(states)}


def _copy_far(g: Gen, backend: Backend) -> Outputs:
    buf, first = _far_state(g, 64)
    src = torch.arange(first, first + 16, device=g.dev)
    dst = torch.arange(first + 8, first + 24, device=g.dev)  # overlapping ranges
    ops.copy_state_slots([buf], src, dst, backend=backend)
    return {"window": buf[:, first:].clone()}


def _copy_cases(ctx: Context) -> Iterator[Case]:
    for idx in (torch.int32, torch.int64):
        for n, skip in ((1, False), (5, True), (64, False)):
            run = functools.partial(_copy_run, n=n, idx=idx, skip=skip)
            yield _case("copy_state_slots", f"{_name(idx)}-n{n}{'-skip' if skip else ''}", ctx, run)
    yield _case("copy_state_slots", "far", ctx, _copy_far)


def _name(idx: torch.dtype) -> str:
    return "int32" if idx == torch.int32 else "int64"


def _move_run(
    g: Gen, backend: Backend, *, gather: bool, idx: torch.dtype, host: bool, n: int, skip: bool
) -> Outputs:
    pool = _states(g, 96)
    other = _states(g, 2 * n, host=host)
    slots = _pick(g, n, 1, 96, idx, skip=skip)
    order = _pick(g, n, 0, 2 * n, idx, skip=False)
    if gather:
        ops.gather_state_slots(pool, slots, other, order, backend=backend)
    else:
        ops.scatter_state_slots(pool, slots, other, order, backend=backend)
    out = other if gather else pool
    return {f"out{i}": t.to(g.dev) for i, t in enumerate(out)}


def _move_far(g: Gen, backend: Backend, *, gather: bool) -> Outputs:
    buf, first = _far_state(g, 64)
    other = [g.bits((1, 16, 2, 4, 8), torch.float32)]
    slots = torch.arange(first + 8, first + 24, device=g.dev)
    if gather:
        ops.gather_state_slots([buf], slots, other, backend=backend)
        return {"out": other[0]}
    ops.scatter_state_slots([buf], slots, other, backend=backend)
    return {"window": buf[:, first:].clone()}


def _move_cases(op: str) -> Callable[[Context], Iterator[Case]]:
    gather = op == "gather_state_slots"

    def cases(ctx: Context) -> Iterator[Case]:
        for idx in (torch.int32, torch.int64):
            for host in (False, True):
                for n, skip in ((3, False), (40, True)):
                    run = functools.partial(
                        _move_run, gather=gather, idx=idx, host=host, n=n, skip=skip
                    )
                    tag = f"{_name(idx)}-{'host' if host else 'device'}-n{n}"
                    yield _case(op, tag + ("-skip" if skip else ""), ctx, run)
        yield _case(op, "far", ctx, functools.partial(_move_far, gather=gather))

    return cases


MAMBA_CASES: dict[str, Callable[[Context], Iterator[Case]]] = {
    "mamba.copy_state_slots": _copy_cases,
    "mamba.gather_state_slots": _move_cases("gather_state_slots"),
    "mamba.scatter_state_slots": _move_cases("scatter_state_slots"),
}
"""Qualified op name -> its case generator (merged into ``_op_cases.CASES``)."""
