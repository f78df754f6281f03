"""The end-of-run report: a rich table for people, a JSON document for machines."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console
from rich.table import Table

from tools.simulate.config import SimConfig
from tools.simulate.stats import SimStats
from tools.simulate.storage_report import backend_label, l3_dict, l3_rows

__all__ = ["render_report", "report_dict"]

_ALLOC_ORDER = (
    "alloc", "alloc_extend", "alloc (extend)", "alloc_decode", "alloc (decode)", "free",
    "free_group_end",
)


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:,.1f} MiB"


def report_dict(cfg: SimConfig, stats: SimStats) -> dict[str, Any]:
    """Everything the table shows, as plain JSON-serialisable data."""
    return {
        "config": dataclasses.asdict(cfg),
        "steps": stats.steps,
        "requests": stats.requests_done,
        "wall_s": round(stats.wall_s, 3),
        "tokens": {
            "prefill": stats.prefill_tokens,
            "decode": stats.decode_tokens,
            "recomputed": stats.recomputed_tokens,
            "draft": stats.draft_tokens,
            "rejected_draft": stats.rejected_draft_tokens,
        },
        "retractions": stats.retractions,
        "shared_prefix": {
            "tokens": cfg.shared_prefix_tokens,
            "hits": stats.shared_prefix_hits,
            "hit_tokens": stats.shared_prefix_hit_tokens,
            "duplicate_pages_freed": stats.duplicate_pages_freed,
            "evictions": stats.shared_prefix_evictions,
        },
        "allocator": {
            kind: {"calls": op.calls, "ns_per_call": round(op.ns_per_call, 1), "items": op.items}
            for kind, op in stats.alloc_ops.items()
        },
        "transfers": {
            d: {"calls": t.calls, "tokens": t.tokens, "bytes": t.bytes,
                "seconds": t.total_ns / 1e9, "gb_per_s": round(t.gb_per_s, 3),
                "failed": t.failed, "aborted": t.aborted}
            for d, t in stats.transfers.items()
        },
        "hits": {
            "returning_turns": stats.returning_turns,
            "device_hits": stats.device_hits,
            "host_hits": stats.host_hits,
            "misses": stats.misses,
            "reusable_tokens": stats.reusable_tokens,
            "device_hit_tokens": stats.device_hit_tokens,
            "host_hit_tokens": stats.host_hit_tokens,
        },
        "memory": {
            "bytes_per_token": stats.bytes_per_token,
            "device_capacity_tokens": stats.device_capacity,
            "host_capacity_tokens": stats.host_capacity,
            "peak_device_tokens": stats.peak_device_tokens,
            "peak_host_tokens": stats.peak_host_tokens,
            "peak_running": stats.peak_running,
        },
        "evictions": {
            "device_to_host": stats.evictions_to_host,
            "device_dropped": stats.device_drops,
            "host_dropped": stats.host_drops,
        },
        "checks": {
            "conservation_checks": stats.conservation_checks,
            "pages_verified": stats.pages_verified,
            "tokens_verified": stats.tokens_verified,
            "sequences_verified": stats.sequences_verified,
            "layer_waits": stats.layer_waits,
            "faults_injected": stats.faults_injected,
            "integrity_failures": stats.integrity_failures,
            "failures": list(stats.failures),
        },
        "storage_backend": backend_label(cfg),
        "storage": l3_dict(stats),
        "hybrid": dict(stats.hybrid),
        "leaks": {pool: {"available": a, "capacity": c} for pool, (a, c) in stats.leaks.items()},
        "ok": stats.integrity_failures == 0 and not stats.leaked and bool(stats.leaks),
    }


def render_report(console: Console, cfg: SimConfig, stats: SimStats) -> None:
    """Print the report table (and any integrity failure messages) to ``console``."""
    shape = (f"{cfg.heads}x{cfg.head_dim}" if cfg.model in ("mha", "hybrid")
             else f"{cfg.kv_lora_rank}+{cfg.qk_rope_head_dim}")
    if cfg.model == "deepseek_v4":  # fixed 584-byte records (448 fp8 + 64 bf16 + scales), no dtype
        shape = "584B-records"
    title = (f"mem-cache simulation: {cfg.model.upper()} {cfg.layers}L {shape} {cfg.dtype}, "
             f"page {cfg.page_size}, host {cfg.host_layout}/{cfg.io_backend}, "
             f"device {cfg.device}, L3 {backend_label(cfg)}, seed {cfg.seed}")
    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_column("detail")
    t.add_row("steps", f"{stats.steps:,}", f"{stats.wall_s:.1f} s wall, "
              f"{stats.steps / stats.wall_s if stats.wall_s else 0.0:,.0f} steps/s")
    t.add_row("requests", f"{stats.requests_done:,}", f"peak running {stats.peak_running}")
    t.add_row("tokens", f"{stats.prefill_tokens + stats.decode_tokens:,}",
              f"prefill {stats.prefill_tokens:,} (recomputed {stats.recomputed_tokens:,}), "
              f"decode {stats.decode_tokens:,}")
    kinds = [k for k in _ALLOC_ORDER if k in stats.alloc_ops]
    kinds += sorted(k for k in stats.alloc_ops if k not in _ALLOC_ORDER)
    for kind in kinds:
        op = stats.alloc_ops[kind]
        label = "alloc (host loads)" if kind == "alloc" else kind
        t.add_row(f"allocator {label}", f"{op.ns_per_call / 1e3:,.1f} us/call",
                  f"{op.calls:,} calls, {op.items:,} slots")
    for direction in sorted(stats.transfers):
        x = stats.transfers[direction]
        t.add_row(f"transfer {direction}", f"{x.gb_per_s:,.2f} GB/s",
                  f"{x.calls:,} ok, {x.tokens:,} tokens, {_mib(x.bytes)}; "
                  f"failed {x.failed}, aborted {x.aborted}")
    t.add_row("device hit rate", _pct(stats.device_hits, stats.returning_turns),
              f"{stats.device_hits}/{stats.returning_turns} returning turns; "
              f"{_pct(stats.device_hit_tokens, stats.reusable_tokens)} of prefix tokens")
    t.add_row("host hit rate", _pct(stats.host_hits, stats.returning_turns),
              f"{stats.host_hits}/{stats.returning_turns} returning turns; "
              f"{_pct(stats.host_hit_tokens, stats.reusable_tokens)} of prefix tokens; "
              f"misses {stats.misses}")
    if cfg.shared_prefix_tokens and cfg.model not in ("deepseek_v4", "hybrid"):
        t.add_row("shared prefix", f"{stats.duplicate_pages_freed:,} dup pages freed",
                  f"{cfg.shared_prefix_tokens} shared tokens; {stats.shared_prefix_hits:,} "
                  f"admission hits ({stats.shared_prefix_hit_tokens:,} tokens); "
                  f"{stats.shared_prefix_evictions} evictions")
    for row in l3_rows(stats, cfg):
        t.add_row(*row)
    bpt = stats.bytes_per_token
    t.add_row("peak device memory", _mib(stats.peak_device_tokens * bpt),
              f"{stats.peak_device_tokens:,}/{stats.device_capacity:,} tokens "
              f"({_pct(stats.peak_device_tokens, stats.device_capacity)})")
    t.add_row("peak host memory", _mib(stats.peak_host_tokens * bpt),
              f"{stats.peak_host_tokens:,}/{stats.host_capacity:,} tokens "
              f"({_pct(stats.peak_host_tokens, stats.host_capacity)})")
    t.add_row("evictions", f"{stats.evictions_to_host:,}",
              f"device->host backups; dropped {stats.device_drops} device, "
              f"{stats.host_drops} host entries")
    t.add_row("invariant checks", f"{stats.conservation_checks:,}",
              f"slot conservation; {stats.pages_verified:,} loaded pages "
              f"({stats.tokens_verified:,} tokens) verified bit-exact; "
              f"{stats.sequences_verified:,} finished sequences checked (1 layer each); "
              f"{stats.layer_waits:,} layer waits")
    for name, value in stats.hybrid.items():  # --model hybrid
        t.add_row(f"hybrid {name}", f"{value:,}", "")
    t.add_row("faults injected", f"{stats.faults_injected:,}", f"rate {cfg.faults}")
    t.add_row("integrity failures", str(stats.integrity_failures),
              "OK" if stats.integrity_failures == 0 else "[red]FAILED[/red]")
    leak_detail = ", ".join(f"{p} {a:,}/{c:,}" for p, (a, c) in stats.leaks.items())
    t.add_row("leak check", "none" if stats.leaks and not stats.leaked else "[red]LEAK[/red]",
              f"available/capacity: {leak_detail}")
    console.print(t)
    for msg in stats.failures:
        console.print(f"[red]integrity failure:[/red] {msg}")
