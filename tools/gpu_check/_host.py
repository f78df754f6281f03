"""Part 2 (host): host pool backup and load GB/s against ``cudaMemcpyAsync`` of the same bytes.

For page sizes 1, 16 and 64, every layout / IO backend pair a host pool supports
(``layer_first`` + kernel, ``layer_first`` + direct, ``page_first`` + kernel,
``page_first_direct`` + direct) and contiguous or scattered pages, one all-layer backup
(device -> host) and one layer-by-layer load (host -> device) of the same tokens are timed with
CUDA events. The reference is a plain ``copy_`` (``cudaMemcpyAsync``) of the same byte count
between pinned host memory (``torch.empty(pin_memory=True)``) and the device, timed in the same
run; a second reference row gives the same copy from the host pools' own memory (an anonymous
mmap registered with ``cudaHostRegister``). Every pool's first backup + load is also checked
bit-exactly (the rows loaded back into other device slots equal the originals), which exercises
the Triton kernels on registered host memory.
"""

from __future__ import annotations

import time
from functools import partial

import torch

from mem_cache_pool import MHATokenToKVPool
from mem_cache_pool_host import MHATokenToKVPoolHost, MmapHostTensorAllocator
from tools.gpu_check._core import (
    Context,
    Row,
    SectionResult,
    backend_env,
    first_difference,
    human_bytes,
    sync,
    time_call,
)

__all__ = ["COMBOS", "run_host"]

COMBOS = (
    ("layer_first", "kernel"),
    ("layer_first", "direct"),
    ("page_first", "kernel"),
    ("page_first_direct", "direct"),
)


def _gbps(nbytes: int, seconds: float | None) -> float | None:
    return None if seconds is None or seconds <= 0 else nbytes / seconds / 1e9


def _memcpy_refs(ctx: Context, nbytes: int, result: SectionResult) -> dict[str, float | None]:
    """GB/s of one contiguous copy pinned -> device and device -> pinned (and from registered
    mmap memory), as table rows; returns the pinned rates by direction."""
    dev = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=ctx.cuda)
    alloc = MmapHostTensorAllocator().allocate_bytes(nbytes)  # registered on CUDA
    mapped = alloc.tensor
    try:
        rates: dict[str, float | None] = {}
        for name, host in (("pinned", pinned), ("registered mmap", mapped)):
            h2d = _gbps(nbytes, time_call(ctx, partial(dev.copy_, host, non_blocking=True)))
            d2h = _gbps(nbytes, time_call(ctx, partial(host.copy_, dev, non_blocking=True)))
            if name == "pinned":
                rates = {"load": h2d, "backup": d2h}
            for direction, rate in (("host->device", h2d), ("device->host", d2h)):
                result.add(
                    Row(
                        "host",
                        f"cudaMemcpyAsync {name}",
                        f"{direction} {human_bytes(nbytes)}",
                        "info",
                        value=rate,
                        unit="GB/s",
                    )
                )
        sync(ctx.device)
        return rates
    finally:
        alloc.close()


def _slots(pages: torch.Tensor, ps: int) -> torch.Tensor:
    return (pages[:, None] * ps + torch.arange(ps)).reshape(-1)


def _check_round_trip(
    pool: MHATokenToKVPool,
    *,
    host: MHATokenToKVPoolHost,
    hidx: torch.Tensor,
    didx: torch.Tensor,
    didx2: torch.Tensor,
    io: str,
) -> str | None:
    """Backup rows ``didx``, load them into rows ``didx2``, compare: None when bit-exact."""
    desc = pool.get_buffer_desc()
    for role in desc.buffers:
        for layer in role:
            layer[didx2] = 0
    host.backup_from_device_all_layer(pool, hidx, didx, io)
    for layer_id in range(host.layer_num):
        host.load_to_device_per_layer(pool, hidx, didx2, layer_id, io)
    sync(desc.device)
    for r, role in enumerate(desc.buffers):
        for i, layer in enumerate(role):
            diff = first_difference(layer[didx2], layer[didx])
            if diff is not None:
                return f"{desc.roles[r]} layer {i}: {diff}"
    return None


def run_host(ctx: Context) -> SectionResult:
    result = SectionResult("host")
    s = ctx.sizes
    L, H, D, tokens = s.bench_layers, s.heads, s.head_dim, s.bench_tokens
    nbytes = tokens * 2 * L * H * D * 2  # bf16 K and V, every layer
    refs = _memcpy_refs(ctx, nbytes, result)
    gen = torch.Generator().manual_seed(0)
    # In a dry run the "device" pool is on the CPU, where backend "auto" means torch: force the
    # Triton interpreter there so the dry run takes the GPU's code path.
    with backend_env("triton" if not ctx.cuda else None):
        for ps in (1, 16, 64):
            if ctx.out_of_time():
                result.add(Row("host", f"page size {ps}", "-", "skipped", detail="time budget"))
                continue
            pool = MHATokenToKVPool(s.bench_device_tokens, ps, torch.bfloat16, H, D, L, ctx.device)
            for buffers in pool.get_buffer_desc().buffers:
                for buf in buffers:
                    buf.view(torch.int16).random_(generator=ctx.generator(ps))
            n_pages = tokens // ps
            for layout, io in COMBOS:
                ctx.save(result)
                _measure_combo(
                    ctx, result, pool, layout=layout, io=io, ps=ps, n_pages=n_pages, gen=gen,
                    refs=refs, nbytes=nbytes,
                )  # fmt: skip
            del pool
    return result


def _measure_combo(
    ctx: Context,
    result: SectionResult,
    pool: MHATokenToKVPool,
    *,
    layout: str,
    io: str,
    ps: int,
    n_pages: int,
    gen: torch.Generator,
    refs: dict[str, float | None],
    nbytes: int,
) -> None:
    name = f"{layout} / {io}"
    if ctx.out_of_time():
        result.add(Row("host", name, f"ps={ps}", "skipped", detail="time budget"))
        return
    host = MHATokenToKVPoolHost(
        pool, host_size_bytes=pool.size * pool.get_buffer_desc().bytes_per_token,
        layout=layout, io_backend=io,
    )  # fmt: skip
    try:
        dev_pages = pool.size // ps
        for pattern in ("contiguous", "scattered"):
            if pattern == "contiguous":
                dpages = torch.arange(1, 1 + n_pages)
                hpages = torch.arange(n_pages)
            else:
                dpages = 1 + torch.randperm(dev_pages, generator=gen)[:n_pages]
                hpages = torch.randperm(host.page_num, generator=gen)[:n_pages]
            spare = torch.tensor(sorted(set(range(1, dev_pages + 1)) - set(dpages.tolist())))
            didx = _slots(dpages, ps).to(ctx.device)
            didx2 = _slots(spare[torch.randperm(spare.numel(), generator=gen)[:n_pages]], ps)
            hidx = _slots(hpages, ps)
            case = f"ps={ps} {pattern}"
            if ctx.out_of_time():
                result.add(Row("host", name, case, "skipped", detail="time budget"))
                continue
            started = time.monotonic()
            bad = _check_round_trip(
                pool, host=host, hidx=hidx, didx=didx, didx2=didx2.to(ctx.device), io=io
            )
            if bad is not None:
                result.add(Row("host", name, case, "FAIL", detail=f"round trip: {bad}"))
                continue

            def backup(h: torch.Tensor = hidx, d: torch.Tensor = didx) -> None:
                host.backup_from_device_all_layer(pool, h, d, io)

            def load(h: torch.Tensor = hidx, d: torch.Tensor = didx) -> None:
                for layer in range(host.layer_num):
                    host.load_to_device_per_layer(pool, h, d, layer, io)

            slow = time.monotonic() - started > 2.0  # a slow path: one timed sample is enough
            for direction, fn in (("backup", backup), ("load", load)):
                seconds = time_call(ctx, fn, iters=1, repeats=1 if slow else None)
                result.add(
                    Row(
                        "host",
                        name,
                        f"{case} {direction}",
                        "ok",
                        value=_gbps(nbytes, seconds),
                        unit="GB/s",
                        reference=refs.get(direction),
                        reference_name="memcpy pinned",
                    )
                )
    finally:
        host.close()
