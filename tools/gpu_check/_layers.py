"""Layer-wise loads: ``LayerDoneCounter``'s per-layer CUDA events (part 3) and the load overlap
they buy (part 2).

Setup: a ``page_first`` host pool (kernel IO) mirrors an MHA device pool with the counter
registered, so ``get_key_buffer(layer)`` / ``get_value_buffer(layer)`` wait for the layer. A loader
thread loads every layer on its own CUDA stream inside ``layer_done_counter.load_batch()``; the
main thread (the "forward pass") pins the batch with ``set_consumer`` and reads layer after layer
on its stream.

* Events check: the load stream first spins for ~50 ms (``torch.cuda._sleep``), so a reader whose
  stream did not wait on the layer's event would read the zeroed target rows. Every layer read
  must equal the source rows bit for bit.
* Overlap: a timing event on the load stream marks the start; after each layer's wait the reader
  records an event on its stream. Reported: time until layer 0 is readable vs until the last
  layer is (the whole load), and their ratio (ideal: 1 / layers).

In a dry run the same code runs on the CPU (no streams or events: the counter's host-side
condition variable does the waiting) and no time is reported.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from mem_cache_pool import MHATokenToKVPool
from mem_cache_pool_host import MHATokenToKVPoolHost
from tools.gpu_check._core import Context, Row, SectionResult, backend_env, first_difference, sync

__all__ = ["run_layers"]

_SPIN_CYCLES = 100_000_000  # ~50 ms at the H200's ~2 GHz


def _event(ctx: Context) -> Any:
    return torch.cuda.Event(enable_timing=True) if ctx.cuda else None  # type: ignore[no-untyped-call]


class _Setup:
    def __init__(self, ctx: Context) -> None:
        s = ctx.sizes
        self.ctx = ctx
        ps, tokens, L = 16, s.bench_tokens, s.bench_layers
        self.pool = MHATokenToKVPool(
            s.bench_device_tokens, ps, torch.bfloat16, s.heads, s.head_dim, L, ctx.device
        )
        self.host = MHATokenToKVPoolHost(
            self.pool,
            host_size_bytes=self.pool.size * self.pool.get_buffer_desc().bytes_per_token,
            layout="page_first",
        )
        pages = tokens // ps
        gen = torch.Generator().manual_seed(1)
        perm = 1 + torch.randperm(self.pool.size // ps, generator=gen)
        self.src = (perm[:pages, None] * ps + torch.arange(ps)).reshape(-1).to(ctx.device)
        self.dst = (perm[pages : 2 * pages, None] * ps + torch.arange(ps)).reshape(-1)
        self.dst = self.dst.to(ctx.device)
        hidx = self.host.alloc(tokens)
        if hidx is None:
            raise RuntimeError(f"host pool of {self.host.size} slots cannot hold {tokens} tokens")
        self.hidx = hidx
        values = ctx.generator(2)
        for role in self.pool.get_buffer_desc().buffers:
            for layer in role:
                shape = (tokens, *layer.shape[1:])
                layer[self.src] = torch.randn(shape, device=ctx.device, generator=values).to(
                    layer.dtype
                )
        self.host.backup_from_device_all_layer(self.pool, self.hidx, self.src, "kernel")
        sync(ctx.device)
        self.pool.register_layer_transfer_counter(self.host.layer_done_counter)

    def close(self) -> None:
        self.pool.register_layer_transfer_counter(None)
        self.host.close()

    def load_and_read(self, *, spin: bool, read: bool) -> tuple[list[Any], Any, list[torch.Tensor]]:
        """One batch: loader thread + layer-by-layer reads. Returns (per-layer ready events on
        the reader's stream, the load's start event, what the reads saw)."""
        ctx, pool, host = self.ctx, self.pool, self.host
        counter = host.layer_done_counter
        L = host.layer_num
        for role in pool.get_buffer_desc().buffers:
            for layer in role:
                layer[self.dst] = 0
        start = _event(ctx)
        ready = [_event(ctx) for _ in range(L)]
        stream = torch.cuda.Stream(ctx.device) if ctx.cuda else None  # type: ignore[no-untyped-call]
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(ctx.device))
        errors: list[BaseException] = []
        target = counter.batch_id + 1

        def loader() -> None:
            try:
                if stream is not None:
                    with torch.cuda.stream(stream):
                        self._load(spin=spin, start=start)
                else:
                    self._load(spin=spin, start=start)
            except BaseException as exc:
                errors.append(exc)
                if counter.batch_id < target:  # failed before the batch began: fail the readers
                    counter.begin()
                    counter.abort(exc)

        counter.set_consumer(target)  # readers wait for the batch about to begin
        thread = threading.Thread(target=loader, name="gpu-check-loader")
        seen: list[torch.Tensor] = []
        try:
            thread.start()
            for layer_id in range(L):
                k = pool.get_key_buffer(layer_id)  # waits for the layer (event on CUDA)
                v = pool.get_value_buffer(layer_id)
                if ready[layer_id] is not None:
                    ready[layer_id].record()
                if read:
                    seen.append(torch.stack([k[self.dst], v[self.dst]]))
        finally:
            thread.join()
            counter.set_consumer(None)
        if errors:
            raise errors[0]
        sync(ctx.device)
        return ready, start, seen

    def _load(self, *, spin: bool, start: Any) -> None:
        if spin and self.ctx.cuda:
            torch.cuda._sleep(_SPIN_CYCLES)  # type: ignore[no-untyped-call]
        if start is not None:
            start.record()
        with self.host.layer_done_counter.load_batch():
            for layer in range(self.host.layer_num):
                self.host.load_to_device_per_layer(self.pool, self.hidx, self.dst, layer, "kernel")

    def expected(self, layer: int) -> torch.Tensor:
        k = self.pool.get_buffer_desc().buffers[0][layer]
        v = self.pool.get_buffer_desc().buffers[1][layer]
        return torch.stack([k[self.src], v[self.src]])


def run_layers(ctx: Context) -> SectionResult:
    result = SectionResult("layers")
    with backend_env("triton" if not ctx.cuda else None):
        setup = _Setup(ctx)
        try:
            _events_check(ctx, setup, result)
            if ctx.out_of_time():
                result.add(Row("layers", "layer-wise load overlap", "-", "skipped"))
            else:
                _overlap(ctx, setup, result)
        finally:
            setup.close()
    return result


def _events_check(ctx: Context, setup: _Setup, result: SectionResult) -> None:
    _, _, seen = setup.load_and_read(spin=True, read=True)
    bad = ""
    for layer, got in enumerate(seen):
        diff = first_difference(got, setup.expected(layer))
        if diff is not None:
            bad = f"layer {layer}: {diff}"
            break
    how = "CUDA events, load stream delayed ~50 ms" if ctx.cuda else "host condition (no CUDA)"
    result.add(
        Row(
            "layers",
            "LayerDoneCounter per-layer wait",
            f"{setup.host.layer_num} layers, {how}",
            "FAIL" if bad else "ok",
            detail=bad or "every layer read after its wait equals the loaded rows",
        )
    )


def _overlap(ctx: Context, setup: _Setup, result: SectionResult) -> None:
    firsts: list[float] = []
    wholes: list[float] = []
    for _ in range(ctx.sizes.repeats + 1):  # the first batch is a warm-up
        ready, start, _ = setup.load_and_read(spin=False, read=False)
        if ctx.cuda:
            firsts.append(start.elapsed_time(ready[0]) / 1e3)
            wholes.append(start.elapsed_time(ready[-1]) / 1e3)
    first = sorted(firsts[1:])[len(firsts[1:]) // 2] if len(firsts) > 1 else None
    whole = sorted(wholes[1:])[len(wholes[1:]) // 2] if len(wholes) > 1 else None
    L = setup.host.layer_num
    result.add(
        Row(
            "layers",
            "layer 0 readable (us)",
            f"{L} layers x {ctx.sizes.bench_tokens} tokens, page_first kernel",
            "ok",
            value=None if first is None else first * 1e6,
            unit="us",
            reference=None if whole is None else whole * 1e6,
            reference_name="whole load",
            detail=f"ideal ratio: {L}",
        )
    )
