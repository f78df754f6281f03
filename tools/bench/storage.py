"""Storage tier (L3) benchmark: set and get pages/s and GB/s per backend, page size 16 and 64,
batch 1/32/128 pages per call (zero-copy ``batch_set_v1`` / ``batch_get_v1`` on a host pool),
each as a ratio to one plain ``memcpy`` (``torch`` ``copy_``) of the same bytes measured in the
same run, plus the controller's prefetch throughput (``batch_exists`` + reserve + background
``batch_get_v1`` + hand-off) with the simulator's model shape.

The file backend writes into a fresh temporary directory; reads are served from the OS page
cache right after the writes, so they measure the backend's own cost (checks, checksum, syscalls),
not a disk.

The mooncake backend (``--mooncake``, on by default when its client is installed) runs against
a local store started here (``tools.mooncake.store``: master + holder on loopback, tcp). Its set
rows write fresh keys on every call (a key already present is not rewritten) and the store is
cleared after each row.

**Side by side with SGLang** (``--no-sglang`` skips it): SGLang 0.5.23's own ``HiCacheFile``
(loaded from its wheel by ``tools.sglang_ref``) and ours on the same host pool, the same pages and
the same keys, in the same run: ``set`` / ``get`` / ``exists`` at page sizes 16 and 64 and batches
of 1, 32 and 128 pages. SGLang's file backend is driven as SGLang's controller drives it (it has
no v1 calls): ``get_data_page`` + ``batch_set``, ``get_dummy_flat_data_page`` + ``batch_get`` +
``set_from_flat_data_page``, ``batch_exists``. Ours is driven as SGLang's controller drives a
``interface_v1`` backend: ``batch_set_v1`` / ``batch_get_v1`` (every read verified: format, size,
checksum) / ``batch_exists``, in our key scheme and in the ``sglang`` scheme. Every ``set``
repeat writes fresh keys (SGLang skips a key already present) into the directory as the earlier
repeats left it, after untimed writes of at least 8 pages: the steady state of a serving engine,
whose writer has its segment and the index log open (``--set-into-empty`` empties the
directory before each repeat instead, so each timed call also creates the files a first write
creates: our segment and index log, SGLang's page file); the
ratio column is ours / SGLang's pages per second, the median of ``--rounds`` alternating rounds
(the order of the sides flips every round; each round takes the best of ``--repeat``). Before
each series of timed sets and of timed gets, dirty pages are flushed (no side is timed while the
kernel writes back the other's pages) and memory for all of the calls is written to a scratch
file and freed (:mod:`tools.bench.recycle`), for both sides alike: on a virtual machine whose host
takes back free memory (this one), new memory costs about 10 us per 4 KiB page at first touch,
and a row moving 64 MiB per call would time that instead of the backends (``--no-recycle``
skips the flush and the scratch write: it times the memory as the machine leaves it).
:func:`sglang_file_rows` gives the same rows to ``python -m tools.bench.sglang`` (``--against
sglang``), whose ``storage`` section they are.

Every backend (every Mooncake client) is closed before the local Mooncake store stops; the
client's own log lines are off unless ``--verbose``.

Usage: ``python -m tools.bench.storage [--quick] [--json PATH] [--repeat N] [--rounds N]
[--dir DIR] [--no-mooncake] [--no-sglang] [--only-sglang] [--set-into-empty] [--no-recycle]
[--verbose]``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from mem_cache_pool import MHATokenToKVPool
from mem_cache_pool_host import MHATokenToKVPoolHost
from mem_cache_storage import HiCacheStorageConfig, create_backend, page_hashes
from mem_cache_storage.controller import StorageController
from tools.bench.recycle import Recycler
from tools.cli import OneLineParser
from tools.simulate.logs import quiet_third_party_logs

__all__ = ["FILE_GOAL", "Row", "main", "sglang_file_rows", "side_by_side"]

BACKENDS = ("file", "memory")
MOONCAKE_SEGMENT_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class Row:
    backend: str
    op: str
    page_size: int
    batch: int
    page_bytes: int
    seconds: float
    pages_per_s: float
    gbps: float
    memcpy_gbps: float

    @property
    def ratio(self) -> float:
        return self.gbps / self.memcpy_gbps if self.memcpy_gbps else 0.0


@dataclass(frozen=True, slots=True)
class Config:
    layers: int
    heads: int
    head_dim: int
    page_sizes: tuple[int, ...]
    batches: tuple[int, ...]
    repeat: int
    prefetch_pages: int


def _best(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _memcpy_gbps(nbytes: int, repeat: int) -> float:
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    return nbytes / _best(lambda: dst.copy_(src), 3 * repeat) / 1e9


def _host(cfg: Config, ps: int, pages: int) -> MHATokenToKVPoolHost:
    dev = MHATokenToKVPool(4 * ps, ps, torch.bfloat16, cfg.heads, cfg.head_dim, cfg.layers, "cpu")
    bpt = dev.get_buffer_desc().bytes_per_token
    host = MHATokenToKVPoolHost(dev, host_size_bytes=pages * ps * bpt, layout="page_first",
                                pin_memory=False)
    for buf in host.buffers:
        raw = buf.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8))
    return host


def _backend(name: str, ps: int, root: Path, host: MHATokenToKVPoolHost,
             options: dict[str, Any] | None = None) -> Any:
    config = HiCacheStorageConfig(model_name="bench", extra_config={"model_fingerprint": "b"})
    directory = root / f"{name}-{ps}"
    return create_backend(name, config, host, storage_dir=str(directory), **(options or {}))


def run(cfg: Config, root: Path, mooncake: dict[str, Any] | None = None
        ) -> tuple[list[Row], list[dict[str, Any]]]:
    """``mooncake``: client options of a running store (adds the mooncake backend's rows)."""
    rows: list[Row] = []
    prefetch: list[dict[str, Any]] = []
    max_batch = max(cfg.batches)
    for ps in cfg.page_sizes:
        pages = max(2 * max_batch, 2 * cfg.prefetch_pages)
        host = _host(cfg, ps, pages)
        page_bytes = ps * host.get_size_per_token()
        memcpy = {b: _memcpy_gbps(b * page_bytes, cfg.repeat) for b in cfg.batches}
        for name in (*BACKENDS, *(("mooncake",) if mooncake else ())):
            storage = _backend(name, ps, root, host, mooncake if name == "mooncake" else None)
            try:
                prefetch.append(_rows_of(cfg, name, storage, host, ps=ps, memcpy=memcpy,
                                         rows=rows))
            finally:  # clients close before the store stops (main stops it last)
                storage.clear()
                storage.close()
        host.close()
    return rows, prefetch


def _rows_of(cfg: Config, name: str, storage: Any, host: MHATokenToKVPoolHost, *, ps: int,
             memcpy: dict[int, float], rows: list[Row]) -> dict[str, Any]:
    """The set / get rows of one backend (appended to ``rows``) and its prefetch row."""
    page_bytes = ps * host.get_size_per_token()
    max_batch = max(cfg.batches)
    fresh = name == "mooncake"  # a present key is not rewritten: new keys per call
    calls = [0]
    src = host.alloc(max_batch * ps)
    dst = host.alloc(max_batch * ps)
    assert src is not None and dst is not None
    for batch in cfg.batches:
        keys = page_hashes(list(range(batch * ps)), ps)
        s_idx, d_idx = src[: batch * ps], dst[: batch * ps]

        def put(*, keys: list[str] = keys, idx: torch.Tensor = s_idx,
                storage: Any = storage, fresh: bool = fresh, n: int = batch,
                calls: list[int] = calls, ps: int = ps) -> None:
            if fresh:
                calls[0] += 1
                keys = page_hashes(list(range(n * ps)), ps, f"{calls[0]:064x}")
            if not all(storage.batch_set_v1(keys, idx)):
                raise RuntimeError("batch_set_v1 failed")

        def get(keys: list[str] = keys, idx: torch.Tensor = d_idx,
                storage: Any = storage) -> None:
            if not all(storage.batch_get_v1(keys, idx)):
                raise RuntimeError("batch_get_v1 missed")

        for op, fn in (("set", put), ("get", get)):
            if fresh and op == "get":
                storage.clear()
                storage.batch_set_v1(keys, s_idx)
            sec = _best(fn, cfg.repeat)
            nbytes = batch * page_bytes
            rows.append(Row(name, op, ps, batch, page_bytes, sec, batch / sec,
                            nbytes / sec / 1e9, memcpy[batch]))
    host.free(src)
    host.free(dst)
    # controller prefetch: lookup + reserve + background batch_get_v1 + hand-off
    n = cfg.prefetch_pages
    keys = page_hashes(list(range(n * ps)), ps, "ab" * 32)
    with StorageController(storage, host, prefetch_budget_pages=n) as ctl:
        staged = host.alloc(n * ps)
        assert staged is not None
        ctl.write(keys, staged)
        host.free(staged)

        def fetch(ctl: StorageController = ctl, keys: list[str] = keys,
                  host: MHATokenToKVPoolHost = host) -> None:
            res = ctl.prefetch(keys).wait(timeout=120)
            if res.pages != len(keys):
                raise RuntimeError(f"prefetch returned {res.pages}/{len(keys)} pages")
            host.free(res.host_indices)

        sec = _best(fetch, cfg.repeat)
    memcpy_n = _memcpy_gbps(n * page_bytes, cfg.repeat)
    return {
        "backend": name, "page_size": ps, "pages": n, "page_bytes": page_bytes,
        "seconds": sec, "pages_per_s": n / sec, "gbps": n * page_bytes / sec / 1e9,
        "memcpy_gbps": memcpy_n, "ratio": n * page_bytes / sec / 1e9 / memcpy_n,
    }


#: untimed ``set`` pages before the timed ones (see the module docstring)
_WARM_PAGES = 8


def _timed(fn: Callable[[], Any], prepare: Callable[[], Any], repeat: int,
           warm: int = 1) -> float:
    """Best of ``repeat`` timed ``fn()`` calls, each after an untimed ``prepare()``, after
    ``warm`` untimed ``prepare(); fn()`` rounds."""
    for _ in range(warm):
        prepare()
        fn()
    best = float("inf")
    for _ in range(repeat):
        prepare()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _measure(label: str, b: Any, host: Any, *, ps: int, s_idx: torch.Tensor,
             d_idx: torch.Tensor, repeat: int, calls: list[int], empty_set: bool = False,
             recycle: Recycler | None = None) -> tuple[float, float, float]:
    """Seconds of one ``set`` / ``get`` / ``exists`` of ``len(s_idx) // ps`` pages through
    backend ``b`` (SGLang's driven as its controller drives it, see the module docstring).
    Each timed ``set`` writes fresh keys into the directory as the earlier repeats left it
    (steady state), or into an emptied one with ``empty_set``. ``recycle``: before the set and
    the get calls, memory for all of them is used and freed (:mod:`tools.bench.recycle`)."""
    batch = s_idx.numel() // ps
    moved = 2 * batch * ps * host.get_size_per_token()  # at most, in one call of either side

    def recycled(calls: int) -> None:
        if recycle is not None:
            recycle(calls * moved)
    firsts = [int(i) for i in s_idx[::ps].tolist()]
    d_firsts = [int(i) for i in d_idx[::ps].tolist()]
    keys = page_hashes(list(range(batch * ps)), ps)
    fresh = [keys]
    sgl = label == "sglang"

    def put() -> None:
        if sgl:
            ok = b.batch_set(fresh[0], [host.get_data_page(i, flat=True) for i in firsts])
        else:
            ok = all(b.batch_set_v1(fresh[0], s_idx))
        if not ok:
            raise RuntimeError(f"{label} set failed")

    def get() -> None:
        if sgl:
            got = b.batch_get(keys, [host.get_dummy_flat_data_page() for _ in d_firsts])
            for i, page in zip(d_firsts, got):
                if page is None:
                    raise RuntimeError("sglang get missed")
                host.set_from_flat_data_page(i, page)
        elif not all(b.batch_get_v1(keys, d_idx)):
            raise RuntimeError(f"{label} get missed")

    def exists() -> None:
        if b.batch_exists(keys) != batch:
            raise RuntimeError(f"{label} exists")

    def new_keys() -> None:
        if empty_set:
            b.clear()
        calls[0] += 1
        fresh[0] = page_hashes(list(range(batch * ps)), ps, f"{calls[0]:064x}")

    b.clear()
    # untimed writes of at least _WARM_PAGES pages first: the timed ones see a writer's steady
    # state (its segment and the index log open and written), not the first writes after the
    # clear (one call for a large batch, whose cost is its bytes)
    warm = 1 if empty_set else max(1, -(-_WARM_PAGES // batch))
    recycled(warm + repeat)
    sec_set = _timed(put, new_keys, repeat, warm=warm)
    b.clear()
    fresh[0] = keys
    put()
    recycled(1 + repeat)
    sec_get = _best(get, repeat)
    for i, j in zip(firsts, d_firsts):
        if not torch.equal(host.get_data_page(j).view(torch.int16),
                           host.get_data_page(i).view(torch.int16)):
            raise RuntimeError(f"{label}: get returned other bytes")
    return sec_set, sec_get, _best(exists, repeat)


#: bytes the recycler writes per ``pwrite`` (again and again up to what a series needs)
_RECYCLE_BUFFER = 8 << 20
SIDES = ("sglang", "ours", "ours-sgl")  # ours-sgl: our backend in the ``sglang`` key scheme


def side_by_side(cfg: Config, root: Path, rounds: int = 1, *, empty_set: bool = False,
                 recycle: bool = True) -> list[dict[str, Any]]:
    """SGLang's ``HiCacheFile`` and ours on the same pages (see the module docstring):
    ``rounds`` alternating rounds (round ``r`` runs the sides in turn, reversed on odd rounds),
    each row with its per-round seconds (best of ``cfg.repeat`` per round) and their median."""
    from tools.sglang_ref import load

    (hs,) = load("sglang.srt.mem_cache.hicache_storage")
    logging.getLogger("sglang").setLevel(logging.ERROR)
    samples: dict[tuple[str, str, int, int], list[float]] = {}
    sizes: dict[int, int] = {}
    max_batch = max(cfg.batches)
    recycler = Recycler(root, _RECYCLE_BUFFER) if recycle else None
    for ps in cfg.page_sizes:
        host = _host(cfg, ps, 2 * max_batch)
        sizes[ps] = ps * host.get_size_per_token()
        src = host.alloc(max_batch * ps)
        dst = host.alloc(max_batch * ps)
        assert src is not None and dst is not None
        sgl_cfg = hs.HiCacheStorageConfig(
            tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
            model_name="bench", extra_config={"file_storage_path": str(root / f"sgl-{ps}")})
        sides: dict[str, Any] = {"sglang": hs.HiCacheFile(sgl_cfg)}
        for label, scheme in (("ours", "mem_cache"), ("ours-sgl", "sglang")):
            sides[label] = create_backend(
                "file", HiCacheStorageConfig(model_name="bench"), host,
                storage_dir=str(root / f"{label}-{ps}"), key_scheme=scheme)
        calls = [0]
        try:
            for r in range(rounds):
                order = SIDES if r % 2 == 0 else SIDES[::-1]
                for batch in cfg.batches:
                    for label in order:
                        got = _measure(label, sides[label], host, ps=ps,
                                       s_idx=src[: batch * ps], d_idx=dst[: batch * ps],
                                       repeat=cfg.repeat, calls=calls, empty_set=empty_set,
                                       recycle=recycler)
                        for op, sec in zip(("set", "get", "exists"), got):
                            samples.setdefault((label, op, ps, batch), []).append(sec)
        finally:
            for b in sides.values():
                b.clear()
                if hasattr(b, "close"):
                    b.close()
            host.close()
    out: list[dict[str, Any]] = []
    for (label, op, ps, batch), secs in samples.items():
        sec = statistics.median(secs)
        out.append({"impl": label, "op": op, "page_size": ps, "batch": batch,
                    "page_bytes": sizes[ps], "seconds": sec, "round_seconds": secs,
                    "pages_per_s": batch / sec, "gbps": batch * sizes[ps] / sec / 1e9})
    return out


def _ratios(rows: list[dict[str, Any]], label: str, op: str, ps: int, batch: int
            ) -> list[float]:
    """Per-round ``label`` / SGLang pages-per-second ratios (same round, same pages)."""
    by = {(r["impl"], r["op"], r["page_size"], r["batch"]): r for r in rows}
    ours, theirs = by[(label, op, ps, batch)], by[("sglang", op, ps, batch)]
    return [t / o for o, t in zip(ours["round_seconds"], theirs["round_seconds"])]


def _side_table(rows: list[dict[str, Any]]) -> str:
    by = {(r["impl"], r["op"], r["page_size"], r["batch"]): r for r in rows}
    head = (f"{'op':<7}{'ps':>4}{'batch':>7}{'sglang p/s':>12}{'GB/s':>7}{'ours p/s':>11}"
            f"{'GB/s':>7}{'ratio':>7}{'(min..max)':>14}{'ours-sgl p/s':>14}{'ratio':>7}"
            f"{'(min..max)':>14}")
    lines = [head, "-" * len(head)]
    for op in ("set", "get", "exists"):
        for (impl, o, ps, batch), r in by.items():
            if impl != "sglang" or o != op:
                continue
            a, b = by[("ours", op, ps, batch)], by[("ours-sgl", op, ps, batch)]
            ra, rb = _ratios(rows, "ours", op, ps, batch), _ratios(rows, "ours-sgl", op, ps, batch)
            gb = (f"{r['gbps']:>7.2f}", f"{a['gbps']:>7.2f}") if op != "exists" else (
                f"{'':>7}", f"{'':>7}")
            lines.append(
                f"{op:<7}{ps:>4}{batch:>7}{r['pages_per_s']:>12,.0f}{gb[0]}"
                f"{a['pages_per_s']:>11,.0f}{gb[1]}{statistics.median(ra):>7.2f}"
                f"{f'({min(ra):.2f}..{max(ra):.2f})':>14}"
                f"{b['pages_per_s']:>14,.0f}{statistics.median(rb):>7.2f}"
                f"{f'({min(rb):.2f}..{max(rb):.2f})':>14}")
    return "\n".join(lines)


def _config(quick: bool, repeat: int | None) -> Config:
    if quick:  # tiny model, same page sizes and batches
        return Config(2, 2, 16, (16, 64), (1, 32, 128), repeat or 1, 32)
    # the simulator's default model: MHA 8 layers x 4 heads x 64, bf16
    return Config(8, 4, 64, (16, 64), (1, 32, 128), repeat or 5, 256)


#: ours / SGLang time per page at most this for set and get (issue 25: 2x the throughput)
FILE_GOAL = 0.5


def sglang_file_rows(*, quick: bool, rounds: int, directory: str | None = None
                     ) -> list[dict[str, Any]]:
    """The side-by-side rows for ``python -m tools.bench.sglang`` (its ``storage`` section):
    microseconds per page per round, ours (our key scheme, goal :data:`FILE_GOAL` on set and
    get) and ours in the ``sglang`` key scheme (reported, no goal: one page file plus a
    side-car per page) against SGLang's ``HiCacheFile``."""
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="bench-storage-", dir=directory))
    try:
        rows = side_by_side(_config(quick, None), root, rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    by = {(r["impl"], r["op"], r["page_size"], r["batch"]): r for r in rows}
    out: list[dict[str, Any]] = []
    for (impl, op, ps, batch), theirs in by.items():
        if impl != "sglang":
            continue
        for label, scheme in (("ours", "mem_cache"), ("ours-sgl", "sglang")):
            ours = by[(label, op, ps, batch)]
            kib = ours["page_bytes"] // 1024
            out.append({
                "name": f"file {op} ps={ps} batch={batch} ({kib} KiB pages), {scheme} scheme",
                "ours_us": [s / batch * 1e6 for s in ours["round_seconds"]],
                "sglang_us": [s / batch * 1e6 for s in theirs["round_seconds"]],
                "goal": FILE_GOAL if label == "ours" and op != "exists" else None,
                "note": "us per page; reads verified" if op == "get" else "us per page",
            })
    return out


def _table(rows: list[Row], prefetch: list[dict[str, Any]]) -> str:
    head = (f"{'backend':<9}{'op':<5}{'ps':>4}{'batch':>7}{'KiB/page':>10}{'pages/s':>11}"
            f"{'GB/s':>8}{'memcpy':>8}{'ratio':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.backend:<9}{r.op:<5}{r.page_size:>4}{r.batch:>7}"
                     f"{r.page_bytes / 1024:>10.0f}{r.pages_per_s:>11,.0f}{r.gbps:>8.2f}"
                     f"{r.memcpy_gbps:>8.2f}{r.ratio:>7.3f}")
    lines.append("")
    lines.append("controller prefetch (lookup + reserve + background batch_get_v1 + hand-off)")
    for p in prefetch:
        lines.append(f"{p['backend']:<9}{'pf':<5}{p['page_size']:>4}{p['pages']:>7}"
                     f"{p['page_bytes'] / 1024:>10.0f}{p['pages_per_s']:>11,.0f}"
                     f"{p['gbps']:>8.2f}{p['memcpy_gbps']:>8.2f}{p['ratio']:>7.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m tools.bench.storage",
                           description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--repeat", type=int, default=None, help="best of N (default 5)")
    parser.add_argument("--dir", default=None, help="parent of the file backend's directory")
    parser.add_argument("--no-mooncake", action="store_true",
                        help="skip the mooncake backend (default: run it when installed)")
    parser.add_argument("--no-sglang", action="store_true",
                        help="skip the side-by-side run against SGLang 0.5.23's HiCacheFile")
    parser.add_argument("--only-sglang", action="store_true",
                        help="run only the side-by-side comparison")
    parser.add_argument("--rounds", type=int, default=None,
                        help="side-by-side rounds, alternating order (default 3; quick 1)")
    parser.add_argument("--set-into-empty", action="store_true",
                        help="side by side: empty the directory before each timed set")
    parser.add_argument("--no-recycle", action="store_true",
                        help="side by side: no flush of dirty pages and no scratch write "
                             "before each timed set and get (time them in memory as the "
                             "machine leaves it)")
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party logs (the Mooncake client's glog lines)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1; 0 keeps torch's default)")
    args = parser.parse_args(argv)
    quiet_third_party_logs(args.verbose)
    cfg = _config(args.quick, args.repeat)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if rounds < 1:
        parser.error(f"--rounds must be >= 1, got {rounds}")
    if args.threads:
        torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="bench-storage-", dir=args.dir))
    store: Any = None
    rows: list[Row] = []
    prefetch: list[dict[str, Any]] = []
    side: list[dict[str, Any]] = []
    try:
        if not args.only_sglang:
            if not args.no_mooncake and importlib.util.find_spec("mooncake") is not None:
                from tools.mooncake.store import LocalMooncakeStore

                store = LocalMooncakeStore(segment_bytes=MOONCAKE_SEGMENT_BYTES).start()
            options = {**store.client_options(), "verbose": args.verbose} if store else None
            rows, prefetch = run(cfg, root, options)  # closes every client it opened
        if not args.no_sglang:
            side = side_by_side(cfg, root, rounds, empty_set=args.set_into_empty,
                                recycle=not args.no_recycle)
    finally:
        if store is not None:  # after the clients: a store stopped under them logs errors
            store.stop()
        shutil.rmtree(root, ignore_errors=True)
    shape = (f"MHA {cfg.layers}L x {cfg.heads} heads x {cfg.head_dim} bf16, page_first host "
             f"pool, best of {cfg.repeat}, {torch.get_num_threads()} threads")
    into = "an emptied directory" if args.set_into_empty else "the directory as left (steady)"
    if rows:
        print(f"storage tier benchmark: {shape}, zero-copy v1 calls; memcpy = one copy_ of the "
              "same bytes")
        print(_table(rows, prefetch))
    if side:
        print(f"\nfile backends side by side ({shape}; {rounds} alternating rounds, medians): "
              "SGLang 0.5.23 HiCacheFile vs ours (verified reads); ratio = ours / SGLang pages "
              f"per second, median of the per-round ratios (min..max); set into {into}")
        print(_side_table(side))
        print("memory: " + ("as the machine leaves it (--no-recycle)" if args.no_recycle else
                             "recently freed before the timed sets and gets (tools.bench.recycle)"))
    if args.json:
        payload = {
            "benchmark": "bench_storage", "config": asdict(cfg), "torch": torch.__version__,
            "machine": platform.machine(),
            "rows": [asdict(r) | {"ratio": r.ratio} for r in rows],
            "prefetch": prefetch,
            "side_by_side": side,
            "memory_recycled": bool(side) and not args.no_recycle,
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
