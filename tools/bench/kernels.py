"""Kernel benchmark: KV transfer GB/s against the memcpy roofline, and allocation call cost.

For every transfer op of :mod:`mem_cache_kernels`, item size (512 B .. 64 KiB per row) and index
pattern, the op moves the same number of bytes as one plain contiguous ``copy_`` between buffers
on the same devices (the memcpy roofline). Roofline and op are timed alternately and the ratio is
the median of the per-repeat ratios, so load bursts on a shared machine hit both. Patterns:

* ``runs``: runs of 8 consecutive pages (page size 16) on both sides;
* ``pages``: scattered pages (every page still 16 consecutive rows);
* ``tokens``: scattered single rows (page size 1), the worst case.

``alloc_extend``/``alloc_decode`` are timed at batch 1, 32, 256 and 1024 (ns per call), without and
with the host-side page-count hints (``+hint`` rows: what the allocators pass). ``--only alloc``
runs just that part.

Usage: ``python -m tools.bench.kernels [--quick] [--json PATH] [--device cpu|cuda]
[--backend auto|torch|triton] [--threads N]``. On a CPU-only machine "device" buffers are CPU
tensors (the torch reference path); with ``--device cuda`` host buffers are pinned.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import cast

import torch

import mem_cache_kernels as mk
from tools.cli import OneLineParser

__all__ = ["AllocRow", "TransferRow", "main"]

PAGE = 16
RUN_PAGES = 8
ROLES = 2  # MHA: K and V


@dataclass(frozen=True, slots=True)
class TransferRow:
    """One measured (op, item size, pattern) point."""

    op: str
    backend: str
    item_bytes: int
    pattern: str
    nbytes: int
    seconds: float
    gbps: float
    roofline_gbps: float
    ratio: float
    direction: str  # d2h or h2d: which memcpy roofline it is compared with


@dataclass(frozen=True, slots=True)
class AllocRow:
    """Median cost of one allocation call."""

    op: str
    backend: str
    batch: int
    ns_per_call: float


@dataclass(frozen=True, slots=True)
class Config:
    device: torch.device
    backend: mk.Backend
    budget: int  # bytes moved per call
    layers: int
    items: tuple[int, ...]
    repeat: int
    alloc_batches: tuple[int, ...]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _paired(
    op: Callable[[], object], roof: Callable[[], object], repeat: int, device: torch.device
) -> tuple[float, float, float]:
    """(median op seconds, median roofline seconds, median of roof/op ratios), interleaved."""
    op()
    roof()
    _sync(device)
    ops, roofs, ratios = [], [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        roof()
        _sync(device)
        t1 = time.perf_counter()
        op()
        _sync(device)
        t2 = time.perf_counter()
        ops.append(t2 - t1)
        roofs.append(t1 - t0)
        ratios.append((t1 - t0) / (t2 - t1))
    return statistics.median(ops), statistics.median(roofs), statistics.median(ratios)


def _copier(src: torch.Tensor, dst: torch.Tensor) -> Callable[[], object]:
    """The roofline: one contiguous copy of the same bytes between the same devices."""

    def copy() -> object:
        return dst.copy_(src, non_blocking=True)

    return copy


def _indices(pattern: str, n: int, space: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` distinct row indices in ``[0, space)`` following ``pattern`` (see the docstring)."""
    if pattern == "tokens":
        return torch.randperm(space, generator=gen)[:n]
    pages = n // PAGE
    if pattern == "pages":
        chosen = torch.randperm(space // PAGE, generator=gen)[:pages]
    else:  # runs of RUN_PAGES consecutive pages, runs in random order
        runs = -(-pages // RUN_PAGES)
        starts = torch.randperm(space // PAGE // RUN_PAGES, generator=gen)[:runs] * RUN_PAGES
        chosen = (starts[:, None] + torch.arange(RUN_PAGES)).flatten()[:pages]
    return (chosen[:, None] * PAGE + torch.arange(PAGE)).flatten()


def _host(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    t = torch.empty(shape, dtype=torch.uint8, pin_memory=device.type == "cuda")
    t.fill_(1)
    return t


def _dev(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.full(shape, 2, dtype=torch.uint8, device=device)


def _cases(  # noqa: PLR0917
    cfg: Config, item: int, n: int, hi: torch.Tensor, di: torch.Tensor, space: int
) -> dict[str, tuple[Callable[[], object], int, str]]:
    """op name -> (call, bytes moved, direction d2h/h2d) for one item size and index pair."""
    dev, L, be = cfg.device, cfg.layers, cfg.backend
    d_layers = [[_dev((space, item), dev) for _ in range(L)] for _ in range(ROLES)]
    h_lf = [[_host((space, item), dev) for _ in range(L)] for _ in range(ROLES)]
    h_pf = [_host((space, L, item), dev) for _ in range(ROLES)]
    h_pfd = [_host((space // PAGE, L, PAGE, item), dev) for _ in range(ROLES)]
    one = [r[0] for r in d_layers]
    di_dev = di.to(dev)
    hi_dev = hi.to(dev) if dev.type == "cuda" and be != "torch" else hi
    b = be
    layer = n * item * ROLES
    return {
        "transfer_rows": (
            lambda: mk.transfer_rows(one, [r[0] for r in h_lf], di_dev, hi_dev, backend=b),
            layer,
            "d2h",
        ),
        "transfer_rows_all_layers": (
            lambda: mk.transfer_rows_all_layers(d_layers, h_lf, di_dev, hi_dev, backend=b),
            layer * L,
            "d2h",
        ),
        "load_layer_from_page_first": (
            lambda: mk.load_layer_from_page_first(h_pf, one, hi_dev, di_dev, 0, backend=b),
            layer,
            "h2d",
        ),
        "backup_all_layers_to_page_first": (
            lambda: mk.backup_all_layers_to_page_first(d_layers, h_pf, di_dev, hi_dev, backend=b),
            layer * L,
            "d2h",
        ),
        "direct_transfer_rows": (
            lambda: mk.direct_transfer_rows(d_layers, h_lf, di, hi, PAGE),
            layer * L,
            "d2h",
        ),
        "direct_load_layer_from_page_first_direct": (
            lambda: mk.direct_load_layer_from_page_first_direct(h_pfd, one, hi, di, 0, PAGE),
            layer,
            "h2d",
        ),
        "direct_backup_all_layers_to_page_first_direct": (
            lambda: mk.direct_backup_all_layers_to_page_first_direct(d_layers, h_pfd, di, hi, PAGE),
            layer * L,
            "d2h",
        ),
    }


def run_transfers(cfg: Config) -> list[TransferRow]:
    """Every (item size, pattern, op) point."""
    rows: list[TransferRow] = []
    gen = torch.Generator().manual_seed(0)
    for item in cfg.items:
        # tokens per call: the budget spread over roles and (for all-layer ops) layers
        n = max(PAGE * RUN_PAGES, cfg.budget // (item * ROLES * cfg.layers) // PAGE * PAGE)
        space = -(-n * 5 // 4 // (PAGE * RUN_PAGES)) * PAGE * RUN_PAGES  # 25% slack, whole runs
        roof_src = {"d2h": _dev((n * item * ROLES * cfg.layers,), cfg.device)}
        roof_dst = {"d2h": _host((n * item * ROLES * cfg.layers,), cfg.device)}
        roof_src["h2d"], roof_dst["h2d"] = roof_dst["d2h"], roof_src["d2h"]
        for pattern in ("runs", "pages", "tokens"):
            di = _indices(pattern, n, space, gen)
            hi = _indices(pattern, n, space, gen)
            for op, (call, nbytes, direction) in _cases(cfg, item, n, hi, di, space).items():
                if op.startswith("direct") and pattern == "tokens":
                    continue  # page-granular by contract; token scatter is the kernels' job
                src, dst = roof_src[direction][:nbytes], roof_dst[direction][:nbytes]
                sec, roof_sec, ratio = _paired(
                    call,
                    _copier(src, dst),
                    cfg.repeat,
                    cfg.device,
                )
                backend = (
                    "host"
                    if op.startswith("direct")
                    else mk.resolve_backend(cfg.backend, roof_src["d2h"])
                )
                rows.append(
                    TransferRow(
                        op=op,
                        backend=backend,
                        item_bytes=item,
                        pattern=pattern,
                        nbytes=nbytes,
                        seconds=sec,
                        gbps=nbytes / sec / 1e9,
                        roofline_gbps=nbytes / roof_sec / 1e9,
                        ratio=ratio,
                        direction=direction,
                    )
                )
    return rows


def run_alloc(cfg: Config) -> list[AllocRow]:
    """ns per call of alloc_extend / alloc_decode at each batch size (page size 16)."""
    rows: list[AllocRow] = []
    gen = torch.Generator().manual_seed(1)
    dev = cfg.device
    for bs in cfg.alloc_batches:
        pre = torch.randint(0, 200, (bs,), generator=gen)
        seq = pre + torch.randint(1, 64, (bs,), generator=gen)
        last = torch.where(pre > 0, (pre - 1) % PAGE + 10 * PAGE, -1)
        free = torch.arange(1, bs * 8 + 2)
        total = int((seq - pre).sum())
        out_e = torch.empty(total, dtype=torch.int64, device=dev)
        out_d = torch.empty(bs, dtype=torch.int64, device=dev)
        args = [t.to(dev) for t in (pre, seq, last, free)]

        pages = int(((seq + PAGE - 1) // PAGE - (pre + PAGE - 1) // PAGE).sum())
        starts = int(((seq - 1) % PAGE == 0).sum())

        def extend(
            a: Sequence[torch.Tensor] = args, o: torch.Tensor = out_e, b: mk.Backend = cfg.backend
        ) -> None:
            mk.alloc_extend(a[0], a[1], a[2], a[3], o, PAGE, backend=b)

        def extend_hinted(
            a: Sequence[torch.Tensor] = args,
            o: torch.Tensor = out_e,
            b: mk.Backend = cfg.backend,
            n: int = pages,
            t: int = total,
        ) -> None:
            mk.alloc_extend(
                a[0], a[1], a[2], a[3], o, PAGE, num_new_pages=n, num_tokens=t, backend=b
            )

        def decode(
            a: Sequence[torch.Tensor] = args, o: torch.Tensor = out_d, b: mk.Backend = cfg.backend
        ) -> None:
            mk.alloc_decode(a[1], a[2], a[3], o, PAGE, backend=b)

        def decode_hinted(
            a: Sequence[torch.Tensor] = args,
            o: torch.Tensor = out_d,
            b: mk.Backend = cfg.backend,
            n: int = starts,
        ) -> None:
            mk.alloc_decode(a[1], a[2], a[3], o, PAGE, num_new_pages=n, backend=b)

        for name, fn in (
            ("alloc_extend", extend),
            ("alloc_extend+hint", extend_hinted),
            ("alloc_decode", decode),
            ("alloc_decode+hint", decode_hinted),
        ):
            fn()
            _sync(dev)
            loops = max(3, cfg.repeat * 4)
            samples = []
            for _ in range(cfg.repeat):
                t0 = time.perf_counter()
                for _ in range(loops):
                    fn()
                _sync(dev)
                samples.append((time.perf_counter() - t0) / loops)
            backend = mk.resolve_backend(cfg.backend, args[0])
            rows.append(AllocRow(name, backend, bs, statistics.median(samples) * 1e9))
    return rows


def _print(transfers: list[TransferRow], allocs: list[AllocRow], title: str) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is a dev dependency
        for r in transfers:
            print(r)
        for a in allocs:
            print(a)
        return
    table = Table(title=title)
    for col in ("op", "backend", "item B/row", "pattern", "MiB/call", "GB/s", "memcpy GB/s",
                "ratio (GB/s / memcpy)"):
        table.add_column(col, justify="left" if col in ("op", "backend", "pattern") else "right")
    for r in transfers:
        table.add_row(
            r.op,
            r.backend,
            f"{r.item_bytes}",
            r.pattern,
            f"{r.nbytes / 2**20:.1f}",
            f"{r.gbps:.2f}",
            f"{r.roofline_gbps:.2f}",
            f"{r.ratio:.2f}",
        )
    alloc = Table(title="allocation (page size 16)")
    for col in ("op", "backend", "batch (requests)", "ns/call (mean)"):
        alloc.add_column(col, justify="left" if col in ("op", "backend") else "right")
    for a in allocs:
        alloc.add_row(a.op, a.backend, str(a.batch), f"{a.ns_per_call:,.0f}")
    console = Console(width=120)
    if transfers:
        console.print(table)
    if allocs:
        console.print(alloc)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m tools.bench.kernels",
                           description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default_device, help="device-buffer device")
    parser.add_argument("--backend", default="auto", choices=("auto", "torch", "triton"))
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--items", default=None, help="comma-separated item sizes in bytes")
    parser.add_argument(
        "--only",
        choices=("all", "transfer", "alloc"),
        default="all",
        help="run only the transfer or only the allocation benchmark",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: stable on a shared machine; 0 keeps torch's)",
    )
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = Config(
        device=device,
        backend=cast(mk.Backend, args.backend),
        budget=(256 << 10) if args.quick else (64 << 20),
        layers=2 if args.quick else 4,
        items=(
            tuple(int(x) for x in args.items.split(","))
            if args.items
            else (512, 4096)
            if args.quick
            else (512, 4096, 16384, 65536)
        ),
        repeat=args.repeat or (2 if args.quick else 9),
        alloc_batches=(1, 32) if args.quick else (1, 32, 256, 1024),
    )
    transfers = run_transfers(cfg) if args.only != "alloc" else []
    allocs = run_alloc(cfg) if args.only != "transfer" else []
    title = (
        f"mem_cache_kernels transfers on {device} (backend {args.backend}, "
        f"{torch.get_num_threads()} thread(s), {cfg.budget >> 20 or cfg.budget >> 10}"
        f"{'MiB' if cfg.budget >= 1 << 20 else 'KiB'} per call)"
    )
    _print(transfers, allocs, title)
    if args.json:
        meta = {
            "device": str(device),
            "backend": args.backend,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "machine": platform.machine(),
            "quick": args.quick,
            "budget_bytes": cfg.budget,
            "layers": cfg.layers,
            "page_size": PAGE,
        }
        payload = {
            "meta": meta,
            "transfers": [asdict(r) for r in transfers],
            "alloc": [asdict(a) for a in allocs],
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(payload, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
