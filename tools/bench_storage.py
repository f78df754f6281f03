"""Storage tier (L3) benchmark: set and get pages/s and GB/s per backend, page size 16 and 64,
batch 1/32/128 pages per call (zero-copy ``batch_set_v1`` / ``batch_get_v1`` on a host pool),
each as a ratio to one plain ``memcpy`` (``torch`` ``copy_``) of the same bytes measured in the
same run, plus the controller's prefetch throughput (``batch_exists`` + reserve + background
``batch_get_v1`` + hand-off) with the simulator's model shape.

The file backend writes into a fresh temporary directory; reads are served from the OS page
cache right after the writes, so they measure the backend's own cost (header, CRC, syscalls),
not a disk.

The mooncake backend (``--mooncake``, on by default when its client is installed) runs against
a local store started here (``tools.mooncake_store``: master + holder on loopback, tcp). Its set
rows write fresh keys on every call (a key already present is not rewritten) and the store is
cleared after each row.

Usage: ``python -m tools.bench_storage [--quick] [--json PATH] [--repeat N] [--dir DIR]
[--no-mooncake]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import shutil
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

__all__ = ["Row", "main"]

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
            prefetch.append({
                "backend": name, "page_size": ps, "pages": n, "page_bytes": page_bytes,
                "seconds": sec, "pages_per_s": n / sec, "gbps": n * page_bytes / sec / 1e9,
                "memcpy_gbps": memcpy_n, "ratio": n * page_bytes / sec / 1e9 / memcpy_n,
            })
            storage.clear()
        host.close()
    return rows, prefetch


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
    parser = argparse.ArgumentParser(prog="bench_storage", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--repeat", type=int, default=None, help="best of N (default 5)")
    parser.add_argument("--dir", default=None, help="parent of the file backend's directory")
    parser.add_argument("--no-mooncake", action="store_true",
                        help="skip the mooncake backend (default: run it when installed)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1; 0 keeps torch's default)")
    args = parser.parse_args(argv)
    if args.quick:  # tiny model, same page sizes and batches
        cfg = Config(2, 2, 16, (16, 64), (1, 32, 128), args.repeat or 1, 32)
    else:  # the simulator's default model: MHA 8 layers x 4 heads x 64, bf16
        cfg = Config(8, 4, 64, (16, 64), (1, 32, 128), args.repeat or 5, 256)
    if args.threads:
        torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="bench-storage-", dir=args.dir))
    store: Any = None
    try:
        if not args.no_mooncake and importlib.util.find_spec("mooncake") is not None:
            from tools.mooncake_store import LocalMooncakeStore

            store = LocalMooncakeStore(segment_bytes=MOONCAKE_SEGMENT_BYTES).start()
        rows, prefetch = run(cfg, root, store.client_options() if store else None)
    finally:
        if store is not None:
            store.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"storage tier benchmark: MHA {cfg.layers}L x {cfg.heads} heads x {cfg.head_dim} bf16, "
          f"page_first host pool, zero-copy v1 calls, best of {cfg.repeat}, "
          f"{torch.get_num_threads()} threads; memcpy = one copy_ of the same bytes")
    print(_table(rows, prefetch))
    if args.json:
        payload = {
            "benchmark": "bench_storage", "config": asdict(cfg), "torch": torch.__version__,
            "machine": platform.machine(),
            "rows": [asdict(r) | {"ratio": r.ratio} for r in rows],
            "prefetch": prefetch,
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
