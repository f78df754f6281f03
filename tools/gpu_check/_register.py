"""Part 3: host memory registration (``cudaHostRegister``) in chunks, rollback and release.

Checks, each one a table row:

* **rollback on a real failure**: an mmap of four chunks whose third chunk was registered
  beforehand, so ``register_chunked`` gets a genuine ``cudaErrorHostMemoryAlreadyRegistered``
  on it. Expected: ``RuntimeError``; chunks 0 and 1 registered then unregistered in reverse
  order; afterwards chunks 0, 1 and 3 are not registered (``cudaPointerGetAttributes``), chunk 2
  (ours) still is, and the device still runs kernels (the failed call's error did not stick).
* **chunked registration succeeds**: the same range in four chunks, all pinned, then released.
* **host pool release on close**: an ``MHATokenToKVPoolHost`` whose allocator registers in
  small chunks: every chunk of every buffer is pinned, a backup + load through the Triton kernels
  reads and writes it bit-exactly, and after ``close()`` no chunk is pinned any more (views taken
  before closing stay valid memory).

In a dry run a ledger registrar stands in for CUDA: it refuses overlapping registrations and
unknown unregistrations the way the driver does, so the same code paths run.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass, field
from typing import Any

import torch

from mem_cache_pool import MHATokenToKVPool
from mem_cache_pool_host import (
    CudaHostRegistrar,
    HostRegistrar,
    MHATokenToKVPoolHost,
    MmapHostTensorAllocator,
)
from mem_cache_pool_host.registration import register_chunked
from tools.gpu_check._core import Context, Row, SectionResult, backend_env, first_difference, sync

__all__ = ["LedgerRegistrar", "SpyRegistrar", "run_register"]


@dataclass
class LedgerRegistrar:
    """A :class:`HostRegistrar` without a device: remembers registered ranges and fails like the
    driver on an overlapping registration or an unknown unregistration."""

    ranges: dict[int, int] = field(default_factory=dict)

    def register(self, ptr: int, nbytes: int) -> None:
        for start, size in self.ranges.items():
            if ptr < start + size and start < ptr + nbytes:
                raise RuntimeError(
                    f"ledger: [{ptr:#x}, +{nbytes}) overlaps registered [{start:#x}, +{size})"
                )
        self.ranges[ptr] = nbytes

    def unregister(self, ptr: int) -> None:
        if ptr not in self.ranges:
            raise RuntimeError(f"ledger: {ptr:#x} is not registered")
        del self.ranges[ptr]

    def pinned(self, ptr: int) -> bool:
        return any(start <= ptr < start + size for start, size in self.ranges.items())


@dataclass
class SpyRegistrar:
    """Wraps a registrar and records every call as ``(verb, offset, ok)``."""

    inner: HostRegistrar
    base: int = 0
    calls: list[tuple[str, int, bool]] = field(default_factory=list)

    def register(self, ptr: int, nbytes: int) -> None:
        try:
            self.inner.register(ptr, nbytes)
        except BaseException:
            self.calls.append(("register", ptr - self.base, False))
            raise
        self.calls.append(("register", ptr - self.base, True))

    def unregister(self, ptr: int) -> None:
        self.inner.unregister(ptr)
        self.calls.append(("unregister", ptr - self.base, True))


class _Probe:
    """Is the host memory at a tensor's first byte registered with the driver?

    CUDA: ``cudaPointerGetAttributes`` on that address (memory type host = registered). Not
    ``Tensor.is_pinned()``: it looks at the start of the tensor's *storage*, so every view into
    one mmap would report the first chunk's state. Fallback when libcudart cannot be opened:
    registering the chunk's first page again fails (already registered) or succeeds (then it is
    unregistered at once). Dry run: the ledger.
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.ledger = LedgerRegistrar()
        self.registrar: HostRegistrar = CudaHostRegistrar() if ctx.cuda else self.ledger
        self.cudart = _cudart() if ctx.cuda else None
        self.how = (
            "ledger"
            if not ctx.cuda
            else "cudaPointerGetAttributes"
            if self.cudart is not None
            else "re-registration"
        )

    def pinned(self, t: torch.Tensor) -> bool:
        ptr = t.data_ptr()
        if not self.ctx.cuda:
            return self.ledger.pinned(ptr)
        if self.cudart is not None:
            attrs = (ctypes.c_int * 16)()  # cudaPointerAttributes (24 bytes), type first
            err = self.cudart.cudaPointerGetAttributes(attrs, ctypes.c_void_p(ptr))
            if err == 0:
                return attrs[0] == _CUDA_MEMORY_TYPE_HOST
            self.cudart.cudaGetLastError()
        try:
            self.registrar.register(ptr, _PAGE)
        except RuntimeError:
            return True
        self.registrar.unregister(ptr)
        return False


_CUDA_MEMORY_TYPE_HOST = 1
_PAGE = 4096


def _cudart() -> Any:
    """libcudart (already loaded by torch, so the soname resolves), or None."""
    for name in (
        "libcudart.so.13",
        "libcudart.so.12",
        "libcudart.so",
        ctypes.util.find_library("cudart"),
    ):
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _device_healthy(ctx: Context) -> bool:
    x = torch.arange(1024, device=ctx.device)
    ok = int(x.sum()) == 1024 * 1023 // 2
    sync(ctx.device)
    return ok


def _rollback(ctx: Context, probe: _Probe, chunk: int) -> tuple[str, str]:
    nbytes = 4 * chunk
    alloc = MmapHostTensorAllocator(register=False).allocate_bytes(nbytes)
    buf = alloc.tensor
    base = buf.data_ptr()
    spy = SpyRegistrar(probe.registrar, base)
    probe.registrar.register(base + 2 * chunk, chunk)  # chunk 2 is taken: a real failure
    problems: list[str] = []
    try:
        try:
            register_chunked(spy, base, nbytes, chunk)
            problems.append("register_chunked did not raise")
        except RuntimeError as exc:
            message = str(exc)
        else:
            message = ""
        want = [
            ("register", 0, True),
            ("register", chunk, True),
            ("register", 2 * chunk, False),
            ("unregister", chunk, True),
            ("unregister", 0, True),
        ]
        if spy.calls != want:
            problems.append(f"calls {spy.calls}, expected {want}")
        states = [probe.pinned(buf[i * chunk :]) for i in range(4)]
        if states != [False, False, True, False]:
            problems.append(f"pinned per chunk after rollback {states}, expected F,F,T,F")
        if not _device_healthy(ctx):
            problems.append("device unhealthy after the failed registration")
    finally:
        probe.registrar.unregister(base + 2 * chunk)
        alloc.close()
    return ("FAIL" if problems else "ok"), "; ".join(problems) or f"raised: {message[:120]}"


def _chunked_ok(probe: _Probe, chunk: int) -> tuple[str, str]:
    nbytes = 4 * chunk
    alloc = MmapHostTensorAllocator(register=False).allocate_bytes(nbytes)
    buf = alloc.tensor
    problems: list[str] = []
    try:
        chunks = register_chunked(probe.registrar, buf.data_ptr(), nbytes, chunk)
        if len(chunks) != 4:
            problems.append(f"{len(chunks)} chunks, expected 4")
        if not all(probe.pinned(buf[i * chunk :]) for i in range(4)):
            problems.append("not every chunk pinned")
        for ptr, _ in reversed(chunks):
            probe.registrar.unregister(ptr)
        if any(probe.pinned(buf[i * chunk :]) for i in range(4)):
            problems.append("a chunk still pinned after unregistering")
    finally:
        alloc.close()
    return ("FAIL" if problems else "ok"), "; ".join(problems) or "4 chunks pinned, then released"


def _pool_release(ctx: Context, probe: _Probe, chunk: int) -> tuple[str, str]:
    s = ctx.sizes
    ps, layers = 16, s.layers
    pool = MHATokenToKVPool(
        s.pool_rows, ps, torch.bfloat16, s.heads, s.head_dim, layers, ctx.device
    )
    spy = SpyRegistrar(probe.registrar)
    allocator = MmapHostTensorAllocator(register=True, registrar=spy, register_chunk_bytes=chunk)
    host = MHATokenToKVPoolHost(
        pool,
        host_size_bytes=pool.size * pool.get_buffer_desc().bytes_per_token,
        layout="page_first",
        allocator=allocator,
    )
    problems: list[str] = []
    views = [b.view(-1).view(torch.uint8) for b in host.buffers]
    try:
        starts = [list(range(0, v.numel(), chunk)) for v in views]
        registered = sum(1 for verb, _, ok in spy.calls if verb == "register" and ok)
        if registered != sum(len(x) for x in starts) or registered < 2 * 2:
            problems.append(f"{registered} chunks registered for buffers of {views[0].numel()} B")
        if not host.pinned or not all(
            probe.pinned(v[o:]) for v, offs in zip(views, starts) for o in offs
        ):
            problems.append("host pool memory not pinned after construction")
        problems += _round_trip(ctx, pool, host)
        host.close()
        if any(probe.pinned(v[o:]) for v, offs in zip(views, starts) for o in offs):
            problems.append("host pool memory still pinned after close()")
        unregistered = sum(1 for verb, _, _ in spy.calls if verb == "unregister")
        if unregistered != registered:
            problems.append(f"close() unregistered {unregistered} of {registered} chunks")
        detail = (
            f"{registered} chunks of {chunk} B pinned, kernel round trip bit-exact, released "
            f"(probe: {probe.how})"
        )
        if host.pinned:
            detail += "; note: HostKVCache.pinned still reports True after close()"
    finally:
        host.close()
    return ("FAIL" if problems else "ok"), "; ".join(problems) or detail


def _round_trip(ctx: Context, pool: MHATokenToKVPool, host: MHATokenToKVPoolHost) -> list[str]:
    """Backup rows through the Triton kernels into the chunk-registered pool, load them back
    into other rows, compare."""
    n = host.size // 2
    ps = pool.page_size
    src = torch.arange(ps, ps + n, device=ctx.device)
    dst = torch.arange(ps + n, ps + 2 * n, device=ctx.device)
    hidx = host.alloc(n)
    if hidx is None:
        return ["host pool too small for the round trip"]
    gen = ctx.generator(5)
    for role in pool.get_buffer_desc().buffers:
        for layer in role:
            layer.view(torch.int16).random_(generator=gen)
            layer[dst] = 0
    with backend_env("triton" if not ctx.cuda else None):
        host.backup_from_device_all_layer(pool, hidx, src, "kernel")
        for layer_id in range(host.layer_num):
            host.load_to_device_per_layer(pool, hidx, dst, layer_id, "kernel")
    sync(ctx.device)
    for r, role in enumerate(pool.get_buffer_desc().buffers):
        for i, layer in enumerate(role):
            diff = first_difference(layer[dst], layer[src])
            if diff is not None:
                return [f"round trip {pool.get_buffer_desc().roles[r]} layer {i}: {diff}"]
    return []


def run_register(ctx: Context) -> SectionResult:
    result = SectionResult("register")
    probe = _Probe(ctx)
    chunk = (64 << 20) if ctx.cuda else 4096  # dry run: one page per chunk
    what = "cudaHostRegister" if ctx.cuda else "ledger registrar (no CUDA)"
    for item, fn in (
        ("register_chunked rollback on a real failure", _rollback),
        ("register_chunked in 4 chunks", lambda c, p, k: _chunked_ok(p, k)),
        ("host pool pinned in chunks, released on close", _pool_release),
    ):
        try:
            status, detail = fn(ctx, probe, chunk)
        except Exception as exc:
            status, detail = "error", f"{type(exc).__name__}: {exc}"
        result.add(Row("register", item, what, status, detail=detail))
    return result
