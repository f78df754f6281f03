"""Shared machinery of the GPU check: run context, time budget, result rows, timing, comparison.

Every section receives one :class:`Context`. On a CUDA machine it carries ``device="cuda"`` and
times with CUDA events; in a dry run it carries ``device="cpu"``, tiny sizes and no timing (every
timing helper returns ``None`` after running the measured code once, so the same code paths
execute and figures print as ``-``).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from mem_cache_kernels.dispatch import BACKEND_ENV_VAR

__all__ = [
    "Context",
    "Row",
    "SectionResult",
    "Sizes",
    "backend_env",
    "first_difference",
    "human_bytes",
    "paired_times",
    "sync",
    "time_call",
]

_BACKEND_ENV = BACKEND_ENV_VAR  # the kernels' one name for the backend setting


@dataclass(frozen=True, slots=True)
class Sizes:
    """Problem sizes of one run (realistic on CUDA, tiny in a dry run)."""

    tokens: int
    """Tokens (index pairs) per op call in the correctness cases; a multiple of 64."""
    pool_rows: int
    """Rows of a device buffer in the correctness cases (a multiple of 64, > 2 * tokens)."""
    heads: int
    head_dim: int
    mla_nope: int
    mla_rope: int
    layers: int
    """Layers of the multi-layer correctness cases."""
    bench_layers: int
    """Layers of the host pool / overlap measurements (a realistic model)."""
    bench_tokens: int
    """Tokens per host pool transfer (a multiple of 64)."""
    bench_device_tokens: int
    """Device pool size of the host pool measurements."""
    store_tokens: int
    """Tokens per ``store_kv`` measurement."""
    move_tokens: int
    """Rows moved per ``copy_all_layer_kv_cache`` measurement."""
    alloc_batches: tuple[int, ...]
    repeats: int
    """Timed samples per measurement (median)."""
    iters: int
    """Calls per timed sample of a fast (microsecond) op."""


CUDA_SIZES = Sizes(
    tokens=4096,
    pool_rows=16384,
    heads=8,
    head_dim=128,
    mla_nope=512,
    mla_rope=64,
    layers=4,
    bench_layers=32,
    bench_tokens=2048,
    bench_device_tokens=4096,
    store_tokens=32768,
    move_tokens=2048,
    alloc_batches=(1, 32, 256, 1024),
    repeats=3,
    iters=20,
)

DRY_SIZES = Sizes(
    tokens=64,
    pool_rows=256,
    heads=2,
    head_dim=8,
    mla_nope=16,
    mla_rope=8,
    layers=2,
    bench_layers=2,
    bench_tokens=128,
    bench_device_tokens=256,
    store_tokens=64,
    move_tokens=64,
    alloc_batches=(1, 32),
    repeats=1,
    iters=1,
)


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the final table (and one entry of the JSON)."""

    section: str
    item: str
    case: str
    status: str
    """``ok``, ``FAIL``, ``error``, ``skipped`` or ``info``."""
    value: float | None = None
    unit: str = ""
    reference: float | None = None
    reference_name: str = ""
    detail: str = ""

    @property
    def ratio(self) -> float | None:
        """``value / reference`` for rates (GB/s), ``reference / value`` for latencies (us)."""
        if self.value is None or self.reference is None or not self.value or not self.reference:
            return None
        if self.unit == "GB/s":
            return self.value / self.reference
        return self.reference / self.value

    def as_json(self) -> dict[str, Any]:
        return {
            "section": self.section,
            "item": self.item,
            "case": self.case,
            "status": self.status,
            "value": self.value,
            "unit": self.unit,
            "reference": self.reference,
            "reference_name": self.reference_name,
            "ratio": self.ratio,
            "detail": self.detail,
        }


@dataclass(slots=True)
class SectionResult:
    """What one section produced: table rows, optional per-case records and notes."""

    name: str
    rows: list[Row] = field(default_factory=list)
    cases: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    status: str = "ok"

    def add(self, row: Row) -> None:
        self.rows.append(row)

    @property
    def failed(self) -> bool:
        return self.status in ("FAIL", "error") or any(
            r.status in ("FAIL", "error") for r in self.rows
        )

    @property
    def incomplete(self) -> bool:
        return self.status == "skipped" or any(r.status == "skipped" for r in self.rows)

    def as_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "wall_s": round(self.wall_s, 3),
            "rows": [r.as_json() for r in self.rows],
            "cases": self.cases,
            "notes": self.notes,
        }


@dataclass(slots=True)
class Context:
    """Run-wide settings and the time budget."""

    device: torch.device
    dry_run: bool
    sizes: Sizes
    deadline: float
    """``time.monotonic()`` after which no new measurement or case starts."""
    section_deadline: float = float("inf")
    full_matrix: bool = True
    """Every combination of the correctness matrix (CUDA) or a covering subset (dry run)."""
    ops: tuple[str, ...] = ()
    """Restrict the ops section to these op names (empty: every op)."""
    checkpoint: Callable[[SectionResult], None] | None = None
    """Saves a section's partial result (in a child process: so a crash keeps what ran)."""

    def save(self, result: SectionResult) -> None:
        if self.checkpoint is not None:
            self.checkpoint(result)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def left(self) -> float:
        """Seconds left before the earlier of the run's and the section's deadline."""
        return min(self.deadline, self.section_deadline) - time.monotonic()

    def out_of_time(self, need: float = 0.0) -> bool:
        return self.left() <= need

    def generator(self, seed: int) -> torch.Generator:
        """A generator on the run's device (same seed, same device: same numbers)."""
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)
        return gen


def sync(device: torch.device) -> None:
    """Wait for the device (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(
    ctx: Context, fn: Callable[[], object], *, iters: int = 1, repeats: int | None = None
) -> float | None:
    """Seconds per call of ``fn`` (median of ``repeats`` (default ``ctx.sizes.repeats``) samples
    of ``iters`` calls, after one warm-up call), timed with CUDA events on the current stream;
    ``None`` (after one call) in a dry run."""
    fn()
    if not ctx.cuda:
        return None
    sync(ctx.device)
    samples = []
    for _ in range(repeats or ctx.sizes.repeats):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / iters)
    return float(statistics.median(samples))


def paired_times(
    ctx: Context, op: Callable[[], object], ref: Callable[[], object], *, iters: int = 1
) -> tuple[float | None, float | None]:
    """(op seconds, reference seconds) per call, samples interleaved so load bursts hit both."""
    op()
    ref()
    if not ctx.cuda:
        return None, None
    sync(ctx.device)
    ops: list[float] = []
    refs: list[float] = []
    for _ in range(ctx.sizes.repeats):
        for fn, out in ((ref, refs), (op, ops)):
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3 / iters)
    return statistics.median(ops), statistics.median(refs)


@contextmanager
def backend_env(backend: str | None) -> Iterator[None]:
    """Set ``MEM_CACHE_KERNELS_BACKEND`` (what ``backend="auto"`` resolves to) for a block."""
    old = os.environ.get(_BACKEND_ENV)
    if backend is None:
        os.environ.pop(_BACKEND_ENV, None)
    else:
        os.environ[_BACKEND_ENV] = backend
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(_BACKEND_ENV, None)
        else:
            os.environ[_BACKEND_ENV] = old


def human_bytes(n: int) -> str:
    """``n`` bytes as MiB / KiB / B."""
    if n >= 2**20:
        return f"{n / 2**20:.0f} MiB"
    return f"{n / 2**10:.0f} KiB" if n >= 2**10 else f"{n} B"


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, flat (bit-exact comparison: NaN payloads, -0.0, fp8 included)."""
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)


def first_difference(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """``None`` when the tensors are bit-identical (shape, dtype, bytes), else a description
    naming the first differing element index and both values. Compared on the tensors' device;
    only the description moves data to the host."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {tuple(got.shape)}/{got.dtype} vs {tuple(want.shape)}/{want.dtype}"
    a, b = _bytes(got), _bytes(want)
    if a.device != b.device:
        a, b = a.cpu(), b.cpu()
    if torch.equal(a, b):
        return None
    byte = int(torch.nonzero(a != b)[0, 0])
    item = max(1, got.element_size())
    flat = byte // item
    index = _unravel(flat, tuple(got.shape))
    g = got.detach().reshape(-1)[flat].cpu()
    w = want.detach().reshape(-1)[flat].cpu()
    return f"first difference at index {index} (flat {flat}): triton {_show(g)} vs torch {_show(w)}"


def _unravel(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    out: list[int] = []
    for size in reversed(shape):
        out.append(flat % size if size else 0)
        flat = flat // size if size else 0
    return tuple(reversed(out))


def _show(x: torch.Tensor) -> str:
    raw = x.reshape(1).view(torch.uint8) if x.dtype != torch.bool else x.to(torch.uint8)
    bits = "".join(f"{int(b):02x}" for b in raw.tolist())
    if x.dtype.is_floating_point and x.element_size() >= 2:
        return f"{float(x):.6g} (0x{bits})"
    if x.dtype.is_floating_point:
        return f"0x{bits}"
    return str(int(x))
