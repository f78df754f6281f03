"""Part 2 (device): ``store_kv`` and ``copy_all_layer_kv_cache`` GB/s against a device-to-device
``copy_`` of the same bytes, per backend (Triton and the torch path on the same GPU).

Bytes counted once (what the op writes). ``store_kv``: ``tokens`` K and V rows of
``heads x head_dim`` into a pool at contiguous slots, scattered 16-token pages or scattered
single slots, bf16 and fp8 (bf16 inputs cast by the op). ``copy_all_layer_kv_cache``: ``rows``
moved in every K and V buffer of every layer (speculative-decoding moves: scattered single slots
and scattered pages). The op's result is checked bit-exactly against the torch path once per
case before timing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

import torch

import mem_cache_kernels as mk
from mem_cache_kernels import Backend
from tools.gpu_check._core import (
    Context,
    Row,
    SectionResult,
    first_difference,
    human_bytes,
    sync,
    time_call,
)

__all__ = ["run_device"]

_BACKENDS: tuple[Backend, ...] = ("triton", "torch")


def _gbps(nbytes: int, seconds: float | None) -> float | None:
    return None if seconds is None or seconds <= 0 else nbytes / seconds / 1e9


def _slots(ctx: Context, n: int, pattern: str, rows: int, gen: torch.Generator) -> torch.Tensor:
    if pattern == "contiguous":
        return torch.arange(16, 16 + n, device=ctx.device)
    ps = 16 if pattern == "scattered pages" else 1
    pages = 1 + torch.randperm(rows // ps - 1, generator=gen)[: n // ps]
    return (pages[:, None] * ps + torch.arange(ps)).reshape(-1).to(ctx.device)


def _d2d(ctx: Context, nbytes: int) -> float | None:
    src = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device)
    dst = torch.empty_like(src)
    return _gbps(nbytes, time_call(ctx, lambda: dst.copy_(src), iters=ctx.sizes.iters))


def run_device(ctx: Context) -> SectionResult:
    result = SectionResult("device")
    s = ctx.sizes
    gen = torch.Generator().manual_seed(3)
    row = (s.heads, s.head_dim)
    refs: dict[int, float | None] = {}

    def reference(nbytes: int) -> float | None:
        if nbytes not in refs:
            refs[nbytes] = _d2d(ctx, nbytes)
            result.add(
                Row(
                    "device",
                    "device copy_",
                    human_bytes(nbytes),
                    "info",
                    value=refs[nbytes],
                    unit="GB/s",
                )
            )
        return refs[nbytes]

    # store_kv
    n = s.store_tokens
    rows = 2 * n + 16
    for dt, pattern in (
        ("bf16", "contiguous"),
        ("bf16", "scattered pages"),
        ("bf16", "scattered slots"),
        ("fp8", "scattered pages"),
    ):
        store = torch.uint8 if dt == "fp8" else torch.bfloat16
        loc = _slots(ctx, n, pattern, rows, gen)
        k = torch.randn((n, *row), device=ctx.device).to(torch.bfloat16)
        v = torch.randn((n, *row), device=ctx.device).to(torch.bfloat16)
        outs = {
            be: [torch.zeros((rows, *row), dtype=store, device=ctx.device) for _ in range(2)]
            for be in _BACKENDS
        }
        calls = {
            be: partial(
                mk.store_kv, outs[be][0], outs[be][1], loc, k, v,
                dtype=torch.float8_e4m3fn if dt == "fp8" else None, backend=be,
            )
            for be in _BACKENDS
        }  # fmt: skip
        nbytes = n * 2 * row[0] * row[1] * store.itemsize
        case = f"{dt} {pattern} {n} tokens"
        _measure(
            ctx, result, "store_kv", case, calls=calls, outs=outs, nbytes=nbytes, ref=reference
        )

    # copy_all_layer_kv_cache
    n = s.move_tokens
    rows = 2 * n + 16
    for pattern in ("scattered slots", "scattered pages"):
        tgt = _slots(ctx, n, pattern, rows, gen)
        src = _slots(ctx, n, pattern, rows, gen)
        base = [
            torch.randn((rows, *row), device=ctx.device).to(torch.bfloat16)
            for _ in range(2 * s.bench_layers)
        ]
        outs = {be: [b.clone() for b in base] for be in _BACKENDS}
        del base
        calls = {
            be: partial(mk.copy_all_layer_kv_cache, outs[be], tgt, src, backend=be)
            for be in _BACKENDS
        }
        nbytes = n * 2 * s.bench_layers * row[0] * row[1] * 2
        case = f"bf16 {pattern} {n} rows x {2 * s.bench_layers} buffers"
        op = "copy_all_layer_kv_cache"
        _measure(ctx, result, op, case, calls=calls, outs=outs, nbytes=nbytes, ref=reference)
    return result


def _measure(
    ctx: Context,
    result: SectionResult,
    op: str,
    case: str,
    *,
    calls: Mapping[Backend, Callable[[], object]],
    outs: dict[Backend, list[torch.Tensor]],
    nbytes: int,
    ref: Callable[[int], float | None],
) -> None:
    """Check the backends agree bit for bit (one call each), then time each one."""
    if ctx.out_of_time():
        result.add(Row("device", op, case, "skipped", detail="time budget"))
        return
    for be in _BACKENDS:
        calls[be]()
    sync(ctx.device)
    bad = None
    for a, b in zip(outs["triton"], outs["torch"]):
        bad = first_difference(a, b)
        if bad:
            break
    reference = ref(nbytes)
    for be in _BACKENDS:
        seconds = time_call(ctx, calls[be], iters=ctx.sizes.iters)
        result.add(
            Row(
                "device",
                f"{op} [{be}]",
                case,
                "FAIL" if bad else "ok",
                value=_gbps(nbytes, seconds),
                unit="GB/s",
                reference=reference,
                reference_name="device copy_",
                detail=bad or "",
            )
        )
