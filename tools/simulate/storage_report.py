"""Report rows and JSON for the storage tier (L3), rendered by ``report.py``."""

from __future__ import annotations

from typing import Any

from mem_cache_storage.controller import PoolStats
from tools.simulate.config import MODELS_WITH_L3, SimConfig
from tools.simulate.stats import SimStats
from tools.simulate.storage_tier import L3Stats

__all__ = ["l3_dict", "l3_rows"]


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def l3_dict(stats: SimStats) -> dict[str, Any] | None:
    """The L3 section of the JSON report (``None`` when the run had no storage tier)."""
    s: L3Stats | None = stats.l3
    if s is None:
        return None
    c = s.controller
    return {
        "backend": s.backend, "write_policy": s.write_policy,
        "lookups": s.lookups, "hits": s.hits, "hit_tokens": s.hit_tokens,
        "hit_rate_turns": round(s.hits / stats.returning_turns, 4)
        if stats.returning_turns else 0.0,
        "hit_rate_tokens": round(s.hit_tokens / stats.reusable_tokens, 4)
        if stats.reusable_tokens else 0.0,
        "hits_after_restart": s.hits_after_restart, "load_failures": s.load_failures,
        "timeouts": s.timeouts, "restarts": s.restarts,
        "pages_loaded": c.pages_loaded, "bytes_loaded": c.bytes_loaded,
        "load_gb_per_s": round(c.load_gb_per_s, 3),
        "pages_written": c.pages_written, "pages_skipped": c.pages_skipped,
        "pages_write_failed": c.pages_write_failed, "bytes_written": c.bytes_written,
        "write_gb_per_s": round(c.write_gb_per_s, 3),
        "prefetch_p50_ms": round(s.prefetch_p50_s * 1e3, 3),
        "prefetch_p99_ms": round(s.prefetch_p99_s * 1e3, 3),
        "backend_errors": s.backend_errors, "pages_rejected": s.pages_rejected,
        "pages_evicted": s.pages_evicted, "set_refused": s.set_refused,
        "faults": dict(s.faults),
        "pools": _pools_dict(s),
    }


def _pools_dict(s: L3Stats) -> dict[str, dict[str, Any]]:
    """Per extra host pool (``--model hybrid`` / ``deepseek_v4``): its hit policy and pages /
    bytes written and read, skipped, failed, and the prefetches its part cut or lost."""
    out: dict[str, dict[str, Any]] = {}
    for name, policy in s.extra_pools.items():
        p = s.controller.pools.get(name, PoolStats())
        out[name] = {"hit_policy": policy, "pages_written": p.pages_written,
                     "bytes_written": p.bytes_written, "pages_skipped": p.pages_skipped,
                     "pages_write_failed": p.pages_write_failed,
                     "pages_loaded": p.pages_loaded, "bytes_loaded": p.bytes_loaded,
                     "part_misses": p.part_misses}
    return out


def backend_label(cfg: SimConfig) -> str:
    """The storage backend in words: ``file``, ``mooncake (local store)``, ``off (...)``."""
    if cfg.model not in MODELS_WITH_L3:
        return f"off (--model {cfg.model} has no storage tier)"
    if cfg.storage == "none":
        return "off (--storage none)"
    if cfg.storage == "mooncake":
        return f"mooncake (master {cfg.storage_master})" if cfg.storage_master \
            else "mooncake (local store)"
    return "file"


def l3_rows(stats: SimStats, cfg: SimConfig) -> list[tuple[str, str, str]]:
    """Rows (metric, value, detail) for the report table."""
    s: L3Stats | None = stats.l3
    if s is None:
        return [("L3 storage", "off", backend_label(cfg).removeprefix("off ").strip("()"))]
    c = s.controller
    faults = ", ".join(f"{k} {v}" for k, v in s.faults.items())
    where = (f"directory {s.directory}" if s.backend == "file"
             else f"master {s.directory}")
    return [
        ("L3 storage", s.backend, f"{backend_label(cfg)}; {where}; {s.write_policy}"),
        ("L3 hit rate", _pct(s.hits, stats.returning_turns),
         f"{s.hits}/{stats.returning_turns} returning turns; "
         f"{_pct(s.hit_tokens, stats.reusable_tokens)} of prefix tokens ({s.hit_tokens:,}, all "
         f"verified bit-exact on load); {s.lookups} lookups after L1/L2 misses; restarts "
         f"{s.restarts} ({s.hits_after_restart} hits after)"),
        ("L3 read (prefetch)", f"{c.load_gb_per_s:,.2f} GB/s",
         f"{c.pages_loaded:,} pages, {c.bytes_loaded / 2**20:,.1f} MiB; prefetch p50 "
         f"{s.prefetch_p50_s * 1e3:,.2f} ms, p99 {s.prefetch_p99_s * 1e3:,.2f} ms; "
         f"timeouts {s.timeouts}, failed loads {s.load_failures}"),
        ("L3 write", f"{c.write_gb_per_s:,.2f} GB/s",
         f"{s.write_policy}: {c.pages_written:,} pages, {c.bytes_written / 2**20:,.1f} MiB; "
         f"{c.pages_skipped:,} already stored; {c.pages_write_failed} failed; "
         f"{s.pages_evicted:,} evicted (LRU, capacity)"),
        ("L3 faults", f"{sum(s.faults.values()):,}",
         f"{faults}; backend errors {s.backend_errors}, corrupted/foreign pages rejected "
         f"{s.pages_rejected}; store refusals {s.set_refused} (writes the store refused, "
         "retried ones included)"),
        *_pool_rows(s),
    ]


def _pool_rows(s: L3Stats) -> list[tuple[str, str, str]]:
    rows = []
    for name, p in _pools_dict(s).items():
        rows.append((
            f"L3 pool {name}", f"{p['pages_loaded']:,} read",
            f"{p['hit_policy']}: written {p['pages_written']:,} pages "
            f"({p['bytes_written'] / 2**20:,.2f} MiB), {p['pages_skipped']:,} already stored, "
            f"{p['pages_write_failed']} failed; read {p['pages_loaded']:,} pages "
            f"({p['bytes_loaded'] / 2**20:,.2f} MiB, verified with the prefix); prefetches "
            f"cut or lost by a missing part {p['part_misses']}",
        ))
    return rows
