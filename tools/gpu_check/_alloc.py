"""Part 2 (allocation): ``alloc_extend`` / ``alloc_decode`` latency at batch 1, 32, 256 and 1024.

Three figures per op and batch, all on the same GPU tensors, page size 16, with the host-side
hints the allocators pass (``num_new_pages`` / ``num_tokens``):

* the kernel op with ``backend="triton"`` against ``backend="torch"`` (us per call, CUDA events
  around ``iters`` back-to-back calls, so host launch overhead counts);
* the Triton op captured in a CUDA graph and replayed, against the eager Triton call (the graph's
  output is first checked bit-exactly against the eager one);
* ``PagedTokenToKVPoolAllocator.alloc_extend`` / ``alloc_decode`` end to end (host bookkeeping
  included, state restored after each call) with the kernels' Triton path against their torch
  path (``MEM_CACHE_KERNELS_BACKEND``).

The allocator object itself is not captured: its free list and page accounting live on the host
(it takes the ``*_cpu`` lengths, decides shortage before launching and advances a host-side
free-list offset), so a replayed graph would hand out the same pages again. Engines (SGLang too)
allocate outside the graph and capture only the forward pass.

Batches: prefix lengths up to 512 tokens and 1-63 new tokens per request (extend), sequence
lengths up to 512 (decode); each request's partial page is continued from ``last_loc``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import mem_cache_kernels as mk
from mem_cache_allocator import PagedTokenToKVPoolAllocator
from tools.gpu_check._core import (
    Context,
    Row,
    SectionResult,
    backend_env,
    first_difference,
    paired_times,
    sync,
    time_call,
)

__all__ = ["ALLOCATOR_GRAPH_NOTE", "run_alloc"]

PS = 16
ALLOCATOR_GRAPH_NOTE = (
    "PagedTokenToKVPoolAllocator is not captured in a CUDA graph: its free list and page counts "
    "live on the host (shortage is decided from the *_cpu lengths before any launch and the "
    "free-list head advances on the host), so a replay would hand out the same pages again; only "
    "the allocation kernels are captured"
)


class _Batch:
    """Extend and decode inputs for ``bs`` requests, on the device, plus an allocator whose
    free list holds enough pages."""

    def __init__(self, ctx: Context, bs: int, gen: torch.Generator) -> None:
        dev = ctx.device
        self.bs = bs
        pre = torch.randint(0, 512, (bs,), generator=gen)
        ext = torch.randint(1, 64, (bs,), generator=gen)
        seq = pre + ext
        self.pre_cpu, self.seq_cpu = pre, seq
        pages = int((-(-seq // PS)).sum()) + bs + 8
        self.alloc = PagedTokenToKVPoolAllocator(pages * PS * 2, PS, torch.bfloat16, dev, None)
        # the prefixes: allocate them (extend from empty), then take each request's last slot
        zeros = torch.zeros(bs, dtype=torch.int64)
        with backend_env("torch"):
            slots = self.alloc.alloc_extend(
                zeros.to(dev), zeros, pre.to(dev), pre, torch.full((bs,), -1, device=dev),
                int(pre.sum()),
            )  # fmt: skip
        if slots is None:
            raise RuntimeError("allocator too small for the prefixes")
        last = torch.full_like(pre, -1)
        if slots.numel():
            ends = (torch.cumsum(pre, 0) - 1).clamp(min=0)
            last = torch.where(pre > 0, slots.cpu()[ends], last)
        self.pre, self.seq, self.last = pre.to(dev), seq.to(dev), last.to(dev)
        self.ext_tokens = int(ext.sum())
        self.ext_pages = int((-(-seq // PS) + pre // -PS).sum())
        # decode: one new token after each prefix (seq_lens count it)
        self.dec_seq_cpu = pre + 1
        self.dec_seq = self.dec_seq_cpu.to(dev)
        self.dec_pages = int((pre % PS == 0).sum())
        self.state = self.alloc.backup_state()
        free = self.alloc.free_pages_tensor()
        self.free = free[: max(self.ext_pages, self.dec_pages) + 8].to(dev)
        self.out_ext = torch.full((self.ext_tokens,), -1, dtype=torch.int64, device=dev)
        self.out_dec = torch.full((bs,), -1, dtype=torch.int64, device=dev)

    def extend_op(self, backend: mk.Backend) -> Callable[[], None]:
        def call() -> None:
            mk.alloc_extend(
                self.pre, self.seq, self.last, self.free, self.out_ext, PS,
                num_new_pages=self.ext_pages, num_tokens=self.ext_tokens, backend=backend,
            )  # fmt: skip

        return call

    def decode_op(self, backend: mk.Backend) -> Callable[[], None]:
        def call() -> None:
            mk.alloc_decode(
                self.dec_seq, self.last, self.free, self.out_dec, PS,
                num_new_pages=self.dec_pages, backend=backend,
            )  # fmt: skip

        return call

    def extend_allocator(self) -> Callable[[], None]:
        def call() -> None:
            out = self.alloc.alloc_extend(
                self.pre, self.pre_cpu, self.seq, self.seq_cpu, self.last, self.ext_tokens
            )
            if out is None:
                raise RuntimeError("allocator ran out of pages")
            self.alloc.restore_state(self.state)

        return call

    def decode_allocator(self) -> Callable[[], None]:
        def call() -> None:
            out = self.alloc.alloc_decode(self.dec_seq, self.dec_seq_cpu, self.last)
            if out is None:
                raise RuntimeError("allocator ran out of pages")
            self.alloc.restore_state(self.state)

        return call


def _us(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e6


def _graph(ctx: Context, fn: Callable[[], None], out: torch.Tensor) -> tuple[float | None, str]:
    """(us per graph replay, problem) of ``fn`` captured in a CUDA graph; its output must equal
    the eager output bit for bit."""
    if not ctx.cuda:
        return None, "no CUDA graphs without CUDA"
    fn()
    sync(ctx.device)
    eager = out.clone()
    out.fill_(-1)
    side = torch.cuda.Stream(ctx.device)  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream(ctx.device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()  # warm-up outside the capture (compiles, caches)
    torch.cuda.current_stream(ctx.device).wait_stream(side)
    graph: Any = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    out.fill_(-1)
    graph.replay()
    sync(ctx.device)
    diff = first_difference(out, eager)
    if diff is not None:
        return None, f"graph replay differs from eager: {diff}"
    iters = ctx.sizes.iters
    samples = []
    for _ in range(ctx.sizes.repeats):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / iters)
    return sorted(samples)[len(samples) // 2] * 1e6, ""


def run_alloc(ctx: Context) -> SectionResult:
    result = SectionResult("alloc")
    result.notes.append(ALLOCATOR_GRAPH_NOTE)
    gen = torch.Generator().manual_seed(4)
    iters = max(1, ctx.sizes.iters)
    for bs in ctx.sizes.alloc_batches:
        if ctx.out_of_time():
            result.add(Row("alloc", "alloc_extend / alloc_decode", f"bs={bs}", "skipped"))
            continue
        batch = _Batch(ctx, bs, gen)
        for op, make, out, via_alloc in (
            ("alloc_extend", batch.extend_op, batch.out_ext, batch.extend_allocator),
            ("alloc_decode", batch.decode_op, batch.out_dec, batch.decode_allocator),
        ):
            case = f"bs={bs} ps={PS}"
            make("torch")()
            want = out.clone()
            out.fill_(-1)
            make("triton")()
            bad = first_difference(out, want)
            tri, tor = paired_times(ctx, make("triton"), make("torch"), iters=iters)
            result.add(
                Row(
                    "alloc",
                    f"{op} kernel [triton]",
                    case,
                    "FAIL" if bad else "ok",
                    value=_us(tri),
                    unit="us",
                    reference=_us(tor),
                    reference_name="torch path",
                    detail=bad or "",
                )
            )
            try:
                graph_us, problem = _graph(ctx, make("triton"), out)
            except Exception as exc:
                graph_us, problem = None, f"capture failed: {type(exc).__name__}: {exc}"
            result.add(
                Row(
                    "alloc",
                    f"{op} kernel [triton, CUDA graph]",
                    case,
                    _graph_status(ctx, problem),
                    value=graph_us,
                    unit="us",
                    reference=_us(tri),
                    reference_name="eager triton",
                    detail=problem,
                )
            )
            with backend_env("triton"):
                alloc_tri = _time_allocator(ctx, via_alloc(), iters)
            with backend_env("torch"):
                alloc_tor = _time_allocator(ctx, via_alloc(), iters)
            result.add(
                Row(
                    "alloc",
                    f"PagedTokenToKVPoolAllocator.{op} [triton]",
                    case,
                    "ok",
                    value=_us(alloc_tri),
                    unit="us",
                    reference=_us(alloc_tor),
                    reference_name="torch path",
                )
            )
    return result


def _time_allocator(ctx: Context, fn: Callable[[], None], iters: int) -> float | None:
    return time_call(ctx, fn, iters=iters)


def _graph_status(ctx: Context, problem: str) -> str:
    if not ctx.cuda:
        return "info"
    if not problem:
        return "ok"
    return "FAIL" if problem.startswith("graph replay differs") else "error"
