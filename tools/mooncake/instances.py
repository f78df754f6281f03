"""Several simulator engines sharing one Mooncake Store: cross-instance L3 hits, verified.

``python3 tools/dev run --storage mooncake --instances N [--routing round-robin|random]
[--storage-master HOST:PORT [--storage-metadata URL]] [--kill-master-at WAVE]
[--storage-fault-rate P] [--requests R] [--seed X] [--json PATH] [simulator options]``
(also ``python -m tools.mooncake.instances ...``; any other option is a ``tools.simulate``
option and applies to every instance, e.g. ``--layers``, ``--device-tokens``, ``--faults``).

What runs: a local store (master with HTTP metadata + holder, ``tools.mooncake.store``) unless
``--storage-master`` names one, and N instance processes. Each runs the simulator's real engine
(``tools.simulate``: device pool + allocator + request table as L1, host pool as L2, the
storage tier on a ``HiCacheMooncake`` backend as L3, every L2/L3-loaded page verified bit-exact
on the device, the slot-conservation check every step and the leak check at the end).

The workload is the simulator's (sessions of several turns; the same seeded workload in every
process). Turns run in waves: wave ``w`` holds turn ``w`` of every session that has one, each
routed to an instance (``round-robin``: ``(session + turn) % N``, so consecutive turns of a
session land on different instances; ``random``: seeded). A wave is a barrier: an instance runs
its share of the wave to completion, then publishes every prefix it caches (device prefixes
backed up to a staging host page, host prefixes as they are) to the store, and only then does the
next wave start, so a later turn always finds its earlier turn's pages in L3 if the store kept
them.

Cross-instance hits: every instance logs the keys its backend stored (``batch_set_v1`` results)
and the keys of every L3 hit that was verified on the device; the coordinator keeps a writer
table (key -> instance that last stored it) and counts a hit page as cross-instance when its
writer is another instance.

Faults: ``--kill-master-at W`` SIGKILLs the master before wave W and restarts it after that wave
(the restarted master holds no objects: misses); ``--storage-fault-rate`` wraps each backend in
the simulator's seeded fault injector (failed, slow and partial calls). Exit status 1 when any
instance has an integrity failure or a leak.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import sys
import time
from dataclasses import asdict, replace
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["build_parser", "main", "run"]


def _publish(engine: Any, l3: Any, published: dict[int, int]) -> None:
    """Write every cached prefix of ``engine`` not published yet (``published``: session ->
    tokens written by an earlier call) to L3, device ones through a host staging copy; nothing
    is dropped."""
    host = engine.stack.host_pool
    ps = engine.ps
    for session in list(engine.store.sessions()):
        entry = engine.store.take(session)
        if entry is None:
            continue
        engine.store.put(entry)
        if entry.length <= published.get(int(session), 0):
            continue
        keys = l3.keys(int(entry.session), entry.length // ps)
        if entry.tier == "host":
            l3.controller.write(keys, entry.slots)
            published[int(session)] = entry.length
            continue
        staging = host.alloc(entry.length)
        if staging is None:  # host full of cached prefixes: try again after the next wave
            continue
        try:
            if engine.transfers.backup(entry.slots, staging):
                l3.controller.write(keys, staging)
                published[int(session)] = entry.length
        finally:
            host.free(staging)


def _drop_stale(engine: Any, spec: Any, turn: int) -> None:
    """Free this instance's cached prefix of ``spec`` when it is shorter than the history of
    ``turn`` (an earlier turn ran here, a later one elsewhere): the engine serves a cached prefix
    from one tier only, and L3 holds the longer one."""
    ps = engine.ps
    entry = engine.store.take(spec.session)
    if entry is None:
        return
    if entry.length >= spec.history_len(turn) // ps * ps:
        engine.store.put(entry)
        return
    if entry.tier == "device":
        engine.stack.allocator.free(entry.slots)
    else:
        engine.stack.host_pool.free(entry.slots)


def _instance(idx: int, conn: Connection, cfg: Any) -> None:
    import torch

    from tools.simulate.engine import Engine
    from tools.simulate.faults import FaultInjector
    from tools.simulate.integrity import leak_check
    from tools.simulate.report import report_dict
    from tools.simulate.stack import build_stack
    from tools.simulate.stats import SimStats
    from tools.simulate.storage_tier import StorageTier
    from tools.simulate.workload import generate_workload

    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    workload = generate_workload(cfg)
    sessions = {s.session: s for s in workload.sessions}
    stack = build_stack(cfg, workload.max_context_len + 1)
    stats = SimStats(device_capacity=stack.device_capacity, host_capacity=stack.host_capacity,
                     bytes_per_token=stack.bytes_per_token)
    l3 = StorageTier(stack, directory=None, write_policy=cfg.storage_write,
                     fault_rate=cfg.storage_fault_rate, seed=cfg.seed + 7919 * idx)
    engine = Engine(workload, stack, stats, FaultInjector(cfg.faults, cfg.seed + idx), l3,
                    follow_ups=False)
    published: dict[int, int] = {}
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            for session, turn in msg:
                _drop_stale(engine, sessions[session], turn)
                engine.submit(sessions[session], turn)
            while not engine.done():
                engine.step()
            _publish(engine, l3, published)
            conn.send((l3.take_written_keys(), l3.take_hit_keys()))
        engine.check()
        engine.drain()
    finally:
        engine.close()
        l3.close()
        stats.l3 = l3.stats
    engine.check()
    leak_check(stack, stats)
    budget = l3.controller.prefetch_budget_pages
    stats.leaks["l3 prefetch"] = (budget - l3.stats.prefetch_reserved_at_end, budget)
    stack.host_pool.close()
    stats.wall_s = time.perf_counter() - t0
    conn.send(report_dict(cfg, stats))


def _waves(cfg: Any, routing: str, n: int, seed: int) -> list[list[list[tuple[int, int]]]]:
    """``waves[w][i]``: the (session, turn) pairs instance ``i`` runs in wave ``w``."""
    from tools.simulate.workload import generate_workload

    workload = generate_workload(cfg)
    rng = random.Random(seed ^ 0x5EED)
    depth = max(len(s.turns) for s in workload.sessions)
    waves: list[list[list[tuple[int, int]]]] = []
    for turn in range(depth):
        wave: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        for s in workload.sessions:
            if turn < len(s.turns):
                inst = (int(s.session) + turn) % n if routing == "round-robin" \
                    else rng.randrange(n)
                wave[inst].append((int(s.session), turn))
        waves.append(wave)
    return waves


def run(args: argparse.Namespace, sim_argv: list[str]) -> dict[str, Any]:
    from tools.mooncake.store import LocalMooncakeStore
    from tools.simulate.config import config_from_args
    from tools.simulate.options import build_parser as sim_parser

    cfg = config_from_args(sim_parser().parse_args(sim_argv))
    if cfg.model not in ("mha", "mla"):
        raise ValueError(f"--model {cfg.model}: the multi-instance run (a shared Mooncake store) "
                         "needs mha or mla")
    cfg = replace(cfg, storage="mooncake", storage_master=args.storage_master,
                  storage_metadata=args.storage_metadata,
                  storage_fault_rate=args.storage_fault_rate)
    store = None
    if not args.storage_master:
        store = LocalMooncakeStore(segment_bytes=args.segment_mib << 20).start()
        cfg = replace(cfg, storage_master=store.master_address,
                      storage_metadata=store.metadata_server)
    waves = _waves(cfg, args.routing, args.instances, cfg.seed)
    ctx = mp.get_context("spawn")
    pipes: list[Connection] = []
    procs = []
    writer: dict[str, int] = {}
    cross = [0] * args.instances
    hit_pages = [0] * args.instances
    t0 = time.perf_counter()
    reports: list[dict[str, Any]] = []
    try:
        for i in range(args.instances):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_instance, args=(i, child, cfg))
            p.start()
            pipes.append(parent)
            procs.append(p)
        for w, wave in enumerate(waves):
            if store is not None and w == args.kill_master_at:
                store.kill_master()
            for pipe, work in zip(pipes, wave, strict=True):
                pipe.send(work)
            results = [pipe.recv() for pipe in pipes]
            for i, (_, hits) in enumerate(results):  # writers as of the wave's start
                hit_pages[i] += len(hits)
                cross[i] += sum(1 for k in hits if writer.get(k, i) != i)
            for i, (written, _) in enumerate(results):
                for k in written:
                    writer[k] = i
            if store is not None and w == args.kill_master_at:
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
    wall = time.perf_counter() - t0
    rows = []
    for i, rep in enumerate(reports):
        st, hits = rep["storage"], rep["hits"]
        rows.append({
            "instance": i, "requests": rep["requests"], "returning_turns": hits["returning_turns"],
            "device_hits": hits["device_hits"], "host_hits": hits["host_hits"],
            "l3_hits": st["hits"], "l3_hit_rate_turns": st["hit_rate_turns"],
            "l3_hit_tokens": st["hit_tokens"], "reusable_tokens": hits["reusable_tokens"],
            "l3_hit_rate_tokens": st["hit_rate_tokens"], "l3_hit_pages": hit_pages[i],
            "cross_instance_hit_pages": cross[i], "pages_loaded": st["pages_loaded"],
            "bytes_loaded": st["bytes_loaded"], "load_gb_per_s": st["load_gb_per_s"],
            "pages_written": st["pages_written"], "pages_write_failed": st["pages_write_failed"],
            "bytes_written": st["bytes_written"], "write_gb_per_s": st["write_gb_per_s"],
            "timeouts": st["timeouts"], "backend_errors": st["backend_errors"],
            "pages_rejected": st["pages_rejected"], "faults": st["faults"],
            "pages_verified": rep["checks"]["pages_verified"],
            "integrity_failures": rep["checks"]["integrity_failures"],
            "failures": rep["checks"]["failures"],
            "leaks": {k: v for k, v in rep["leaks"].items() if v["available"] != v["capacity"]},
            "ok": rep["ok"], "wall_s": rep["wall_s"],
        })
    summed = ("requests", "returning_turns", "l3_hits", "l3_hit_tokens", "reusable_tokens",
              "l3_hit_pages", "cross_instance_hit_pages", "pages_loaded", "bytes_loaded",
              "pages_written", "pages_write_failed", "bytes_written", "pages_verified",
              "integrity_failures", "timeouts", "pages_rejected")
    total: dict[str, Any] = {k: sum(r[k] for r in rows) for k in summed}
    total["leaks"] = sum(len(r["leaks"]) for r in rows)
    total["l3_hit_rate_turns"] = round(total["l3_hits"] / total["returning_turns"], 4) \
        if total["returning_turns"] else 0.0
    total["l3_hit_rate_tokens"] = round(total["l3_hit_tokens"] / total["reusable_tokens"], 4) \
        if total["reusable_tokens"] else 0.0
    # instances load and write concurrently: the aggregate rate is the sum of theirs
    total["load_gb_per_s"] = round(sum(r["load_gb_per_s"] for r in rows), 3)
    total["write_gb_per_s"] = round(sum(r["write_gb_per_s"] for r in rows), 3)
    total["waves"] = len(waves)
    total["wall_s"] = round(wall, 2)
    ok = bool(rows) and all(r["ok"] for r in rows) and total["integrity_failures"] == 0
    return {"instances": rows, "total": total, "ok": ok,
            "config": {**vars(args), "sim": asdict(cfg)}}


def _print(doc: dict[str, Any]) -> None:
    cfg = doc["config"]
    t = doc["total"]
    print(f"mooncake multi-instance run: {cfg['instances']} simulator engines, {t['requests']} "
          f"turns in {t['waves']} waves, routing {cfg['routing']}, kill master at wave "
          f"{cfg['kill_master_at']}, storage fault rate {cfg['storage_fault_rate']}")
    head = (f"{'inst':>4}{'turns':>6}{'ret':>5}{'L1 hit':>7}{'L2 hit':>7}{'L3 hit':>7}"
            f"{'L3 %tok':>8}{'L3 pg':>7}{'x-inst':>7}{'verified':>9}{'written':>8}{'wfail':>6}"
            f"{'load GB/s':>10}{'write GB/s':>11}{'bad':>4}{'leaks':>6}")
    print(head)
    print("-" * len(head))
    for r in doc["instances"]:
        print(f"{r['instance']:>4}{r['requests']:>6}{r['returning_turns']:>5}"
              f"{r['device_hits']:>7}{r['host_hits']:>7}{r['l3_hits']:>7}"
              f"{100 * r['l3_hit_rate_tokens']:>7.1f}%{r['l3_hit_pages']:>7}"
              f"{r['cross_instance_hit_pages']:>7}{r['pages_verified']:>9}"
              f"{r['pages_written']:>8}{r['pages_write_failed']:>6}{r['load_gb_per_s']:>10.3f}"
              f"{r['write_gb_per_s']:>11.3f}{r['integrity_failures']:>4}{len(r['leaks']):>6}")
        for msg in r["failures"]:
            print(f"     integrity failure: {msg}")
    print(f"total: L3 hits {t['l3_hits']}/{t['returning_turns']} returning turns "
          f"({100 * t['l3_hit_rate_turns']:.1f}%), {100 * t['l3_hit_rate_tokens']:.1f}% of "
          f"prefix tokens; {t['l3_hit_pages']} L3 pages served, {t['cross_instance_hit_pages']} "
          f"written by another instance; {t['pages_verified']} loaded pages verified bit-exact; "
          f"L3 load {t['load_gb_per_s']:.3f} GB/s, write {t['write_gb_per_s']:.3f} GB/s "
          f"(sum over instances); write failures {t['pages_write_failed']}, prefetch timeouts "
          f"{t['timeouts']}; integrity failures {t['integrity_failures']}, leaks {t['leaks']}; "
          f"{t['wall_s']:.1f} s -> {'OK' if doc['ok'] else 'FAILED'}")
    if cfg["kill_master_at"] >= t["waves"]:
        print(f"warning: --kill-master-at {cfg['kill_master_at']}: the run had {t['waves']} "
              "waves, the master was never killed (pick a wave below that)")


def build_parser() -> argparse.ArgumentParser:
    """The multi-instance options (the rest of the command line goes to the simulator)."""
    from tools.cli import OneLineParser
    from tools.simulate.options import _Formatter

    ap = OneLineParser(prog="tools/dev run --storage mooncake --instances N",
                       formatter_class=_Formatter,
                       description=(__doc__ or "").splitlines()[0] + " Any other option is a "
                       "simulator option (`tools/dev run --help`) and applies to every instance.")
    ap.add_argument("--storage", choices=["mooncake"], default="mooncake",
                    help="the multi-instance mode needs the Mooncake Store")
    ap.add_argument("--instances", type=int, default=4, metavar="N",
                    help="simulator engines (processes) on one store")
    ap.add_argument("--routing", choices=["round-robin", "random"], default="round-robin",
                    help="which engine serves a turn: round-robin ((session + turn) %% N) or "
                    "seeded random")
    ap.add_argument("--storage-master", default=None, metavar="HOST:PORT",
                    help="join this Mooncake master (default: a local store started for the "
                    "run)")
    ap.add_argument("--storage-metadata", default=None, metavar="URL",
                    help="with --storage-master: its metadata server (default: "
                    "http://HOST:8080/metadata)")
    ap.add_argument("--kill-master-at", type=int, default=-1, metavar="WAVE",
                    help="SIGKILL the local store's master before this wave and restart it "
                    "after (-1: never; not with --storage-master)")
    ap.add_argument("--storage-fault-rate", type=float, default=0.0, metavar="P",
                    help="probability that a storage call fails, is slow or stops partway")
    ap.add_argument("--segment-mib", type=int, default=1024, metavar="MIB",
                    help="the local store's holder segment (MiB)")
    ap.add_argument("--json", default=None, metavar="PATH",
                    help="also write the result as JSON to PATH (its folder must exist)")
    ap.add_argument("--verbose", action="store_true",
                    help="show third-party logs (the Mooncake client's)")
    return ap


def _check(args: argparse.Namespace, sim_argv: list[str]) -> str | None:
    """The first problem with the multi-instance options, as an error line (``None``: none)."""
    from tools.simulate.options import UsageError, check_output_path

    if args.instances < 1:
        return f"--instances must be >= 1, got {args.instances}"
    if not 0.0 <= args.storage_fault_rate <= 1.0:
        return f"--storage-fault-rate must be a probability in [0, 1], " \
               f"got {args.storage_fault_rate}"
    if args.segment_mib < 16:
        return f"--segment-mib must be >= 16, got {args.segment_mib}"
    if args.kill_master_at < -1:
        return f"--kill-master-at must be a wave >= 0 (or -1: never), got {args.kill_master_at}"
    if args.kill_master_at >= 0 and args.storage_master:
        return "--kill-master-at is ignored with --storage-master (only a local store is " \
               "killed): drop one of them"
    if args.storage_metadata and not args.storage_master:
        return "--storage-metadata is ignored without --storage-master"
    for option in ("--storage-dir", "--storage-capacity-mb", "--restart-at"):
        if any(a == option or a.startswith(option + "=") for a in sim_argv):
            return f"{option} is ignored by the multi-instance mode (each instance's L3 is " \
                   "the shared Mooncake Store): drop it"
    if args.json not in (None, "-"):
        try:
            check_output_path("--json", args.json)
        except UsageError as exc:
            return str(exc)
    return None


# the simulator defaults for a multi-instance run: a smaller workload per run (each instance
# serves about requests / instances turns)
DEFAULT_SIM = ["--requests", "240", "--device-tokens", "8192", "--host-tokens", "8192",
               "--mean-turns", "4", "--max-running", "32", "--storage-write", "write_back"]


def main(argv: list[str] | None = None) -> int:
    from tools.simulate.logs import filtered_stderr, quiet_third_party_logs

    parser = build_parser()
    args, sim_argv = parser.parse_known_args(argv)
    problem = _check(args, sim_argv)
    if problem is not None:
        print(f"{parser.prog}: error: {problem}", file=sys.stderr)
        return 2
    quiet_third_party_logs(args.verbose)
    try:
        with filtered_stderr(args.verbose):
            doc = run(args, DEFAULT_SIM + sim_argv)
    except ValueError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    _print(doc)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2, default=str)
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
