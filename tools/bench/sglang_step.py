"""One scheduler step of SGLang 0.5.23's own radix-cache path, over SGLang's classes and ours.

The workload is SGLang's code, loaded from its wheel (:func:`tools.sglang_ref.load`):
``RadixCache.match_prefix`` + ``lock`` for newly admitted requests, ``allocation.alloc_for_extend``
for their prefill, ``allocation.alloc_for_decode`` for the running batch, and
``common.release_kv_cache`` (tree checkpoint, row free, unlock) for finished requests. What is
ours on the "ours" side is exactly what SGLang's scheduler builds and hands in: the token
allocator, the KV pool and the ``ReqToTokenPool``. The radix cache is SGLang's on both sides.

SGLang's ``Req`` and ``ScheduleBatch`` are not built: the radix-loop driver
(:mod:`tools.sglang_ref.radix_loop`, shared with ``tests/sglang/test_alloc_radix_loop.py``)
carries the attributes those functions read and builds the tree, the batches and the prefix
matches; the request's KV record is SGLang's own ``ReqKvInfo``. Requests share one of a few system
prompts (so the tree hits and evicts), are prefilled whole in one extend and decode a few
tokens; both sides get the same calls, alternating which goes first on every step, and must
hand out identical slots (``RuntimeError`` otherwise).

Timed per step: the calls above (the memory layer), nothing of the batch bookkeeping.
Reported: memory-layer microseconds per step and per scheduled token (prefill + decode tokens),
and the part of it spent inside the allocator's and the ``ReqToTokenPool``'s own methods (the
classes the two sides differ in; SGLang's radix cache and glue are the same code on both).

A side whose classes lack a member SGLang's path reaches gets a row that says which one
(:func:`missing_members`), instead of failing.

Where the time goes: the same runs give, per method of the allocator and the req pool, its calls
per step and wall time per call on each side (:class:`MethodRow`; outermost calls only). Run
alone: ``python -m tools.bench.sglang_step [--quick] [--rounds N] [--page-sizes 1,16,64]
[--json PATH]`` prints the step rows and that table.
"""

from __future__ import annotations

import math
import statistics
import time
import traceback
import types
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tools.sglang_ref.radix_loop import RadixLoop, Req, build_side, load_modules

__all__ = [
    "REACHED", "MethodRow", "StepConfig", "main", "method_table", "missing_members", "step_rows",
]

# Members SGLang's step path (allocation.py, common.py, radix_cache.py) reaches on what the
# scheduler hands in, per object.
REACHED: dict[str, tuple[str, ...]] = {
    "allocator": ("alloc", "alloc_extend", "alloc_decode", "free", "free_segment",
                  "free_segments", "page_size", "device", "available_size",
                  "evict_to_free_tokens", "get_extend_allocation_demand"),
    "req_to_token_pool": ("req_to_token", "alloc", "free", "write", "alloc_aux_to_lengths",
                          "device", "available_size"),
}


# evict_to_free_tokens(tree_cache, n) runs the tree's evict (SGLang's code, the same on both
# sides); the frees that eviction makes are timed (free_segment), the tree walk is not.
_NOT_TIMED = frozenset({"evict_to_free_tokens"})


@dataclass(frozen=True, slots=True)
class StepConfig:
    num_requests: int = 200
    running: int = 32
    system_prompts: int = 4
    system_len: int = 256
    tail_median: float = 96.0
    output_median: float = 24.0
    sigma: float = 0.6
    admit_per_step: int = 4
    capacity: int = 1 << 15
    context: int = 2048
    seed: int = 0


def missing_members(allocator: Any, req_to_token_pool: Any) -> list[str]:
    """``"our X lacks member Y"`` for every member of :data:`REACHED` the objects lack."""
    out = []
    for what, obj in (("allocator", allocator), ("req_to_token_pool", req_to_token_pool)):
        for name in REACHED[what]:
            if not hasattr(obj, name):
                out.append(f"our {type(obj).__name__} lacks member {name}")
    return out


def _requests(cfg: StepConfig, kv_info: Callable[[], Any]) -> list[Req]:
    g = torch.Generator().manual_seed(cfg.seed)

    def lognormal(median: float) -> int:
        return max(1, round(median * math.exp(cfg.sigma * float(torch.randn(1, generator=g)))))

    systems = [torch.randint(1, 30000, (cfg.system_len,), generator=g).tolist()
               for _ in range(cfg.system_prompts)]
    reqs = []
    for i in range(cfg.num_requests):
        sysp = systems[int(torch.randint(0, cfg.system_prompts, (1,), generator=g))]
        tail = torch.randint(1, 30000, (min(lognormal(cfg.tail_median), cfg.context // 2),),
                             generator=g).tolist()
        out = min(lognormal(cfg.output_median), cfg.context // 4)
        reqs.append(Req(i, sysp + tail, kv_info(), max_new=out))
    return reqs


class _Side:
    """One side's pools, allocator and SGLang radix cache, and its share of the run."""

    def __init__(self, sgl: types.SimpleNamespace, allocator: Any, req_pool: Any,
                 ps: int, cfg: StepConfig) -> None:
        self.sgl, self.allocator, self.req_pool, self.ps = sgl, allocator, req_pool, ps
        self.loop = RadixLoop(sgl, allocator, req_pool, ps)
        self.tree = self.loop.tree
        self.waiting = list(reversed(_requests(cfg, sgl.sched.ReqKvInfo)))
        self.running: list[Req] = []
        self.ns = 0
        self.tokens = 0
        self.inner = [0]  # ns spent inside the allocator's and the req pool's own methods
        self.methods: dict[str, list[int]] = {}  # "allocator.free" -> [ns, calls]
        depth = [0]
        for obj, what in ((allocator, "allocator"), (req_pool, "req_to_token_pool")):
            for name in REACHED[what]:
                if name not in _NOT_TIMED and callable(getattr(obj, name, None)):
                    _time_method(obj, name, self.inner, depth,
                                 self.methods.setdefault(f"{what}.{name}", [0, 0]))


def _time_method(obj: Any, name: str, total: list[int], depth: list[int],
                 own: list[int]) -> None:
    """Shadow ``obj.name`` with a wrapper adding its wall time to ``total[0]`` and to
    ``own[0]`` (its calls to ``own[1]``), outermost calls only: a method calling another timed
    one is counted once, as itself. Both sides get the same wrappers, so their cost (well under
    a microsecond a call) is in both sides' step time."""
    bound = getattr(obj, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        if depth[0]:
            return bound(*args, **kwargs)
        depth[0] = 1
        t0 = time.perf_counter_ns()
        try:
            return bound(*args, **kwargs)
        finally:
            ns = time.perf_counter_ns() - t0
            total[0] += ns
            own[0] += ns
            own[1] += 1
            depth[0] = 0

    setattr(obj, name, timed)


def _step(side: _Side, cfg: StepConfig) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """One scheduler step on ``side``; returns (extend slots, decode slots) for the check."""
    sgl = side.sgl
    admit: list[Req] = []
    while side.waiting and len(admit) < cfg.admit_per_step and \
            len(side.running) + len(admit) < cfg.running:
        admit.append(side.waiting.pop())
    ext_out = dec_out = None
    ns = 0
    if admit:
        # bookkeeping of the batch, untimed: the keys of the matches
        keys = [sgl.radix.RadixKey(r.origin_input_ids[:-1]) for r in admit]
        t0 = time.perf_counter_ns()
        for r, key in zip(admit, keys):
            side.loop.match(r, key)
        ns += time.perf_counter_ns() - t0
        batch = side.loop.extend_batch(admit, [r.prefix_len for r in admit],
                                       [len(r.origin_input_ids) for r in admit])
        t0 = time.perf_counter_ns()
        ext_out, _, _ = sgl.allocation.alloc_for_extend(batch)
        ns += time.perf_counter_ns() - t0
        side.tokens += batch.extend_num_tokens
        for r in admit:
            r.output_ids.append(1)  # the first output token of the prefill
    if side.running:
        batch = side.loop.decode_batch(side.running,
                                       [r.kv.kv_committed_len for r in side.running])
        t0 = time.perf_counter_ns()
        dec_out = sgl.allocation.alloc_for_decode(batch, 1)
        ns += time.perf_counter_ns() - t0
        side.tokens += len(side.running)
        for r in side.running:
            r.output_ids.append(2 + len(r.output_ids) % 100)
    side.running += admit
    done = [r for r in side.running if r.finished()]
    side.running = [r for r in side.running if not r.finished()]
    t0 = time.perf_counter_ns()
    for r in done:
        sgl.common.release_kv_cache(r, side.tree, checkpoint=True)
    ns += time.perf_counter_ns() - t0
    side.ns += ns
    return ext_out, dec_out


def _sides(sgl: types.SimpleNamespace, ps: int, cfg: StepConfig) -> tuple[Any, Any]:
    """(SGLang's allocator, req pool), (ours): both built by the radix-loop driver's
    ``build_side`` (one MHA layer, bf16, need_sort on), the one place both stacks are made."""
    kw: dict[str, Any] = dict(kind="mha", page_size=ps, size=cfg.capacity, need_sort=True,
                              rows=cfg.running + 1, context=cfg.context, dtype=torch.bfloat16,
                              head_dim=8)
    s, o = build_side(sgl, ours=False, **kw), build_side(sgl, ours=True, **kw)
    return (s.allocator, s.req_to_token_pool), (o.allocator, o.req_to_token_pool)


def _run(sgl: types.SimpleNamespace, ps: int, cfg: StepConfig,
         swap: bool) -> tuple[_Side, _Side, int]:
    (a_s, r_s), (a_o, r_o) = _sides(sgl, ps, cfg)
    theirs, ours = _Side(sgl, a_s, r_s, ps, cfg), _Side(sgl, a_o, r_o, ps, cfg)
    steps = 0
    while theirs.waiting or theirs.running:
        steps += 1
        order = (ours, theirs) if (steps + swap) % 2 else (theirs, ours)
        outs = {id(s): _step(s, cfg) for s in order}
        for a, b in zip(outs[id(ours)], outs[id(theirs)]):
            if ((a is None or b is None) and a is not b) or (
                a is not None and b is not None and not torch.equal(a, b)
            ):
                raise RuntimeError(f"ours and SGLang's classes disagree at step {steps}")
    return ours, theirs, steps


def _run_alone(sgl: types.SimpleNamespace, ps: int, cfg: StepConfig) -> float:
    """SGLang's side alone (while ours cannot run): memory-layer microseconds per step."""
    (a_s, r_s), _ = _sides(sgl, ps, cfg)
    side = _Side(sgl, a_s, r_s, ps, cfg)
    steps = 0
    while side.waiting or side.running:
        steps += 1
        _step(side, cfg)
    return side.ns / 1e3 / max(1, steps)


def step_rows(*, quick: bool, rounds: int, page_sizes: Sequence[int],
              make_row: Callable[..., Any], skipped_row: Callable[..., Any],
              goal: float, methods: list[MethodRow] | None = None) -> list[Any]:
    """Rows of :mod:`tools.bench.sglang` (its ``make_row`` / ``skipped_row`` passed in);
    ``methods``: gets the per-method breakdown of the same runs (:class:`MethodRow`)."""
    cfg = StepConfig(num_requests=24, running=8, capacity=1 << 13) if quick else StepConfig()
    sgl = load_modules()
    rows = []
    for ps in page_sizes:
        (_, _), (a_o, r_o) = _sides(sgl, ps, cfg)
        missing = missing_members(a_o, r_o)
        if missing:
            reason = "not comparable yet: " + "; ".join(missing)
            alone = [_run_alone(sgl, ps, cfg) for _ in range(rounds)]
            rows.append(skipped_row("step", f"ps={ps} memory layer per step", reason,
                                    sglang_us=statistics.median(alone)))
            continue
        per_step: tuple[list[float], list[float]] = ([], [])
        per_tok: tuple[list[float], list[float]] = ([], [])
        inner: tuple[list[float], list[float]] = ([], [])
        per_method: dict[str, tuple[list[float], list[float], list[float]]] = {}
        steps = 0
        try:
            for r in range(rounds):
                ours, theirs, steps = _run(sgl, ps, cfg, swap=bool(r % 2))
                for i, side in enumerate((ours, theirs)):
                    per_step[i].append(side.ns / 1e3 / steps)
                    per_tok[i].append(side.ns / 1e3 / max(1, side.tokens))
                    inner[i].append(side.inner[0] / 1e3 / steps)
                _add_methods(per_method, ours, theirs, steps)
        except Exception as exc:  # reported in the row; the run goes on
            where = traceback.extract_tb(exc.__traceback__)[-1]
            reason = (f"not comparable yet: {type(exc).__name__}: {exc} (at "
                      f"{Path(where.filename).name}:{where.lineno} {where.name})")
            rows.append(skipped_row("step", f"ps={ps} memory layer per step", reason))
            continue
        rows.append(make_row("step", f"ps={ps} memory layer per step", *per_step, goal=goal,
                             note=f"{steps} steps", steps=steps))
        rows.append(make_row("step", f"ps={ps} memory layer per scheduled token", *per_tok))
        rows.append(make_row("step", f"ps={ps} inside allocator + req pool, per step", *inner,
                             goal=goal, note="the classes' own methods only (SGLang's radix "
                             "cache and allocation glue, the same code on both sides, excluded)"))
        if methods is not None:
            methods += _method_summary(ps, per_method)
    return rows


@dataclass(frozen=True, slots=True)
class MethodRow:
    """One method's share of the step on both sides (medians over the rounds)."""

    page_size: int
    method: str
    calls_per_step: float
    ours_us: float  # per call
    sglang_us: float
    ours_us_per_step: float
    sglang_us_per_step: float

    @property
    def ratio(self) -> float:
        return self.ours_us / self.sglang_us if self.sglang_us else math.inf

    def as_json(self) -> dict[str, Any]:
        """The fields and the ratio as strict JSON (a ratio that cannot be taken: ``null``)."""
        ratio = self.ratio
        return asdict(self) | {"ratio": ratio if math.isfinite(ratio) else None}


def _add_methods(per: dict[str, tuple[list[float], list[float], list[float]]],
                 ours: _Side, theirs: _Side, steps: int) -> None:
    """One run's per-method figures into ``per``: name -> (ours us/call, SGLang us/call,
    calls/step) lists."""
    for name, (ns, calls) in ours.methods.items():
        s_ns, s_calls = theirs.methods.get(name, [0, 0])
        if calls == 0 and s_calls == 0:
            continue
        o_us, s_us, cps = per.setdefault(name, ([], [], []))
        o_us.append(ns / 1e3 / max(1, calls))
        s_us.append(s_ns / 1e3 / max(1, s_calls))
        cps.append(calls / steps)


def _method_summary(
    ps: int, per: dict[str, tuple[list[float], list[float], list[float]]]
) -> list[MethodRow]:
    out = []
    for name, (o_us, s_us, cps) in sorted(per.items()):
        o, s, c = statistics.median(o_us), statistics.median(s_us), statistics.median(cps)
        out.append(MethodRow(ps, name, c, o, s, o * c, s * c))
    return out


def method_table(rows: Sequence[MethodRow]) -> str:
    """The per-method breakdown as a text table."""
    head = (f"{'ps':>3}  {'method':<40} {'calls/step':>10} {'ours us':>8} {'sglang us':>9} "
            f"{'ours/sgl':>8} {'ours us/step':>12} {'sgl us/step':>11}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.page_size:>3}  {r.method:<40} {r.calls_per_step:>10.2f} "
                     f"{r.ours_us:>8.2f} {r.sglang_us:>9.2f} {r.ratio:>7.2f}x "
                     f"{r.ours_us_per_step:>12.1f} {r.sglang_us_per_step:>11.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.bench.sglang_step``: the step rows and where their time goes, per method
    (the step section of ``python -m tools.bench.sglang`` prints the same breakdown)."""
    import json

    from tools.bench.sglang import GOALS, make_row, print_rows, skipped_row
    from tools.cli import OneLineParser

    parser = OneLineParser(prog="python -m tools.bench.sglang_step",
                           description=main.__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny trace (smoke test)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per page size (default 3)")
    parser.add_argument("--page-sizes", default="1,16,64")
    parser.add_argument("--json", metavar="PATH", help="write the per-method rows as JSON")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    try:
        page_sizes = [int(p) for p in args.page_sizes.split(",") if p.strip()]
    except ValueError:
        parser.error(f"--page-sizes must be comma-separated ints, got {args.page_sizes!r}")
    if not page_sizes or min(page_sizes) < 1:
        parser.error(f"--page-sizes must be ints >= 1, got {args.page_sizes!r}")
    torch.set_num_threads(1)
    methods: list[MethodRow] = []
    rows = step_rows(quick=args.quick, rounds=args.rounds, page_sizes=page_sizes,
                     make_row=make_row, skipped_row=skipped_row, goal=GOALS["step"],
                     methods=methods)
    print_rows(rows)
    print(f"\nwhere the step's memory-layer microseconds go, per method (ours / SGLang 0.5.23, "
          f"medians of {args.rounds} alternating runs; outermost calls only)")
    print(method_table(methods))
    if args.json:
        Path(args.json).write_text(json.dumps([r.as_json() for r in methods], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
