"""Soak: millions of random allocator operations, misuse mixed in, invariants after every one.

Per allocator class (token, paged 16, paged 64, SWA, HiSparse, Mamba slots), a seeded random
driver plays an engine: new requests (``alloc_extend`` from an empty prefix), continued requests
(``alloc_extend`` from the request's last slot), decode batches (``alloc_decode``), plain
``alloc``, frees of whole requests (inside free groups or not), backup/restore round trips and,
for Mamba, alloc groups. Every allocator runs in debug mode (``debug=True``) and a share of the
operations are *misuse*: double frees, frees of the padding page, of never-allocated, out-of-range
or -1 slots, of half a live page, lists and float tensors instead of index tensors, inconsistent
``alloc_extend`` / ``alloc_decode`` inputs (prefix > seq, ``last_loc = -1`` with a prefix,
``seq_lens`` != ``seq_lens_cpu``, ``seq_lens == 0``). A misuse must raise ``ValueError`` /
``TypeError`` and change nothing.

After **every** operation the driver checks, against its own model of who owns what:

* conservation: on every side of the allocator (full/SWA, logical/device), ``available`` equals
  the capacity minus the pages the model holds;
* no double hand-out: every page an allocation returns is free in the model (or the request's
  own current page), never the padding page, never past the capacity.

The first violation stops that class's run and is reported with the operation number and what
was seen. Output: a table (+ ``--json PATH``). ``python -m tools.bench.soak [--ops N] [--seed S]
[--classes token,paged16,...]``; the default is 10^6 operations per class (several minutes);
CI runs ``--ops 10000`` (tests/test_soak.py).
"""

from __future__ import annotations

import json
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from tools.cli import OneLineParser

__all__ = ["CLASSES", "SoakResult", "main", "soak"]

F16 = torch.float16
I64 = torch.int64
MISUSE_RATE = 0.05
MAX_REQS = 48


class InvariantError(AssertionError):
    """An invariant of the allocator (conservation, no double hand-out, misuse) did not hold."""


@dataclass(slots=True)
class SoakResult:
    """Figures of one class's run."""

    name: str
    ops: int = 0
    allocs: int = 0
    shortages: int = 0
    frees: int = 0
    restores: int = 0
    misuse: int = 0
    misuse_rejected: int = 0
    checks: int = 0
    seconds: float = 0.0
    failure: str = ""
    misuse_kinds: dict[str, int] = field(default_factory=dict)
    # misuse kinds that were not rejected with ValueError/TypeError: kind -> first example
    misuse_missed: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failure and self.misuse == self.misuse_rejected

    def record_misuse(
        self, kind: str, call: Callable[[], object], state: Callable[[], object]
    ) -> None:
        """Run one misuse ``call``: it must raise ValueError/TypeError and leave ``state()``
        unchanged. A misuse that is accepted (or raises another type) without changing the
        state is recorded in ``misuse_missed`` and the run goes on; one that changes the state
        raises :class:`InvariantError` (the model no longer matches the allocator)."""
        self.misuse += 1
        self.misuse_kinds[kind] = self.misuse_kinds.get(kind, 0) + 1
        before = state()
        try:
            got = call()
        except (ValueError, TypeError):
            self.misuse_rejected += 1
            outcome = ""
        except Exception as exc:  # the wrong type: a finding, reported with its message
            outcome = f"raised {type(exc).__name__}: {exc}"
        else:
            outcome = f"accepted (returned {got!r})"
        if state() != before:
            raise InvariantError(
                f"misuse {kind!r} {outcome or 'raised'} and changed the allocator's state"
            )
        if outcome:
            self.misuse_missed.setdefault(kind, outcome[:200])


def _t(values: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(values), dtype=I64)


@dataclass(slots=True)
class Side:
    """One allocation side: its free-token count, capacity and the map from handed-out slots to
    this side's slots (``<= 0``: none)."""

    name: str
    available: Callable[[], int]
    translate: Callable[[torch.Tensor], torch.Tensor]
    capacity: int = 0


# ------------------------------------------------------------------------ allocator factories
def _token() -> tuple[Any, list[Side], int]:
    from mem_cache_allocator import TokenToKVPoolAllocator

    a = TokenToKVPoolAllocator(2048, F16, "cpu", None, debug=True)
    return a, [Side("full", a.available_size, lambda s: s)], 1


def _paged(ps: int, size: int) -> Callable[[], tuple[Any, list[Side], int]]:
    def make() -> tuple[Any, list[Side], int]:
        from mem_cache_allocator import PagedTokenToKVPoolAllocator

        a = PagedTokenToKVPoolAllocator(size, ps, F16, "cpu", None, debug=True)
        return a, [Side("full", a.available_size, lambda s: s)], ps

    return make


def _swa() -> tuple[Any, list[Side], int]:
    from mem_cache_allocator import SWATokenToKVPoolAllocator
    from mem_cache_pool.swa import SWAKVPool

    ps = 16
    pool = SWAKVPool(2048, 1024, ps, F16, 1, 8, [0], [1], "cpu")
    a = SWATokenToKVPoolAllocator(2048, 1024, ps, F16, "cpu", pool, debug=True)
    return (
        a,
        [
            Side("full", a.full_available_size, lambda s: s),
            Side("swa", a.swa_available_size, a.translate_loc_from_full_to_swa),
        ],
        ps,
    )


def _hisparse() -> tuple[Any, list[Side], int]:
    from mem_cache_allocator import HiSparseTokenToKVPoolAllocator

    ps = 16
    a = HiSparseTokenToKVPoolAllocator(
        1024, ps, F16, "cpu", None, host_to_device_ratio=2, debug=True
    )
    mapping = a.full_to_hisparse_device_index_mapping
    return (
        a,
        [
            Side("logical", a.logical_attn_allocator.available_size, lambda s: s),
            Side("device", a.hisparse_attn_allocator.available_size, lambda s: mapping[s]),
        ],
        ps,
    )


PAGED_CLASSES: dict[str, Callable[[], tuple[Any, list[Side], int]]] = {
    "token": _token,
    "paged16": _paged(16, 4096),
    "paged64": _paged(64, 8192),
    "swa": _swa,
    "hisparse": _hisparse,
}
CLASSES = (*PAGED_CLASSES, "mamba")


# ------------------------------------------------------------------------ token/paged driver
class PagedDriver:
    """Drives a ``BaseTokenToKVPoolAllocator`` and mirrors its ownership per side."""

    def __init__(self, name: str, seed: int, result: SoakResult) -> None:
        self.a, self.sides, self.ps = PAGED_CLASSES[name]()
        for side in self.sides:
            side.capacity = side.available()
        self.rng = random.Random(seed)
        self.r = result
        self.reqs: dict[int, list[int]] = {}  # request -> its slots (positions in order)
        self.owner: list[dict[int, int]] = [{} for _ in self.sides]  # side -> page -> request
        self.req_pages: dict[int, list[set[int]]] = {}  # request -> per side, its pages
        self.next_req = 1
        self.freed: list[list[int]] = []  # slots of recently freed requests (for double frees)
        self.hisparse = name == "hisparse"
        # HiSparse: requests whose last slot is logical-only (decode); a device-side extend
        # cannot continue them (the coordinator would assign device slots first)
        self.logical_tail: set[int] = set()

    # ---------------------------------------------------------------- model
    def _adopt(self, req: int, slots: torch.Tensor, op: str) -> None:
        """Record newly handed-out ``slots`` of ``req``; raise on a double hand-out."""
        values = slots.tolist()
        if any(s <= 0 for s in values):
            raise InvariantError(f"{op}: handed out a padding or negative slot: {values}")
        pages = self.req_pages.setdefault(req, [set() for _ in self.sides])
        for i, side in enumerate(self.sides):
            mapped = side.translate(slots).tolist()
            for s in mapped:
                if s <= 0:
                    if i == 0:
                        raise InvariantError(f"{op}: side {side.name} slot {s}")
                    continue  # HiSparse logical-only slots have no device slot yet
                p = s // self.ps
                if p * self.ps >= side.capacity + self.ps:
                    raise InvariantError(f"{op}: {side.name} slot {s} past the capacity")
                held = self.owner[i].get(p)
                if held is None:
                    self.owner[i][p] = req
                    pages[i].add(p)
                elif held != req:
                    raise InvariantError(
                        f"{op}: {side.name} page {p} handed to request {req} while request "
                        f"{held} holds it (double hand-out)"
                    )
        self.reqs.setdefault(req, []).extend(values)

    def _drop(self, req: int) -> None:
        for i, pages in enumerate(self.req_pages.pop(req, [])):
            for p in pages:
                del self.owner[i][p]
        self.logical_tail.discard(req)
        self.freed.append(self.reqs.pop(req))
        del self.freed[:-8]

    def check(self, op: str) -> None:
        self.r.checks += 1
        for i, side in enumerate(self.sides):
            want = side.capacity - len(self.owner[i]) * self.ps
            got = side.available()
            if got != want:
                raise InvariantError(
                    f"{op}: conservation broken on side {side.name}: available {got}, "
                    f"expected {want} (capacity {side.capacity}, {len(self.owner[i])} pages held)"
                )

    def _snapshot(self) -> tuple[int, ...]:
        return tuple(side.available() for side in self.sides)

    # ---------------------------------------------------------------- operations
    def step(self) -> str:
        rng = self.rng
        if rng.random() < MISUSE_RATE:
            return self.misuse()
        x = rng.random()
        if not self.reqs or (x < 0.25 and len(self.reqs) < MAX_REQS):
            return self.extend(new=rng.randint(1, 3), cont=0)
        if x < 0.45:
            return self.extend(new=rng.randint(0, 1), cont=rng.randint(1, 3))
        if x < 0.70:
            return self.decode()
        if x < 0.75 and not self.hisparse:
            return self.alloc()
        if x < 0.95:
            return self.free(grouped=rng.random() < 0.5)
        return self.backup_restore()

    def _batch(self, new: int, cont: int) -> tuple[list[int], list[int], list[int], list[int]]:
        rng = self.rng
        live = [r for r in self.reqs if self.reqs[r] and r not in self.logical_tail]
        picks = rng.sample(live, min(cont, len(live)))
        reqs, pre, seq, last = [], [], [], []
        for r in picks:
            n = len(self.reqs[r])
            reqs.append(r)
            pre.append(n)
            seq.append(n + rng.randint(1, 40))
            last.append(self.reqs[r][-1])
        for _ in range(new):
            reqs.append(self.next_req)
            self.next_req += 1
            pre.append(0)
            seq.append(rng.randint(1, 80))
            last.append(-1)
        return reqs, pre, seq, last

    def extend(self, new: int, cont: int, *, allow_free: bool = True) -> str:
        reqs, pre, seq, last = self._batch(new, cont)
        if not reqs:
            return "extend (empty)"
        before = self._snapshot()
        out = self.a.alloc_extend(_t(pre), _t(pre), _t(seq), _t(seq), _t(last), sum(seq) - sum(pre))
        if out is None:
            self.r.shortages += 1
            if self._snapshot() != before:
                raise InvariantError("alloc_extend returned None but changed available sizes")
            return self.free(grouped=False) if self.reqs and allow_free else "extend (short)"
        self.r.allocs += 1
        if out.numel() != sum(seq) - sum(pre):
            raise InvariantError(f"alloc_extend returned {out.numel()} slots")
        off = 0
        for r, p, q in zip(reqs, pre, seq):
            self._adopt(r, out[off : off + q - p], "alloc_extend")
            off += q - p
        return "alloc_extend"

    def decode(self) -> str:
        live = [r for r in self.reqs if self.reqs[r]]
        picks = self.rng.sample(live, min(self.rng.randint(1, 8), len(live)))
        seq = [len(self.reqs[r]) + 1 for r in picks]
        last = [self.reqs[r][-1] for r in picks]
        before = self._snapshot()
        out = self.a.alloc_decode(_t(seq), _t(seq), _t(last))
        if out is None:
            self.r.shortages += 1
            if self._snapshot() != before:
                raise InvariantError("alloc_decode returned None but changed available sizes")
            return self.free(grouped=False)
        self.r.allocs += 1
        for i, r in enumerate(picks):
            self._adopt(r, out[i : i + 1], "alloc_decode")
            if self.hisparse:
                self.logical_tail.add(r)
        return "alloc_decode"

    def alloc(self) -> str:
        n = self.rng.randint(1, 4) * self.ps
        before = self._snapshot()
        out = self.a.alloc(n)
        if out is None:
            self.r.shortages += 1
            if self._snapshot() != before:
                raise InvariantError("alloc returned None but changed available sizes")
            return "alloc (short)"
        self.r.allocs += 1
        # each page of a plain alloc is its own "request" (freed whole later)
        for k in range(0, n, self.ps):
            req = self.next_req
            self.next_req += 1
            self._adopt(req, out[k : k + self.ps], "alloc")
        return "alloc"

    def free(self, grouped: bool) -> str:
        if not self.reqs:
            return "free (none)"
        picks = self.rng.sample(list(self.reqs), min(self.rng.randint(1, 3), len(self.reqs)))
        if grouped:
            self.a.free_group_begin()
        for r in picks:
            slots = self.reqs[r]
            if slots:
                self.a.free(_t(slots))
            self._drop(r)
        if grouped:
            self.a.free_group_end()
        self.r.frees += len(picks)
        return "free_group" if grouped else "free"

    def backup_restore(self) -> str:
        """Back up, allocate a few new requests, restore: they must be gone again."""
        state = self.a.backup_state()
        first = self.next_req
        for _ in range(self.rng.randint(1, 3)):
            self.extend(new=self.rng.randint(1, 2), cont=0, allow_free=False)
        self.a.restore_state(state)
        for req in [r for r in self.reqs if r >= first]:  # undo them in the model
            for i, pages in enumerate(self.req_pages.pop(req, [])):
                for p in pages:
                    del self.owner[i][p]
            del self.reqs[req]
        self.r.restores += 1
        return "backup/restore"

    # ---------------------------------------------------------------- misuse
    def _misuse_cases(self) -> dict[str, Callable[[], object]]:
        a, ps, rng = self.a, self.ps, self.rng
        cap = self.sides[0].capacity
        cases: dict[str, Callable[[], object]] = {
            "free padding slot 0": lambda: a.free(_t([0])),
            "free -1": lambda: a.free(_t([-1])),
            "free out of range": lambda: a.free(_t([cap + 2 * ps + 1])),
            "free a list": lambda: a.free([1, 2]),
            "free float tensor": lambda: a.free(torch.tensor([1.0])),
            "extend prefix > seq": lambda: a.alloc_extend(
                _t([5]), _t([5]), _t([3]), _t([3]), _t([-1]), 0
            ),
            "extend num_tokens mismatch": lambda: a.alloc_extend(
                _t([0]), _t([0]), _t([4]), _t([4]), _t([-1]), 7
            ),
            "decode seq_lens 0": lambda: a.alloc_decode(_t([0]), _t([0]), _t([-1])),
        }
        if ps > 1:  # a token allocator (page size 1) does not use last_loc / seq_lens
            cases["extend last_loc -1 with a prefix"] = lambda: a.alloc_extend(
                _t([3]), _t([3]), _t([9]), _t([9]), _t([-1]), 6
            )
        free_pages = [p for p in range(1, cap // ps + 1) if p not in self.owner[0]]
        if free_pages:
            p = rng.choice(free_pages)
            cases["free never allocated"] = lambda: a.free(_t([p * ps]))
        if self.freed and self.freed[-1]:
            gone = self.freed[-1]
            if all(s // ps not in self.owner[0] for s in gone):
                cases["double free"] = lambda: a.free(_t(gone))
        live = [r for r in self.reqs if len(self.reqs[r]) >= 2]
        if live:
            r = rng.choice(live)
            slots = self.reqs[r]
            n = len(slots)
            if ps > 1:
                cases["decode seq_lens != seq_lens_cpu"] = lambda: a.alloc_decode(
                    _t([n + 1]), _t([n + 2]), _t([slots[-1]])
                )
            if ps > 1:
                whole = [s for s in slots if s // ps == slots[0] // ps]
                if len(whole) == ps:
                    cases["free half of a live page"] = lambda: a.free(_t(whole[: ps // 2]))
        return cases

    def misuse(self) -> str:
        cases = self._misuse_cases()
        kind = self.rng.choice(sorted(cases))
        self.r.record_misuse(kind, cases[kind], self._snapshot)
        return f"misuse: {kind}"


# ------------------------------------------------------------------------ Mamba driver
class MambaDriver:
    """Drives ``MambaSlotAllocator``: alloc, free, alloc groups, backup/restore, misuse."""

    def __init__(self, seed: int, result: SoakResult) -> None:
        from mem_cache_allocator import MambaSlotAllocator

        self.size = 512
        self.a = MambaSlotAllocator(self.size, "cpu", debug=True)
        self.rng = random.Random(seed)
        self.r = result
        self.owned: set[int] = set()
        self.freed: list[int] = []

    def check(self, op: str) -> None:
        self.r.checks += 1
        got, want = self.a.available_size(), self.size - len(self.owned)
        if got != want:
            raise InvariantError(f"{op}: conservation broken: available {got}, expected {want}")

    def _adopt(self, out: torch.Tensor, op: str) -> None:
        for s in out.tolist():
            if not 1 <= s <= self.size or s in self.owned:
                raise InvariantError(f"{op}: handed out slot {s} (owned or out of range)")
            self.owned.add(s)

    def step(self) -> str:
        rng = self.rng
        if rng.random() < MISUSE_RATE:
            return self.misuse()
        x = rng.random()
        if x < 0.4:
            out = self.a.alloc(rng.randint(1, 8))
            if out is None:
                self.r.shortages += 1
                return self.free()
            self.r.allocs += 1
            self._adopt(out, "alloc")
            return "alloc"
        if x < 0.55:
            k = rng.randint(0, 6)
            self.a.alloc_group_begin(k)
            for _ in range(rng.randint(0, k + 1)):
                out = self.a.alloc(1)
                if out is not None:
                    self._adopt(out, "group alloc")
            self.a.alloc_group_end()
            self.r.allocs += 1
            return "alloc group"
        if x < 0.95:
            return self.free()
        state = self.a.backup_state()
        owned = set(self.owned)
        out = self.a.alloc(rng.randint(1, 4))
        if out is not None:
            self._adopt(out, "alloc before restore")
        self.a.restore_state(state)
        self.owned = owned
        self.r.restores += 1
        return "backup/restore"

    def free(self) -> str:
        if not self.owned:
            return "free (none)"
        picks = self.rng.sample(sorted(self.owned), min(self.rng.randint(1, 8), len(self.owned)))
        self.a.free(_t(picks))
        self.owned.difference_update(picks)
        self.freed = picks
        self.r.frees += 1
        return "free"

    def misuse(self) -> str:
        a = self.a
        cases: dict[str, Callable[[], object]] = {
            "free slot 0": lambda: a.free(_t([0])),
            "free -1": lambda: a.free(_t([-1])),
            "free out of range": lambda: a.free(_t([self.size + 1])),
            "free float tensor": lambda: a.free(torch.tensor([1.0])),
            "free a list": lambda: a.free([1]),
            "alloc -1": lambda: a.alloc(-1),
            "alloc bool": lambda: a.alloc(True),
            "group size -1": lambda: a.alloc_group_begin(-1),
        }
        never = [s for s in range(1, self.size + 1) if s not in self.owned]
        if never:
            fresh = self.rng.choice(never)
            cases["free never allocated"] = lambda: a.free(_t([fresh]))
        gone = [s for s in self.freed if s not in self.owned]
        if gone:
            cases["double free"] = lambda: a.free(_t(gone))
        if self.owned:
            held = next(iter(self.owned))
            cases["free duplicates"] = lambda: a.free(_t([held, held]))
        kind = self.rng.choice(sorted(cases))
        self.r.record_misuse(kind, cases[kind], a.available_size)
        return f"misuse: {kind}"


# ------------------------------------------------------------------------ runner
def soak(name: str, ops: int, seed: int = 0) -> SoakResult:
    """Run ``ops`` random operations on allocator class ``name``; the first violated invariant
    (or an unexpected exception) ends the run and is recorded in ``failure``."""
    if name not in CLASSES:
        raise ValueError(f"name must be one of {CLASSES}, got {name!r}")
    result = SoakResult(name)
    driver: PagedDriver | MambaDriver
    driver = MambaDriver(seed, result) if name == "mamba" else PagedDriver(name, seed, result)
    t0 = time.perf_counter()
    op = "start"
    try:
        driver.check(op)
        for i in range(ops):
            op = f"op {i} ({driver.step()})"
            driver.check(op)
            result.ops = i + 1
    except InvariantError as exc:
        result.failure = f"op {result.ops}: {exc}"
    except Exception as exc:  # an unexpected error is a finding too, reported precisely
        result.failure = f"op {result.ops} after {op}: {type(exc).__name__}: {exc}"
    result.seconds = time.perf_counter() - t0
    return result


def _table(results: list[SoakResult]) -> str:
    head = (
        f"{'class':<10} {'ops':>9} {'allocs':>8} {'short':>6} {'frees':>8} {'restore':>7} "
        f"{'misuse':>7} {'rejected':>8} {'missed':>6} {'checks':>9} {'s':>7} {'ops/s':>8}  result"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        rate = r.ops / r.seconds if r.seconds else 0.0
        lines.append(
            f"{r.name:<10} {r.ops:>9} {r.allocs:>8} {r.shortages:>6} {r.frees:>8} "
            f"{r.restores:>7} {r.misuse:>7} {r.misuse_rejected:>8} "
            f"{r.misuse - r.misuse_rejected:>6} {r.checks:>9} "
            f"{r.seconds:>7.1f} {rate:>8.0f}  {'ok' if r.ok else 'FAIL: ' + r.failure}"
        )
    for r in results:
        for kind, outcome in sorted(r.misuse_missed.items()):
            lines.append(f"  {r.name}: misuse {kind!r} not rejected: {outcome}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m tools.bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--ops", type=int, default=1_000_000, help="operations per class")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--classes", default=",".join(CLASSES), help="comma-separated subset")
    parser.add_argument("--json", metavar="PATH", default=None)
    args = parser.parse_args(argv)
    names = [n for n in args.classes.split(",") if n]
    bad = [n for n in names if n not in CLASSES]
    if bad or args.ops < 1:
        print(f"error: classes must be among {CLASSES}, --ops >= 1 (got {bad}, {args.ops})",
              file=sys.stderr)  # fmt: skip
        return 2
    torch.set_num_threads(1)
    results = []
    for n in names:
        results.append(soak(n, args.ops, args.seed))
        print(_table(results[-1:]).splitlines()[2], file=sys.stderr, flush=True)
    print(_table(results))
    if args.json:
        doc = {
            "ops_per_class": args.ops,
            "seed": args.seed,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "results": [{**asdict(r), "ok": r.ok} for r in results],
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
