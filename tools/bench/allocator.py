"""Benchmark: mem_cache_allocator on a continuous-batching trace vs an SGLang-like naive baseline.

A seeded trace (lognormal prompt and output lengths, about ``--running`` requests in flight, a
share of requests hitting a cached page-aligned prefix, chunked prefill with a token budget per
step) drives both allocators through the same calls: ``alloc_extend`` for prefill chunks,
``alloc_decode`` for the decode batch, frees of finished requests inside a free group, shaped as
engines pass them (each request's slots shuffled, every other free int32, requests concatenated
in pairs, so partial last pages sit inside one free); ``--free-api segments`` frees each request
with ``free_segments`` instead (positions stated: the sync-free API). Page size 1 uses ``alloc``
for both (as SGLang's scheduler does). Every op is timed per call (``perf_counter_ns``), and both
allocators must return identical slots (checked on every call).

The baseline (``NaiveAllocator``: ``ReferenceAllocator`` of the allocator tests'
``_allocator_reference``) is a straightforward vectorised torch allocator with SGLang 0.5.23's
data structures and semantics: one free-list tensor rebuilt with ``torch.cat`` on every free,
``torch.unique`` page dedup, free groups freed as one concatenated free at the end. The last
table is the total allocator time (ours / baseline), as a plain sum and as per-op medians x calls
(robust to preemption spikes).

Usage: ``python -m tools.bench.allocator [--quick] [--json PATH] [--page-sizes 1,16,64]
[--free-api free|segments]``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tools.cli import OneLineParser


def _load_reference() -> Any:
    """The allocator tests' SGLang-semantics reference (test support beside the tests, not
    shipped: ``packages/mem-cache-allocator/tests/_allocator_reference.py``)."""
    name = "_allocator_reference"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "packages/mem-cache-allocator/tests"
        spec = importlib.util.spec_from_file_location(name, path / f"{name}.py")
        if spec is None or spec.loader is None:
            raise RuntimeError(f"cannot load {name} from {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_reference = _load_reference()
ReferenceAllocator = _reference.ReferenceAllocator
naive_alloc_decode = _reference.naive_alloc_decode
naive_alloc_extend = _reference.naive_alloc_extend

__all__ = ["NaiveAllocator", "TraceConfig", "main", "naive_alloc_decode", "naive_alloc_extend"]


# ---------------------------------------------------------------------------- baseline
# The SGLang-0.5.23-like reference (the equivalence tests' model).
NaiveAllocator = ReferenceAllocator


# ---------------------------------------------------------------------------- trace
@dataclass(frozen=True, slots=True)
class TraceConfig:
    num_requests: int = 3000
    running: int = 256
    prompt_median: float = 600.0
    output_median: float = 160.0
    sigma: float = 0.8
    max_len: int = 4096
    prefill_budget: int = 1280
    prefix_hit_rate: float = 0.3
    shared_prefix_len: int = 512
    capacity: int = 1 << 19
    seed: int = 0


@dataclass(slots=True)
class _Req:
    prompt: int
    output: int
    shared: bool
    slots: list[int] = field(default_factory=list)  # own slots (after the shared prefix)
    prefix: int = 0  # shared prefix length (page-aligned)
    done: int = 0  # tokens with slots (prefix included)

    @property
    def total(self) -> int:
        return self.prompt + self.output


def _make_requests(cfg: TraceConfig) -> list[_Req]:
    g = torch.Generator().manual_seed(cfg.seed)

    def lognormal(median: float) -> int:
        z = float(torch.randn(1, generator=g))
        return max(1, min(cfg.max_len, round(median * math.exp(cfg.sigma * z))))

    reqs = []
    for _ in range(cfg.num_requests):
        shared = float(torch.rand(1, generator=g)) < cfg.prefix_hit_rate
        prompt = lognormal(cfg.prompt_median) + (cfg.shared_prefix_len if shared else 0)
        reqs.append(_Req(prompt=prompt, output=lognormal(cfg.output_median), shared=shared))
    return reqs


class _Timer:
    def __init__(self) -> None:
        self.ns: dict[str, list[int]] = {}

    def call(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = fn(*args)
        self.ns.setdefault(op, []).append(time.perf_counter_ns() - t0)
        return out


def _i64(values: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


def _engine_shaped_frees(
    finished: list[_Req], dev: torch.device, shuffle: torch.Generator, free_api: str
) -> list[Any]:
    """The group's free calls: ``free`` (shuffled, int32/int64, pairs concatenated) or, for
    ``free_api="segments"``, one ``free_segments`` per request (positions stated)."""
    if free_api == "segments":
        return [[(_i64(r.slots, dev), r.prefix)] for r in finished]
    out: list[Any] = []
    for k in range(0, len(finished), 2):
        slots = [s for r in finished[k : k + 2] for s in r.slots]
        t = _i64(slots, dev)
        t = t[torch.randperm(t.numel(), generator=shuffle)]
        out.append(t.to(torch.int32) if (k // 2) % 2 else t)
    return out


def run_trace(
    allocs: Sequence[Any], page_size: int, cfg: TraceConfig, free_api: str = "free"
) -> tuple[list[_Timer], list[list[int]], int]:
    """Drive every allocator in ``allocs`` through one trace; returns timers, per-step ns, steps.

    All allocators get identical calls; their results must be identical (``RuntimeError`` if not).
    """
    ps = page_size
    dev = torch.device("cpu")
    timers = [_Timer() for _ in allocs]
    step_ns: list[list[int]] = [[] for _ in allocs]
    # shared prefix held for the whole run (like a pinned system prompt in the radix cache)
    shared_len = cfg.shared_prefix_len // ps * ps
    shared = [a.alloc(shared_len) for a in allocs]
    if any(s is None for s in shared):
        raise RuntimeError("capacity too small for the shared prefix")
    shared_slots: list[int] = shared[0].tolist()
    waiting = list(reversed(_make_requests(cfg)))
    running: list[_Req] = []
    prefilling: list[_Req] = []
    steps = 0
    shuffle = torch.Generator().manual_seed(cfg.seed + 7)

    flip = [0]

    def order() -> range:
        """Alternate which allocator goes first on every call: the first one to touch freshly
        built input tensors pays the cache misses."""
        flip[0] ^= 1
        return range(len(allocs)) if flip[0] else range(len(allocs) - 1, -1, -1)

    def both(op: str, name: str, *args: Any) -> list[Any]:
        """Call ``name`` on every allocator (alternating order), timed as ``op``."""
        outs: list[Any] = [None] * len(allocs)
        for i in order():
            outs[i] = timers[i].call(op, getattr(allocs[i], name), *args)
        return outs

    def same(outs: list[Any], op: str) -> Any:
        first = outs[0]
        for o in outs[1:]:
            if (first is None) != (o is None) or (first is not None and not torch.equal(first, o)):
                raise RuntimeError(f"allocators disagree on {op} at step {steps}")
        return first

    while waiting or running or prefilling:
        steps += 1
        before = [sum(len(v) for v in t.ns.values()) for t in timers]
        marks = [{k: len(v) for k, v in t.ns.items()} for t in timers]
        # ---- prefill: continue chunked requests, then admit new ones, within the budget
        budget = cfg.prefill_budget
        batch: list[tuple[_Req, int]] = []
        for r in prefilling:
            if budget <= 0:
                break
            n = min(budget, r.prompt - r.done)
            batch.append((r, n))
            budget -= n
        while waiting and budget > 0 and len(running) + len(prefilling) < cfg.running:
            r = waiting.pop()
            if r.shared:
                r.prefix = r.done = shared_len
            n = min(budget, r.prompt - r.done)
            batch.append((r, n))
            prefilling.append(r)
            budget -= n
        if batch:
            pre = [r.done for r, _ in batch]
            seq = [r.done + n for r, n in batch]
            last = [
                (r.slots[-1] if r.slots else (shared_slots[r.prefix - 1] if r.prefix else -1))
                for r, _ in batch
            ]
            total = sum(n for _, n in batch)
            if ps == 1:
                outs = both("alloc_extend", "alloc", total)
            else:
                args = (
                    _i64(pre, dev),
                    _i64(pre, dev),
                    _i64(seq, dev),
                    _i64(seq, dev),
                    _i64(last, dev),
                    total,
                )
                outs = both("alloc_extend", "alloc_extend", *args)
            out = same(outs, "alloc_extend")
            if out is None:
                raise RuntimeError("trace capacity exhausted (increase TraceConfig.capacity)")
            flat = out.tolist()
            off = 0
            for r, n in batch:
                r.slots.extend(flat[off : off + n])
                off += n
                r.done += n
                if r.done == r.prompt:
                    prefilling.remove(r)
                    running.append(r)
        # ---- decode: one token for every running request
        if running:
            seq = [r.done + 1 for r in running]
            last = [r.slots[-1] for r in running]
            if ps == 1:
                outs = both("alloc_decode", "alloc", len(running))
            else:
                args3 = (_i64(seq, dev), _i64(seq, dev), _i64(last, dev))
                outs = both("alloc_decode", "alloc_decode", *args3)
            out = same(outs, "alloc_decode")
            if out is None:
                raise RuntimeError("trace capacity exhausted (increase TraceConfig.capacity)")
            for r, s in zip(running, out.tolist()):
                r.slots.append(s)
                r.done += 1
        # ---- free finished requests in one group, shaped as engines pass them (item 4 of the
        # free-path issue): each request's slots shuffled, int32 for every other one, and
        # requests concatenated in pairs (partial last pages in the middle of one free)
        finished = [r for r in running if r.done >= r.total]
        if finished:
            running = [r for r in running if r.done < r.total]
            tensors = _engine_shaped_frees(finished, dev, shuffle, free_api)
            for i in order():
                timers[i].call("free_group_begin", allocs[i].free_group_begin)
            for x in tensors:
                for i in order():
                    if free_api == "segments":
                        timers[i].call("free", allocs[i].free_segments, x)
                    else:
                        timers[i].call("free", allocs[i].free, x)
            for i in order():
                timers[i].call("free_group_end", allocs[i].free_group_end)
        for i, t in enumerate(timers):
            total_ns = 0
            for k, v in t.ns.items():
                total_ns += sum(v[marks[i].get(k, 0) :])
            if sum(len(v) for v in t.ns.values()) > before[i]:
                step_ns[i].append(total_ns)
    return timers, step_ns, steps


# ---------------------------------------------------------------------------- report
def _stats(ns: list[int]) -> dict[str, float]:
    if not ns:
        return {"calls": 0, "mean_us": float("nan"), "p50_us": float("nan"), "p99_us": float("nan")}
    s = sorted(ns)
    return {
        "calls": len(ns),
        "mean_us": statistics.fmean(ns) / 1e3,
        "p50_us": s[len(s) // 2] / 1e3,
        "p99_us": s[min(len(s) - 1, int(len(s) * 0.99))] / 1e3,
    }


TARGETS_US = {"alloc_decode": 60.0, "alloc_extend": 150.0, "free_group_end": 40.0}


def bench_page_size(page_size: int, cfg: TraceConfig, free_api: str = "free") -> dict[str, Any]:
    from mem_cache_allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

    ours: Any
    if page_size == 1:
        ours = TokenToKVPoolAllocator(cfg.capacity, torch.float16, "cpu", None)
    else:
        ours = PagedTokenToKVPoolAllocator(cfg.capacity, page_size, torch.float16, "cpu", None)
    naive = NaiveAllocator(cfg.capacity, page_size, token=page_size == 1)
    # warm-up (first-call costs) on a tiny trace, then the measured run
    warm = TraceConfig(num_requests=20, running=8, capacity=cfg.capacity, seed=cfg.seed + 1)
    run_trace([ours, naive], page_size, warm, free_api)
    ours.clear()
    naive.clear()
    timers, step_ns, steps = run_trace([ours, naive], page_size, cfg, free_api)
    ops = sorted(set(timers[0].ns) | set(timers[1].ns))
    result: dict[str, Any] = {"page_size": page_size, "steps": steps, "ops": {}}
    for op in ops:
        a, b = _stats(timers[0].ns.get(op, [])), _stats(timers[1].ns.get(op, []))
        result["ops"][op] = {
            "ours": a,
            "baseline": b,
            "speedup": b["mean_us"] / a["mean_us"] if a["mean_us"] else float("nan"),
        }
    a, b = _stats(step_ns[0]), _stats(step_ns[1])
    result["ops"]["step"] = {"ours": a, "baseline": b, "speedup": b["mean_us"] / a["mean_us"]}
    ours_ns = sum(sum(v) for v in timers[0].ns.values())
    base_ns = sum(sum(v) for v in timers[1].ns.values())
    result["total_ms"] = {"ours": ours_ns / 1e6, "baseline": base_ns / 1e6}
    result["total_ratio"] = ours_ns / base_ns
    # robust to preemption spikes on a shared machine: per op, median x calls, summed
    med = [sum(statistics.median(v) * len(v) for v in t.ns.values() if v) for t in timers[:2]]
    result["median_total_ms"] = {"ours": med[0] / 1e6, "baseline": med[1] / 1e6}
    result["median_total_ratio"] = med[0] / med[1]
    return result


TOTAL_RATIO_TARGET = 0.5  # total allocator time, ours / baseline, at most


def _print_totals(results: list[dict[str, Any]]) -> None:
    """Total allocator time (every op of the trace), ours / baseline: the sum of all calls, and
    the sum of per-op medians x calls (robust to the preemption spikes of a shared machine)."""
    print("whole trace, milliseconds: the sum of every call's time; median-based: per-op "
          "median x calls")
    print(
        f"{'ps':>3} {'total ours ms':>14} {'total base ms':>14} {'ours/base':>10}  "
        f"{'median-based':>12}  target"
    )
    for res in results:
        t, r, rm = res["total_ms"], res["total_ratio"], res["median_total_ratio"]
        ok = "ok" if max(r, rm) <= TOTAL_RATIO_TARGET else "MISS"
        print(
            f"{res['page_size']:>3} {t['ours']:>14.1f} {t['baseline']:>14.1f} {r:>9.2f}x  "
            f"{rm:>11.2f}x  <= {TOTAL_RATIO_TARGET:g} {ok}"
        )


def _print_table(results: list[dict[str, Any]]) -> None:
    hdr = (
        f"{'ps':>3} {'op':<17}{'calls':>7} {'ours mean':>10} {'p99':>8} {'base mean':>10} "
        f"{'p99':>8} {'speedup':>8}  target (mean)"
    )
    print("per call, microseconds (us); speedup = base mean / ours mean; a mean above its p99 "
          "means a few slow outliers")
    print(hdr)
    print("-" * len(hdr))
    for res in results:
        for op, row in res["ops"].items():
            a, b = row["ours"], row["baseline"]
            target = TARGETS_US.get(op)
            if res["page_size"] == 1 and op in ("alloc_extend", "alloc_decode"):
                target = 10.0  # page size 1 goes through alloc()
            tgt = (
                ""
                if target is None
                else (f"<= {target:g} {'ok' if a['mean_us'] <= target else 'MISS'}")
            )
            print(
                f"{res['page_size']:>3} {op:<17}{a['calls']:>7} {a['mean_us']:>10.1f} "
                f"{a['p99_us']:>8.1f} {b['mean_us']:>10.1f} {b['p99_us']:>8.1f} "
                f"{row['speedup']:>7.2f}x  {tgt}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny trace (smoke test)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--page-sizes", default="1,16,64")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--free-api",
        choices=("free", "segments"),
        default="free",
        help="how finished requests are freed: engine-shaped free() calls (shuffled, int32, "
        "pairs concatenated) or free_segments() with the positions stated (sync-free)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.quick:
        cfg = TraceConfig(num_requests=60, running=16, capacity=1 << 16, seed=args.seed)
    else:
        cfg = TraceConfig(seed=args.seed)
    if args.requests is not None:
        cfg = TraceConfig(
            **{**{f: getattr(cfg, f) for f in cfg.__slots__}, "num_requests": args.requests}
        )
    page_sizes = [int(p) for p in args.page_sizes.split(",") if p]
    results = [bench_page_size(ps, cfg, args.free_api) for ps in page_sizes]
    print(
        f"trace: {cfg.num_requests} requests, ~{cfg.running} running, prefill budget "
        f"{cfg.prefill_budget} tokens/step, prefix hits {cfg.prefix_hit_rate:.0%}, CPU tensors, "
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"frees: {args.free_api}"
    )
    _print_table(results)
    print()
    _print_totals(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "config": {f: getattr(cfg, f) for f in cfg.__slots__},
                    "free_api": args.free_api,
                    "results": results,
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
