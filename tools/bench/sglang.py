"""Benchmark: ours / SGLang 0.5.23's own classes, side by side in one run (``--against sglang``).

SGLang's modules are loaded from its wheel on the CPU with :func:`tools.sglang_ref.load` (the
loader of the SGLang-in-the-loop tests; nothing of SGLang is vendored). Every row runs both
sides in the same process, in alternating order (rounds alternate which side goes first, and the
allocator trace alternates on every call), and reports medians:

* ``allocator``: the serving trace of :mod:`tools.bench.allocator` (its generator and driver,
  imported) over SGLang's ``TokenToKVPoolAllocator`` / ``PagedTokenToKVPoolAllocator`` and ours,
  page sizes 1, 16, 64, ``need_sort`` on and off; per op (p50 per call) and the total allocator
  time of the trace. Both sides must return identical slots on every call.
* ``pool``: ``MHATokenToKVPool.set_kv_buffer`` (decode-shaped, 1 and 64 tokens, and prefill-shaped),
  ``get_kv_buffer``,
  ``move_kv_cache`` and ``ReqToTokenPool.write`` on SGLang's CPU torch paths (SGLang's pool with
  ``use_native_move_kv_cache`` on: its non-native move is a Triton kernel). Results are checked
  equal (``torch.equal``) before timing.
* ``step``: one scheduler step of SGLang's own ``RadixCache`` and its ``alloc_for_extend`` /
  ``alloc_for_decode`` / ``release_kv_cache`` (:mod:`tools.bench.sglang_step`) over SGLang's
  classes and over ours; a side that lacks a member SGLang's scheduler reaches says so. A table
  after the rows says where that time goes: per method of the allocator and the req pool, its
  calls per step and microseconds per call on each side (``step_methods`` in the JSON).
* ``storage``: the file backends, from ``tools.bench.storage.sglang_file_rows`` when that module
  exposes it (see :data:`STORAGE_HOOK`).

Each row prints ours, SGLang, ours / SGLang (the median of the per-round ratios), the spread of
the repeats ((max - min) / median of the per-round ratios) and the goal. A row is marked
``noise`` when its spread is above :data:`NOISE_SPREAD`, or ``unsettled`` when the per-round
ratios fall on both sides of its goal. JSON with ``--json PATH``; the ratio plot beside it
(``PATH`` with ``.png``) when matplotlib is installed.

Usage: ``python -m tools.bench.sglang [--quick] [--json PATH] [--rounds N] [--requests N]
[--sections allocator,pool,step,storage] [--page-sizes 1,16,64] [--if-available] [--no-plot]``.
``--if-available`` (the default bench's mode) writes a JSON that says "skipped" and exits 0
when the wheel is not already on disk, instead of fetching it.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import platform
import statistics
import sys
import time
import types
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from tools.bench.allocator import TraceConfig, run_trace
from tools.cli import OneLineParser

__all__ = [
    "GOALS",
    "NOISE_SPREAD",
    "STORAGE_HOOK",
    "Row",
    "allocator_rows",
    "main",
    "make_row",
    "plot_rows",
    "pool_rows",
    "wheel_present",
]

NOISE_SPREAD = 0.2  # (max - min) / median of the per-round ratios above this: the row is noise
GOALS = {"allocator_total": 0.5, "step": 0.5, "pool_write": 1.0}
STORAGE_HOOK = "sglang_file_rows"  # tools.bench.storage.<this>(quick=..., rounds=...) -> rows


# ---------------------------------------------------------------------------- rows
@dataclass(slots=True)
class Row:
    """One comparison: ``ours_us`` / ``sglang_us`` are medians over rounds; ``ratio`` is the
    median of the per-round ratios; ``spread`` is (max - min) / median of those."""

    section: str
    name: str
    ours_us: float
    sglang_us: float
    ratio: float
    ratio_min: float
    ratio_max: float
    spread: float
    rounds: int
    goal: float | None = None
    verdict: str = ""
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def make_row(
    section: str,
    name: str,
    ours: Sequence[float],
    sglang: Sequence[float],
    *,
    goal: float | None = None,
    note: str = "",
    **extra: Any,
) -> Row:
    """A row from per-round values of both sides (microseconds, same unit on both sides)."""
    if len(ours) != len(sglang) or not ours:
        raise ValueError(f"{section}/{name}: need one value per round on both sides, got "
                         f"{len(ours)} and {len(sglang)}")
    ratios = [o / s if s > 0 else float("inf") for o, s in zip(ours, sglang)]
    med = statistics.median(ratios)
    lo, hi = min(ratios), max(ratios)
    spread = (hi - lo) / med if med > 0 and len(ratios) > 1 else 0.0
    verdict = ""
    if goal is not None:
        verdict = "met" if med <= goal else "MISS"
        if lo <= goal < hi:
            verdict = "unsettled"
    if len(ratios) > 1 and spread > NOISE_SPREAD:
        verdict = (verdict + " noise").strip()
    return Row(section, name, statistics.median(ours), statistics.median(sglang), med, lo, hi,
               spread, len(ratios), goal, verdict, note, dict(extra))


def skipped_row(section: str, name: str, reason: str, sglang_us: float = float("nan")) -> Row:
    """A row that could not be compared, with the reason printed in place of the ratio
    (``sglang_us``: SGLang's own figure, when that side could be measured alone)."""
    nan = float("nan")
    return Row(section, name, nan, sglang_us, nan, nan, nan, nan, 0, None, "n/a", reason)


# ---------------------------------------------------------------------------- allocator
def _allocators(sgl_alloc: types.ModuleType, ps: int, capacity: int,
                need_sort: bool) -> tuple[Any, Any]:
    from mem_cache_allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

    dt = torch.float16
    if ps == 1:
        return (TokenToKVPoolAllocator(capacity, dt, "cpu", None, need_sort),
                sgl_alloc.TokenToKVPoolAllocator(capacity, dt, "cpu", None, need_sort))
    return (PagedTokenToKVPoolAllocator(capacity, ps, dt, "cpu", None, need_sort),
            sgl_alloc.PagedTokenToKVPoolAllocator(capacity, ps, dt, "cpu", None, need_sort))


def allocator_rows(
    sgl_alloc: types.ModuleType,
    cfg: TraceConfig,
    page_sizes: Sequence[int],
    rounds: int,
    sorts: Sequence[bool] = (True, False),
) -> list[Row]:
    """The serving trace over both allocators, ``rounds`` times per (page size, need_sort)."""
    rows: list[Row] = []
    warm = replace(cfg, num_requests=20, running=8, seed=cfg.seed + 1)
    for ps in page_sizes:
        for need_sort in sorts:
            tag = f"ps={ps} sort={'on' if need_sort else 'off'}"
            per_op: dict[str, tuple[list[float], list[float]]] = {}
            totals: tuple[list[float], list[float]] = ([], [])
            robust: tuple[list[float], list[float]] = ([], [])
            calls: dict[str, int] = {}
            for r in range(rounds):
                ours, theirs = _allocators(sgl_alloc, ps, cfg.capacity, need_sort)
                pair = [ours, theirs] if r % 2 == 0 else [theirs, ours]
                run_trace(pair, ps, warm)
                ours.clear()
                theirs.clear()
                timers, _, _ = run_trace(pair, ps, cfg)
                t_ours, t_sgl = (timers[0], timers[1]) if r % 2 == 0 else (timers[1], timers[0])
                for op in sorted(set(t_ours.ns) | set(t_sgl.ns)):
                    a, b = t_ours.ns.get(op, []), t_sgl.ns.get(op, [])
                    o_list, s_list = per_op.setdefault(op, ([], []))
                    o_list.append(statistics.median(a) / 1e3 if a else float("nan"))
                    s_list.append(statistics.median(b) / 1e3 if b else float("nan"))
                    calls[op] = len(a)
                totals[0].append(sum(sum(v) for v in t_ours.ns.values()) / 1e3)
                totals[1].append(sum(sum(v) for v in t_sgl.ns.values()) / 1e3)
                for side, t in zip(robust, (t_ours, t_sgl)):
                    side.append(sum(statistics.median(v) * len(v) for v in t.ns.values() if v)
                                / 1e3)
            for op, (o_list, s_list) in per_op.items():
                rows.append(make_row("allocator", f"{tag} {op} p50", o_list, s_list,
                                     calls=calls[op]))
            rows.append(make_row("allocator", f"{tag} TOTAL", *totals,
                                 goal=GOALS["allocator_total"],
                                 note="total allocator time of the trace (sum of all calls)"))
            rows.append(make_row("allocator", f"{tag} TOTAL (median x calls)", *robust,
                                 goal=GOALS["allocator_total"],
                                 note="per op: median per call x calls, summed (robust to "
                                 "preemption spikes)"))
    return rows


# ---------------------------------------------------------------------------- pools
def _time_calls(fn: Callable[[], Any], n: int) -> float:
    """Median microseconds of ``n`` timed calls of ``fn``."""
    ns = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        ns.append(time.perf_counter_ns() - t0)
    return statistics.median(ns) / 1e3


def _side_by_side(ours: Callable[[], Any], theirs: Callable[[], Any], rounds: int,
                  n: int) -> tuple[list[float], list[float]]:
    o: list[float] = []
    s: list[float] = []
    ours()
    theirs()  # first-call costs out of the way
    for r in range(rounds):
        if r % 2 == 0:
            o.append(_time_calls(ours, n))
            s.append(_time_calls(theirs, n))
        else:
            s.append(_time_calls(theirs, n))
            o.append(_time_calls(ours, n))
    return o, s


def pool_rows(sgl_mp: types.ModuleType, rounds: int, calls: int, quick: bool) -> list[Row]:
    """Pool writes, reads and moves on SGLang's CPU torch paths; results checked equal first."""
    import mem_cache_pool as ours_mp

    size, ps, heads, dim, layers = (2048, 16, 2, 64, 2) if quick else (65536, 16, 8, 128, 4)
    dt = torch.bfloat16
    theirs = sgl_mp.MHATokenToKVPool(size=size, page_size=ps, dtype=dt, head_num=heads,
                                     head_dim=dim, layer_num=layers, device="cpu",
                                     enable_memory_saver=False)
    theirs.use_native_move_kv_cache = True  # SGLang's torch move (the other one is Triton)
    ours = ours_mp.MHATokenToKVPool(size, ps, dt, heads, dim, layers, "cpu")
    layer = types.SimpleNamespace(layer_id=1)  # SGLang's RadixAttention-like layer object
    g = torch.Generator().manual_seed(0)
    rows: list[Row] = []

    def check(what: str) -> None:
        for lid in range(layers):
            for a, b in zip(ours.get_kv_buffer(lid), theirs.get_kv_buffer(lid)):
                if not torch.equal(a, b):
                    raise RuntimeError(f"pools disagree after {what} (layer {lid})")

    # decode bs=1: the per-call cost of one layer's write, with no bytes to hide it
    shapes = (("decode bs=1", 1), ("decode bs=64", 64),
              ("prefill 1024 tokens", 1024 if not quick else 256))
    for shape, n in shapes:
        loc = torch.randperm(size, generator=g)[:n] + 1
        k = torch.randn(n, heads, dim, generator=g).to(dt)
        v = torch.randn(n, heads, dim, generator=g).to(dt)
        ours.set_kv_buffer(1, loc, k, v)
        theirs.set_kv_buffer(layer, loc, k, v)
        check("set_kv_buffer")
        o, s = _side_by_side(partial(ours.set_kv_buffer, 1, loc, k, v),
                             partial(theirs.set_kv_buffer, layer, loc, k, v), rounds, calls)
        rows.append(make_row("pool", f"set_kv_buffer {shape}", o, s, goal=GOALS["pool_write"],
                             note="ours: layer_id int; SGLang: layer object"))
    o, s = _side_by_side(partial(ours.get_kv_buffer, 1), partial(theirs.get_kv_buffer, 1),
                         rounds, calls)
    rows.append(make_row("pool", "get_kv_buffer", o, s))
    for n in (64, 1024 if not quick else 256):
        perm = torch.randperm(size, generator=g) + 1
        src, tgt = perm[:n], perm[n : 2 * n]
        ours.move_kv_cache(tgt, src)
        theirs.move_kv_cache(tgt, src)
        check("move_kv_cache")
        o, s = _side_by_side(partial(ours.move_kv_cache, tgt, src),
                             partial(theirs.move_kv_cache, tgt, src), rounds, calls)
        rows.append(make_row("pool", f"move_kv_cache {n} slots x {layers} layers", o, s,
                             goal=GOALS["pool_write"]))
    reqs, ctx = (64, 1024) if quick else (256, 8192)
    r_ours = ours_mp.ReqToTokenPool(reqs, ctx, "cpu")
    r_sgl = sgl_mp.ReqToTokenPool(size=reqs, max_context_len=ctx, device="cpu",
                                  enable_memory_saver=False)
    vals = torch.randint(0, size, (600,), generator=g, dtype=torch.int32)
    idx = (3, slice(100, 700))
    rows_t = torch.randperm(reqs, generator=g)[:64] + 1
    cols = torch.randint(0, ctx, (64,), generator=g)
    dvals = torch.randint(0, size, (64,), generator=g, dtype=torch.int32)
    cases: list[tuple[str, Any, torch.Tensor]] = [
        ("ReqToTokenPool.write extend (row, slice) 600", idx, vals),
        # SGLang's prefill writes its int64 slot tensors (prefix and out_cache_loc) as they are:
        # ours range-checks them for int32 (one aminmax), SGLang's assignment casts silently
        ("ReqToTokenPool.write extend int64 values 600", idx, vals.to(torch.int64)),
        ("ReqToTokenPool.write decode (rows, cols) bs=64", (rows_t, cols), dvals),
    ]
    for name, index, values in cases:
        r_ours.write(index, values)
        r_sgl.write(index, values)
        if not torch.equal(r_ours.req_to_token, r_sgl.req_to_token):
            raise RuntimeError(f"req_to_token disagrees after {name}")
        o, s = _side_by_side(partial(r_ours.write, index, values),
                             partial(r_sgl.write, index, values), rounds, calls)
        rows.append(make_row("pool", name, o, s, goal=GOALS["pool_write"]))
    return rows


# ---------------------------------------------------------------------------- storage, step
def storage_rows(quick: bool, rounds: int) -> list[Row]:
    """Rows from ``tools.bench.storage.sglang_file_rows(quick=..., rounds=...)``: an iterable
    of dicts ``{"name": str, "ours_us": [per round], "sglang_us": [per round], "goal": float |
    None (optional), "note": str (optional)}``. Absent hook: one row that says so."""
    mod = importlib.import_module("tools.bench.storage")
    hook = getattr(mod, STORAGE_HOOK, None)
    if hook is None:
        return [skipped_row("storage", "file backend (HiCacheFile vs ours)",
                            f"not measured: tools.bench.storage has no {STORAGE_HOOK}() yet")]
    return [make_row("storage", str(d["name"]), d["ours_us"], d["sglang_us"],
                     goal=d.get("goal"), note=str(d.get("note", "")))
            for d in hook(quick=quick, rounds=rounds)]


def step_rows(quick: bool, rounds: int, page_sizes: Sequence[int],
              methods: list[Any] | None = None) -> list[Row]:
    """The step rows; ``methods`` gets their per-method breakdown
    (:class:`tools.bench.sglang_step.MethodRow`)."""
    from tools.bench.sglang_step import step_rows as rows

    out: list[Row] = rows(quick=quick, rounds=rounds, page_sizes=page_sizes, make_row=make_row,
                skipped_row=skipped_row, goal=GOALS["step"], methods=methods)
    return out


# ---------------------------------------------------------------------------- report
def _fmt(x: float, width: int, prec: int = 1, suffix: str = "") -> str:
    return f"{'-':>{width}}" if math.isnan(x) else f"{x:>{width - len(suffix)}.{prec}f}{suffix}"


def print_rows(rows: Sequence[Row]) -> None:
    hdr = (f"{'section':<9} {'row':<50} {'ours us':>10} {'sglang us':>10} {'ours/sgl':>9} "
           f"{'spread':>7} {'goal':>6}  verdict")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        goal = f"<={r.goal:g}" if r.goal is not None else ""
        line = (f"{r.section:<9} {r.name:<50} {_fmt(r.ours_us, 10)} {_fmt(r.sglang_us, 10)} "
                f"{_fmt(r.ratio, 9, 2, 'x')} {_fmt(r.spread * 100, 7, 0, '%')} {goal:>6}  "
                f"{r.verdict}")
        if r.rounds == 0:
            line += f"  {r.note}"
        print(line)


def plot_rows(rows: Sequence[Row], path: Path) -> Path | None:
    """Horizontal bars of ours / SGLang per row (log scale), repeat range as error bars, goals
    as ticks; ``None`` when matplotlib is not installed."""
    try:
        import matplotlib
        import matplotlib.ticker

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    shown = [r for r in rows if r.rounds > 0 and not math.isnan(r.ratio) and r.ratio > 0]
    if not shown:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(shown) + 1.5))
    ys = list(range(len(shown)))[::-1]
    colors = {"allocator": "tab:blue", "pool": "tab:orange", "step": "tab:green",
              "storage": "tab:purple"}
    ax.barh(ys, [r.ratio for r in shown], color=[colors.get(r.section, "gray") for r in shown],
            xerr=[[r.ratio - r.ratio_min for r in shown], [r.ratio_max - r.ratio for r in shown]],
            capsize=2)
    for y, r in zip(ys, shown):
        if r.goal is not None:
            ax.plot([r.goal, r.goal], [y - 0.4, y + 0.4], color="red", lw=1.5)
    ax.axvline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xscale("log")
    lo = min(*(r.ratio_min for r in shown), 0.25)
    hi = max(*(r.ratio_max for r in shown), 2.0)
    ticks = [t for t in (0.0625, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0) if lo <= t <= hi]
    ax.set_xlim(lo / 1.2, hi * 1.2)
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{t:g}x" for t in ticks])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{r.section}: {r.name}" for r in shown], fontsize=7)
    ax.set_xlabel("ours / SGLang 0.5.23 (lower is faster; bars: repeat range; red: goal)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _json_row(row: Row) -> dict[str, Any]:
    """The row as strict JSON: a figure that could not be measured is ``null``, not NaN."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in asdict(row).items()}


def wheel_present() -> bool:
    """The SGLang tree is on disk already (or ``$SGLANG_WHEEL`` names a wheel): no download."""
    from tools.sglang_ref._wheel import VERSION, cache_dir

    if os.environ.get("SGLANG_WHEEL"):
        return True
    return (cache_dir() / f"sglang-{VERSION}" / ".complete").exists()


def _machine() -> dict[str, Any]:
    return {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "python": platform.python_version(),
            "torch_threads": torch.get_num_threads(), "platform": platform.platform()}


SECTIONS = ("allocator", "pool", "step", "storage")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m tools.bench.sglang",
                           description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--json", metavar="PATH", help="write the rows as JSON (plot beside it)")
    parser.add_argument("--rounds", type=int, default=None, help="repeats per row (default 5; "
                        "quick 2)")
    parser.add_argument("--requests", type=int, default=None, help="trace requests")
    parser.add_argument("--page-sizes", default="1,16,64")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--if-available", action="store_true",
                        help="skip (exit 0, JSON says skipped) when the wheel is not on disk")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        parser.error(f"--sections must be among {list(SECTIONS)}, got {bad}")
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 5)
    if rounds < 1:
        parser.error(f"--rounds must be >= 1, got {rounds}")
    page_sizes = [int(p) for p in args.page_sizes.split(",") if p]
    if args.if_available and not wheel_present():
        from tools.sglang_ref import HOW_TO_GET

        print(f"sglang: skipped (the SGLang wheel is not on disk). {HOW_TO_GET}")
        if args.json:
            Path(args.json).write_text(json.dumps({"skipped": HOW_TO_GET}, indent=2))
        return 0
    from tools.sglang_ref import load

    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SGLang's import-time "only CUDA supports X" notes
        sgl_mp, sgl_alloc = load("sglang.srt.mem_cache.memory_pool",
                                 "sglang.srt.mem_cache.allocator")
    if args.quick:
        cfg = TraceConfig(num_requests=40, running=8, capacity=1 << 15)
    else:
        cfg = TraceConfig(num_requests=400, running=64, capacity=1 << 18)
    if args.requests is not None:
        cfg = replace(cfg, num_requests=args.requests)
    calls = 50 if args.quick else 300
    rows: list[Row] = []
    t0 = time.perf_counter()
    if "allocator" in sections:
        rows += allocator_rows(sgl_alloc, cfg, page_sizes, rounds)
    if "pool" in sections:
        rows += pool_rows(sgl_mp, rounds, calls, args.quick)
    methods: list[Any] = []
    if "step" in sections:
        rows += step_rows(args.quick, rounds, page_sizes, methods)
    if "storage" in sections:
        rows += storage_rows(args.quick, rounds)
    seconds = time.perf_counter() - t0
    machine = _machine()
    print(f"ours / SGLang 0.5.23 (same process, alternating order, medians of {rounds} rounds); "
          f"trace {cfg.num_requests} requests ~{cfg.running} running; {machine['processor']}, "
          f"{machine['cpus']} CPUs, torch {machine['torch']}, 1 thread; {seconds:.1f} s")
    print_rows(rows)
    goals = [r for r in rows if r.goal is not None]
    if goals:
        print("\ngoals (ours / SGLang, this run):")
        for r in goals:
            print(f"  {r.section}/{r.name}: {r.ratio:.2f}x (rounds {r.ratio_min:.2f}.."
                  f"{r.ratio_max:.2f}) vs <= {r.goal:g}: {r.verdict}")
    if methods:
        from tools.bench.sglang_step import method_table

        print("\nstep: where the memory-layer microseconds go, per method of the allocator and "
              "the req pool (outermost calls; medians over the rounds)")
        print(method_table(methods))
    noisy = [r for r in rows if "noise" in r.verdict]
    print(f"\nnoise: {len(noisy)} of {len(rows)} rows have a repeat spread > "
          f"{NOISE_SPREAD:.0%} (ratios of those rows are not a verdict)")
    if args.json:
        path = Path(args.json)
        data = {"machine": machine, "rounds": rounds, "noise_spread": NOISE_SPREAD,
                "config": {"trace": asdict(cfg), "calls_per_round": calls,
                           "page_sizes": page_sizes, "sections": sections, "quick": args.quick},
                "seconds": seconds, "rows": [_json_row(r) for r in rows],
                "step_methods": [m.as_json() for m in methods]}
        path.write_text(json.dumps(data, indent=2, allow_nan=False))
        if not args.no_plot:
            png = plot_rows(rows, path.with_suffix(".png"))
            print(f"plot: {png}" if png else "plot: skipped (matplotlib is not installed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
