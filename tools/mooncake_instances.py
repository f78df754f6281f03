"""Several engine instances sharing one Mooncake Store: cross-instance L3 hits, verified.

``python3 tools/dev run --storage mooncake --instances N [--routing round-robin|random]
[--storage-master HOST:PORT --storage-metadata URL] [--kill-master-at ROUND]
[--storage-fault-rate P] [--sessions S] [--turns T] [--seed X] [--json PATH]``
(also ``python -m tools.mooncake_instances ...``).

What runs: a local store (master with HTTP metadata + holder, ``tools.mooncake_store``) unless
``--storage-master`` names one, and N instance processes, each with its own host pool (L2) and a
``StorageController`` on a ``HiCacheMooncake`` backend. The workload is S sessions of T turns;
in round ``r`` every session runs its turn ``r`` on the instance the router picks (round-robin
over ``session + turn`` or seeded random), so a session's turns land on different instances.
Rounds are barriers: a turn starts only after the session's previous turn finished elsewhere.

A turn of session ``s`` with ``h`` history pages and ``n`` new pages: look up and prefetch the
history from L3 (``lookup`` + ``prefetch``), check every loaded page bit-exact against the
session's deterministic content (a seeded function of session and page index), then write the
history pages that were not loaded (recomputed) and the new pages through the controller
(``write``: only missing keys). These instances keep nothing between turns beyond L3, so every
returning turn exercises the store. A loaded page is a *cross-instance hit* when the turn that
produced it ran on another instance.

Faults: ``--kill-master-at R`` SIGKILLs the master before round R and restarts it after that
round (the restarted master has no objects: misses); ``--storage-fault-rate`` wraps the backend
in the simulator's seeded fault injector (failed, slow, corrupted calls). In every instance the
run checks: integrity failures (a loaded page with other bytes) and leaks (prefetch
reservations left, host pages not returned) must be zero; the exit status is 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import torch

PAGE = 16


@dataclass
class InstanceReport:
    instance: int
    turns: int = 0
    returning_turns: int = 0
    history_pages: int = 0
    hit_pages: int = 0
    cross_instance_hit_pages: int = 0
    integrity_failures: int = 0
    pages_written: int = 0
    pages_write_failed: int = 0
    bytes_loaded: int = 0
    load_seconds: float = 0.0
    bytes_written: int = 0
    write_seconds: float = 0.0
    prefetch_statuses: dict[str, int] = field(default_factory=dict)
    leaked_reserved_pages: int = 0
    leaked_host_slots: int = 0

    @property
    def load_gbps(self) -> float:
        return self.bytes_loaded / self.load_seconds / 1e9 if self.load_seconds else 0.0

    @property
    def write_gbps(self) -> float:
        return self.bytes_written / self.write_seconds / 1e9 if self.write_seconds else 0.0


def _page_content(session: int, page: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed((session * 1_000_003 + page) & 0x7FFF_FFFF)
    raw = torch.randint(0, 256, (numel * torch.empty(0, dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=gen)
    return raw.view(dtype)


def _tokens(session: int, pages: int) -> list[int]:
    return [(session * 7919 + i * 104729) % 50_000 for i in range(pages * PAGE)]


def _instance(idx: int, conn: Connection, options: dict[str, Any], fault_rate: float,
              seed: int) -> None:
    from mem_cache_pool import MHATokenToKVPool
    from mem_cache_pool_host import MHATokenToKVPoolHost
    from mem_cache_storage import HiCacheStorageConfig, page_hashes
    from mem_cache_storage.controller import StorageController
    from mem_cache_storage.mooncake import HiCacheMooncake

    dev = MHATokenToKVPool(64 * PAGE, PAGE, torch.bfloat16, 4, 64, 4, "cpu")
    host = MHATokenToKVPoolHost(dev, host_to_device_ratio=4.0, layout="page_first",
                                pin_memory=False)
    free0 = host.available_size()
    cfg = HiCacheStorageConfig(model_name="multi-instance", extra_config={
        **options, "model_fingerprint": f"seed{seed}", "retry_backoff_s": 0.2,
        "max_backoff_s": 1.0})
    backend: Any = HiCacheMooncake(cfg, host)
    if fault_rate:
        from tools.simulate.storage_faults import FaultyStorage

        backend = FaultyStorage(backend, fault_rate, seed + idx, 0.3)
    ctl = StorageController(backend, host, prefetch_budget_pages=64)
    numel = host.get_dummy_flat_data_page().numel()
    dtype = host.get_dummy_flat_data_page().dtype
    rep = InstanceReport(idx)
    while True:
        msg = conn.recv()
        if msg is None:
            break
        for session, history, new, owners in msg:
            rep.turns += 1
            keys = page_hashes(_tokens(session, history + new), PAGE)
            loaded = 0
            if history:
                rep.returning_turns += 1
                rep.history_pages += history
                res = ctl.prefetch(keys[:history]).wait(timeout=10 if fault_rate else 60)
                rep.prefetch_statuses[res.status] = rep.prefetch_statuses.get(res.status, 0) + 1
                if res.status == "done":
                    for j in range(res.pages):
                        got = host.get_data_page(int(res.host_indices[j * PAGE]))
                        want = _page_content(session, j, numel, dtype)
                        if torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
                            loaded += 1
                            rep.hit_pages += 1
                            rep.cross_instance_hit_pages += owners[j] != idx
                        else:
                            rep.integrity_failures += 1
                            break
                    host.free(res.host_indices)
            todo = list(range(loaded, history + new))  # recomputed history + new pages
            slots = host.alloc(len(todo) * PAGE)
            if slots is None:
                raise RuntimeError("instance host pool too small for one turn")
            for k, j in enumerate(todo):
                host.set_from_flat_data_page(int(slots[k * PAGE]),
                                             _page_content(session, j, numel, dtype))
            w = ctl.write([keys[j] for j in todo], slots)
            rep.pages_write_failed += w.failed
            host.free(slots)
        conn.send("ok")
    ctl.close()
    stats = ctl.stats()
    rep.pages_written = stats.pages_written
    rep.bytes_loaded, rep.load_seconds = stats.bytes_loaded, stats.load_seconds
    rep.bytes_written, rep.write_seconds = stats.bytes_written, stats.write_seconds
    rep.leaked_reserved_pages = ctl.reserved_pages
    rep.leaked_host_slots = free0 - host.available_size()
    inner = backend.inner if fault_rate else backend
    inner.close()
    conn.send(asdict(rep) | {"load_gbps": rep.load_gbps, "write_gbps": rep.write_gbps})


def _route(mode: str, rng: random.Random, session: int, turn: int, n: int) -> int:
    return (session + turn) % n if mode == "round-robin" else rng.randrange(n)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tools.mooncake_store import LocalMooncakeStore

    store = None
    if args.storage_master:
        options = {"master_server_address": args.storage_master,
                   "metadata_server": args.storage_metadata
                   or f"http://{args.storage_master.rsplit(':', 1)[0]}:8080/metadata"}
    else:
        store = LocalMooncakeStore(segment_bytes=args.segment_mib << 20).start()
        options = store.client_options()
    rng = random.Random(args.seed)
    wl = random.Random(args.seed + 1)
    new_pages = {(s, t): wl.randint(1, 3) for s in range(args.sessions)
                 for t in range(args.turns)}
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    t0 = time.perf_counter()
    try:
        for i in range(args.instances):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_instance, args=(i, child, options,
                                                    args.storage_fault_rate, args.seed))
            p.start()
            pipes.append(parent)
            procs.append(p)
        owners: dict[int, list[int]] = {s: [] for s in range(args.sessions)}
        for turn in range(args.turns):
            if store is not None and turn == args.kill_master_at:
                store.kill_master()
            work: list[list[Any]] = [[] for _ in range(args.instances)]
            for s in range(args.sessions):
                inst = _route(args.routing, rng, s, turn, args.instances)
                history = len(owners[s])
                work[inst].append((s, history, new_pages[s, turn], list(owners[s])))
                owners[s].extend([inst] * new_pages[s, turn])
            for pipe, w in zip(pipes, work):
                pipe.send(w)
            for pipe in pipes:
                if pipe.recv() != "ok":
                    raise RuntimeError("an instance failed")
            if store is not None and turn == args.kill_master_at:
                store.start_master()
                if not store.wait_mounted():
                    raise RuntimeError("the holder did not re-mount its segment")
        for pipe in pipes:
            pipe.send(None)
        reports = [pipe.recv() for pipe in pipes]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        if store is not None:
            store.stop()
    total: dict[str, Any] = {k: sum(r[k] for r in reports) for k in (
        "turns", "returning_turns", "history_pages", "hit_pages", "cross_instance_hit_pages",
        "integrity_failures", "pages_written", "pages_write_failed", "bytes_loaded",
        "bytes_written", "leaked_reserved_pages", "leaked_host_slots")}
    wall = time.perf_counter() - t0
    total["wall_s"] = wall
    ok = total["integrity_failures"] == 0 and not total["leaked_reserved_pages"] \
        and not total["leaked_host_slots"]
    return {"instances": reports, "total": total, "ok": ok, "config": vars(args)}


def _print(doc: dict[str, Any]) -> None:
    cfg = doc["config"]
    print(f"mooncake multi-instance run: {cfg['instances']} instances, {cfg['sessions']} sessions"
          f" x {cfg['turns']} turns, routing {cfg['routing']}, kill master at "
          f"{cfg['kill_master_at']}, storage fault rate {cfg['storage_fault_rate']}")
    head = (f"{'inst':>4}{'turns':>7}{'ret':>5}{'hist pg':>9}{'L3 hit':>8}{'x-inst':>8}"
            f"{'bad':>5}{'written':>9}{'wfail':>7}{'load GB/s':>11}{'write GB/s':>11}"
            f"{'leaks':>7}  prefetch")
    print(head)
    print("-" * len(head))
    for r in doc["instances"]:
        print(f"{r['instance']:>4}{r['turns']:>7}{r['returning_turns']:>5}"
              f"{r['history_pages']:>9}{r['hit_pages']:>8}{r['cross_instance_hit_pages']:>8}"
              f"{r['integrity_failures']:>5}{r['pages_written']:>9}{r['pages_write_failed']:>7}"
              f"{r['load_gbps']:>11.3f}{r['write_gbps']:>11.3f}"
              f"{r['leaked_reserved_pages'] + r['leaked_host_slots']:>7}  "
              f"{r['prefetch_statuses']}")
    t = doc["total"]
    wall = t["wall_s"]
    print(f"total: L3 hit pages {t['hit_pages']}/{t['history_pages']} "
          f"(cross-instance {t['cross_instance_hit_pages']}), integrity failures "
          f"{t['integrity_failures']}, leaks {t['leaked_reserved_pages'] + t['leaked_host_slots']}"
          f", loaded {t['bytes_loaded'] / 1e6:.1f} MB, written {t['bytes_written'] / 1e6:.1f} MB"
          f" in {wall:.1f}s -> {'OK' if doc['ok'] else 'FAILED'}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tools/dev run --storage mooncake --instances N",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--storage", choices=["mooncake"], default="mooncake")
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--routing", choices=["round-robin", "random"], default="round-robin")
    ap.add_argument("--storage-master", default=None, metavar="HOST:PORT")
    ap.add_argument("--storage-metadata", default=None, metavar="URL")
    ap.add_argument("--kill-master-at", type=int, default=-1, metavar="ROUND")
    ap.add_argument("--storage-fault-rate", type=float, default=0.0)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--segment-mib", type=int, default=512)
    ap.add_argument("--json", default=None, metavar="PATH")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.instances < 1 or args.sessions < 1 or args.turns < 1:
        print("error: --instances, --sessions and --turns must be >= 1", file=sys.stderr)
        return 2
    if not 0.0 <= args.storage_fault_rate <= 1.0:
        print("error: --storage-fault-rate must be in [0, 1]", file=sys.stderr)
        return 2
    doc = run(args)
    _print(doc)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
