"""Host pool transfer benchmark: backup (device -> host, all layers) and load (host -> device,
layer by layer) GB/s per layout and IO backend, page sizes 1/16/64, contiguous vs scattered
pages, against the memcpy roofline (one plain contiguous ``copy_`` of the same bytes between
the same devices) measured in the same run.

Usage: ``python -m tools.bench.host [--quick] [--json PATH] [--device cpu|cuda]``.
On a CPU-only machine "device" buffers are CPU tensors, so the numbers are host memcpy rates.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from mem_cache_pool import MHATokenToKVPool
from mem_cache_pool_host import MHATokenToKVPoolHost
from tools.cli import OneLineParser

__all__ = ["BenchRow", "main"]

COMBOS = (
    ("layer_first", "kernel"),
    ("layer_first", "direct"),
    ("page_first", "kernel"),
    ("page_first_direct", "direct"),
)


@dataclass(frozen=True, slots=True)
class BenchRow:
    layout: str
    io_backend: str
    page_size: int
    pattern: str
    direction: str
    nbytes: int
    seconds: float
    gbps: float
    roofline_gbps: float

    @property
    def ratio(self) -> float:
        return self.gbps / self.roofline_gbps if self.roofline_gbps else 0.0


@dataclass(frozen=True, slots=True)
class Config:
    layer_num: int
    head_num: int
    head_dim: int
    tokens: int
    device_size: int
    repeat: int
    device: str


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn: Callable[[], None], repeat: int, device: torch.device) -> float:
    fn()  # warm-up
    _sync(device)
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - t0)
    return min(samples)  # best of N: throughput least disturbed by other processes


def _slots(pages: torch.Tensor, ps: int) -> torch.Tensor:
    return (pages[:, None] * ps + torch.arange(ps)).reshape(-1)


def _roofline(nbytes: int, device: torch.device, repeat: int) -> tuple[float, float]:
    """GB/s of one contiguous copy device -> host and host -> device of ``nbytes``."""
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")

    def to_host() -> None:
        host.copy_(dev, non_blocking=True)

    def to_device() -> None:
        dev.copy_(host, non_blocking=True)

    d2h = _time(to_host, repeat, device)
    h2d = _time(to_device, repeat, device)
    return nbytes / d2h / 1e9, nbytes / h2d / 1e9


def _measure(
    host: MHATokenToKVPoolHost,
    *,
    pool: MHATokenToKVPool,
    hidx: torch.Tensor,
    didx: torch.Tensor,
    backend: str,
    cfg: Config,
    device: torch.device,
) -> tuple[float, float]:
    """Median seconds of one all-layer backup and of one layer-by-layer load."""

    def backup() -> None:
        host.backup_from_device_all_layer(pool, hidx, didx, backend)

    def load() -> None:
        for layer in range(cfg.layer_num):
            host.load_to_device_per_layer(pool, hidx, didx, layer, backend)

    return _time(backup, cfg.repeat, device), _time(load, cfg.repeat, device)


def run(cfg: Config) -> list[BenchRow]:
    """Every (page size, layout/backend, pattern, direction) row. The memcpy roofline is measured
    before and after the sweep and the best rate per direction is used for every ratio, so a
    burst of load on a shared machine does not skew individual ratios."""
    device = torch.device(cfg.device)
    nbytes = cfg.tokens * 2 * cfg.layer_num * cfg.head_num * cfg.head_dim * 2  # bf16 K and V
    roofs = [_roofline(nbytes, device, 3 * cfg.repeat)]
    measured: list[tuple[str, str, int, str, float, float]] = []
    gen = torch.Generator().manual_seed(0)
    for ps in (1, 16, 64):
        pool = MHATokenToKVPool(
            cfg.device_size, ps, torch.bfloat16, cfg.head_num, cfg.head_dim, cfg.layer_num, device
        )
        assert cfg.tokens * pool.get_buffer_desc().bytes_per_token == nbytes
        n_pages = cfg.tokens // ps
        for layout, backend in COMBOS:
            host = MHATokenToKVPoolHost(pool, layout=layout, io_backend=backend)
            for pattern in ("contiguous", "scattered"):
                if pattern == "contiguous":
                    dpages = torch.arange(1, 1 + n_pages)
                    hpages = torch.arange(n_pages)
                else:
                    dpages = 1 + torch.randperm(cfg.device_size // ps, generator=gen)[:n_pages]
                    hpages = torch.randperm(host.page_num, generator=gen)[:n_pages]
                didx = _slots(dpages, ps).to(device)
                hidx = _slots(hpages, ps)
                backup_s, load_s = _measure(
                    host, pool=pool, hidx=hidx, didx=didx, backend=backend, cfg=cfg, device=device
                )
                measured.append((layout, backend, ps, pattern, backup_s, load_s))
            host.close()
    roofs.append(_roofline(nbytes, device, 3 * cfg.repeat))
    roof_d2h = max(r[0] for r in roofs)
    roof_h2d = max(r[1] for r in roofs)
    rows: list[BenchRow] = []
    for layout, backend, ps, pattern, backup_s, load_s in measured:
        for direction, sec, roof in (("backup", backup_s, roof_d2h), ("load", load_s, roof_h2d)):
            rows.append(
                BenchRow(
                    layout=layout,
                    io_backend=backend,
                    page_size=ps,
                    pattern=pattern,
                    direction=direction,
                    nbytes=nbytes,
                    seconds=sec,
                    gbps=nbytes / sec / 1e9,
                    roofline_gbps=roof,
                )
            )
    return rows


def _table(rows: list[BenchRow]) -> str:
    head = (
        f"{'layout':<18}{'io':<8}{'ps':>4} {'pattern':<11}{'dir':<7}{'MiB':>7}"
        f"{'GB/s':>9}{'memcpy':>9}{'ratio':>7}"
    )
    legend = ("ps: page size (tokens); MiB: bytes per transfer; GB/s and memcpy GB/s: best of "
              "the repeats; ratio: GB/s / memcpy GB/s")
    lines = [legend, head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.layout:<18}{r.io_backend:<8}{r.page_size:>4} {r.pattern:<11}{r.direction:<7}"
            f"{r.nbytes / 2**20:>7.1f}{r.gbps:>9.2f}{r.roofline_gbps:>9.2f}{r.ratio:>7.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m tools.bench.host",
                           description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default_device, help="device pool device")
    parser.add_argument("--tokens", type=int, default=None, help="tokens moved per transfer")
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: one IO thread; 0 keeps torch's default)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        cfg = Config(2, 2, 64, 128, 256, args.repeat or 2, args.device)
    else:
        cfg = Config(8, 8, 128, args.tokens or 2048, 4096, args.repeat or 5, args.device)
    if cfg.tokens % 64 or cfg.tokens > cfg.device_size:
        parser.error(f"--tokens must be a multiple of 64 and <= {cfg.device_size}")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = run(cfg)
    print(
        f"host pool transfer benchmark: device={cfg.device}, bf16 MHA, {cfg.layer_num} layers x "
        f"{cfg.head_num} heads x {cfg.head_dim} dims, {cfg.tokens} tokens per transfer, "
        f"best of {cfg.repeat}, {torch.get_num_threads()} threads; "
        "memcpy = one contiguous copy_ of the same bytes"
    )
    print(_table(rows))
    if args.json:
        payload = {
            "benchmark": "bench_host",
            "config": asdict(cfg),
            "torch": torch.__version__,
            "machine": platform.machine(),
            "threads": torch.get_num_threads(),
            "rows": [asdict(r) | {"ratio": r.ratio} for r in rows],
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
