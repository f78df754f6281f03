"""API parity with SGLang 0.5.23: every public member of every class we mirror, read from SGLang.

``python3 tools/dev parity`` (or ``python -m tools.sglang_ref.parity``) reads SGLang's classes
from the wheel's source with ``ast`` (nothing of SGLang is imported), lists their public methods,
properties and attributes (inherited ones included), and checks that our class of the same name has
each one, of a compatible kind and signature:

* every positional parameter of SGLang's at the same position with the same name (ours may add
  optional parameters after them, or take ``*args`` from that position on);
* every keyword-only parameter of SGLang's by name (or ours takes ``**kwargs``);
* a parameter that is optional in SGLang's is optional in ours; a parameter ours adds is optional;
* SGLang's ``*args`` is matched by ours, except where SGLang's takes only ``*args, **kwargs`` (a
  base-class placeholder: any signature of ours stands in).

A member may be absent or differ only through a row of :data:`tools.sglang_ref.parity_exceptions.
EXCEPTIONS`, each with its reason, or as a *known gap* (:data:`tools.sglang_ref.gaps.GAPS`: work
owed, tracked by an open issue, printed in its own column). Both tables are reviewed like code: a
row that no longer excuses anything is itself an error. Prints coverage per class; ``--json FILE``
writes it; exits 1 when a member is missing or incompatible, 2 on bad flags.
"""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools.cli import OneLineParser
from tools.sglang_ref._surface import Member, SourceTree, our_surface
from tools.sglang_ref._wheel import VERSION, WheelUnavailable, ensure_wheel
from tools.sglang_ref.gaps import GAPS
from tools.sglang_ref.parity_exceptions import EXCEPTIONS

_MP = "sglang.srt.mem_cache"
# our "module:Class" -> SGLang "module:Class"
CLASSES: dict[str, str] = {
    "mem_cache_pool:KVCache": f"{_MP}.memory_pool:KVCache",
    "mem_cache_pool:KVWriteLoc": f"{_MP}.memory_pool:KVWriteLoc",
    "mem_cache_pool:MHATokenToKVPool": f"{_MP}.memory_pool:MHATokenToKVPool",
    "mem_cache_pool:MLATokenToKVPool": f"{_MP}.memory_pool:MLATokenToKVPool",
    "mem_cache_pool:ReqToTokenPool": f"{_MP}.memory_pool:ReqToTokenPool",
    "mem_cache_pool:BaseSWAKVPool": f"{_MP}.base_swa_memory_pool:BaseSWAKVPool",
    "mem_cache_pool:SWAKVPool": f"{_MP}.swa_memory_pool:SWAKVPool",
    "mem_cache_pool:DSATokenToKVPool": f"{_MP}.memory_pool:DSATokenToKVPool",
    "mem_cache_pool:HiSparseDSATokenToKVPool":
        f"{_MP}.hisparse_memory_pool:HiSparseDSATokenToKVPool",
    "mem_cache_pool.deepseek_v4:DeepSeekV4TokenToKVPool":
        f"{_MP}.deepseek_v4_memory_pool:DeepSeekV4TokenToKVPool",
    "mem_cache_allocator:BaseTokenToKVPoolAllocator":
        f"{_MP}.allocator.base:BaseTokenToKVPoolAllocator",
    "mem_cache_allocator:TokenToKVPoolAllocator": f"{_MP}.allocator.token:TokenToKVPoolAllocator",
    "mem_cache_allocator:PagedTokenToKVPoolAllocator":
        f"{_MP}.allocator.paged:PagedTokenToKVPoolAllocator",
    "mem_cache_allocator.swa:SWATokenToKVPoolAllocator":
        f"{_MP}.allocator.swa:SWATokenToKVPoolAllocator",
    "mem_cache_allocator.hisparse:HiSparseTokenToKVPoolAllocator":
        f"{_MP}.allocator.hisparse:HiSparseTokenToKVPoolAllocator",
    "mem_cache_allocator.deepseek_v4_hisparse:DeepSeekV4HiSparseTokenToKVPoolAllocator":
        f"{_MP}.allocator.hisparse:DeepSeekV4HiSparseTokenToKVPoolAllocator",
    "mem_cache_allocator.mamba:MambaSlotAllocator": f"{_MP}.allocator.mamba:MambaSlotAllocator",
    "mem_cache_pool:MambaPool": f"{_MP}.memory_pool:MambaPool",
    "mem_cache_pool:HybridReqToTokenPool": f"{_MP}.memory_pool:HybridReqToTokenPool",
    "mem_cache_pool:HybridLinearKVPool": f"{_MP}.memory_pool:HybridLinearKVPool",
    "mem_cache_pool_host:MambaPoolHost": f"{_MP}.pool_host.mamba:MambaPoolHost",
    "mem_cache_pool_host:HostKVCache": f"{_MP}.pool_host.base:HostKVCache",
    "mem_cache_pool_host:MHATokenToKVPoolHost": f"{_MP}.pool_host.mha:MHATokenToKVPoolHost",
    "mem_cache_pool_host:MLATokenToKVPoolHost": f"{_MP}.pool_host.mla:MLATokenToKVPoolHost",
    "mem_cache_pool_host:HostTensorAllocator": f"{_MP}.pool_host.common:HostTensorAllocator",
    "mem_cache_storage:HiCacheStorage": f"{_MP}.hicache_storage:HiCacheStorage",
    "mem_cache_storage:HiCacheFile": f"{_MP}.hicache_storage:HiCacheFile",
    "mem_cache_storage:HiCacheStorageConfig": f"{_MP}.hicache_storage:HiCacheStorageConfig",
    "mem_cache_storage:HiCacheStorageExtraInfo": f"{_MP}.hicache_storage:HiCacheStorageExtraInfo",
    "mem_cache_storage:StorageBackendFactory":
        f"{_MP}.storage.backend_factory:StorageBackendFactory",
}


@dataclass
class ClassReport:
    """Parity of one class: SGLang's member count and what of it is covered, excepted, wrong."""

    ours: str
    sglang: str
    members: int = 0
    covered: list[str] = field(default_factory=list)
    excepted: dict[str, str] = field(default_factory=dict)
    gaps: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    incompatible: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.incompatible


def signature_problem(theirs: Member, ours: Member) -> str | None:
    """Why ``ours`` cannot stand in for ``theirs`` (None when it can); see the module docstring."""
    if theirs.kind == "method":
        if ours.kind == "property":
            return "SGLang's is a method, ours a property"
        if ours.kind == "attribute":
            return None  # a callable stored on the instance; its signature is not inspectable
    elif ours.kind == "method":
        return f"SGLang's is a {theirs.kind}, ours a method"
    if theirs.kind != "method" or ours.kind != "method":
        return None
    kinds = {p.kind for p in theirs.params}
    if kinds and kinds <= {"var_positional", "var_keyword"}:
        return None  # SGLang's is a placeholder taking anything (a base-class stub)
    ours_pos = [p for p in ours.params if p.kind == "positional"]
    ours_names = {p.name: p for p in ours.params}
    ours_varpos = any(p.kind == "var_positional" for p in ours.params)
    ours_varkw = any(p.kind == "var_keyword" for p in ours.params)
    their_names = {p.name for p in theirs.params}
    theirs_pos = [p for p in theirs.params if p.kind == "positional"]
    for i, p in enumerate(theirs_pos):
        if i < len(ours_pos):
            if ours_pos[i].name != p.name:
                return f"positional parameter {i + 1} is {ours_pos[i].name!r}, SGLang's {p.name!r}"
            if p.has_default and not ours_pos[i].has_default:
                return f"{p.name!r} is optional in SGLang's, required in ours"
        elif not ours_varpos:
            return f"SGLang's positional parameter {p.name!r} is missing"
    for p in theirs.params:
        if p.kind == "keyword":
            mine = ours_names.get(p.name)
            if mine is None and not ours_varkw:
                return f"SGLang's keyword {p.name!r} is missing"
            if mine is not None and p.has_default and not mine.has_default:
                return f"{p.name!r} is optional in SGLang's, required in ours"
        elif p.kind == "var_positional" and not ours_varpos:
            return f"SGLang's takes *{p.name}, ours does not"
    for p in ours.params:
        if p.name not in their_names and not p.has_default:
            return f"ours requires {p.name!r}, which SGLang's callers do not pass"
    return None


def _resolve(spec: str) -> type:
    module, _, name = spec.partition(":")
    obj = getattr(importlib.import_module(module), name)
    if not isinstance(obj, type):
        raise TypeError(f"{spec} is not a class")
    return obj


def check(root: Path | None = None) -> list[ClassReport]:
    """Compare every class of :data:`CLASSES`; ``root`` is the folder holding ``sglang/``."""
    tree = SourceTree(root if root is not None else ensure_wheel())
    reports: list[ClassReport] = []
    used: set[tuple[str, str]] = set()
    for ours_spec, their_spec in CLASSES.items():
        cls_name = ours_spec.partition(":")[2]
        module, _, name = their_spec.partition(":")
        theirs = tree.surface(module, name)
        mine = our_surface(_resolve(ours_spec))
        report = ClassReport(ours_spec, their_spec, members=len(theirs))
        for member_name in sorted(theirs):
            member = theirs[member_name]
            key = (cls_name, member_name)
            problem = None if member_name in mine else "missing"
            if problem is None:
                problem = signature_problem(member, mine[member_name])
            if problem is None:
                report.covered.append(member_name)
            elif key in EXCEPTIONS or (cls_name, "*") in EXCEPTIONS:
                used.add(key if key in EXCEPTIONS else (cls_name, "*"))
                report.excepted[member_name] = EXCEPTIONS.get(key) or EXCEPTIONS[(cls_name, "*")]
            elif key in GAPS:
                used.add(key)
                report.gaps[member_name] = f"{problem}: {GAPS[key]}"
            elif problem == "missing":
                report.missing.append(member_name)
            else:
                report.incompatible[member_name] = problem
        reports.append(report)
    stale = sorted((set(EXCEPTIONS) | set(GAPS)) - used)
    if stale:
        reports.append(ClassReport("parity_exceptions", "(the tables)", members=len(stale),
                                   incompatible={f"{c}.{m}": "exception or gap row excuses "
                                                 "nothing (delete it)" for c, m in stale}))
    return reports


def render(reports: list[ClassReport]) -> str:
    lines = [f"API parity with SGLang {VERSION} (members read from its source with ast)",
             f"{'class':<44} {'SGLang':>6} {'covered':>7} {'excepted':>8} {'gap':>4} "
             f"{'missing':>7} {'wrong':>5}"]
    for r in reports:
        lines.append(f"{r.ours.split(':')[-1]:<44} {r.members:>6} {len(r.covered):>7} "
                     f"{len(r.excepted):>8} {len(r.gaps):>4} {len(r.missing):>7} "
                     f"{len(r.incompatible):>5}")
    total = sum(r.members for r in reports if r.ours != "parity_exceptions")
    covered = sum(len(r.covered) for r in reports)
    excepted = sum(len(r.excepted) for r in reports)
    gaps = sum(len(r.gaps) for r in reports)
    lines.append(f"{'total':<44} {total:>6} {covered:>7} {excepted:>8} {gaps:>4} "
                 f"{sum(len(r.missing) for r in reports):>7} "
                 f"{sum(len(r.incompatible) for r in reports):>5}")
    for r in reports:
        if r.gaps:
            lines.append(f"  GAP     {r.ours.split(':')[-1]}: {len(r.gaps)} members owed "
                         f"(tools/sglang_ref/gaps.py)")
        for m in r.missing:
            lines.append(f"  MISSING {r.ours.split(':')[-1]}.{m}")
        for m, why in r.incompatible.items():
            lines.append(f"  WRONG   {r.ours.split(':')[-1]}.{m}: {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="tools/dev parity", description=__doc__.split("\n")[0])
    parser.add_argument("--json", metavar="FILE", help="also write the per-class report as JSON")
    parser.add_argument("--class", dest="only", metavar="NAME", action="append",
                        help="report only these of our classes (repeatable)")
    args = parser.parse_args(argv)
    if args.json is not None and not Path(args.json).parent.is_dir():
        parser.error(f"--json: folder of {args.json!r} does not exist")
    try:
        reports = check()
    except WheelUnavailable as exc:
        print(f"parity: {exc}", file=sys.stderr)
        return 1
    if args.only:
        reports = [r for r in reports if r.ours.split(":")[-1] in args.only]
    print(render(reports))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in reports], indent=1) + "\n")
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    raise SystemExit(main())
